"""Demo producer: plays a KafScale broker for the embedded demo (`make demo`).

Every round it appends a segment of pizza orders (`workload.pizza_orders`) to each partition of the topic: first it
publishes the partition's new broker watermark (the broker has accepted the records, so lag shows before the segment
lands), then it uploads the segment's `.kfs` and `.index` (the broker uploads them in parallel; the segment is
complete when both exist). Batches inside a segment rotate through every Kafka codec. Orders are stamped with the
wall clock so the table's day partitions are today.
It resumes after the last complete segment of each partition, so restarting it never rewrites ingested offsets.
Watermarks go where the sensors read them: the sqlite offsets store (`offsets.backend: local`) or the broker's
`next_offset` keys in etcd.

With `lfs` (`--lfs`), every `LFS_EVERY`th order carries a photo (a small generated PNG, base64 in the order's
`photo` field) and goes the way KafScale's LFS proxy sends a large payload: the order is stored as a blob and the
record value is its LFS envelope (docs/kafscale-format.md §9). Blobs go to the segment bucket under `lfs/` (S3), or
for a local segment directory to `<local_root>/<LOCAL_LFS_BUCKET>/lfs/...`, where the ingestion's LFS stage looks for
bucket `LOCAL_LFS_BUCKET`. A mapping with `lfs.mode: resolve` (the embedded default's) lands the full orders.

With `cdc` (`--cdc`), the mappings with `cdc.format: debezium` get a change stream of a `stores` table as Debezium's
PostgreSQL connector writes it (`store_status_changes`): creates, updates, deletes (whose `before` holds the primary
key alone) each followed by a tombstone, of a few store ids that are reused (a deleted store opens again), keyed by
`{"store_id": N}`; a store's changes stay in partition `store_id % partitions`. The embedded default lands them in an
upsert table (`mode: upsert`) holding each store's latest row.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import random
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from kafscale_lakehouse.apps.workload import ALL_CODECS, PIZZA_AVRO_SCHEMA, pizza_order_as_avro, pizza_orders
from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.connections import etcd_client_from_config, offset_store_from_config, segment_store_from_config
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.format import Record, encode_segment
from kafscale_lakehouse.format.lfs import encode_envelope
from kafscale_lakehouse.offsets import LocalOffsetStore
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.redaction import redact_url
from kafscale_lakehouse.storage import LocalSegmentStore, S3SegmentStore, SegmentStore
from kafscale_lakehouse.value_formats.avro import parse_avro_schema
from kafscale_lakehouse.value_formats.confluent_registry import (
    ConfluentRegistryClient,
    ConfluentRegistrySettings,
    subject_name,
)
from kafscale_lakehouse.value_formats.registry import SchemaRegistryUnavailableError

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 3
DEFAULT_INTERVAL_SECONDS = 3.0
DEFAULT_RECORDS_PER_SEGMENT = 40
RECORDS_PER_BATCH = 10
LFS_EVERY = 5
LOCAL_LFS_BUCKET = "kafscale-lfs"  # the envelope bucket of blobs beside a local segment directory
STORES = 12  # store ids 1..STORES of the CDC topic: few, so keys are updated, deleted and created again
STORE_CHANGES_PER_SEGMENT = 8
STORE_STATUSES = ("open", "busy", "closed", "renovating")
STORE_CITIES = ("Amsterdam", "Berlin", "Lisbon", "Oslo", "Porto", "Vienna")
STORE_DELETE_SHARE = 0.2

# (topic, partition, next offset) -> None
WatermarkPublisher = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ProducedSegment:
    partition: int
    base_offset: int
    last_offset: int
    kfs_key: str
    codecs: tuple[str, ...]


class DemoProducer:
    """Appends one segment per partition per `produce_round`, continuing after the segments already in `store`."""

    def __init__(self, store: SegmentStore, publish_watermark: WatermarkPublisher, *, topic: str, partitions: int,
                 records_per_segment: int = DEFAULT_RECORDS_PER_SEGMENT, seed: int = 0, lfs: bool = False,
                 avro_schema_id: int | None = None, store_changes: bool = False) -> None:
        if partitions < 1 or records_per_segment < 1:
            raise ValueError(f"partitions ({partitions}) and records_per_segment ({records_per_segment}) must be "
                             f"at least 1")
        self.store = store
        self.publish_watermark = publish_watermark
        self.topic = topic
        self.records_per_segment = records_per_segment
        self.seed = seed
        self.lfs = lfs
        # the orders as PIZZA_AVRO_SCHEMA in the Confluent wire format, with this registered schema id
        self.avro_schema_id = avro_schema_id
        self.store_changes = store_changes  # a Debezium change stream of stores instead of orders
        self.partitions = partitions
        self.stores: dict[int, dict[str, object] | None] = {}  # the source table's rows this producer changed
        self._avro_schema = parse_avro_schema(json.dumps(PIZZA_AVRO_SCHEMA), what="the demo's Avro order",
                                              for_reading=True)
        self.next_offsets = {partition: self._resume_offset(partition) for partition in range(partitions)}
        self.resumed = {partition: offset > 0 for partition, offset in self.next_offsets.items()}
        self.segments_written = 0

    def _resume_offset(self, partition: int) -> int:
        # An orphan `.kfs` (killed between the two uploads) lies at the returned offset and is overwritten.
        segments = self.store.list_segments(self.topic, partition).segments
        return segments[-1].last_offset + 1 if segments else 0

    def produce_round(self, now_ms: int, interval_ms: int) -> list[ProducedSegment]:
        """One segment per partition, its orders spread over the `interval_ms` before `now_ms`."""
        produced = []
        for partition, base_offset in sorted(self.next_offsets.items()):
            count = STORE_CHANGES_PER_SEGMENT if self.store_changes else self.records_per_segment
            spacing_ms = max(1, interval_ms // count)
            if self.store_changes:
                records = store_status_changes(self.stores, partition, self.partitions, base_offset, count,
                                               seed=self.seed, now_ms=now_ms, spacing_ms=spacing_ms,
                                               resumed=self.resumed[partition])
            else:
                records = pizza_orders(base_offset, count, seed=self.seed, partition=partition,
                                   start_ms=now_ms - (base_offset + count - 1) * spacing_ms, interval_ms=spacing_ms)
            if self.avro_schema_id is not None:  # (not with store_changes: run_demo_producer never asks for both)
                records = [pizza_order_as_avro(r, self.avro_schema_id, self._avro_schema) for r in records]
            elif self.lfs:
                records = [self._as_lfs_envelope(partition, base_offset + i, record) if (base_offset + i) % LFS_EVERY
                           == 0 else record for i, record in enumerate(records)]
            shift = self.segments_written % len(ALL_CODECS)
            codecs = ALL_CODECS[shift:] + ALL_CODECS[:shift]
            segment = encode_segment(records, base_offset=base_offset, codec=codecs,
                                     records_per_batch=RECORDS_PER_BATCH, created_ms=now_ms)
            self.publish_watermark(self.topic, partition, segment.last_offset + 1)
            kfs_key, _ = self.store.write_segment(self.topic, partition, base_offset, segment.kfs, segment.index)
            batch_count = -(-len(records) // RECORDS_PER_BATCH)
            produced.append(ProducedSegment(partition, base_offset, segment.last_offset, kfs_key,
                                            tuple(codecs[i % len(codecs)] for i in range(batch_count))))
            self.next_offsets[partition] = segment.last_offset + 1
            self.segments_written += 1
        return produced


    def _as_lfs_envelope(self, partition: int, offset: int, record: Record) -> Record:
        """The order with a photo, stored as an LFS blob; the record carries its envelope."""
        if record.value is None:  # pizza_orders always writes a value
            raise TypeError(f"order at offset {offset} of partition {partition} has no value to store as a blob")
        order = json.loads(record.value)
        order["photo"] = base64.b64encode(pizza_photo(offset)).decode()
        blob = json.dumps(order, separators=(",", ":")).encode()
        key = f"lfs/{self.store.namespace or '_'}/{self.topic}/{partition}/{offset:020d}.json"
        if isinstance(self.store, LocalSegmentStore):
            bucket = LOCAL_LFS_BUCKET
            self.store.put(f"{bucket}/{key}", blob)
        else:
            bucket = cast(S3SegmentStore, self.store).bucket
            self.store.put(key, blob)
        envelope = encode_envelope(bucket, key, blob, content_type="application/json", proxy_id="demo-producer")
        return dataclasses.replace(record, value=envelope)


def store_status_changes(stores: dict[int, dict[str, object] | None], partition: int, partitions: int,
                         first_offset: int, count: int, *, seed: int, now_ms: int, spacing_ms: int,
                         resumed: bool = False) -> list[Record]:
    """At least `count` Debezium change records (a delete brings its tombstone along, so a segment may hold one more)
    of the stores living in `partition` (`store_id % partitions`), from `first_offset` on; `stores` is the source
    table as this producer knows it (None: deleted), updated here. A store not in it is created (`c`), or read
    (`r`, as Debezium's snapshot after a restart does) when the producer `resumed` an existing log and has not seen
    the store since; an existing one is updated (`u`) or deleted (`d`, then a tombstone). Deterministic for
    (`seed`, `partition`, `first_offset`) and `stores`."""
    ids = [store for store in range(1, STORES + 1) if store % partitions == partition]
    if not ids:
        return []
    rng = random.Random(f"{seed}:{partition}:{first_offset}")  # noqa: S311 - demo data, not security
    records: list[Record] = []
    while len(records) < count:
        store = rng.choice(ids)
        timestamp_ms = now_ms - (count - len(records)) * spacing_ms
        before = stores.get(store)
        key = json.dumps({"store_id": store}).encode()
        source = {"version": "2.7.3.Final", "connector": "postgresql", "name": "demo", "ts_ms": timestamp_ms,
                  "db": "shop", "schema": "public", "table": "stores", "lsn": (first_offset + len(records)) * 64}
        if before is not None and rng.random() < STORE_DELETE_SHARE:
            stores[store] = None
            event = {"before": {"store_id": store}, "after": None, "source": source, "op": "d", "ts_ms": timestamp_ms}
            records.append(Record(key=key, value=json.dumps(event).encode(), timestamp_ms=timestamp_ms))
            records.append(Record(key=key, value=None, timestamp_ms=timestamp_ms))  # tombstones.on.delete
            continue
        after: dict[str, object] = {
            "store_id": store, "city": STORE_CITIES[store % len(STORE_CITIES)], "status": rng.choice(STORE_STATUSES),
            "seats": 10 * rng.randrange(2, 9), "updated_at": timestamp_ms * 1000}  # MicroTimestamp
        op = "u" if before is not None else "r" if resumed and store not in stores else "c"
        stores[store] = after
        # REPLICA IDENTITY DEFAULT: an update's `before` is null
        event = {"before": None, "after": after, "source": source, "op": op, "ts_ms": timestamp_ms}
        records.append(Record(key=key, value=json.dumps(event).encode(), timestamp_ms=timestamp_ms))
    return records


def pizza_photo(seed: int, size: int = 24) -> bytes:
    """A tiny PNG of a pizza (RGB, `size` x `size`): a crust-coloured disc with a few salami dots."""
    centre, radius = (size - 1) / 2, size / 2 - 1
    dots = {((seed * 7 + i * 5) % (size - 8) + 4, (seed * 3 + i * 11) % (size - 8) + 4) for i in range(4)}
    rows = []
    for y in range(size):
        row = bytearray(b"\x00")  # filter type none
        for x in range(size):
            inside = (x - centre) ** 2 + (y - centre) ** 2 <= radius ** 2
            near_dot = any(abs(x - dx) + abs(y - dy) <= 1 for dx, dy in dots)
            row += bytes((180, 30, 30) if inside and near_dot else (235, 190, 90) if inside else (255, 255, 255))
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows))) \
        + chunk(b"IEND", b"")


def watermark_publisher(config: LakehouseConfig, etcd: EtcdClient | None = None) -> WatermarkPublisher:
    """Publishes broker watermarks where `OffsetStore.broker_watermarks` reads them for this config (through `etcd`
    when given, else a client of `etcd.*`, for `offsets.backend: etcd`)."""
    if config.offsets.backend == "local":
        # The factory returns a LocalOffsetStore for this backend, the one store with a broker-watermark writer.
        return cast(LocalOffsetStore, offset_store_from_config(config)).record_broker_watermark
    client = etcd or etcd_client_from_config(config)
    return lambda topic, partition, next_offset: client.put(broker_next_offset_key(topic, partition),
                                                            str(next_offset))


def run_demo_producer(config: LakehouseConfig, *, topic: str | None = None, partitions: int = DEFAULT_PARTITIONS,
                      interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
                      records_per_segment: int = DEFAULT_RECORDS_PER_SEGMENT, rounds: int | None = None,
                      keep_going: Callable[[], bool] = lambda: True, lfs: bool = False, avro: bool = False,
                      cdc: bool = False) -> int:
    """Produce a round every `interval_seconds` until `rounds` are done or `keep_going()` is false; returns the
    number of segments written. `topic` defaults to the first mapping's topic; `avro`: the mappings with
    `value_format: avro` get the same orders as Avro, their schema registered in the mapping's registry (`make demo`
    serves one for lakehouse.yaml); `cdc`: the mappings with `cdc.format: debezium` get Debezium changes of stores
    (`store_status_changes`)."""
    if topic is None:
        if not config.mappings:
            raise ValueError("mappings: the config maps no topic; give the demo producer a topic")
        topic = config.mappings[0].topic
    if interval_seconds <= 0:
        raise ValueError(f"interval_seconds {interval_seconds} must be positive")
    if config.segments.local_root is not None:
        config.segments.local_root.mkdir(parents=True, exist_ok=True)  # a broker creates its bucket, so do we
    producer = DemoProducer(segment_store_from_config(config), watermark_publisher(config), topic=topic,
                            partitions=partitions, records_per_segment=records_per_segment, lfs=lfs)
    producers = [producer]
    if avro:
        for mapping in config.mappings:
            if mapping.value_format == "avro" and mapping.topic != topic:
                schema_id = _register_demo_schema(mapping)
                producers.append(DemoProducer(segment_store_from_config(config), watermark_publisher(config),
                                              topic=mapping.topic, partitions=partitions,
                                              records_per_segment=records_per_segment, avro_schema_id=schema_id))
                log.info("demo producer: topic %s gets the orders as Avro (schema id %d)", mapping.topic, schema_id)
    if cdc:
        for mapping in config.mappings:
            if mapping.cdc is not None and mapping.cdc.format == "debezium" and mapping.topic != topic:
                producers.append(DemoProducer(segment_store_from_config(config), watermark_publisher(config),
                                              topic=mapping.topic, partitions=partitions, store_changes=True))
                log.info("demo producer: topic %s gets Debezium changes of %d stores", mapping.topic, STORES)
    log.info("demo producer: topic %s, %d partitions, %d orders per segment every %.1fs into %s; resuming at %s%s",
             topic, partitions, records_per_segment, interval_seconds, producer.store.location, producer.next_offsets,
             f"; every {LFS_EVERY}th order with a photo as an LFS blob" if lfs else "")
    interval_ms = int(interval_seconds * 1000)
    done = 0
    while (rounds is None or done < rounds) and keep_going():
        started = time.monotonic()
        now_ms = time.time_ns() // 1_000_000
        for segment in (s for p in producers for s in p.produce_round(now_ms, interval_ms)):
            log.info("wrote %s (offsets %d..%d, codecs %s)", segment.kfs_key, segment.base_offset,
                     segment.last_offset, "/".join(segment.codecs))
        done += 1
        if rounds is None or done < rounds:
            time.sleep(max(0.0, interval_seconds - (time.monotonic() - started)))
    return sum(p.segments_written for p in producers)


def _register_demo_schema(mapping: MappingConfig) -> int:
    """Register PIZZA_AVRO_SCHEMA under the mapping's value subject in the mapping's registry; its schema id. A
    registry that does not answer is a `ValueError` naming its URL (`make demo` serves the test registry at
    lakehouse.yaml's URL: scripts/run-demo.sh)."""
    registry = mapping.schema_registry
    if registry is None:  # parse_config requires it for value_format avro
        raise ValueError(f"mappings[].schema_registry: is required for topic {mapping.topic}")
    client = ConfluentRegistryClient(ConfluentRegistrySettings(registry.url, timeout_seconds=2), max_attempts=1)
    subject = subject_name(mapping.topic, registry.subject_name_strategy, registry.record_name)
    try:
        return client.register(subject, json.dumps(PIZZA_AVRO_SCHEMA))
    except SchemaRegistryUnavailableError as err:
        raise ValueError(f"mappings[].schema_registry.url: no schema registry answers at {redact_url(registry.url)} "
                         f"for topic {mapping.topic} ({err}); start one there (`make demo` serves the test "
                         "registry, scripts/run-demo.sh)") from err
