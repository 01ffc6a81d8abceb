"""Deterministic pizza-order workload (the classic "completed-pizzas" example) written as KafScale segments.

Used by the benchmarks, the tests and the demo producer. Record number `n` of a (seed, partition) is always the
same order, however the records are split into batches and segments, so a producer can resume at any offset.

Two workloads (`WORKLOADS`):
- `friendly`: key `store-<id>`, a ~175-byte JSON value and the same `source` header on every record. Header
  sections repeat, so a decoder that caches per distinct section looks better than it will on real traffic.
- `realistic` (the benchmarks' default): what traced services produce. Key the order id (unique); 1-3 headers
  with values unique per record, as OpenTelemetry's W3C propagators write them (`traceparent`, often
  `tracestate`, sometimes `baggage`); values of mixed size, 95% 100 B-1 KB, 4.5% 1-10 KB, 0.5% 10-100 KB
  (log-uniform within each band, ~0.75 KB on average), padded with a `notes` text field that compresses like text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kafscale_lakehouse.format import DEFAULT_INDEX_INTERVAL, Record, encode_segment
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.value_formats.avro import encode_framed_avro

PIZZA_TOPIC = "completed-pizzas"
PIZZA_HEADERS = (("source", b"pizza-svc"),)
# 2024-01-01T00:00:00Z, one order per second from there.
DEFAULT_START_MS = 1_704_067_200_000
DEFAULT_INTERVAL_MS = 1_000
ALL_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
WORKLOADS = ("realistic", "friendly")
STORE_COUNT = 100

_SAUCES = ("regular", "light", "extra", "none", "bbq", "alfredo")
_CHEESES = ("regular", "light", "extra", "none", "three cheese", "goat cheese")
_MEATS = ("pepperoni", "sausage", "ham", "bacon", "salami", "anchovies", "none")
_VEGGIES = ("mushrooms", "peppers", "onions", "olives", "tomatoes", "none")


@dataclass(frozen=True)
class WrittenSegment:
    kfs_path: Path
    index_path: Path
    base_offset: int
    last_offset: int
    codec: str


# The mapped columns of the pizza orders (the demo's `rpc.pizzas`), for benchmarks and tests.
PIZZA_COLUMNS = (
    Column(name="order_id", type="string", required=True),
    Column(name="store_id", type="int"),
    Column(name="sauce", type="string"),
    Column(name="cheese", type="string"),
    Column(name="meats", type="string"),
    Column(name="veggies", type="string"),
    Column(name="date_ordered", type="timestamp"),
)

# Value sizes of the realistic workload: (cumulative share out of 1000, smallest, largest) in bytes.
_VALUE_SIZE_BANDS = ((950, 100, 1_000), (995, 1_000, 10_000), (1000, 10_000, 100_000))
_NOTES_WORDS = ("crust", "thin", "extra", "crispy", "please", "ring", "bell", "door", "leave", "at", "the", "gate",
                "no", "onions", "call", "on", "arrival", "birthday", "party", "cut", "in", "squares", "hot", "fast",
                "allergy", "nuts", "gluten", "free", "side", "of", "ranch", "garlic", "dip", "knock", "twice")
_NOTES_RANDOM = random.Random(20240101)  # noqa: S311 - seeded test data, not security
# Text to cut notes from: words in random order compress about as well as free text does.
_NOTES_TEXT = " ".join(_NOTES_RANDOM.choice(_NOTES_WORDS) for _ in range(60_000))
if len(_NOTES_TEXT) <= 2 * _VALUE_SIZE_BANDS[-1][2]:
    raise AssertionError("_NOTES_TEXT is too short for the largest value size band")


def pizza_order(index: int, *, seed: int = 0, partition: int = 0, start_ms: int = DEFAULT_START_MS,
                interval_ms: int = DEFAULT_INTERVAL_MS, workload: str = "friendly") -> Record:
    """Order number `index` of partition `partition` in `workload` (see the module docstring)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}: expected one of {', '.join(WORKLOADS)}")
    digest = hashlib.blake2b(f"{seed}:{partition}:{index}".encode(), digest_size=24).digest()
    store_id = digest[16] % STORE_COUNT + 1
    timestamp_ms = start_ms + index * interval_ms
    order_id = str(uuid.UUID(bytes=digest[:16]))
    order = {
        "order_id": order_id,
        "store_id": store_id,
        "sauce": _SAUCES[digest[17] % len(_SAUCES)],
        "cheese": _CHEESES[digest[18] % len(_CHEESES)],
        "meats": _MEATS[digest[19] % len(_MEATS)],
        "veggies": _VEGGIES[digest[20] % len(_VEGGIES)],
        "date_ordered": datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S"),
    }
    if workload == "friendly":
        return Record(key=f"store-{store_id}".encode(), value=json.dumps(order, separators=(",", ":")).encode(),
                      headers=PIZZA_HEADERS, timestamp_ms=timestamp_ms)
    # A second digest for what only the realistic workload draws, so friendly orders stay as they were.
    extra = hashlib.blake2b(f"{seed}:{partition}:{index}:realistic".encode(), digest_size=32).digest()
    value = json.dumps(order, separators=(",", ":"))
    size = _value_size(int.from_bytes(extra[0:4], "little"))
    if size > len(value) + len(',"notes":""'):
        start = int.from_bytes(extra[4:8], "little") % (len(_NOTES_TEXT) - size)
        value = value[:-1] + ',"notes":"' + _NOTES_TEXT[start:start + size - len(value) - len(',"notes":""')] + '"}'
    trace_id, span_id = extra[8:24].hex(), extra[24:32].hex()
    headers = [("traceparent", f"00-{trace_id}-{span_id}-01".encode())]
    if extra[0] % 3:
        headers.append(("tracestate", f"kfs={digest[:8].hex()},rojo={span_id}".encode()))
    if extra[0] % 3 == 2:
        headers.append(("baggage", f"order.id={order_id},store.id={store_id}".encode()))
    return Record(key=order_id.encode(), value=value.encode(), headers=tuple(headers),
                  timestamp_ms=timestamp_ms)


