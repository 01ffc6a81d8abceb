"""Benchmark (not a test): JSON Schema validation of pizza-order values, records per second.

Run: .venv/bin/python -m kafscale_lakehouse_tests.schema_registry.bench_validation [record_count]
Reports `validate_values` (parse + validate), `validate_parsed` (validate only) and `json.loads` alone, each the
best of three runs on one core.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import pyarrow as pa

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.schema.validation import compile_json_schema, validate_parsed, validate_values
from kafscale_lakehouse_tests.schema_registry.pizza_schema import PIZZA_JSON_SCHEMA


def best_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return min(timings)


def main(record_count: int) -> None:
    raw = [record.value for record in pizza_orders(0, record_count)]
    values = pa.array(raw, type=pa.binary())
    record_ids = pa.array([f"completed-pizzas:0:{offset}" for offset in range(record_count)])
    parsed = [json.loads(value) for value in raw]
    schema = compile_json_schema(PIZZA_JSON_SCHEMA, "bench")

    result = validate_values(values, record_ids, schema)
    assert result.invalid_count == 0, result.summary().metadata()

    for name, run in (
        ("validate_values (parse + validate)", lambda: validate_values(values, record_ids, schema)),
        ("validate_parsed (validate only)", lambda: validate_parsed(parsed, record_ids, schema)),
        ("json.loads alone", lambda: [json.loads(value) for value in values.to_pylist()]),
    ):
        seconds = best_seconds(run)
        print(f"{name:38s} {record_count / seconds:>10,.0f} records/s  ({seconds:.2f}s for {record_count:,})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
