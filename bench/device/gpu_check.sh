#!/bin/bash
# Runs on the device machine from the repo root: the image has torch + CUDA but not the app's other
# packages, so they travel as wheels in .whl/ (see .library device README: pip download --no-deps
# --python-version 3.12 ... for trl, datasets, Django, DRF, drf-spectacular, celery, kombu, redis,
# plotly, orjson, whitenoise, dj-database-url, transformers==5.24.0 and their pure-Python needs).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip show pyarrow fsspec peft accelerate transformers huggingface-hub 2>/dev/null | grep -E "^(Name|Version)"
python3 -c "import trl, django, celery; print('trl', trl.__version__, 'django', django.__version__)" || exit 1
timeout 560 python3 bench/device/gpu_check.py 2>&1 | tail -c 6000
