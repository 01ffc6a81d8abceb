"""Input the run cannot take as is: a corrupt segment, a gap (deleted segment), invalid records. Nothing is skipped
silently: what is complete is committed, the rest fails naming the object, offsets or record."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.engine.ingestion import run as run_module
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.storage import ObjectKind


def test_corrupt_segment_stops_its_partition_until_replaced(production_world, cli_main, caplog):
    world = production_world
    world.write_segments(0, 160, records_per_segment=40, codecs=("none",))  # segments 0, 40, 80, 120
    world.write_segments(1, 80, records_per_segment=40)
    corrupt_key = world.corrupt_segment(0, 40)
    # A small input-partition budget makes every segment a Spark task of its own, so the segments after the corrupt
    # one are read and written too and their files must be thrown away.
    config_path = world.write_config_file(target_file_size_bytes=8_000)

    with caplog.at_level(logging.ERROR, logger="kafscale_lakehouse.apps.cli"):
        assert cli_main("ingest", "--config", str(config_path), "--once") == 1
    [error] = [r.getMessage() for r in caplog.records if r.name == "kafscale_lakehouse.apps.cli"]
    assert f"partition 0: segment {corrupt_key} could not be read" in error
    table = world.assert_exactly_once(runs=1, expected={0: range(40), 1: range(80)})
    assert world.table_data_files() == world.referenced_data_files(table), "files past the corrupt segment deleted"

    world.restore_segment(0, 40)
    assert cli_main("ingest", "--config", str(config_path), "--once") == 0
    world.assert_exactly_once(runs=2)


def test_gap_fails_loudly_unless_allowed_then_is_skipped_and_recorded(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 160, records_per_segment=40)  # segments 0, 40, 80, 120
    world.write_segments(1, 80, records_per_segment=40)
    deleted = world.delete_segment(0, 40)  # retention removed offsets 40..79 before they were ingested

    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)
    error = failed.value.result.partitions[0].error
    assert "offsets 40..79 are missing" in error and world.segment_object_key(0, 80) in error
    world.assert_exactly_once(runs=1, expected={0: range(40), 1: range(80)})  # up to the gap, and partition 1

    with pytest.raises(IngestFailedError, match=r"offsets 40\.\.79 are missing"):
        ingest(world.config(), spark)
    world.assert_exactly_once(runs=1, expected={0: range(40), 1: range(80)})

    [result] = ingest(world.config(allow_gaps=True), spark)
    assert result.partitions[0].skipped == OffsetRange(0, deleted.start, deleted.stop)
    table = world.assert_exactly_once(runs=2)  # every offset that still exists; the next offset is past the gap
    assert world.skipped_ranges(table) == [{"0": [40, 80]}]


def test_committed_offsets_beyond_the_segments_stop_the_partition_naming_it(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 80, records_per_segment=40)  # segments 0, 40
    world.write_segments(1, 40, records_per_segment=40)
    ingest(world.config(), spark)
    world.assert_exactly_once(runs=1)
    # The topic's partition 0 is recreated: its log starts over and now ends at offset 39, below the committed 80.
    world.delete_segment(0, 40)
    world.delete_segment(0, 0)
    world.write_segments(0, 40, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40, base_offset=40)

    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)
    error = failed.value.result.partitions[0].error
    assert "committed next offset 80 lies beyond the newest completed segment" in error
    assert world.segment_object_key(0, 0) in error
    assert failed.value.result.partitions[1].error is None  # the other partition goes on
    assert read_topic_offsets(world.table(), world.topic) == world.store_next_offsets() == {0: 80, 1: 80}


def test_invalid_records_commit_nothing_and_are_named(embedded_world, spark):
    world = embedded_world
    records = pizza_orders(0, 60)
    for offset in (17, 42):  # the required mapped column order_id is missing from these values
        value = json.loads(records[offset].value)
        del value["order_id"]
        records[offset] = dataclasses.replace(records[offset], value=json.dumps(value).encode())
    world.write_records(0, 0, records)
    world.write_segments(1, 40, records_per_segment=40)

    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)

    result = failed.value.result
    assert result.invalid_count == 2
    assert {s.record_id for s in result.invalid_samples} == {f"{world.topic}:0:17", f"{world.topic}:0:42"}
    assert f"{world.topic}:0:17 (order_id:" in str(failed.value)
    assert result.snapshot_id is None and world.our_snapshots() == []
    assert world.store_next_offsets() == {}
    assert world.table_data_files() == set(), "the files written for the batch were deleted"


def test_segment_replaced_between_planning_and_reading_stops_its_partition_and_loses_nothing(
        embedded_world, spark, monkeypatch):
    """A segment re-cut after planning (offsets 100..199 → 100..149) is not read as the planned one:
    the partition commits below it, the error names the object, and a later run lands every offset once."""
    world = embedded_world
    world.write_segments(0, 200, records_per_segment=100)  # segments 0, 100
    world.write_segments(1, 80, records_per_segment=40)
    recut_key, recut_index_key = world.segment_object_key(0, 100), world.segment_object_key(0, 100, ObjectKind.INDEX)
    original = world.segments[0][100]
    original_kfs, original_index = original.kfs_path.read_bytes(), original.index_path.read_bytes()  # embedded: the
    # world's files are the store's objects, so keep the bytes before they are overwritten
    recut = encode_segment(pizza_orders(100, 50, partition=0), base_offset=100, codec="zstd", records_per_batch=10)
    prepare = run_module.prepare_ingest

    def prepare_then_recut(*args, **kwargs):
        prepared = prepare(*args, **kwargs)
        world.put_object(recut_key, recut.kfs)
        world.put_object(recut_index_key, recut.index)
        return prepared

    monkeypatch.setattr(run_module, "prepare_ingest", prepare_then_recut)
    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)
    monkeypatch.undo()

    error = failed.value.result.partitions[0].error
    assert f"segment {recut_key} could not be read" in error and "planned offsets 100..199" in error
    assert "found offsets 100..149" in error
    assert failed.value.result.partitions[1].error is None
    world.assert_exactly_once(runs=1, expected={0: range(100), 1: range(80)})

    world.put_object(recut_key, original_kfs)  # the original segment is back
    world.put_object(recut_index_key, original_index)
    ingest(world.config(), spark)
    world.assert_exactly_once(runs=2, expected={0: range(200), 1: range(80)})


def test_overlapping_or_duplicate_segments_stop_only_their_own_partition(embedded_world, spark):
    # A SegmentOverlapError or DuplicateSegmentError used to fail every partition of the run.
    world = embedded_world
    world.write_segments(0, 80, records_per_segment=40)  # segments 0, 40
    overlapping = world.write_records(0, 30, pizza_orders(30, 40))  # offsets 30..69: overlaps segment 0
    world.write_segments(1, 80, records_per_segment=40)
    padded = world.segment_object_key(1, 40)
    unpadded = padded.replace(f"segment-{40:020d}", "segment-40")
    world.put_object(unpadded, world.segments[1][40].kfs_path.read_bytes())  # a second key for base offset 40
    world.write_segments(2, 80, records_per_segment=40)

    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)

    outcomes = failed.value.result.partitions
    assert world.segment_object_key(0, 30) in outcomes[0].error and world.segment_object_key(0, 0) in outcomes[0].error
    assert overlapping.base_offset == 30
    assert padded in outcomes[1].error and unpadded in outcomes[1].error
    assert outcomes[2].error is None  # the run's other partitions go on
    world.assert_exactly_once(runs=1, expected={2: range(80)})
