"""A sensor tick names the orphaned segment object a partition waits behind past
`processor.orphan_segment_grace_seconds` (the broker uploads `.kfs` and `.index` in parallel), in its skip
message and the topic's observation, with and without its listing cursor; the other partitions are still requested."""

from __future__ import annotations

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.engine.ingestion.topic_scan import WatchSources
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.ranges import OffsetRange, parse_ranges
from kafscale_lakehouse.orchestration.sensors import PLANNED_RANGES_TAG
from kafscale_lakehouse.storage import ObjectKind, segment_key
from kafscale_lakehouse_tests.orchestration.sensors.conftest import SensorWorld, embedded_document


def test_a_tick_names_the_orphan_a_partition_waits_behind_past_the_grace(tmp_path, unique_prefix, dagster_instance):
    document = embedded_document(tmp_path, unique_prefix)
    document["processor"]["orphan_segment_grace_seconds"] = 0
    config = parse_config(document, source="<orphan sensor test>", base_dir=tmp_path)
    world = SensorWorld(config, WatchSources.from_config(config), dagster_instance)
    world.producer(partitions=2).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)  # 0..19 of each
    world.commit({0: 19})
    store = world.sources.store
    orphan = segment_key(store.namespace, world.topic, 0, 20, ObjectKind.INDEX)
    store.put(orphan, encode_segment(pizza_orders(20, 20), base_offset=20, codec="zstd").index)  # its .kfs failed

    first = world.tick()
    [request] = first.run_requests  # partition 1 is still requested
    assert parse_ranges(request.tags[PLANNED_RANGES_TAG], where="test") == {1: OffsetRange(1, 0, 20)}
    [observation] = first.asset_events
    errors = observation.metadata["partition_errors"].value
    assert list(errors) == ["0"] and f"stops at {orphan} (no .kfs (orphan .index))" in errors["0"]

    world.commit({1: 19})
    again = world.tick(first.cursor)  # listed from the cursor now
    assert not again.run_requests and orphan in again.skip_message
