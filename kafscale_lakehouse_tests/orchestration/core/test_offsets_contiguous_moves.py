"""`offsets_contiguous` after a position moved back on purpose: the move's commit records itself
(`kafscale.moved-back.<topic>`), and the check accepts exactly that move, naming it, while any other move back
still fails."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from kafscale_lakehouse.engine.ingestion.replay import move_position
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest
from kafscale_lakehouse.engine.tables.summary import MOVED_BACK_PROPERTY_PREFIX
from kafscale_lakehouse.orchestration.checks import evaluate_offsets_contiguous
from kafscale_lakehouse_tests.orchestration.core.test_check_logic import TOPIC, append, table  # noqa: F401


@pytest.mark.integration
def test_a_position_moved_back_by_the_offsets_command_keeps_the_check_green_and_named(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 120, records_per_segment=40)
    ingest(world.config(), spark)
    config = world.config()
    with IngestContext.from_config(config, spark) as context:
        moved = move_position(context, config.mappings[0], 0, 70)
    ingest(world.config(), spark)  # lands 70..119 again
    world.assert_exactly_once(runs=3)

    result = evaluate_offsets_contiguous(world.table(), world.topic)

    assert result.passed, result.description
    assert f"snapshot {moved.snapshot_id} moved partition 0 back from 120 to 70" in result.description
    [recorded] = result.metadata["moved_back"].value
    assert recorded["snapshot_id"] == moved.snapshot_id and recorded["run_id"].startswith("position-")
    assert (recorded["partition"], recorded["from"], recorded["to"]) == (0, 120, 70)


def test_a_move_back_its_commit_does_not_record_exactly_still_fails(table):  # noqa: F811
    append(table, 0, range(20), next_offsets={0: 20})
    mislabelled = {MOVED_BACK_PROPERTY_PREFIX + TOPIC: json.dumps({"0": [15, 20]})}  # says 20 -> 15, went to 12
    table.append(table.scan().to_arrow().slice(0, 0), snapshot_properties={
        f"kafscale.offsets.{TOPIC}": json.dumps({"0": 12}), "kafscale.run-id": "r", **mislabelled})
    snapshot_back = table.current_snapshot().snapshot_id

    result = evaluate_offsets_contiguous(table, TOPIC)

    assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR
    assert f"snapshot {snapshot_back} moved partition 0 back from 20 to 12" in result.description
    assert result.metadata["moved_back"].value == []
