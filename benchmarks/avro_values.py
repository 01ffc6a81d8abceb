"""Avro value decoding benchmark: our vectorized decoder against confluent-kafka's `AvroDeserializer` per record,
and against our JSON path on the same logical data, on one core.

Run from the repository root: `.venv/bin/python benchmarks/avro_values.py [--records N] [--repeat R]`.
Builds N realistic orders (a nested line-item list of 1 to 40 items, a map of attributes, a free-text note of 0 to
2,000 characters, decimals, timestamps, a uuid, so values from about 60 B to 4 KB) and frames them in the Confluent
wire format with a schema registered in the Confluent-compatible test registry (in this process). Then, pinned to one
core, each decoder turns the N values into Arrow columns R times (medians):
- `ours`: `value_formats.avro.AvroValueDecoder.decode` over the batch, the table's nested Arrow types (what a Spark task
  does per batch);
- `confluent-kafka`: `AvroDeserializer` per record (its schema fetched once and cached), then
  `pa.Table.from_pylist` into the same Arrow schema: the reference the issue names;
- `json (flat)`: the same orders as JSON values through our JSON path (`JsonColumnCoercer`) into its flat mapped
  columns (order_id, store_id, placed_at, status, note): the nested fields stay only in `value` there, so this is
  less work than the Avro decoders do.
Needs the test extra plus `confluent-kafka[avro,schemaregistry]` for the reference.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from kafscale_lakehouse.schema import JsonColumnCoercer
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.value_formats.avro import (
    AvroValueDecoder,
    avro_value_fields,
    encode_framed_avro,
    parse_avro_schema,
)
from kafscale_lakehouse.value_formats.framed import FramedValueSchemas

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry

TOPIC = "orders-avro"
ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "store_id", "type": "long"},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "attributes", "type": {"type": "map", "values": "string"}},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "unit_price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    ]}}},
]}
JSON_COLUMNS = (Column("order_id", "string"), Column("store_id", "long"), Column("placed_at", "timestamp"),
                Column("status", "string"), Column("note", "string"))


def orders(count: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    start = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
    return [{
        "order_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "store_id": rng.randrange(1, 500),
        "placed_at": start + datetime.timedelta(microseconds=n * 1_337),
        "status": rng.choice(("NEW", "PAID", "SHIPPED")),
        "note": None if rng.random() < 0.3 else "x" * (int(rng.paretovariate(1.2) * 20) % 2000),
        "attributes": {f"k{i}": f"v{rng.randrange(1000)}" for i in range(rng.randrange(0, 4))},
        "lines": [{"sku": f"sku-{rng.randrange(10_000)}", "quantity": rng.randrange(1, 9),
                   "unit_price": decimal.Decimal(rng.randrange(100, 100_000)) / 100}
                  for _ in range(min(40, 1 + int(rng.expovariate(0.3))))],
    } for n in range(count)]


def as_json(order: dict[str, Any]) -> bytes:
    return json.dumps({**order, "placed_at": order["placed_at"].isoformat(),
                       "lines": [{**line, "unit_price": str(line["unit_price"])} for line in order["lines"]]},
                      separators=(",", ":")).encode()


def timed(decode: Callable[[], int], repeat: int) -> tuple[float, int]:
    decode()  # warm-up: parsed schemas, caches
    times, rows = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = decode()
        times.append(time.perf_counter() - started)
    return statistics.median(times), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=65_536)  # a Spark task's batch (MAX_ROWS_PER_BATCH)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a Spark task gets

    registry = ConfluentCompatibleRegistry().start()
    schema_id = registry.register(f"{TOPIC}-value", ORDER)
    parsed = fastavro.parse_schema(ORDER)
    records = orders(args.records)
    framed = pa.array([encode_framed_avro(schema_id, parsed, r) for r in records], pa.binary())
    json_values = pa.array([as_json(r) for r in records], pa.binary())
    fields = avro_value_fields(parse_avro_schema(json.dumps(ORDER), what="bench"), what="bench")
    value_schema = schema_to_pyarrow(Schema(*fields))
    print(f"{args.records} orders: Avro {framed.nbytes / args.records:.0f} B/value on average, "
          f"JSON {json_values.nbytes / args.records:.0f} B/value; load {os.getloadavg()[0]:.1f}")

    ours = AvroValueDecoder(FramedValueSchemas(f"{TOPIC}-value", {schema_id: json.dumps(ORDER)}, value_schema))

    def decode_ours() -> int:
        decoded = ours.decode(framed)
        return len(decoded.columns[0])

    results = {"ours (Avro → nested Arrow)": timed(decode_ours, args.repeat)}
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext
    except ImportError:
        print("confluent-kafka[avro,schemaregistry] is not installed: no reference")
    else:
        deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
        context = SerializationContext(TOPIC, MessageField.VALUE)
        values = framed.to_pylist()

        def decode_reference() -> int:
            rows = [deserializer(v, context) for v in values]
            return pa.Table.from_pylist(rows, schema=value_schema).num_rows

        results["confluent-kafka AvroDeserializer per record"] = timed(decode_reference, args.repeat)
    coercer = JsonColumnCoercer(JSON_COLUMNS)

    def decode_json() -> int:
        return len(coercer.coerce(json_values).columns["order_id"])

    results["ours, JSON path (flat columns only)"] = timed(decode_json, args.repeat)
    registry.stop()
    ours_seconds = results["ours (Avro → nested Arrow)"][0]
    for name, (seconds, rows) in results.items():
        assert rows == args.records, (name, rows)
        print(f"{name:48s} {args.records / seconds:>11,.0f} records/s  ({seconds:.3f} s; ours is "
              f"{seconds / ours_seconds:.2f}x faster)")


if __name__ == "__main__":
    main()
