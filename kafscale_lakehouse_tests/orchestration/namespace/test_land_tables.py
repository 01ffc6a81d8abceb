"""A `land_tables` run on the real servers and a real Dagster instance: it lands each table of its batch with its own
commit, and Dagster files each table's materializations and check results under the table's own asset, partitions
and checks; a table whose commit fails leaves the others landed and is requested again after the backoff."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from urllib.parse import urlsplit

import dagster as dg
import pytest
import requests
from pyiceberg.exceptions import CommitFailedException, ValidationError

from kafscale_lakehouse.engine.ingestion import IngestContext, prepare_ingest
from kafscale_lakehouse.engine.ingestion import run as ingest_run
from kafscale_lakehouse.engine.ingestion.spark_job import _BatchTasks, ingestion_task_spec
from kafscale_lakehouse.engine.tables import (
    FRESHNESS,
    OFFSETS_CONTIGUOUS,
    RECORD_ID_UNIQUE,
    RETENTION_HEADROOM,
    SCHEMA_VALID,
)
from kafscale_lakehouse.engine.tables.run_files import remove_run_files
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.offsets.store import OffsetStore
from kafscale_lakehouse.orchestration import land_tables
from kafscale_lakehouse.orchestration.naming import table_asset_key
from kafscale_lakehouse.storage import S3SegmentStore, topic_prefix
from kafscale_lakehouse_tests.orchestration.namespace.conftest import POLL_INTERVAL_SECONDS
from kafscale_lakehouse_tests.orchestration.namespace.test_namespace_sensor import batch_tables, publish_watermarks

CHECKS = (SCHEMA_VALID, RECORD_ID_UNIQUE, OFFSETS_CONTIGUOUS, FRESHNESS, RETENTION_HEADROOM)


def latest_check_runs(instance: dg.DagsterInstance, table: str) -> dict[str, tuple[str, bool]]:
    """`{check: (run id, passed)}` of the latest evaluation of each check of the table's asset."""
    latest = {}
    for check in CHECKS:
        [record] = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(table_asset_key(table), check), limit=1)
        evaluation = record.event.dagster_event.event_specific_data
        latest[check] = (record.run_id, evaluation.passed)
    return latest


def second_batch(world, *, watermarks: bool = False):
    """Every topic's two partitions: 40 records landed by a first batch (which creates the tables), then 20 more in
    segments of 20, listed by a tick; returns the sources and the second batch's run request. `watermarks`: the
    brokers publish their watermarks at the end of the segments written."""
    topics = list(world.topics.values())
    sources = world.sources()
    cursor = None
    for base_offset, records in ((0, 40), (40, 20)):
        for topic in topics:
            for partition in (0, 1):
                topic.write_segments(partition, records, records_per_segment=20, base_offset=base_offset)
        if watermarks:
            publish_watermarks(world, sources)
        tick = world.tick(sources, cursor)
        [request] = tick.run_requests
        if cursor is None:
            assert world.land(request).success
        cursor = tick.cursor
    assert set(batch_tables(request)) == {topic.table_name for topic in topics}
    return sources, request


