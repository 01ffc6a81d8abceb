# Two entry points, as in the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install install-test lint demo test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	scripts/install-etcd.sh

# `dagster dev` on the embedded default (lakehouse.yaml, data in var/) next to the demo producer, which writes a
# segment of pizza orders per partition every few seconds (`--lfs`: every 5th order, with a photo, as a KafScale LFS
# blob that the mapping resolves). Ctrl-C stops both (the trap stops the producer).
demo: install
	mkdir -p $(DAGSTER_HOME)
	cp -n dagster.yaml $(DAGSTER_HOME)/dagster.yaml || true
	$(BIN)/kafscale-lakehouse demo-producer --lfs --rounds 1  # the definitions check at load that the topic exists
	$(BIN)/kafscale-lakehouse demo-producer --lfs & producer=$$!; \
	trap 'kill $$producer 2>/dev/null; wait $$producer' EXIT; trap 'exit 130' INT TERM; \
	DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/dagster dev -h 127.0.0.1 -p 3000

lint: install-test
	$(BIN)/ruff check kafscale_lakehouse kafscale_lakehouse_tests benchmarks scripts
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
