# The README names two targets a newcomer runs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev lint bench-ingest clean

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

# Migrate SQLite, create the demo login, seed the scripted-policy run, queue the tiny-model training
# chain, start a Celery worker (filesystem broker) and the web server on http://127.0.0.1:8000/.
demo: install
	$(BIN)/python manage.py rundemo

test: install-dev
	$(BIN)/python -m pytest

lint: install-dev
	$(BIN)/ruff check .

bench-ingest: install-dev
	$(BIN)/python bench/ingest.py

clean:
	rm -rf var/ test-artifacts/
