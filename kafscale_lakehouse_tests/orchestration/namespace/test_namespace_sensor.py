"""The namespace watch's sensor on the real servers: one tick lists only the partitions whose broker watermark moved
past the segments seen (each from its cursor) and requests `land_tables` runs over the tables with new segments,
packed by the byte budget."""

from __future__ import annotations

import dagster as dg

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion import TABLE_OFFSETS_MAX_AGE_SECONDS, TableOffsetsReader, WatchSources
from kafscale_lakehouse.offsets.ranges import format_ranges, parse_ranges
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.orchestration import namespace_sensor
from kafscale_lakehouse.orchestration.land_tables import BATCH_TABLES_TAG, LAND_TABLES_JOB, LAND_TABLES_OP
from kafscale_lakehouse.orchestration.naming import partitions_def_name, topic_asset_key
from kafscale_lakehouse.orchestration.sensors import build_sensors
from kafscale_lakehouse.storage import ObjectKind, namespace_prefix
from kafscale_lakehouse_tests.orchestration.namespace.conftest import POLL_INTERVAL_SECONDS, NamespaceWorld
from kafscale_lakehouse_tests.support.leases import held_leases
from kafscale_lakehouse_tests.support.servers import S3_BUCKET


def batch_tables(request: dg.RunRequest) -> dict[str, dict]:
    """`{table: entry}` of a `land_tables` run request's config."""
    return {entry["table"]: entry for entry in request.run_config["ops"][LAND_TABLES_OP]["config"]["tables"]}


def kfs_bytes(world: NamespaceWorld, word: str) -> int:
    return sum(s.kfs_path.stat().st_size for segments in world.topics[word].segments.values()
               for s in segments.values())


def publish_watermarks(world: NamespaceWorld, sources: WatchSources) -> None:
    """Each partition's broker watermark in etcd at the end of the segments written to it, as a KafScale broker
    publishes its log end (`/kafscale/topics/<topic>/partitions/<p>/next_offset`)."""
    assert sources.etcd is not None
    for topic in world.topics.values():
        for partition, segments in topic.segments.items():
            end = max(segment.last_offset for segment in segments.values()) + 1
            sources.etcd.put(broker_next_offset_key(topic.topic, partition), str(end))


def test_one_tick_lists_each_partition_once_and_requests_one_run_of_the_tables_with_new_segments(namespace_world,
                                                                                                monkeypatch):
    world = namespace_world
    orders, payments = world.topics["orders"], world.topics["payments"]
    orders.write_segments(0, 100, records_per_segment=50)
    orders.write_segments(1, 50, records_per_segment=50)
    payments.write_segments(0, 60, records_per_segment=30)
    # refunds: no segment yet. An object of another, unmapped topic is listed with the rest and ignored.
    orders.put_object(f"{namespace_prefix(orders.name)}unmapped/0/segment-{0:020d}.index", b"x")
    sources = world.sources()
    publish_watermarks(world, sources)
    etcd_reads: list[str] = []
    read_prefix = sources.offsets._read_prefix
    monkeypatch.setattr(sources.offsets, "_read_prefix",
                        lambda prefix: etcd_reads.append(prefix) or read_prefix(prefix))

    before = sources.store.request_counts
    result = world.tick(sources)
    requests = sources.store.request_counts - before

    assert len(etcd_reads) == 2, f"the offsets and the watermarks of every topic, one read each: {etcd_reads}"
    # discovery.mode s3: each topic's partition directories (3), then each partition found, from its committed offset.
    assert requests["list"] == 3 + 3, requests
    assert requests["get"] == 3, "the newest new segment's footer per partition, nothing else"
    [request] = result.run_requests
    tables = batch_tables(request)
    assert set(tables) == {orders.table_name, payments.table_name}
    assert tables[orders.table_name]["partitions"] == [0, 1]
    assert parse_ranges(tables[orders.table_name]["planned_ranges"], where="test") == parse_ranges(
        '{"0":[0,100],"1":[0,50]}', where="test")
    assert tables[payments.table_name]["planned_ranges"] == '{"0":[0,60]}'
    assert request.tags[BATCH_TABLES_TAG] == f"{orders.table_name},{payments.table_name}"
    assert sorted((r.partitions_def_name, list(r.partition_keys)) for r in result.dynamic_partitions_requests) == \
        sorted([(partitions_def_name(orders.topic), ["0", "1"]), (partitions_def_name(payments.topic), ["0"])])

    # The sensors of the per-table watch list each partition of each topic: one request each, here 3.
    per_table = sources.store.request_counts
    for sensor in build_sensors(world.config(watch="per_table"), sources=lambda: sources):
        sensor.evaluate_tick(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    assert (sources.store.request_counts - per_table)["list"] >= 3

    # Nothing new (every watermark is where the segments seen end): the next tick lists no partition, only the
    # partition directories of refunds, which has none yet; and requests nothing until the requested run is launched
    # (here it never is: requested again after the backoff, as the per-table sensor does).
    before = sources.store.request_counts
    idle = world.tick(sources, result.cursor)
    requests = sources.store.request_counts - before
    assert dict(requests) == {"list": 1}, requests
    assert idle.run_requests == []
    assert "no run was launched for request" in idle.skip_message


def test_a_tick_reads_only_the_newest_footer_of_each_partition_however_many_segments_arrived(namespace_world):
    world = namespace_world
    orders = world.topics["orders"]
    orders.write_segments(0, 50, records_per_segment=50)
    sources = world.sources()
    publish_watermarks(world, sources)
    first = world.tick(sources)
    assert batch_tables(first.run_requests[0])[orders.table_name]["planned_ranges"] == '{"0":[0,50]}'

    # Twelve new segments on partition 0, 3 on partition 1, then an orphan .kfs (its .index not uploaded yet):
    # the listing stops before it, and each partition's end is its newest complete segment's footer.
    orders.write_segments(0, 600, records_per_segment=50, base_offset=50)
    orders.write_segments(1, 90, records_per_segment=30)
    orders.write_segments(0, 7, records_per_segment=7, base_offset=650)
    index_key = orders.segment_object_key(0, 650, ObjectKind.INDEX)
    orders.seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=index_key)
    publish_watermarks(world, sources)  # partition 1 is new: its watermark shows it before S3 discovery lists it
    before = sources.store.request_counts
    second = world.tick(sources, first.cursor)
    requests = sources.store.request_counts - before

    # The two partitions of orders, and the partition directories of payments and refunds (no partition yet).
    assert (requests["list"], requests["get"]) == (2 + 2, 2), requests
    [request] = second.run_requests
    assert parse_ranges(batch_tables(request)[orders.table_name]["planned_ranges"], where="test") == parse_ranges(
        '{"0":[0,650],"1":[0,90]}', where="test")


