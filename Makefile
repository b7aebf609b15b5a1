# The two commands a new user needs: `make run` (the demo) and `make test` (lint, types, tests).
# `make test-fast`: unit and contract tests only (under a minute), while editing.
# `make test-vllm`: the vLLM engine's tests (tests/vllm) on the real vLLM, after installing it
# (`scripts/setup.sh --vllm`) and SmolLM2 (`scripts/import_smollm2.sh`); CI runs it after
# `make test-long`.
# `make test-long`: the whole runs of a minute or more each (tests marked `long`: learning, chaos,
# kill and resume, trainer ranks, about 14 minutes); CI runs it after `make test`.
# They run the tests in 2 pytest-xdist workers, a test file's tests all in one (module fixtures),
# the longest files first (tests/conftest.py).
# `make test-multihost`: the multi-host tier (tests/multihost, about 8 minutes): roles, trainer
# ranks and a Ray cluster on simulated hosts (network namespaces, so it needs root and `ip`);
# CI runs it after `make test-vllm`.
# `make docs`: the documentation site (mkdocs.yml, docs/) into site/, strict: a warning fails it.
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup test test-long test-vllm test-multihost test-fast lint run docs clean

setup:
	bash scripts/setup.sh

lint: setup
	$(BIN)/ruff check llamarl brokers workers tests scripts examples
	$(BIN)/ruff format --check llamarl brokers workers tests scripts examples
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadfile --no-loadscope-reorder \
		--ignore=tests/vllm --ignore=tests/multihost -m "not long" tests

test-long: setup
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadfile --no-loadscope-reorder \
		--ignore=tests/vllm --ignore=tests/multihost -m long tests

test-vllm: setup
	bash scripts/setup.sh --vllm
	bash scripts/import_smollm2.sh
	$(BIN)/python -m pytest -q --durations=10 tests/vllm

test-multihost: setup
	$(BIN)/python -m pytest -q --durations=10 tests/multihost

test-fast: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests/unit tests/contract

run: setup
	$(BIN)/llamarl run configs/tiny.yaml

docs: setup
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site .pytest_cache .mypy_cache .ruff_cache
