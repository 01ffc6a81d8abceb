"""A topic `kafscale-cli restore` (KafScale v1.6.0) made: segments copied into the topic, but no broker `next_offset`
key for its partitions; and a restore that fails deletes the segments it copied, possibly while a run reads them."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.engine.ingestion import run as run_module
from kafscale_lakehouse.engine.ingestion import scan_topic
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.storage import ObjectKind
from kafscale_lakehouse_tests.engine.ingestion.test_orphan_segments import watch_sources


def test_lag_without_a_broker_next_offset_is_measured_against_the_completed_segments(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 150, records_per_segment=50)  # segments 0, 50, 100; no watermark published
    world.write_segments(1, 50, records_per_segment=50)
    config = world.config(max_bytes_per_run=1)  # one segment per partition and run

    with watch_sources(config) as sources:
        scanned = scan_topic(sources, world.topic).partitions
    assert (scanned[0].log_end, scanned[0].lag, scanned[1].lag) == (None, 150, 50)

    [result] = ingest(config, spark)
    assert {p: (o.end_offset, o.lag) for p, o in result.partitions.items()} == {0: (50, 100), 1: (50, 0)}
    with watch_sources(config) as sources:
        assert {p: s.lag for p, s in scan_topic(sources, world.topic).partitions.items()} == {0: 100, 1: 0}


def test_a_segment_deleted_between_plan_and_read_stops_its_partition_and_loses_nothing(embedded_world, spark,
                                                                                       monkeypatch):
    world = embedded_world
    world.write_segments(0, 150, records_per_segment=50)  # segments 0, 50, 100
    world.write_segments(1, 50, records_per_segment=50)
    deleted_key = world.segment_object_key(0, 50)
    kept = {kind: (world.segments_root / world.segment_object_key(0, 50, kind)).read_bytes() for kind in ObjectKind}
    prepare = run_module.prepare_ingest

    def prepare_then_delete(*args, **kwargs):
        prepared = prepare(*args, **kwargs)
        world.delete_segment(0, 50)  # the failed restore's clean-up, after the run planned the segment
        return prepared

    monkeypatch.setattr(run_module, "prepare_ingest", prepare_then_delete)
    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)
    monkeypatch.undo()

    outcomes = failed.value.result.partitions
    assert deleted_key in outcomes[0].error and outcomes[0].end_offset == 50
    assert outcomes[1].error is None and outcomes[1].end_offset == 50
    world.assert_exactly_once(runs=1, expected={0: range(50), 1: range(50)})
    assert world.store_next_offsets() == {0: 50, 1: 50}

    for kind, data in kept.items():  # the restore is run again and copies the segment
        world.put_object(world.segment_object_key(0, 50, kind), data)
    ingest(world.config(), spark)
    world.assert_exactly_once(runs=2, expected={0: range(150), 1: range(50)})
