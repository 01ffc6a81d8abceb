"""Deterministic pizza-order workload (the classic "completed-pizzas" example) written as KafScale segments.

Used by the benchmarks, the tests and the demo producer. Record number `n` of a (seed, partition) is always the
same order, however the records are split into batches and segments, so a producer can resume at any offset.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kafscale_lakehouse.config import ColumnConfig
from kafscale_lakehouse.format import DEFAULT_INDEX_INTERVAL, Record, encode_segment

PIZZA_TOPIC = "completed-pizzas"
PIZZA_HEADERS = (("source", b"pizza-svc"),)
# 2024-01-01T00:00:00Z, one order per second from there.
DEFAULT_START_MS = 1_704_067_200_000
DEFAULT_INTERVAL_MS = 1_000
ALL_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
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
    ColumnConfig(name="order_id", type="string", required=True),
    ColumnConfig(name="store_id", type="int"),
    ColumnConfig(name="sauce", type="string"),
    ColumnConfig(name="cheese", type="string"),
    ColumnConfig(name="meats", type="string"),
    ColumnConfig(name="veggies", type="string"),
    ColumnConfig(name="date_ordered", type="timestamp"),
)

def pizza_order(index: int, *, seed: int = 0, partition: int = 0, start_ms: int = DEFAULT_START_MS,
                interval_ms: int = DEFAULT_INTERVAL_MS) -> Record:
    """Order number `index` of partition `partition`: key `store-<id>`, ~200-byte JSON value, one header."""
    digest = hashlib.blake2b(f"{seed}:{partition}:{index}".encode(), digest_size=24).digest()
    store_id = digest[16] % STORE_COUNT + 1
    timestamp_ms = start_ms + index * interval_ms
    order = {
        "order_id": str(uuid.UUID(bytes=digest[:16])),
        "store_id": store_id,
        "sauce": _SAUCES[digest[17] % len(_SAUCES)],
        "cheese": _CHEESES[digest[18] % len(_CHEESES)],
        "meats": _MEATS[digest[19] % len(_MEATS)],
        "veggies": _VEGGIES[digest[20] % len(_VEGGIES)],
        "date_ordered": datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
    }
    return Record(key=f"store-{store_id}".encode(), value=json.dumps(order, separators=(",", ":")).encode(),
                  headers=PIZZA_HEADERS, timestamp_ms=timestamp_ms)


def pizza_orders(first_index: int, count: int, *, seed: int = 0, partition: int = 0,
                 start_ms: int = DEFAULT_START_MS, interval_ms: int = DEFAULT_INTERVAL_MS) -> list[Record]:
    return [pizza_order(index, seed=seed, partition=partition, start_ms=start_ms, interval_ms=interval_ms)
            for index in range(first_index, first_index + count)]


def partition_dir(root: Path, *, namespace: str, topic: str, partition: int) -> Path:
    """`<root>/<namespace>/<topic>/<partition>`; an empty namespace puts the topic right under the root."""
    return Path(root, namespace, topic, str(partition)) if namespace else Path(root, topic, str(partition))


def write_partition_segments(root: Path, *, record_count: int, namespace: str = "default",
                             topic: str = PIZZA_TOPIC, partition: int = 0, base_offset: int = 0, seed: int = 0,
                             records_per_segment: int = 1_000, records_per_batch: int = 100,
                             codecs: Sequence[str] = ALL_CODECS, created_ms: int = DEFAULT_START_MS,
                             index_interval: int = DEFAULT_INDEX_INTERVAL) -> list[WrittenSegment]:
    """Write `record_count` pizza orders from `base_offset` as contiguous segments of one partition.

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
        segment = encode_segment(pizza_orders(first, count, seed=seed, partition=partition), base_offset=first,
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
