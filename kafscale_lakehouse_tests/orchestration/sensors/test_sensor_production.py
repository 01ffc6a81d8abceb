"""The sensor against the real servers: segments in the SeaweedFS bucket, offsets and broker watermarks in etcd."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.orchestration.naming import topic_asset_key
from kafscale_lakehouse.orchestration.sensors import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG

pytestmark = pytest.mark.integration


def test_sensor_on_s3_and_etcd_lists_only_new_objects_and_reports_etcd_watermarks(production_world):
    world = production_world
    store = world.sources.store
    producer = world.producer(partitions=1, records_per_segment=5)
    for round_number in range(60):
        producer.produce_round(now_ms=1_700_000_000_000 + round_number, interval_ms=1000)
    world.commit({0: 299})

    before = store.request_counts
    first = world.tick()
    # ListObjectsV2 for the partition directories and one for partition 0 after the committed offset, which finds
    # nothing; on this first sight of the partition, one listing of its keys and one of the newest segment with its
    # footer (GET) show that no segment holds the committed offset mid-way.
    assert store.request_counts - before == {"list": 4, "get": 1}
    assert first.run_requests == []
    assert "no completed segments beyond the committed offsets" in first.skip_message
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [["0"]]

    # The broker accepted records of partition 1 (watermark in etcd) before any segment of it landed, and two
    # segments of partition 0 landed.
    world.sources.etcd.put(f"/kafscale/topics/{world.topic}/partitions/1/next_offset", b"7")
    producer.produce_round(now_ms=1_700_000_001_000, interval_ms=1000)
    producer.produce_round(now_ms=1_700_000_001_001, interval_ms=1000)
    before = store.request_counts
    second = world.tick(first.cursor)
    assert store.request_counts - before == {"list": 3, "get": 1}  # discovery, partitions 0 and 1; the newest footer

    [request] = second.run_requests
    assert (request.tags[PARTITION_RANGE_START_TAG], request.tags[PARTITION_RANGE_END_TAG]) == ("0", "0")
    assert [list(r.partition_keys) for r in second.dynamic_partitions_requests] == [["1"]]
    [observation] = second.asset_events
    assert observation.asset_key == topic_asset_key(world.topic)
    assert observation.metadata["broker_next_offset"].value == {"0": 310, "1": 7}
    assert observation.metadata["committed_next_offset"].value == {"0": 300, "1": None}  # nothing committed
    assert observation.metadata["lag_by_partition"].value == {"0": 10, "1": 7}
    assert observation.metadata["pending_partitions"].value == [0]
