"""The LFS hook of a task's read (`segment_reader.read_input_partition`, no Spark needed): a failing record stops
the partition out of band like a failing segment, naming record and blob; the `lfs_*` columns must end the columns."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.config import LfsConfig
from kafscale_lakehouse.engine.ingestion.lfs import LFS_ERROR_TYPE, LfsReadSettings
from kafscale_lakehouse.engine.ingestion.segment_reader import (
    SegmentReadError,
    read_input_partition,
    segment_run_partitions,
)
from kafscale_lakehouse.engine.tables.summary import LfsStats
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.format.lfs import encode_envelope
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema.columns import LFS_METADATA_COLUMNS, Column
from kafscale_lakehouse.storage import LocalSegmentStore, segments_from

TOPIC = "photos"


def store_with_missing_blob(tmp_path) -> LocalSegmentStore:
    store = LocalSegmentStore(tmp_path, create=True)
    records = pizza_orders(0, 5)
    records[3] = dataclasses.replace(records[3], value=encode_envelope("blobs", "gone.png", b"png"))
    segment = encode_segment(records, base_offset=0, codec="none", records_per_batch=5)
    store.write_segment(TOPIC, 0, 0, segment.kfs, segment.index)
    return store


def whole_partition(store: LocalSegmentStore) -> list:
    """The Spark task that reads every completed segment of partition 0, as the run plans it."""
    segments = segments_from(store, TOPIC, 0, None).segments
    return segment_run_partitions(TOPIC, OffsetRange(0, 0, segments[-1].last_offset + 1), segments, 1 << 30)


def test_a_failing_record_stops_the_partition_out_of_band_naming_record_and_blob(tmp_path):
    store = store_with_missing_blob(tmp_path)
    [partition] = whole_partition(store)
    settings = LfsReadSettings(LfsConfig(mode="resolve"))
    stats = LfsStats()
    delivered = []
    with pytest.raises(SegmentReadError) as raised:
        for batch in read_input_partition(store, partition, (), None, settings, stats):
            delivered.extend(batch.column("offset").to_pylist())
    failure = raised.value.failure
    assert delivered == [0, 1, 2]  # the records before the failing one, none after it
    assert (failure.error_type, failure.key, failure.next_offset) == (LFS_ERROR_TYPE, "s3://blobs/gone.png", 3)
    assert "record photos:0:3 (LFS blob s3://blobs/gone.png: blob not found" in failure.message
    assert stats.errors == {"resolve": 1}
    # Spark ships it back pickled, with its failure.
    assert pickle.loads(pickle.dumps(raised.value)).failure == failure


def test_the_settings_travel_pickled_and_metadata_columns_must_end_the_columns(tmp_path):
    settings = LfsReadSettings(LfsConfig(mode="hybrid", max_inline_size=10, store_metadata=True,
                                         validate_checksum=False, resolve_concurrency=2), "dead_letter")
    assert pickle.loads(pickle.dumps(settings)) == settings
    store = store_with_missing_blob(tmp_path)
    [partition] = whole_partition(store)
    with pytest.raises(ValueError, match="must end with the lfs_"):
        next(read_input_partition(store, partition, (Column(name="order_id", type="string"),), None, settings))
    batches = list(read_input_partition(store, partition, LFS_METADATA_COLUMNS, None, settings))
    [invalid] = [r for b in batches for r in b.to_pylist() if r["_kafscale_invalid_reason"] is not None]
    assert invalid["offset"] == 3 and "s3://blobs/gone.png" in invalid["_kafscale_invalid_reason"]
