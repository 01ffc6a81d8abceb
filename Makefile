# Two entry points, as in the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install install-test lint docs demo test test-fast fuzz

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e ".[webserver]"

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	scripts/install-etcd.sh
	scripts/install-clang.sh
	scripts/install-kafscale.sh  # KafScale's broker for the real-broker tests (needs Go >= 1.25)

# `dagster dev` on the embedded default (lakehouse.yaml, data in var/) next to the demo producer, which writes a
# segment of pizza orders per partition every few seconds (`--lfs`: every 5th order, with a photo, as a KafScale LFS
# blob that the mapping resolves; `--avro`: the same orders as Avro to rpc.pizzas_avro, their schema in the test
# registry, kafscale_lakehouse_tests/support/schema_registry.py, on 127.0.0.1:18081; `--cdc`: Debezium change events
# of stores to rpc.store_status, an upsert table), and the Spark engine (a Spark Connect server on
# 127.0.0.1:$(SPARK_ENGINE_PORT)) that every run connects to through SPARK_REMOTE, so no run starts a JVM. Ctrl-C (or
# SIGTERM) stops them all within seconds, the engine last, once no run uses it (scripts/run-demo.sh).
SPARK_ENGINE_PORT ?= 15002
DAGSTER_PORT ?= 3000
demo: install
	$(BIN)/kafscale-lakehouse dagster-home $(DAGSTER_HOME)  # the repository's dagster.yaml: Dagster's defaults
	DAGSTER_HOME=$(DAGSTER_HOME) scripts/run-demo.sh $(BIN) $(SPARK_ENGINE_PORT) $(DAGSTER_PORT)

lint: install-test
	$(BIN)/ruff check kafscale_lakehouse kafscale_lakehouse_tests benchmarks scripts docs/hooks
	$(BIN)/mypy
	# The dg project: defs.yaml files validate and the code location's definitions load (KafscaleLakehouseComponent).
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dg check defs

# The docs site (mkdocs.yml) into site/: --strict fails on a broken link or anchor, and the configuration reference
# is generated from the config models at build time (docs/hooks/config_reference.py). `$(BIN)/mkdocs serve` to read it.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# --durations: CI's log lists the slowest tests, so the suite's time (kept well under 30 minutes) has its culprits named.
# -n: test processes (pytest-xdist), each with its own servers; a module's tests stay in one process (loadfile).
PYTEST_WORKERS ?= 2
test: lint docs
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The tests that need no server (not marked `integration`: no SeaweedFS, etcd, Spark or `dagster dev`; conftest.py
# marks every test using a server fixture) and no fuzz run: the tier to run while changing code, a few minutes.
FAST_MARKERS := not integration and not fuzz
test-fast: install-test
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 -n $(PYTEST_WORKERS) --dist loadfile \
		-m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# The Avro decoder extension under AddressSanitizer and UBSan, fuzzed by atheris from the seed corpus for
# FUZZ_SECONDS (the suite runs the same for 60 s: kafscale_lakehouse_tests/fuzz/test_avro_fuzz.py).
FUZZ_SECONDS ?= 600
fuzz: install-test
	PYTHON=$(BIN)/python FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz-avro.sh
