"""Benchmark (not a test): JSON coercion of pizza-order values against a bare pyarrow JSON reader pipeline.

Run: .venv/bin/python -m kafscale_lakehouse_tests.schema.bench_coercion [record_count]
The baseline joins the values with newlines and parses them with `pyarrow.json.read_json` and an explicit
schema, with no coercion rules, no invalid-record handling and no fallback; the target is at most 2x its time.
"""

from __future__ import annotations

import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from kafscale_lakehouse.apps.workload import PIZZA_COLUMNS, pizza_orders
from kafscale_lakehouse.schema import JsonColumnCoercer

_BASELINE_SCHEMA = pa.schema(
    [("order_id", pa.string()), ("store_id", pa.int64()), ("sauce", pa.string()), ("cheese", pa.string()),
     ("meats", pa.string()), ("veggies", pa.string()), ("date_ordered", pa.timestamp("us"))]
)


def baseline(values: pa.BinaryArray) -> pa.Table:
    joined = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), b"\n")
    options = pa_json.ParseOptions(explicit_schema=_BASELINE_SCHEMA, unexpected_field_behavior="ignore")
    return pa_json.read_json(pa.BufferReader(joined.buffers()[2]), parse_options=options)


def best_seconds(function, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def main(record_count: int = 200_000) -> None:
    values = pa.array([record.value for record in pizza_orders(0, record_count)], pa.binary())
    coercer = JsonColumnCoercer(PIZZA_COLUMNS)
    result = coercer.coerce(values)
    assert result.invalid_count == 0 and not any(result.nulled_counts.values()), "pizza values must all coerce"
    assert baseline(values).num_rows == record_count
    ours = best_seconds(lambda: coercer.coerce(values))
    reader = best_seconds(lambda: baseline(values))
    print(f"{record_count} pizza values ({values.nbytes / 1e6:.1f} MB)")
    print(f"pyarrow JSON reader baseline: {reader * 1000:8.1f} ms  {record_count / reader:12,.0f} records/s")
    print(f"JsonColumnCoercer:            {ours * 1000:8.1f} ms  {record_count / ours:12,.0f} records/s  "
          f"({ours / reader:.2f}x baseline)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
