"""The namespace watch keeps up to `processor.max_batch_runs` `land_tables` runs in flight over disjoint tables, on the
real servers (SeaweedFS S3 + Iceberg REST, etcd, a Dagster instance; Spark where a run lands): a tick requests a run
per free slot, the longest waiting tables first, never a table with a run in flight, and a table that just landed
does not go before one waiting longer (issue 22: batches that overlap)."""

from __future__ import annotations

import dagster as dg

from kafscale_lakehouse.orchestration import namespace_sensor
from kafscale_lakehouse.orchestration.land_tables import BATCH_TABLES_TAG, LAND_TABLES_JOB
from kafscale_lakehouse_tests.orchestration.namespace.conftest import NamespaceWorld
from kafscale_lakehouse_tests.orchestration.namespace.test_namespace_sensor import batch_tables


def batch_in_flight(world: NamespaceWorld, number: int, tags: dict[str, str] | None = None) -> dg.DagsterRun:
    """A `land_tables` run that is running: of the tables `tags` name, or of a table no mapping has."""
    run = dg.DagsterRun(job_name=LAND_TABLES_JOB, run_id=f"{number:036d}",
                        tags=tags or {BATCH_TABLES_TAG: f"elsewhere.t{number}"}, status=dg.DagsterRunStatus.STARTED)
    world.instance.add_run(run)
    return run


def requested_tables(result: dg.SensorResult) -> list[list[str]]:
    return [list(batch_tables(request)) for request in result.run_requests]


def test_a_tick_requests_a_run_per_free_slot_over_disjoint_tables_the_longest_waiting_first(namespace_world,
                                                                                          monkeypatch):
    world = namespace_world
    monkeypatch.setattr(namespace_sensor, "MIN_TABLES_PER_BATCH_RUN", 1)  # three tables: a run each (3 slots)
    orders, payments, refunds = world.topics["orders"], world.topics["payments"], world.topics["refunds"]
    config = world.config(max_batch_runs=3)
    sources = world.sources(config)
    others = [batch_in_flight(world, number) for number in range(3)]

    # Every slot is taken: refunds waits, pending since 1000.
    refunds.write_segments(0, 40, records_per_segment=40)
    first = world.tick(sources, at=1000.0, config=config)
    assert first.run_requests == []
    assert (f"{refunds.table_name}: waiting for a batch run slot: 3 land_tables runs queued or running "
            f"(processor.max_batch_runs 3)") in first.skip_message

    # Two slots free up; orders and payments have segments now too: two runs, one table each, refunds (waiting
    # longest) first, then orders; payments waits for the next slot.
    for run in others[:2]:
        world.instance.report_run_failed(run)
    orders.write_segments(0, 100, records_per_segment=50)
    payments.write_segments(0, 60, records_per_segment=30)
    second = world.tick(sources, first.cursor, at=1010.0, config=config)
    assert requested_tables(second) == [[refunds.table_name], [orders.table_name]]
    cursor = world.cursor_of(second)
    assert cursor.tables[payments.table_name].request is None
    assert cursor.pending_since[payments.table_name] == 1010.0

    # Both launched: no slot is free, nothing is requested.
    launched = [batch_in_flight(world, number, dict(request.tags))
                for number, request in enumerate(second.run_requests, start=10)]
    third = world.tick(sources, second.cursor, at=1020.0, config=config)
    assert third.run_requests == []
    assert f"{payments.table_name}: waiting for a batch run slot" in third.skip_message

    # The last of the other runs ends: one slot, for payments; orders and refunds, in flight, have new segments and
    # stay out.
    world.instance.report_run_failed(others[2])
    orders.write_segments(0, 50, records_per_segment=50, base_offset=100)
    refunds.write_segments(0, 40, records_per_segment=40, base_offset=40)
    fourth = world.tick(sources, third.cursor, at=1030.0, config=config)
    assert requested_tables(fourth) == [[payments.table_name]]
    assert all(run.status == dg.DagsterRunStatus.STARTED for run in launched)


def test_a_table_that_just_landed_waits_behind_a_table_waiting_longer_when_a_slot_frees(namespace_world, spark,
                                                                                       monkeypatch):
    world = namespace_world
    monkeypatch.setattr(namespace_sensor, "MIN_TABLES_PER_BATCH_RUN", 1)
    orders, refunds = world.topics["orders"], world.topics["refunds"]
    config = world.config(max_batch_runs=3)  # three mappings over three slots: a run holds one table
    sources = world.sources(config)
    others = [batch_in_flight(world, number) for number in range(3)]

    orders.write_segments(0, 40, records_per_segment=40)
    first = world.tick(sources, at=900.0, config=config)  # orders pending since 900, no slot
    refunds.write_segments(0, 40, records_per_segment=40)
    second = world.tick(sources, first.cursor, at=950.0, config=config)  # refunds since 950, no slot
    assert first.run_requests == second.run_requests == []

    # A slot frees: orders, waiting longest, goes; refunds waits.
    world.instance.report_run_failed(others[0])
    third = world.tick(sources, second.cursor, at=1000.0, config=config)
    [request] = third.run_requests
    assert list(batch_tables(request)) == [orders.table_name]
    assert world.land(request).success
    orders.assert_exactly_once(runs=1)

    # New segments of orders arrived after its request. When its slot frees, refunds (pending since 950) goes, not
    # orders: its pending segments are newer than its request (1000).
    orders.write_segments(0, 40, records_per_segment=40, base_offset=40)
    fourth = world.tick(sources, third.cursor, at=1010.0, config=config)
    assert requested_tables(fourth) == [[refunds.table_name]]
    cursor = world.cursor_of(fourth)
    assert (cursor.pending_since[orders.table_name], cursor.pending_since[refunds.table_name]) == (1000.0, 950.0)
