"""Sensor ticks with `build_sensor_context` on the embedded world (local segment directory, sqlite offsets)."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.ranges import OffsetRange, parse_ranges
from kafscale_lakehouse.orchestration.naming import ingest_job_name, partitions_def_name, topic_asset_key
from kafscale_lakehouse.orchestration.sensors import (
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PLANNED_RANGES_TAG,
    SensorCursor,
    SensorCursorError,
    build_sensors,
    sensor_name,
)
from kafscale_lakehouse.storage import ObjectKind, segment_key
from kafscale_lakehouse_tests.orchestration.sensors.conftest import POLL_INTERVAL_SECONDS


def requested_range(result) -> tuple[str, str, str]:
    """(first, last partition key, the pending partitions the run's planned ranges cover)."""
    [request] = result.run_requests
    planned = parse_ranges(request.tags[PLANNED_RANGES_TAG], where="test")
    return (request.tags[PARTITION_RANGE_START_TAG], request.tags[PARTITION_RANGE_END_TAG],
            ",".join(str(p) for p in sorted(planned)))


def planned_ranges(result) -> dict[int, OffsetRange]:
    [request] = result.run_requests
    return parse_ranges(request.tags[PLANNED_RANGES_TAG], where="test")


def test_sensors_are_one_per_mapping_on_by_default_at_the_poll_interval(embedded_world):
    [sensor] = build_sensors(embedded_world.config)
    assert sensor.name == sensor_name(embedded_world.mapping.table)
    assert sensor.job_name == ingest_job_name(embedded_world.mapping.table)
    assert sensor.minimum_interval_seconds == POLL_INTERVAL_SECONDS
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_first_tick_registers_partitions_requests_one_run_and_observes_the_topic(embedded_world):
    world = embedded_world
    world.producer(partitions=3, records_per_segment=20).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)

    result = world.tick()

    [add] = result.dynamic_partitions_requests
    assert add.partitions_def_name == partitions_def_name(world.topic)
    assert list(add.partition_keys) == ["0", "1", "2"]
    [request] = result.run_requests
    assert request.job_name == ingest_job_name(world.mapping.table)
    assert requested_range(result) == ("0", "2", "0,1,2")
    assert planned_ranges(result) == {p: OffsetRange(p, 0, 20) for p in range(3)}
    [observation] = result.asset_events
    assert observation.asset_key == topic_asset_key(world.topic)
    assert observation.metadata["lag"].value == 60
    assert observation.metadata["broker_next_offset"].value == {"0": 20, "1": 20, "2": 20}
    assert observation.metadata["completed_segments_end"].value == {"0": 20, "1": 20, "2": 20}
    cursor = world.cursor_of(result)
    assert cursor.partitions[1].last_kfs_key == segment_key(world.config.s3.namespace, world.topic, 1, 0,
                                                            ObjectKind.SEGMENT)
    assert cursor.requested == {0: (0, 20), 1: (0, 20), 2: (0, 20)}


def test_no_run_and_no_observation_when_nothing_moved_and_no_run_once_committed(embedded_world):
    world = embedded_world
    world.producer(partitions=2).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    first = world.tick()
    assert first.run_requests

    again = world.tick(first.cursor)
    assert again.run_requests == [] and again.asset_events == []
    assert "already requested" in again.skip_message

    world.commit({0: 19, 1: 19})
    committed = world.tick(again.cursor)
    assert committed.run_requests == []
    assert "no completed segments beyond the committed offsets" in committed.skip_message
    [observation] = committed.asset_events  # the committed offsets moved
    assert observation.metadata["lag"].value == 0


def test_a_failed_run_is_not_retried_in_a_loop_but_new_segments_request_the_next(embedded_world):
    world = embedded_world
    producer = world.producer(partitions=1)
    producer.produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    first = world.tick()
    assert requested_range(first) == ("0", "0", "0")

    # The run failed without committing anything: same state, no new request.
    assert world.tick(first.cursor).run_requests == []

    producer.produce_round(now_ms=1_700_000_001_000, interval_ms=1000)
    retry = world.tick(first.cursor)
    assert requested_range(retry) == ("0", "0", "0")
    assert world.cursor_of(retry).requested == {0: (0, 40)}


def test_no_run_is_requested_while_a_run_of_the_job_is_active(embedded_world):
    world = embedded_world
    world.producer(partitions=1).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    job_name = ingest_job_name(world.mapping.table)
    world.instance.add_run(dg.DagsterRun(job_name=job_name, run_id=str(uuid.uuid4()),
                                         status=dg.DagsterRunStatus.STARTED))

    busy = world.tick()
    assert busy.run_requests == []
    assert "is started" in busy.skip_message
    assert world.cursor_of(busy).requested == {}  # requested once the run is over

    [run] = world.instance.get_runs(dg.RunsFilter(job_name=job_name))
    world.instance.report_run_failed(run)
    assert requested_range(world.tick(busy.cursor)) == ("0", "0", "0")