def test_a_batch_lands_each_table_as_its_own_asset_and_a_failed_commit_is_retried_alone(namespace_world, spark,
                                                                                      monkeypatch):
    world = namespace_world
    orders, payments, refunds = world.topics["orders"], world.topics["payments"], world.topics["refunds"]
    orders.write_segments(0, 100, records_per_segment=50)
    orders.write_segments(1, 50, records_per_segment=50)
    payments.write_segments(0, 60, records_per_segment=30)
    refunds.write_segments(0, 40, records_per_segment=40)
    sources = world.sources()
    first = world.tick(sources)
    [request] = first.run_requests
    assert set(batch_tables(request)) == {orders.table_name, payments.table_name, refunds.table_name}

    # The catalog refuses the payments commit (a conflict it reports after its retries): only that table fails.
    commit_append = ingest_run.commit_append

    def refuse_payments(table, files, topic, *args, **kwargs):
        if topic == payments.topic:
            raise CommitFailedException(f"injected: table {payments.table_name} changed under the commit")
        return commit_append(table, files, topic, *args, **kwargs)

    # One Spark job writes the three tables' segments (the run's own per-table job is never used).
    jobs: list[list[str]] = []
    batch_job, table_job = ingest_run.run_batch_spark_job, ingest_run.run_ingestion_spark_job

    def counted_batch_job(spark, run_id, table_jobs):
        jobs.append(sorted(job.tasks.sink.table_name for job in table_jobs))
        return batch_job(spark, run_id, table_jobs)

    def no_table_job(*args, **kwargs):
        jobs.append(["a Spark job of one table"])
        return table_job(*args, **kwargs)

    monkeypatch.setattr(ingest_run, "commit_append", refuse_payments)
    monkeypatch.setattr(ingest_run, "run_batch_spark_job", counted_batch_job)
    monkeypatch.setattr(ingest_run, "run_ingestion_spark_job", no_table_job)
    result = world.land(request)
    monkeypatch.undo()
    assert jobs == [sorted([orders.table_name, payments.table_name, refunds.table_name])]

    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.step_failure_data.error.message
    assert f"1 of 3 tables did not land: {payments.table_name}" in message and "injected" in message
    run_id = result.run_id
    for world_of, partitions, records in ((orders, {"0", "1"}, {0: 100, 1: 50}), (refunds, {"0"}, {0: 40})):
        world_of.assert_exactly_once(runs=1)
        assert world_of.store_next_offsets() == records
        key = table_asset_key(world_of.table_name)
        # Its own materializations: one per Kafka partition, under the table's asset and partitions (what its
        # partition status and freshness read), with the run's metadata.
        assert world.instance.get_materialized_partitions(key) == partitions
        latest = world.instance.get_latest_materialization_event(key)
        assert latest.run_id == run_id
        metadata = latest.asset_materialization.metadata
        assert metadata["dagster/table_name"].value == world_of.table_name
        assert metadata["committed_offset_ranges"].value == {str(p): [0, n] for p, n in records.items()}
        # Its own check results, recorded as the table's checks' evaluations of this run.
        assert latest_check_runs(world.instance, world_of.table_name) == dict.fromkeys(CHECKS, (run_id, True))
    assert world.instance.get_materialized_partitions(table_asset_key(payments.table_name)) == set()
    assert payments.store_next_offsets() == {}
    assert payments.our_snapshots() == []
    assert payments.lease_keys() == []

    # The next tick: orders and refunds landed (nothing pending); payments' unchanged state is due again after the
    # backoff of its first failure, alone.
    [record] = world.instance.get_run_records(dg.RunsFilter(run_ids=[run_id]))
    waiting = world.tick(sources, first.cursor, at=record.end_time + 1)
    assert waiting.run_requests == []
    assert f"run {run_id} failed (attempt 1); requested again in" in waiting.skip_message
    retry = world.tick(sources, waiting.cursor, at=record.end_time + POLL_INTERVAL_SECONDS)
    [again] = retry.run_requests
    assert list(batch_tables(again)) == [payments.table_name]
    assert world.cursor_of(retry).tables[payments.table_name].request.attempt == 2

    landed = world.land(again)
    assert landed.success
    payments.assert_exactly_once(runs=1)
    assert world.instance.get_materialized_partitions(table_asset_key(payments.table_name)) == {"0"}
    assert latest_check_runs(world.instance, payments.table_name) == dict.fromkeys(CHECKS, (landed.run_id, True))
    orders.assert_exactly_once(runs=1)  # untouched by the retry


def test_a_batch_packs_small_partitions_into_few_spark_tasks_and_loads_each_table_once(namespace_world, spark,
                                                                                      monkeypatch):
    """At hundreds of tables a batch's cost is per table and per Kafka partition: a Spark task per partition's
    segments (~0.5 s each on 2 cores, against ~0.1 s of reading a small segment run) and a catalog load of each
    table by the commit's materializations and by the freshness check again. Small partitions are packed into a
    task per slot of the engine, a table is loaded once to prepare and refreshed once to commit, and the batch
    connects to the catalog once."""
    world = namespace_world
    topics = list(world.topics.values())
    _, request = second_batch(world)

    spark_tasks: list[int | None] = []
    spark_range = type(spark).range

    def counted_range(self, start, end=None, step=1, numPartitions=None):  # noqa: N803 - Spark's keyword
        spark_tasks.append(numPartitions)
        return spark_range(self, start, end, step, numPartitions)

    catalog_gets: Counter[str] = Counter()  # table name, or "config"
    send = requests.Session.send

    def counted_send(self, prepared, **kwargs):
        path = urlsplit(prepared.url).path.rstrip("/").split("/")
        if prepared.method == "GET" and path[-1] == "config":
            catalog_gets["config"] += 1
        elif prepared.method == "GET" and len(path) > 2 and path[-2] == "tables":
            catalog_gets[path[-1]] += 1
        return send(self, prepared, **kwargs)

    monkeypatch.setattr(type(spark), "range", counted_range)
    monkeypatch.setattr(requests.Session, "send", counted_send)
    result = world.land(request)
    monkeypatch.undo()

    assert result.success
    # Six Kafka partitions of a few KB each: one Spark task per slot of local[2], not one per partition.
    assert spark_tasks == [2]
    for topic in topics:
        topic.assert_exactly_once(runs=2)
        assert topic.store_next_offsets() == {0: 60, 1: 60}
        assert latest_check_runs(world.instance, topic.table_name) == dict.fromkeys(CHECKS, (result.run_id, True))
        # Loaded to prepare, refreshed by the commit's offsets re-check; nothing loads it again.
        assert catalog_gets[topic.table_name.rsplit(".", 1)[1]] == 2, catalog_gets
    # One connection to the catalog for the batch (a connection per table was a quarter of preparing it).
    assert catalog_gets["config"] == 1, catalog_gets