def test_the_byte_budget_splits_the_pending_tables_into_runs_the_longest_waiting_first(namespace_world):
    world = namespace_world
    orders, payments, refunds = world.topics["orders"], world.topics["payments"], world.topics["refunds"]
    orders.write_segments(0, 100, records_per_segment=50)
    sources = world.sources()
    first = world.tick(sources)
    [alone] = first.run_requests
    assert set(batch_tables(alone)) == {orders.table_name}

    payments.write_segments(0, 60, records_per_segment=30)
    refunds.write_segments(0, 40, records_per_segment=40)
    budget = kfs_bytes(world, "payments") + kfs_bytes(world, "refunds") - 1  # both do not fit in one run
    config = world.config(max_bytes_per_batch_run=budget, max_batch_runs=4)  # slots to spare: the budget splits
    # The orders' run is still going: orders stays out of the batches, the other two split by the budget.
    world.instance.add_run(dg.DagsterRun(job_name="land_tables", run_id="0" * 36, tags=dict(alone.tags),
                                         status=dg.DagsterRunStatus.STARTED))
    second = world.tick(sources, first.cursor, config=config)
    assert [list(batch_tables(r)) for r in second.run_requests] == [[payments.table_name], [refunds.table_name]]
    cursor = world.cursor_of(second)
    assert cursor.tables[orders.table_name].requested == {0: (0, 100)}
    assert format_ranges(parse_ranges(batch_tables(second.run_requests[1])[refunds.table_name]["planned_ranges"],
                                      where="test")) == '{"0":[0,40]}'


def test_a_mapping_taken_out_of_the_config_leaves_nothing_in_the_cursor(namespace_world):
    world = namespace_world
    orders, refunds = world.topics["orders"], world.topics["refunds"]
    orders.write_segments(0, 50, records_per_segment=50)
    refunds.write_segments(0, 40, records_per_segment=40)
    sources = world.sources()
    first = world.tick(sources)
    assert set(world.cursor_of(first).pending_since) == {orders.table_name, refunds.table_name}

    del world.topics["refunds"]
    second = world.tick(sources, first.cursor)
    cursor = world.cursor_of(second)
    assert refunds.table_name not in cursor.tables and refunds.table_name not in cursor.pending_since
    assert set(cursor.tables) == {orders.table_name, world.topics["payments"].table_name}


def test_a_tick_reuses_a_tables_offsets_until_the_offsets_store_moves_or_they_age(namespace_world, monkeypatch):
    world = namespace_world
    orders = world.topics["orders"]
    orders.write_segments(0, 50, records_per_segment=50)
    sources = world.sources()
    now = [1000.0]
    sources.tables = TableOffsetsReader(catalog_settings(world.config()), clock=lambda: now[0])
    loads: list[str] = []
    read = sources.tables.read
    monkeypatch.setattr(sources.tables, "read", lambda table, topic: loads.append(table) or read(table, topic))

    first = world.tick(sources)
    assert sorted(loads) == sorted(world.topics[w].table_name for w in world.topics)
    loads.clear()
    second = world.tick(sources, first.cursor)
    assert loads == [], "nothing moved: no catalog load"

    # A run of orders committed (the store moved): only its table is loaded again.
    with held_leases(sources.offsets, orders.topic, [0], "test") as leases:
        sources.offsets.commit_offsets(leases.values(), {0: (50, 0)})
    third = world.tick(sources, second.cursor)
    assert loads == [orders.table_name]
    loads.clear()

    # Past the reuse age every table is loaded again (a table rolled back behind the store's back is seen then).
    now[0] += TABLE_OFFSETS_MAX_AGE_SECONDS
    world.tick(sources, third.cursor)
    assert sorted(loads) == sorted(world.topics[w].table_name for w in world.topics)