# The demo's Avro topic: the same orders as a record with a nested list of toppings, written in the Confluent
# wire format (`pizza_order_as_avro`).
PIZZA_AVRO_SCHEMA = {"type": "record", "name": "PizzaOrder", "namespace": "kafscale.demo", "fields": [
    {"name": "order_id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "store_id", "type": "int"},
    {"name": "date_ordered", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "sauce", "type": "string"},
    {"name": "cheese", "type": "string"},
    {"name": "toppings", "type": {"type": "array", "items": {"type": "record", "name": "Topping", "fields": [
        {"name": "kind", "type": {"type": "enum", "name": "ToppingKind", "symbols": ["MEAT", "VEGGIE"]}},
        {"name": "name", "type": "string"},
    ]}}},
    {"name": "notes", "type": ["null", "string"], "default": None},
]}


def pizza_order_as_avro(record: Record, schema_id: int, parsed_schema: Any) -> Record:
    """A `pizza_order` record with its JSON value re-encoded as `PIZZA_AVRO_SCHEMA` in the Confluent wire format."""
    if record.value is None:
        return record
    order = json.loads(record.value)
    toppings = [{"kind": kind, "name": order[field]} for kind, field in (("MEAT", "meats"), ("VEGGIE", "veggies"))
                if order[field] != "none"]
    avro_order = {"order_id": order["order_id"], "store_id": order["store_id"],
                  "date_ordered": datetime.fromtimestamp(record.timestamp_ms / 1000, tz=UTC),
                  "sauce": order["sauce"], "cheese": order["cheese"], "toppings": toppings,
                  "notes": order.get("notes")}
    return dataclasses.replace(record, value=encode_framed_avro(schema_id, parsed_schema, avro_order))


def _value_size(draw: int) -> int:
    """A value size in bytes from a uniform 32-bit `draw`: the band by its share, log-uniform inside it."""
    share, fraction = draw % 1000, (draw // 1000) / (2 ** 32 // 1000)
    smallest, largest = next((low, high) for cumulative, low, high in _VALUE_SIZE_BANDS if share < cumulative)
    return int(smallest * math.exp(fraction * math.log(largest / smallest)))


def pizza_orders(first_index: int, count: int, *, seed: int = 0, partition: int = 0,
                 start_ms: int = DEFAULT_START_MS, interval_ms: int = DEFAULT_INTERVAL_MS,
                 workload: str = "friendly") -> list[Record]:
    return [pizza_order(index, seed=seed, partition=partition, start_ms=start_ms, interval_ms=interval_ms,
                        workload=workload)
            for index in range(first_index, first_index + count)]


def partition_dir(root: Path, *, namespace: str, topic: str, partition: int) -> Path:
    """`<root>/<namespace>/<topic>/<partition>`; an empty namespace puts the topic right under the root."""
    return Path(root, namespace, topic, str(partition)) if namespace else Path(root, topic, str(partition))


def write_partition_segments(root: Path, *, record_count: int, namespace: str = "default",
                             topic: str = PIZZA_TOPIC, partition: int = 0, base_offset: int = 0, seed: int = 0,
                             records_per_segment: int = 1_000, records_per_batch: int = 100,
                             codecs: Sequence[str] = ALL_CODECS, created_ms: int = DEFAULT_START_MS,
                             index_interval: int = DEFAULT_INDEX_INTERVAL, workload: str = "friendly",
                             transform: Callable[[Record], Record] | None = None) -> list[WrittenSegment]:
    """Write `record_count` pizza orders (of `workload`) from `base_offset` as contiguous segments of one partition;
    `transform` rewrites each order first (e.g. `pizza_order_as_avro`: the benchmarks' Avro workload).

    Segment `i` uses `codecs[i % len(codecs)]`. Files are `segment-%020d.kfs` and `.index` under
    `partition_dir(...)`; each is written to a `.tmp` name and renamed, `.kfs` before `.index` as the broker
    uploads them, so a reader never sees a partial object and a segment is complete once its index exists.
    Records use offsets as their workload index, so re-running from any base offset gives the same orders.
    """
    if record_count < 1 or records_per_segment < 1:
        raise ValueError(f"record_count ({record_count}) and records_per_segment ({records_per_segment}) "
                         f"must be positive")
    if not codecs:
        raise ValueError("codecs must name at least one codec")
    directory = partition_dir(root, namespace=namespace, topic=topic, partition=partition)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for segment_number, first in enumerate(range(base_offset, base_offset + record_count, records_per_segment)):
        count = min(records_per_segment, base_offset + record_count - first)
        codec = codecs[segment_number % len(codecs)]
        orders = pizza_orders(first, count, seed=seed, partition=partition, workload=workload)
        segment = encode_segment(orders if transform is None else [transform(order) for order in orders],
                                 base_offset=first,
                                 codec=codec, records_per_batch=records_per_batch, created_ms=created_ms,
                                 index_interval=index_interval)
        kfs_path = directory / f"segment-{first:020d}.kfs"
        index_path = directory / f"segment-{first:020d}.index"
        _write_atomically(kfs_path, segment.kfs)
        _write_atomically(index_path, segment.index)
        written.append(WrittenSegment(kfs_path, index_path, segment.base_offset, segment.last_offset, codec))
    return written


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
