"""The sensor, the topic observation and the freshness check take the table's offsets, not the offsets store's:
after an operator rolls the table back, the rolled-back offsets are pending again."""

from __future__ import annotations

import dagster as dg
import pytest
from pyiceberg.table import Table

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.checks import FRESHNESS
from kafscale_lakehouse.offsets.ranges import OffsetRange, parse_ranges
from kafscale_lakehouse.orchestration.checks import build_table_checks
from kafscale_lakehouse.orchestration.naming import ingest_job_name
from kafscale_lakehouse.orchestration.resources import lakehouse_resources
from kafscale_lakehouse.orchestration.sensors import PLANNED_RANGES_TAG
from kafscale_lakehouse_tests.engine.tables.helpers import lakehouse_schema, write_batch
from kafscale_lakehouse_tests.orchestration.sensors.conftest import SensorWorld

RECORDS_PER_SEGMENT = 20
MAX_LAG_RECORDS = 10


def landed_table(world: SensorWorld) -> Table:
    """The mapping's table holding two commits of ours, offsets [0, 20) then [20, 40) of partition 0 (one segment
    each), and the offsets store saying 40 as an ingest run leaves it."""
    table = open_table(load_catalog(catalog_settings(world.config)), world.mapping.table, schema=lakehouse_schema(),
                       create_if_missing=True)
    for start in (0, RECORDS_PER_SEGMENT):
        end = start + RECORDS_PER_SEGMENT
        run_id = f"run-{start}"
        commit_append(table, write_batch(table, world.topic, {0: (start, end)}, run_id, tasks=1), world.topic,
                      {0: start}, {0: end}, run_id)
    world.commit({0: 2 * RECORDS_PER_SEGMENT - 1})
    return table


def freshness(world: SensorWorld, max_lag_records: int = MAX_LAG_RECORDS):
    """The mapping's freshness check as Dagster runs it, with the deployment's resources."""
    mapping = world.mapping.model_copy(update={"freshness_max_lag_records": max_lag_records})
    check = next(c for c in build_table_checks(world.config, mapping) if c.check_key.name == FRESHNESS)
    resources = lakehouse_resources(world.config)
    return check(**{key: value for key, value in resources.items() if key in check.required_resource_keys})


@pytest.mark.parametrize("world_fixture", ["embedded_world", "production_world"])
def test_a_table_rolled_back_one_snapshot_requests_the_run_and_fails_freshness(world_fixture, request):
    world: SensorWorld = request.getfixturevalue(world_fixture)
    producer = world.producer(partitions=1, records_per_segment=RECORDS_PER_SEGMENT)
    producer.produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    producer.produce_round(now_ms=1_700_000_001_000, interval_ms=1000)
    table = landed_table(world)
    settled = world.tick()
    assert settled.run_requests == [] and "no completed segments beyond" in settled.skip_message
    assert freshness(world).passed

    # An operator rolls the table back to its first commit: offsets [20, 40) are no longer in it.
    first_snapshot = table.current_snapshot().parent_snapshot_id
    table.manage_snapshots().rollback_to_snapshot(first_snapshot).commit()

    rolled_back = world.tick(settled.cursor)

    [request] = rolled_back.run_requests
    assert parse_ranges(request.tags[PLANNED_RANGES_TAG], where="test") == {0: OffsetRange(0, 20, 40)}
    [observation] = rolled_back.asset_events
    assert observation.metadata["committed_next_offset"].value == {"0": 20}
    assert observation.metadata["offsets_disagree"].value == {"0": {"store": 40, "table": 20}}
    assert observation.metadata["lag"].value == 20
    check = freshness(world)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "the table lacks offsets the offsets store says landed (partition 0: table next offset 20, store 40)" \
        in check.description
    assert check.metadata["offsets_disagree"].value == {"0": {"store": 40, "table": 20}}
    assert check.metadata["max_lag"].value == 20
    # Whatever the lag threshold: rows the store says landed are missing.
    assert not freshness(world, max_lag_records=10_000).passed


def test_the_table_ahead_of_a_stale_store_requests_no_run(embedded_world):
    # The commit landed but the store update was lost (the run died in between): nothing is pending.
    world = embedded_world
    world.producer(partitions=1, records_per_segment=RECORDS_PER_SEGMENT).produce_round(
        now_ms=1_700_000_000_000, interval_ms=1000)
    table = open_table(load_catalog(catalog_settings(world.config)), world.mapping.table, schema=lakehouse_schema(),
                       create_if_missing=True)
    commit_append(table, write_batch(table, world.topic, {0: (0, 20)}, "run-0", tasks=1), world.topic, {0: 0},
                  {0: 20}, "run-0")

    result = world.tick()

    assert result.run_requests == [] and "no completed segments beyond" in result.skip_message
    [observation] = result.asset_events
    assert observation.metadata["offsets_disagree"].value == {"0": {"store": None, "table": 20}}


def test_the_run_the_sensor_requests_after_a_rollback_lands_the_rows_again_and_repairs_the_store(embedded_world,
                                                                                                 spark):
    world = embedded_world
    producer = world.producer(partitions=1, records_per_segment=RECORDS_PER_SEGMENT)
    job = build_definitions(world.config).resolve_job_def(ingest_job_name(world.mapping.table))
    cursor = None
    for round_number in range(2):  # two runs, one segment each: two snapshots
        producer.produce_round(now_ms=1_700_000_000_000 + 1000 * round_number, interval_ms=1000)
        tick = world.tick(cursor)
        [request] = tick.run_requests
        assert job.execute_in_process(instance=world.instance, tags=request.tags).success
        cursor = tick.cursor
    table = load_catalog(catalog_settings(world.config)).load_table(world.mapping.table)
    table.manage_snapshots().rollback_to_snapshot(table.current_snapshot().parent_snapshot_id).commit()

    # No tick saw the second run's progress: the pending state is the one that run was requested for, and it
    # succeeded; having committed, it is requested again.
    rolled_back = world.tick(cursor)
    [request] = rolled_back.run_requests
    assert parse_ranges(request.tags[PLANNED_RANGES_TAG], where="test") == {0: OffsetRange(0, 20, 40)}
    assert job.execute_in_process(instance=world.instance, tags=request.tags).success

    table.refresh()
    offsets = sorted(row["offset"] for row in table.scan(selected_fields=("offset",)).to_arrow().to_pylist())
    assert offsets == list(range(40)), "every offset once: the rolled-back rows landed again"
    assert {p: c.next_offset for p, c in world.sources.offsets.committed_offsets(world.topic).items()} == {0: 40}
    settled = world.tick(rolled_back.cursor)
    assert settled.run_requests == [] and "offsets_disagree" not in settled.asset_events[0].metadata
