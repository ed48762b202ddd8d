# Two entry points do all the set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.relm-installed

.PHONY: demo test lint format setup clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Keep an existing torch (a CUDA build on a GPU machine); otherwise take the CPU build that lies on disk,
# because a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/relm train

test: $(STAMP)
	$(BIN)/ruff check relm tests
	$(BIN)/ruff format --check relm tests
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check relm tests

format: $(STAMP)
	$(BIN)/ruff format relm tests
	$(BIN)/ruff check --fix relm tests

clean:
	rm -rf $(VENV) outputs