def test_a_packed_spark_task_that_fails_leaves_no_file_of_the_runs_it_had_finished(namespace_world, spark):
    """A Spark task of a batch runs several tables' segment runs; when a later one fails, the data files the earlier
    ones wrote are deleted before the task fails (Spark may retry it; nothing of the failed attempt stays), as a
    segment run alone in its task deletes its own."""
    world = namespace_world
    orders, payments = world.topics["orders"], world.topics["payments"]
    orders.write_segments(0, 40, records_per_segment=20)
    payments.write_segments(0, 40, records_per_segment=20)
    config = world.config()
    mappings = {mapping.topic: mapping for mapping in config.mappings}
    run_id = uuid.uuid4().hex
    with IngestContext.from_config(config, spark) as context:
        runs = [prepare_ingest(context, mappings[topic.topic], partitions=[0], run_id=run_id)
                for topic in (orders, payments)]
        try:
            good, other = (ingestion_task_spec(**ingest_run._job_arguments(run)) for run in runs)
            assert len(good.input_partitions) == len(other.input_partitions) == 1
            # payments' share cannot write (its sink's table metadata is no metadata); orders' runs first.
            broken = replace(other, sink=replace(other.sink, table_metadata_json="{}"))
            tasks = _BatchTasks((good, broken), ((0, 0), (1, 0)), ((0, 1),))
            written = _BatchTasks((good,), ((0, 0),), ((0,),))._run_group([0])
            assert [len(output.data_files) for _, output in written] == [1]  # what orders' run writes alone
            orders_dir = runs[0].data_dir(runs[0].table)
            assert len(remove_run_files(runs[0].table, orders_dir)) == 1

            for threads in (1, 2):  # one after another, or at once (a group of small runs)
                with pytest.raises(ValidationError):
                    tasks._run_group([0, 1], threads)

                assert remove_run_files(runs[0].table, orders_dir) == []  # nothing of the failed attempt is left
        finally:
            for run in runs:
                run.release_leases()
                run.forget_run()


def test_a_batchs_freshness_checks_list_no_segments_of_partitions_with_a_broker_watermark(namespace_world, spark,
                                                                                        monkeypatch):
    """The freshness check measures lag against the broker watermark where the broker publishes one, so a batch's
    checks list none of those partitions' segments (they used to list the whole namespace once per batch, a cost
    that grew with every segment the namespace keeps); with S3 discovery they list each topic's partitions once.
    The offsets and watermarks of all the batch's topics are read once, not per table (two etcd reads per table
    before)."""
    world = namespace_world
    topics = list(world.topics.values())
    sources, request = second_batch(world, watermarks=True)
    for topic in topics:  # the brokers went on: 7 records per partition not in a completed segment yet
        for partition in (0, 1):
            sources.etcd.put(broker_next_offset_key(topic.topic, partition), "67")

    check_listings: list[tuple[str, str | None]] = []  # (prefix, delimiter) listed on the checks' threads
    list_page = S3SegmentStore._list_page

    def recorded(self, prefix, *, start_after, delimiter, token):
        if threading.current_thread().name.startswith(("checks", "partition-listing")):
            check_listings.append((prefix, delimiter))
        return list_page(self, prefix, start_after=start_after, delimiter=delimiter, token=token)

    check_offset_reads: Counter[str] = Counter()  # the offsets store's reads on the checks' threads

    def counting(name: str):
        read = getattr(OffsetStore, name)

        def counted(self, *args, **kwargs):
            if threading.current_thread().name.startswith("checks"):
                check_offset_reads[name] += 1
            return read(self, *args, **kwargs)
        return counted

    for name in ("committed_offsets", "broker_watermarks", "committed_offsets_by_topic", "broker_watermarks_by_topic"):
        monkeypatch.setattr(OffsetStore, name, counting(name))
    monkeypatch.setattr(S3SegmentStore, "_list_page", recorded)
    result = world.land(request)
    monkeypatch.undo()

    assert result.success
    assert check_offset_reads == {"committed_offsets_by_topic": 1, "broker_watermarks_by_topic": 1}, \
        check_offset_reads
    namespace = topics[0].name
    assert sorted(check_listings) == sorted((topic_prefix(namespace, t.topic), "/") for t in topics)
    for topic in topics:
        [freshness] = world.instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(table_asset_key(topic.table_name), FRESHNESS), limit=1)
        evaluation = freshness.event.dagster_event.event_specific_data
        assert evaluation.passed and evaluation.metadata["max_lag"].value == 7
        lags = {row.data["partition"]: (row.data["lag"], row.data["measured_against"])
                for row in evaluation.metadata["lag_by_partition"].value.records}
        assert lags == {0: (7, "broker watermark"), 1: (7, "broker watermark")}


