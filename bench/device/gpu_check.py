"""GPU machine check: the demo chain's teacher -> SFT -> GRPO through a real Celery worker on
CUDA (filesystem broker, SQLite), then a GRPO run asking for more GPUs than the host has, which the
worker must refuse in words. Prints a JSON summary (also $OUT/summary.json). Run by
bench/device/gpu_check.sh on the device machine (docs/experiments/2026-12-04-gpu-check.md).

STAGES (default teacher,sft,grpo) picks demo-chain stages; CHAIN_LIMIT bounds the wait (s)."""
# ruff: noqa: E402  (settings and sys.path come first: this runs as a plain script there)

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.chdir(ROOT)
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
VAR = Path("/tmp/rdvar")
VAR.mkdir(parents=True, exist_ok=True)
os.environ.update(
    DATABASE_URL=f"sqlite:///{VAR}/db.sqlite3",
    CELERY_BROKER_URL="filesystem://",
    DJANGO_SETTINGS_MODULE="webapp.settings",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    TOKENIZERS_PARALLELISM="false",
    WORKER_DEVICE="auto",
    RD_RUNS_DIR=str(VAR / "runs"),
    PYTHONUNBUFFERED="1",
)
summary = {}
import torch

summary["torch"] = torch.__version__
summary["cuda"] = torch.cuda.is_available()
summary["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], check=True)
import django

django.setup()
from training.environments import get_environment
from webapp.rollouts.models import Group, Rollout
from webapp.rollouts.services import environment_from_training
from webapp.runs.launch import launch_run
from webapp.runs.models import Run

env = environment_from_training(get_environment("diagram"))
import training.demo_chain as dc

_stages = dc.demo_chain_stages
STAGES = os.environ.get("STAGES", "teacher,sft,grpo").split(",")
dc.demo_chain_stages = lambda env="diagram": [s for s in _stages(env) if s.name in STAGES]
from webapp.runs.launch import queue_demo_chain

summary["queued"] = queue_demo_chain()
t0 = time.time()
log = open(  # noqa: SIM115  (the worker writes to it until the end)
    OUT / "worker.log", "w"
)
worker = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers",
        "worker",
        "-Q",
        "gpu,default",
        "--concurrency",
        "1",
        "--pool",
        "solo",
        "-l",
        "info",
    ],
    stdout=log,
    stderr=subprocess.STDOUT,
)
LIMIT = float(os.environ.get("CHAIN_LIMIT", "420"))


def finished():
    live = Run.objects.filter(status__in=("queued", "running"))
    return not [
        r
        for r in live
        if r.status == "running"
        or r.parent is None
        or r.parent.status in ("queued", "running", "succeeded")
    ]


while time.time() - t0 < LIMIT and not finished():
    time.sleep(3)
summary["chain_seconds"] = round(time.time() - t0, 1)
runs = []
for r in Run.objects.order_by("id"):
    lines = (r.log_tail or "").splitlines()
    runs.append(
        {
            "id": r.id,
            "kind": r.kind,
            "status": r.status,
            "secs": (r.finished_at - r.started_at).total_seconds()
            if r.finished_at and r.started_at
            else None,
            "groups": Group.objects.filter(run=r).count(),
            "rollouts": Rollout.objects.filter(run=r).count(),
            "device": [line for line in lines if "device" in line][:2],
            "error": (r.error or "")[-800:],
            "last": lines[-3:] if lines else [],
        }
    )
summary["runs"] = runs
# The multi-GPU path asks for 2 GPUs on this 1-GPU host: the worker must refuse it in words
# (accelerate would quietly run ONE process).
run2 = launch_run(
    name="two gpus",
    kind="grpo",
    environment=env,
    config={
        "max_steps": 1,
        "num_prompts": 2,
        "num_generations": 4,
        "per_device_batch_size": 8,
        "num_gpus": 2,
    },
    base_model="tiny:diagram",
)
t1 = time.time()
while time.time() - t1 < 20:
    run2.refresh_from_db()
    if run2.status in ("succeeded", "failed", "cancelled"):
        break
    time.sleep(1)
summary["two_gpu_run"] = {"status": run2.status, "error": (run2.error or "")[-500:]}
print(json.dumps(summary, indent=1))
(OUT / "summary.json").write_text(json.dumps(summary, indent=1))
worker.terminate()
try:
    worker.wait(20)
except subprocess.TimeoutExpired:
    worker.kill()
