# The two commands of the README: `make repro` (set up, run the embedded default audit) and
# `make test` (set up with dev tools, lint and type-check, run the test suite). Both create .venv if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: repro test test-ecosystem lint venv venv-dev mlflow-ui clean mutation remote

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "ACRB needs Python >= 3.10"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# pip byte-compiles what it installs one file after another (about 60 s of the dev install's
# 32,000 files); installing without it and compiling the environment afterwards on every CPU
# takes half the time. Files that are not valid Python 3.11 (torch ships a 3.12 example) are
# skipped silently, as pip skips them.
COMPILE_ENV = $(BIN)/python -m compileall -qq -j 0 \
              "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true

$(VENV)/.core-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e .
	@$(COMPILE_ENV)
	@touch $@

# The dev tools include transformers, for the test of the local-LLM prompt writer; torch 2.13.0
# (a CPU build where the package index has one) is installed first, so that nothing newer or
# larger is pulled in.
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile "torch==2.13.0"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	@$(COMPILE_ENV)
	@touch $@ $(VENV)/.core-installed

venv: $(VENV)/.core-installed
venv-dev: $(VENV)/.dev-installed

# Every stage is a process that imports ACRB's modules: byte-compiled once here, they are not
# compiled again in each process where Python is told not to write bytecode
# (PYTHONDONTWRITEBYTECODE, set in many containers); only changed files are recompiled.
repro: venv
	$(BIN)/python -m compileall -q src/acrb
	$(BIN)/dvc repro
	@$(BIN)/acrb mlflow-sync
	@echo
	@echo "Report:   $(CURDIR)/reports/report.html"
	@echo "Metrics:  $(CURDIR)/metrics/audit/   (dvc metrics show; plots: dvc plots show)"
	@echo "MLflow:   $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db   (or: make mlflow-ui)"
	@echo "          then open $$($(BIN)/acrb mlflow-url || echo http://127.0.0.1:5000)"
	@echo "          (every model's delta_refusal, delta_erasure, delta_lightening beside each pipeline run)"

lint: venv-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m mypy

# Two workers by default (CI has two cores); a test file runs on one worker, so its module
# fixtures are built once. `make test TEST_WORKERS=0` runs serially. Files are handed out in
# the order tests/conftest.py collects them (the longest first, LONG_FILES); without
# --no-loadscope-reorder pytest-xdist hands out the files with the most tests first, and the
# longest test ran alone at the end while the other worker idled.
TEST_WORKERS ?= 2
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: lint
	$(BIN)/python -m compileall -q src/acrb
	$(BIN)/python -m pytest $(PYTEST_XDIST)

# The README's ecosystem promises, slow (each runs whole `dvc repro`s or servers): the
# pipeline's DVC round trip (what a repeat, a code change and a param change rerun, metrics
# diff, MLflow runs found from elsewhere) and one analyze in two processes writing the bytes of
# one, a sequential audit's repeat and its resumption after `dvc repro` is killed, queued DVC
# experiments in isolation, push -> clone -> pull through an S3 remote, and a tracking server
# with S3 artifacts. Not in `make test`; CI (.ci/run) runs them after it, every
# test named (only the `slow` tests of these files run here).
ECOSYSTEM_TESTS := tests/test_dvc_pipeline.py tests/test_analyze_pool.py \
                   tests/test_dvc_sequential.py \
                   tests/test_dvc_experiments.py tests/test_dvc_sharing.py \
                   tests/test_tracking_server.py
test-ecosystem: venv-dev
	$(BIN)/python -m compileall -q src/acrb
	$(BIN)/python -m pytest -m slow $(PYTEST_XDIST) -v $(ECOSYSTEM_TESTS)

# Mutation testing of the modules that make published numbers and security properties
# (docs/mutation.md): slow (tens of minutes), one worker, not part of `make test` or CI.
# Writes benchmarks/results/mutation.json and fails when a module's score drops under 90%.
MUTATION_WORKERS ?= 1
mutation: venv-dev
	$(BIN)/mutmut run --max-children $(MUTATION_WORKERS) $$($(BIN)/python benchmarks/mutation_report.py --globs)
	$(BIN)/python benchmarks/mutation_report.py --recheck-timeouts

# A DVC remote every clone of this user on this machine shares: one absolute folder, set in
# .dvc/config.local (git-ignored), because a path in the committed .dvc/config is either relative
# (resolved inside each clone, so every clone had its own empty remote) or one machine's absolute
# path. `make remote DVC_STORAGE=/srv/acrb/dvc` for a folder a team shares; for S3 see the
# docs/team.md.
DVC_STORAGE ?= $(HOME)/.cache/acrb/dvc-storage
remote: venv
	mkdir -p "$(DVC_STORAGE)"
	$(BIN)/dvc remote add --local --default --force local "$(abspath $(DVC_STORAGE))"
	@echo "DVC remote 'local' -> $(abspath $(DVC_STORAGE))   (dvc push / dvc pull)"

# MLflow 3 starts a job runner beside the UI by default (nine processes importing MLflow, for
# GenAI jobs ACRB never submits): off here.
mlflow-ui: venv
	@echo "Open $$($(BIN)/acrb mlflow-url)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db

clean:
	rm -rf mutants
	rm -rf data/sources data/prompts data/plan data/generations data/judgements data/analysis \
	       metrics plots reports mlflow.db logs
