"""The namespace watch keeps up to `processor.max_batch_runs` `land_tables` runs in flight over disjoint tables, on the
real servers (SeaweedFS S3 + Iceberg REST, etcd, a Dagster instance; Spark where a run lands): a tick requests a run
per free slot, the longest waiting tables first, never a table with a run in flight, and a table that just landed
does not go before one waiting longer; a tick while every slot is taken lists nothing (batches that
overlap)."""

from __future__ import annotations

import dagster as dg

from kafscale_lakehouse.orchestration import namespace_sensor
from kafscale_lakehouse.orchestration.land_tables import (
    BATCH_COMMITTED_TAG,
    BATCH_TABLES_TAG,
    LAND_TABLES_JOB,
    RECORD_AFTER_TAG,
)
from kafscale_lakehouse_tests.orchestration.namespace.conftest import NamespaceWorld
from kafscale_lakehouse_tests.orchestration.namespace.test_namespace_listing_cost import record_listings
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
    others = [batch_in_flight(world, number) for number in range(2)]  # one slot of three is free

    # One slot: orders and refunds, both pending since 1000 (same wait, neither requested before: by name); orders
    # goes, refunds waits.
    orders.write_segments(0, 100, records_per_segment=50)
    refunds.write_segments(0, 40, records_per_segment=40)
    first = world.tick(sources, at=1000.0, config=config)
    assert requested_tables(first) == [[orders.table_name]]
    assert world.cursor_of(first).pending_since[refunds.table_name] == 1000.0
    landing_orders = batch_in_flight(world, 10, dict(first.run_requests[0].tags))

    # Every slot is taken: nothing could be requested and nothing is listed; only the first such tick changes the
    # cursor (what the next listing finds for the first time is pending since then).
    payments.write_segments(0, 60, records_per_segment=30)
    listed = record_listings(sources)
    second = world.tick(sources, first.cursor, at=1010.0, config=config)
    assert second.run_requests == [] and listed == []
    assert second.skip_message == ("every batch run slot is taken (3 land_tables runs queued or running, "
                                   "processor.max_batch_runs 3): the namespace is listed again once one frees")
    assert world.cursor_of(second).unscanned_since == 1010.0
    third = world.tick(sources, second.cursor, at=1015.0, config=config)
    assert third.run_requests == [] and listed == [] and third.cursor == second.cursor

    # A slot frees: refunds (pending since 1000) goes before payments, found now and pending since 1010 (it may have
    # landed any time after the last listing); orders, in flight, has new segments and stays out.
    world.instance.report_run_failed(others[0])
    orders.write_segments(0, 50, records_per_segment=50, base_offset=100)
    fourth = world.tick(sources, second.cursor, at=1020.0, config=config)
    assert listed, "a slot is free: the namespace is listed"
    assert requested_tables(fourth) == [[refunds.table_name]]
    cursor = world.cursor_of(fourth)
    assert cursor.pending_since[payments.table_name] == 1010.0 and cursor.unscanned_since is None
    assert cursor.tables[payments.table_name].request is None
    batch_in_flight(world, 11, dict(fourth.run_requests[0].tags))

    # The last of the other runs ends: its slot goes to payments; orders and refunds stay out.
    world.instance.report_run_failed(others[1])
    fifth = world.tick(sources, fourth.cursor, at=1030.0, config=config)
    assert requested_tables(fifth) == [[payments.table_name]]
    assert world.instance.get_run_by_id(landing_orders.run_id).status == dg.DagsterRunStatus.STARTED


def test_a_table_that_just_landed_waits_behind_a_table_waiting_longer_when_a_slot_frees(namespace_world, spark,
                                                                                       monkeypatch):
    world = namespace_world
    monkeypatch.setattr(namespace_sensor, "MIN_TABLES_PER_BATCH_RUN", 1)
    orders, refunds = world.topics["orders"], world.topics["refunds"]
    config = world.config(max_batch_runs=3)  # three mappings over three slots: a run holds one table
    sources = world.sources(config)
    others = [batch_in_flight(world, number) for number in range(3)]

    orders.write_segments(0, 40, records_per_segment=40)
    first = world.tick(sources, at=900.0, config=config)  # no slot: nothing listed, the first such tick
    refunds.write_segments(0, 40, records_per_segment=40)
    second = world.tick(sources, first.cursor, at=950.0, config=config)  # no slot
    assert first.run_requests == second.run_requests == []

    # A slot frees: both are found pending, since the first tick that did not list (900); orders goes first (same
    # wait, neither requested before: by name), refunds waits.
    world.instance.report_run_failed(others[0])
    third = world.tick(sources, second.cursor, at=1000.0, config=config)
    [request] = third.run_requests
    assert list(batch_tables(request)) == [orders.table_name]
    assert world.land(request).success
    orders.assert_exactly_once(runs=1)

    # New segments of orders arrived after its request. When its slot frees, refunds (pending since 900) goes, not
    # orders: its pending segments are newer than its request (1000).
    orders.write_segments(0, 40, records_per_segment=40, base_offset=40)
    fourth = world.tick(sources, third.cursor, at=1010.0, config=config)
    assert requested_tables(fourth) == [[refunds.table_name]]
    cursor = world.cursor_of(fourth)
    assert (cursor.pending_since[orders.table_name], cursor.pending_since[refunds.table_name]) == (1000.0, 900.0)


def test_a_batch_run_that_committed_takes_no_slot_and_its_tables_go_into_the_next_batch(namespace_world,
                                                                                      monkeypatch):
    """A `land_tables` run that committed every table only records events: its slot and its tables are free, and the
    next batch of its tables records its events after it (land_tables.RECORD_AFTER_TAG)."""
    world = namespace_world
    orders, refunds = world.topics["orders"], world.topics["refunds"]
    config = world.config(max_batch_runs=1)
    sources = world.sources(config)
    recording = batch_in_flight(world, 1, {BATCH_TABLES_TAG: orders.table_name, BATCH_COMMITTED_TAG: "true"})
    orders.write_segments(0, 40, records_per_segment=40)
    refunds.write_segments(0, 40, records_per_segment=40)

    [request] = world.tick(sources, at=1000.0, config=config).run_requests
    assert sorted(batch_tables(request)) == sorted([orders.table_name, refunds.table_name])
    assert request.tags[RECORD_AFTER_TAG] == recording.run_id