def test_tables_of_a_failed_batch_are_retried_in_halves_so_one_failing_table_does_not_hold_back_the_rest(
        namespace_world):
    world = namespace_world
    for word, topic in world.topics.items():
        topic.write_segments(0, 40 + 10 * len(word), records_per_segment=10)
    sources = world.sources()
    started = 1_800_000_000.0

    def fail(request: dg.RunRequest, number: int) -> None:
        world.instance.add_run(dg.DagsterRun(job_name=LAND_TABLES_JOB, run_id=f"{number:036d}", tags=dict(request.tags),
                                             status=dg.DagsterRunStatus.FAILURE))

    config = world.config(max_batch_runs=4)  # a slot for each table when the halves are down to one table each
    first = world.tick(sources, at=started, config=config)
    [batch] = first.run_requests
    assert len(batch_tables(batch)) == 3
    fail(batch, 1)

    # After the backoff (one poll interval), the three come back on their second attempt in two runs, not one.
    second = world.tick(sources, first.cursor, at=started + POLL_INTERVAL_SECONDS + 1, config=config)
    halves = [set(batch_tables(r)) for r in second.run_requests]
    assert sorted(map(len, halves)) == [1, 2]
    assert set().union(*halves) == {t.table_name for t in world.topics.values()}
    for number, request in enumerate(second.run_requests, start=2):
        fail(request, number)

    # Failing again (third attempt, after twice the backoff): each table alone.
    third = world.tick(sources, second.cursor, at=started + 3 * POLL_INTERVAL_SECONDS + 2, config=config)
    assert sorted(len(batch_tables(r)) for r in third.run_requests) == [1, 1, 1]


def test_a_tick_reports_the_topics_observed_longest_ago_and_the_others_on_later_ticks(namespace_world,
                                                                                    monkeypatch):
    world = namespace_world
    monkeypatch.setattr(namespace_sensor, "OBSERVATIONS_PER_TICK", 2)
    for topic in world.topics.values():
        topic.write_segments(0, 20, records_per_segment=10)
    sources = world.sources()
    topic_keys = {topic_asset_key(t.topic) for t in world.topics.values()}

    first = world.tick(sources, at=1000.0)
    observed = {event.asset_key for event in first.asset_events}
    assert len(observed) == 2

    # Nothing moved since: the topic left out is reported now, the two others are not again.
    second = world.tick(sources, first.cursor, at=1005.0)
    assert {event.asset_key for event in second.asset_events} == topic_keys - observed

    # All three move: the two observed at 1000 go first.
    for topic in world.topics.values():
        topic.write_segments(0, 10, records_per_segment=10, base_offset=20)
    third = world.tick(sources, second.cursor, at=1010.0)
    assert {event.asset_key for event in third.asset_events} == observed


def test_a_table_with_a_run_in_flight_has_its_new_segments_read_after_the_run(namespace_world):
    world = namespace_world
    orders, payments = world.topics["orders"], world.topics["payments"]
    orders.write_segments(0, 50, records_per_segment=50)
    sources = world.sources()
    first = world.tick(sources)
    [request] = first.run_requests
    run = dg.DagsterRun(job_name=LAND_TABLES_JOB, run_id="2" * 36, tags=dict(request.tags),
                        status=dg.DagsterRunStatus.STARTED)
    world.instance.add_run(run)

    orders.write_segments(0, 150, records_per_segment=50, base_offset=50)
    payments.write_segments(0, 30, records_per_segment=30)
    publish_watermarks(world, sources)
    before = sources.store.request_counts
    second = world.tick(sources, first.cursor)
    assert (sources.store.request_counts - before)["get"] == 1, "payments' footer only: orders' run is in flight"
    [batch] = second.run_requests
    assert list(batch_tables(batch)) == [payments.table_name]

    world.instance.report_run_failed(run)  # the run ends (it landed nothing here): orders' new segments count now
    before = sources.store.request_counts
    third = world.tick(sources, second.cursor)
    assert (sources.store.request_counts - before)["get"] == 1, "orders' newest footer"
    [batch] = [r for r in third.run_requests if orders.table_name in batch_tables(r)]
    assert batch_tables(batch)[orders.table_name]["planned_ranges"] == '{"0":[0,200]}'