def test_a_tables_events_are_recorded_while_another_tables_checks_still_run(namespace_world, spark, monkeypatch):
    """The event-log writes (one per materialization and check result: on sqlite the slowest part of a batch of
    hundreds of tables) overlap the other tables' checks instead of waiting for all of them."""
    world = namespace_world
    orders, refunds = world.topics["orders"], world.topics["refunds"]
    _, request = second_batch(world)
    refunds_key = table_asset_key(refunds.table_name)
    first_run = world.instance.get_latest_materialization_event(refunds_key).run_id
    seen_while_checking: list[bool] = []
    table_events = land_tables._table_events

    def orders_waits_for_refunds(mapping, *args):
        if mapping.table == orders.table_name:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if world.instance.get_latest_materialization_event(refunds_key).run_id != first_run:
                    seen_while_checking.append(True)
                    break
                time.sleep(0.2)
            else:
                seen_while_checking.append(False)
        return table_events(mapping, *args)

    monkeypatch.setattr(land_tables, "_table_events", orders_waits_for_refunds)
    result = world.land(request)
    monkeypatch.undo()

    assert result.success
    assert seen_while_checking == [True]  # refunds' events were in the instance before orders' checks ended
    for topic in world.topics.values():
        assert latest_check_runs(world.instance, topic.table_name) == dict.fromkeys(CHECKS, (result.run_id, True))


def test_a_batch_frees_its_tables_once_committed_and_records_after_the_run_that_committed_them_before(
        namespace_world, spark):
    """A batch tags itself committed as soon as its commits are done (the watch may then request its tables again
    while it records their events); a batch that lands tables such a run committed records its own events only once
    that run ended, so each partition's latest materialization is its latest commit's."""
    world = namespace_world
    orders = world.topics["orders"]
    orders.write_segments(0, 40, records_per_segment=40)
    [request] = world.tick(world.sources()).run_requests
    recording = dg.DagsterRun(job_name=land_tables.LAND_TABLES_JOB, run_id=str(uuid.uuid4()),
                              status=dg.DagsterRunStatus.STARTED,
                              tags={land_tables.BATCH_TABLES_TAG: orders.table_name,
                                    land_tables.BATCH_COMMITTED_TAG: "true"})
    world.instance.add_run(recording)
    ended: list[float] = []

    def end_recording_once_the_batch_committed() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            committed = world.instance.get_runs(dg.RunsFilter(tags={land_tables.BATCH_COMMITTED_TAG: "true"}))
            if any(run.run_id != recording.run_id for run in committed):
                time.sleep(1.0)  # the batch has committed and now waits
                ended.append(time.time())
                world.instance.report_run_failed(recording)
                return
            time.sleep(0.1)

    waiter = threading.Thread(target=end_recording_once_the_batch_committed)
    waiter.start()
    result = world.land(dg.RunRequest(job_name=request.job_name, run_config=request.run_config,
                                      tags={**request.tags, land_tables.RECORD_AFTER_TAG: recording.run_id}))
    waiter.join()

    assert result.success and ended, "the batch tagged itself committed before recording its events"
    assert world.instance.get_run_by_id(result.run_id).tags[land_tables.BATCH_COMMITTED_TAG] == "true"
    records = world.instance.get_records_for_run(result.run_id,
                                                 of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    assert records and min(record.timestamp for record in records) >= ended[0]
    orders.assert_exactly_once(runs=1)


def test_a_batch_records_its_checks_and_events_at_a_lower_cpu_priority_than_it_lands(namespace_world, spark,
                                                                                      monkeypatch):
    """Once committed, a batch's checks and event-log writes are bookkeeping: on shared cores they yield to the runs
    still landing tables (their thread's nice value is RECORDING_NICENESS higher), and the thread gets its own back
    after (this process may raise it again: tests run as root)."""
    world = namespace_world
    _, request = second_batch(world)
    this_thread = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, this_thread)
    landing: list[int] = []
    recording: list[int] = []
    commit_append, table_events = ingest_run.commit_append, land_tables._table_events

    def committed(*args, **kwargs):
        landing.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return commit_append(*args, **kwargs)

    def recorded(*args):
        recording.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return table_events(*args)

    monkeypatch.setattr(ingest_run, "commit_append", committed)
    monkeypatch.setattr(land_tables, "_table_events", recorded)
    result = world.land(request)
    monkeypatch.undo()

    assert result.success
    assert landing == [before] * len(world.topics)
    assert recording == [min(19, before + land_tables.RECORDING_NICENESS)] * len(world.topics)
    assert os.getpriority(os.PRIO_PROCESS, this_thread) == before
