"""Fixtures for reading segments: segment stores we can observe, pizza segments, read requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from kafscale_lakehouse.apps.workload import ALL_CODECS, PIZZA_TOPIC, pizza_orders
from kafscale_lakehouse.engine.ingestion.segment_reader import (
    SegmentReadError,
    SegmentReadFailure,
    SegmentRunPartition,
    read_input_partition,
    segment_run_partitions,
    source_arrow_schema,
)
from kafscale_lakehouse.format import EncodedSegment, encode_segment
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.schema.validation import CompiledJsonSchema
from kafscale_lakehouse.storage import (
    LocalSegmentStore,
    ObjectKind,
    S3SegmentStore,
    SegmentStore,
    find_gaps,
    segment_key,
    segments_from,
)
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY

TOPIC = PIZZA_TOPIC
# Small batches and a short index interval give segments several index entries, so ranged reads have a choice.
RECORDS_PER_BATCH = 10
INDEX_INTERVAL = 20

PIZZA_COLUMNS = (
    Column(name="order_id", type="string", required=True),
    Column(name="store_id", type="int", required=True),
    Column(name="date_ordered", type="timestamp"),
)


@dataclass(frozen=True)
class ObjectRead:
    key: str
    byte_range: tuple[int, int] | None
    size: int


class RecordingLocalStore(LocalSegmentStore):
    """A real local store that also remembers every object read (key, range, bytes returned)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: list[ObjectRead] = []

    def _get(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        data = super()._get(key, byte_range)
        self.reads.append(ObjectRead(key, byte_range, len(data)))
        return data


def write_pizza_segments(store: SegmentStore, partition: int, segment_sizes: Sequence[int], *, first_offset: int = 0,
                         codecs: Sequence[str] = ALL_CODECS, topic: str = TOPIC) -> list[EncodedSegment]:
    """Contiguous pizza-order segments of `segment_sizes` records from `first_offset`; segment i uses codec i."""
    written = []
    offset = first_offset
    for number, size in enumerate(segment_sizes):
        segment = encode_segment(pizza_orders(offset, size, partition=partition), base_offset=offset,
                                 codec=codecs[number % len(codecs)], records_per_batch=RECORDS_PER_BATCH,
                                 index_interval=INDEX_INTERVAL)
        store.write_segment(topic, partition, offset, segment.kfs, segment.index)
        written.append(segment)
        offset += size
    return written


def corrupt_segment(store: LocalSegmentStore, partition: int, base_offset: int) -> str:
    """Flip one byte inside the first batch's records; returns the `.kfs` key."""
    key = segment_key(store.namespace, TOPIC, partition, base_offset, ObjectKind.SEGMENT)
    path = store.root / key
    data = bytearray(path.read_bytes())
    data[32 + 70] ^= 0xFF
    path.write_bytes(bytes(data))
    return key


def s3_store_at(seaweedfs, namespace: str) -> S3SegmentStore:
    return S3SegmentStore(S3_BUCKET, namespace=namespace, endpoint=seaweedfs.s3_endpoint, region=REGION,
                          path_style=True, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)


@dataclass(frozen=True)
class ReadPlan:
    """`ranges`: the range read per Kafka partition (a partition without a completed segment to read has none)."""

    ranges: dict[int, OffsetRange]
    input_partitions: list[SegmentRunPartition]


@dataclass(frozen=True)
class ReadRequest:
    """What a test reads, planned and read the way the ingestion run does: each partition of `starting` is listed
    from its next offset (None: nothing committed, from the oldest segment) with `segments_from`, optionally cut at
    `ending[partition]` (exclusive; default: the end of the newest completed segment), grouped into input partitions
    with `segment_run_partitions`, and read with `read_input_partition` with the columns (and JSON Schema)."""

    starting: dict[int, int | None]
    ending: dict[int, int] = field(default_factory=dict)
    topic: str = TOPIC
    columns: tuple[Column, ...] = ()
    max_bytes_per_partition: int = 128 * 1024 * 1024
    json_schema: CompiledJsonSchema | None = None

    def plan(self, store: SegmentStore) -> ReadPlan:
        ranges: dict[int, OffsetRange] = {}
        input_partitions: list[SegmentRunPartition] = []
        for partition, start in sorted(self.starting.items()):
            segments = segments_from(store, self.topic, partition, start).segments
            end = self.ending.get(partition)
            if end is not None:
                segments = [segment for segment in segments if segment.base_offset < end]
            if not segments:
                continue
            # A test reads a contiguous range; gap handling is the run's (test_plan_and_read.py's planner tests).
            assert find_gaps(segments, next_offset=start) == [], f"partition {partition}: gap in the test's range"
            offsets = OffsetRange(partition, segments[0].base_offset if start is None else start,
                                  segments[-1].last_offset + 1 if end is None else end)
            assert offsets.end <= segments[-1].last_offset + 1, f"partition {partition}: {offsets} beyond segments"
            ranges[partition] = offsets
            input_partitions.extend(segment_run_partitions(self.topic, offsets, segments,
                                                           self.max_bytes_per_partition))
        return ReadPlan(ranges, input_partitions)

    def read(self, store: SegmentStore) -> tuple[pa.Table, list[SegmentReadFailure]]:
        """The rows of every input partition (each up to a segment it cannot read), and those failures."""
        batches, failures = [], []
        for partition in self.plan(store).input_partitions:
            try:
                batches.extend(read_input_partition(store, partition, self.columns, self.json_schema))
            except SegmentReadError as exc:
                failures.append(exc.failure)
        schema = source_arrow_schema(self.columns, validated=self.json_schema is not None)
        return pa.Table.from_batches(batches, schema=schema), failures

    def read_all(self, store: SegmentStore) -> pa.Table:
        """The rows, when every segment can be read."""
        table, failures = self.read(store)
        assert failures == []
        return table


@pytest.fixture
def local_store(tmp_path, unique_prefix) -> RecordingLocalStore:
    return RecordingLocalStore(tmp_path / "segments", namespace=unique_prefix, create=True)


@pytest.fixture
def s3_store(seaweedfs, unique_prefix) -> S3SegmentStore:
    return s3_store_at(seaweedfs, unique_prefix)