def test_new_partitions_are_added_and_the_run_spans_only_pending_partitions(embedded_world):
    world = embedded_world
    world.producer(partitions=3).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    first = world.tick()
    world.commit({0: 19, 1: 19, 2: 19})
    settled = world.tick(first.cursor)
    assert settled.run_requests == []

    # Partitions 0 and 2 get segments, partition 3 appears; partition 1 stays committed.
    world.producer(partitions=4).produce_round(now_ms=1_700_000_001_000, interval_ms=1000)
    world.commit({1: 39})
    grown = world.tick(settled.cursor)

    [add] = grown.dynamic_partitions_requests
    assert list(add.partition_keys) == ["3"]
    assert world.registered_partitions() == ["0", "1", "2", "3"]
    # One run: the key range in insertion order from the first to the last pending partition.
    assert requested_range(grown) == ("0", "3", "0,2,3")
    assert planned_ranges(grown) == {0: OffsetRange(0, 20, 40), 2: OffsetRange(2, 20, 40), 3: OffsetRange(3, 0, 20)}
    assert world.cursor_of(grown).requested == {0: (20, 40), 2: (20, 40), 3: (0, 20)}


def test_a_kfs_without_its_index_is_not_pending_until_the_index_lands(embedded_world):
    world = embedded_world
    world.producer(partitions=1).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    world.commit({0: 19})
    store = world.sources.store
    segment = encode_segment(pizza_orders(20, 20), base_offset=20, codec="zstd")
    kfs_key = segment_key(store.namespace, world.topic, 0, 20, ObjectKind.SEGMENT)
    store.put(kfs_key, segment.kfs)

    uploading = world.tick()
    assert uploading.run_requests == []
    assert world.cursor_of(uploading).partitions[0].last_kfs_key is not None
    assert world.cursor_of(uploading).partitions[0].last_kfs_key < kfs_key  # the cursor waits before the orphan

    store.put(segment_key(store.namespace, world.topic, 0, 20, ObjectKind.INDEX), segment.index)
    landed = world.tick(uploading.cursor)
    assert requested_range(landed) == ("0", "0", "0")
    assert world.cursor_of(landed).partitions[0].last_kfs_key == kfs_key


def test_tick_cost_follows_new_segments_not_the_backlog(embedded_world):
    world = embedded_world
    producer = world.producer(partitions=1, records_per_segment=5)
    for round_number in range(200):
        producer.produce_round(now_ms=1_700_000_000_000 + round_number, interval_ms=1000)
    world.commit({0: 999})
    store = world.sources.store

    before = store.request_counts
    first = world.tick()
    # One listing for discovery, one for the partition (after the committed offset) that finds nothing new; on this
    # first sight of the partition, its keys (no footers) and the footer of the newest segment show that no segment
    # holds the committed offset mid-way.
    assert store.request_counts - before == {"list": 4, "get": 1}
    assert first.run_requests == []

    for round_number in range(3):
        producer.produce_round(now_ms=1_700_000_001_000 + round_number, interval_ms=1000)
    before = store.request_counts
    second = world.tick(first.cursor)
    assert store.request_counts - before == {"list": 2, "get": 1}  # the newest new segment's footer only
    assert world.cursor_of(second).partitions[0].segments_end == 1015

    before = store.request_counts
    world.tick(second.cursor)
    assert store.request_counts - before == {"list": 2}


def test_a_committed_offset_inside_the_newest_segment_is_pending(embedded_world):
    # Offsets committed mid-way into a segment (the Go processor commits per record batch): the rest of the segment
    # is pending. The sensor used to list only after the committed offset's key and missed the segment holding it.
    world = embedded_world
    world.producer(partitions=1, records_per_segment=20).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    world.commit({0: 9})

    result = world.tick()

    assert requested_range(result) == ("0", "0", "0")
    assert planned_ranges(result) == {0: OffsetRange(0, 10, 20)}
    assert world.cursor_of(result).partitions[0].segments_end == 20
    [observation] = result.asset_events
    assert observation.metadata["committed_next_offset"].value == {"0": 10}


def test_a_committed_offset_beyond_the_segments_is_reported_and_the_other_partitions_go_on(embedded_world):
    # Partition 0's offsets were committed up to 49, but its segments end at 19 (topic recreated, segments re-cut).
    world = embedded_world
    world.producer(partitions=2, records_per_segment=20).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    world.commit({0: 49})

    result = world.tick()

    assert planned_ranges(result) == {1: OffsetRange(1, 0, 20)}
    [observation] = result.asset_events
    [error] = observation.metadata["partition_errors"].value.values()
    assert "partition 0: the committed next offset 50 lies beyond the newest completed segment" in error
    assert 0 not in world.cursor_of(result).partitions  # listed from the committed offset again next tick

    world.commit({1: 19})
    skipped = world.tick(result.cursor)
    assert not skipped.run_requests and "next offset 50 lies beyond" in skipped.skip_message


def test_an_unreadable_cursor_names_the_sensor(embedded_world):
    with pytest.raises(SensorCursorError, match=r"sensor kafscale_x_sensor: cursor '\{\"version\":9\}'"):
        SensorCursor.from_json('{"version":9}', "kafscale_x_sensor")
    with pytest.raises(SensorCursorError, match="reset the cursor"):
        embedded_world.tick("not json")


def test_a_topic_without_partitions_skips_with_the_store_it_looked_in(embedded_world):
    result = embedded_world.tick()
    assert result.run_requests == [] and result.dynamic_partitions_requests == []
    assert f"no partitions of topic {embedded_world.topic!r} in local directory" in result.skip_message
