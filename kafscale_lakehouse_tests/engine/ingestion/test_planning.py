"""Phase one of a run (`prepare_ingest`: leases, offsets, the planned ranges) on the embedded world; no Spark job."""

from __future__ import annotations

import logging

from kafscale_lakehouse.engine.ingestion.run import IngestContext, prepare_ingest
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse_tests.support.leases import held_leases


def test_the_run_rechecks_the_sensor_plan_against_the_committed_offsets_and_reads_a_segment_held_mid_way(
        embedded_world, caplog):
    world = embedded_world
    world.write_segments(0, 40, records_per_segment=20)  # offsets 0..19, 20..39
    config = world.config()
    mapping = config.mappings[0]
    context = IngestContext.from_config(config, spark=None)  # phase one starts no Spark job
    try:
        # The Go processor committed up to offset 24 (mid-way into the newest segment); the table has no commit.
        with held_leases(context.offsets, world.topic, [0], "go-processor") as leases:
            context.offsets.commit_offsets(leases.values(), {0: (25, 0)})

        with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.engine.ingestion.planning"):
            prepared = prepare_ingest(context, mapping, partitions=[0], planned={0: OffsetRange(0, 20, 40)})
        try:
            plan = prepared.plans[0]
            assert (plan.commit_start, plan.read) == (25, OffsetRange(0, 25, 40))  # the store's offset, not the plan's
            assert [s.base_offset for s in plan.segments] == [20]
            assert "planned from next offset 20, but the committed offsets say 25" in caplog.text
        finally:
            prepared.release_leases()
        assert all(lease.released for lease in prepared.leases.values())

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.engine.ingestion.planning"):
            prepare_ingest(context, mapping, partitions=[0], planned={0: OffsetRange(0, 25, 40)}).release_leases()
        assert "planned from next offset" not in caplog.text
    finally:
        context.close()
