# The README names two targets a newcomer runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev sandbox-tool lint bench-ingest clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# Model-written code runs only under bubblewrap (docs/sandbox.md): install it when missing and we are
# root with apt-get; otherwise say so (code execution then refuses to run, it never runs unconfined).
sandbox-tool:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "bubblewrap (bwrap) is not installed: sandboxed code execution will refuse to run." >&2; \
	    echo "Install it with: sudo apt-get install bubblewrap" >&2; \
	  fi; }

# Migrate SQLite, create the demo login, seed the scripted-policy run, queue the tiny-model training
# chain, start a Celery worker (filesystem broker) and the web server on http://127.0.0.1:8000/.
demo: install sandbox-tool
	$(BIN)/python manage.py rundemo

# Production server: refuses to start with unapplied migrations, collects static files (whitenoise serves
# them), then gunicorn with cores + 1 threaded workers of THREADS (4) threads each (gunicorn.conf.py says
# why). Settings come from the environment (DATABASE_URL, SECRET_KEY, DEBUG=0, ALLOWED_HOSTS,
# CELERY_BROKER_URL); BIND, WORKERS and THREADS override the defaults.
BIND ?= 127.0.0.1:8000
WORKERS ?= $(shell echo $$(($$(nproc 2>/dev/null || echo 1) + 1)))
serve: install
	@$(BIN)/python manage.py migrate --check >/dev/null || { echo "unapplied migrations (or the error above): run $(BIN)/python manage.py migrate first"; exit 1; }
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	exec $(BIN)/gunicorn webapp.wsgi -c gunicorn.conf.py --bind $(BIND) --workers $(WORKERS)

test: install-dev sandbox-tool
	$(BIN)/python -m pytest

lint: install-dev
	$(BIN)/ruff check .

bench-ingest: install-dev
	$(BIN)/python bench/ingest.py

clean:
	rm -rf var/ test-artifacts/
