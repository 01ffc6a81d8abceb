"""The `kafscale` source's `lfs` option: it round-trips through Spark's string options, and read with
onSegmentError=fail a failing record raises an error naming it and its blob (no Spark needed)."""

from __future__ import annotations

import dataclasses

import pytest

from kafscale_lakehouse.config import ColumnConfig, LfsConfig
from kafscale_lakehouse.engine.kafscale_source import (
    KafscaleOptionError,
    KafscaleReadOptions,
    LfsResolutionError,
    StoreOptions,
    plan_read,
    read_input_partition,
)
from kafscale_lakehouse.engine.lfs_resolution import LfsReadSettings
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.format.lfs import encode_envelope
from kafscale_lakehouse.schema.columns import LFS_METADATA_COLUMNS
from kafscale_lakehouse.storage import LocalSegmentStore
from kafscale_lakehouse.workload import pizza_orders

TOPIC = "photos"


def options(store: LocalSegmentStore, lfs: LfsReadSettings, columns=LFS_METADATA_COLUMNS) -> KafscaleReadOptions:
    return KafscaleReadOptions(store=StoreOptions(kind="local", namespace=store.namespace, local_root=str(store.root)),
                               topic=TOPIC, ending_offsets={0: -1}, columns=tuple(columns), lfs=lfs)


def test_the_option_round_trips_and_metadata_columns_must_end_the_columns(tmp_path):
    store = LocalSegmentStore(tmp_path, create=True)
    settings = LfsReadSettings(LfsConfig(mode="hybrid", max_inline_size=10, store_metadata=True,
                                         validate_checksum=False, resolve_concurrency=2), "dead_letter")
    read = options(store, settings)
    assert KafscaleReadOptions.from_options(read.to_options()).lfs == settings
    with pytest.raises(KafscaleOptionError, match="must end with the lfs_"):
        options(store, settings, columns=[ColumnConfig(name="order_id", type="string")])
    with pytest.raises(KafscaleOptionError, match="option lfs is invalid"):
        KafscaleReadOptions.from_options({**read.to_options(), "lfs": '{"mode": "sideways"}'})


def test_with_on_segment_error_fail_a_failing_record_raises_naming_record_and_blob(tmp_path):
    store = LocalSegmentStore(tmp_path, create=True)
    records = pizza_orders(0, 5)
    records[3] = dataclasses.replace(records[3], value=encode_envelope("blobs", "gone.png", b"png"))
    segment = encode_segment(records, base_offset=0, codec="none", records_per_batch=5)
    store.write_segment(TOPIC, 0, 0, segment.kfs, segment.index)
    read = options(store, LfsReadSettings(LfsConfig(mode="resolve")), columns=())

    [partition] = plan_read(store, read).input_partitions
    with pytest.raises(LfsResolutionError, match=r"record photos:0:3 \(LFS blob s3://blobs/gone.png: blob not found"):
        list(read_input_partition(store, partition, read.columns, read.on_segment_error, read.json_schema, read.lfs))
