"""What the namespace watch lists per tick on the real servers (SeaweedFS S3, etcd): only the partitions whose broker
watermark moved past the segments seen, each from its cursor, so a tick's listing does not grow with the segments the
namespace keeps; new topics and partitions are still found, and the pending bytes a batch is packed by stay right."""

from __future__ import annotations

from kafscale_lakehouse.engine.ingestion import (
    PARTITION_DISCOVERY_SECONDS,
    NamespaceWatchMemory,
    WatchSources,
    scan_namespace,
)
from kafscale_lakehouse.storage import ObjectKind, partition_prefix, topic_prefix
from kafscale_lakehouse_tests.orchestration.namespace.conftest import NamespaceWorld, TopicWorld
from kafscale_lakehouse_tests.orchestration.namespace.test_namespace_sensor import batch_tables, publish_watermarks
from kafscale_lakehouse_tests.support.leases import held_leases
from kafscale_lakehouse_tests.support.servers import S3_BUCKET


def record_listings(sources: WatchSources) -> list[str]:
    """The prefixes of the list requests `sources.store` sends from now on."""
    prefixes: list[str] = []
    list_page = sources.store._list_page

    def recorded(prefix, **kwargs):
        prefixes.append(prefix)
        return list_page(prefix, **kwargs)

    sources.store._list_page = recorded  # type: ignore[method-assign]
    return prefixes


def commit_to(sources: WatchSources, topic: TopicWorld, partition: int, next_offset: int) -> None:
    """The offsets store says everything before `next_offset` landed (as a run's commit leaves it)."""
    with held_leases(sources.offsets, topic.topic, [partition], "test") as leases:
        sources.offsets.commit_offsets(leases.values(), {partition: (next_offset, 0)})


def partition_of(topic: TopicWorld, partition: int) -> str:
    return partition_prefix(topic.name, topic.topic, partition)


def test_a_tick_lists_what_is_new_however_many_segments_the_namespace_keeps(namespace_world: NamespaceWorld):
    world = namespace_world
    orders, payments = world.topics["orders"], world.topics["payments"]
    sources = world.sources()
    sources.store.list_page_size = 10  # pages of 10 keys: a namespace of 160 objects is 16 pages
    orders.write_segments(0, 400, records_per_segment=10)  # 40 landed segments of history per partition
    orders.write_segments(1, 400, records_per_segment=10)
    payments.write_segments(0, 30, records_per_segment=10)
    for topic, partition, end in ((orders, 0, 400), (orders, 1, 400), (payments, 0, 30)):
        commit_to(sources, topic, partition, end)
    publish_watermarks(world, sources)
    first = world.tick(sources)
    assert first.run_requests == [], "everything landed"

    # One new segment on orders' partition 0: that partition is listed, from its cursor, and nothing else is.
    orders.write_segments(0, 10, records_per_segment=10, base_offset=400)
    publish_watermarks(world, sources)
    listed = record_listings(sources)
    before = sources.store.request_counts
    second = world.tick(sources, first.cursor)
    requests = sources.store.request_counts - before
    refunds = topic_prefix(orders.name, world.topics["refunds"].topic)
    assert [p for p in listed if p != refunds] == [partition_of(orders, 0)], listed  # refunds: no partition yet
    assert (requests["list"], requests["get"]) == (2, 1), requests
    [request] = second.run_requests
    assert batch_tables(request)[orders.table_name]["planned_ranges"] == '{"0":[400,410]}'

    # Forty more landed segments of history: the next new segment costs the same.
    orders.write_segments(1, 400, records_per_segment=10, base_offset=400)
    commit_to(sources, orders, 1, 800)
    publish_watermarks(world, sources)
    third = world.tick(sources, second.cursor)  # lists partition 1's new (landed) segments once
    orders.write_segments(0, 10, records_per_segment=10, base_offset=410)
    publish_watermarks(world, sources)
    listed.clear()
    before = sources.store.request_counts
    world.tick(sources, third.cursor)
    requests = sources.store.request_counts - before
    assert [p for p in listed if p != refunds] == [partition_of(orders, 0)], listed
    assert (requests["list"], requests["get"]) == (2, 1), requests


def test_a_partition_whose_watermark_did_not_move_is_not_listed_and_new_topics_and_partitions_are_found(
        namespace_world: NamespaceWorld):
    world = namespace_world
    orders, payments = world.topics["orders"], world.topics["payments"]
    orders.write_segments(0, 50, records_per_segment=50)
    sources = world.sources()
    now = [1000.0]
    sources.memory = NamespaceWatchMemory(clock=lambda: now[0])
    publish_watermarks(world, sources)
    first = world.tick(sources)

    # A new topic (payments), and a new partition of orders whose broker publishes its watermark: both found on the
    # next tick; orders' partition 0 did not move and is not listed.
    payments.write_segments(0, 30, records_per_segment=30)
    orders.write_segments(1, 20, records_per_segment=20)
    publish_watermarks(world, sources)
    listed = record_listings(sources)
    second = world.tick(sources, first.cursor)
    assert partition_of(orders, 0) not in listed, listed
    assert {partition_of(orders, 1), partition_of(payments, 0)} <= set(listed), listed
    [request] = second.run_requests
    assert {t: e["planned_ranges"] for t, e in batch_tables(request).items()} == {
        orders.table_name: '{"0":[0,50],"1":[0,20]}', payments.table_name: '{"0":[0,30]}'}

    # A new partition of a known topic without a watermark (discovery.mode s3, a broker that publishes none): found
    # when its topic's partitions are listed again, within PARTITION_DISCOVERY_SECONDS.
    orders.write_segments(2, 10, records_per_segment=10)
    third = world.tick(sources, second.cursor)
    assert 2 not in world.cursor_of(third).tables[orders.table_name].partitions
    now[0] += PARTITION_DISCOVERY_SECONDS
    listed.clear()
    fourth = world.tick(sources, third.cursor)
    assert partition_of(orders, 2) in listed, listed
    assert 2 in world.cursor_of(fourth).tables[orders.table_name].partitions


def test_pending_bytes_add_up_over_the_ticks_that_listed_them_and_after_a_restart(namespace_world: NamespaceWorld):
    world = namespace_world
    orders = world.topics["orders"]
    tables = {t.topic: t.table_name for t in world.topics.values()}
    first_segments = orders.write_segments(0, 20, records_per_segment=10)
    sources = world.sources()
    publish_watermarks(world, sources)
    first = scan_namespace(sources, tables)
    later_segments = orders.write_segments(0, 30, records_per_segment=10, base_offset=20)
    publish_watermarks(world, sources)
    cursors = {topic: scan.cursors for topic, scan in first.topics.items()}
    second = scan_namespace(sources, tables, cursors)

    sizes = [s.kfs_path.stat().st_size for s in first_segments + later_segments]
    assert second.pending_bytes[orders.topic] == {0: sum(sizes)}
    # Offsets 0..19 landed: their segments no longer count.
    commit_to(sources, orders, 0, 20)
    third = scan_namespace(sources, tables, {topic: scan.cursors for topic, scan in second.topics.items()})
    assert third.pending_bytes[orders.topic] == {0: sum(sizes[2:])}
    # A new process (nothing remembered) with the same cursors lists the partition from its committed offset once.
    restarted = world.sources()
    listed = record_listings(restarted)
    again = scan_namespace(restarted, tables, {topic: scan.cursors for topic, scan in third.topics.items()})
    assert again.pending_bytes[orders.topic] == {0: sum(sizes[2:])}
    assert partition_of(orders, 0) in listed


def test_a_partition_waiting_behind_an_incomplete_segment_is_listed_and_reported_every_tick(
        namespace_world: NamespaceWorld):
    world = namespace_world
    orders = world.topics["orders"]
    tables = {t.topic: t.table_name for t in world.topics.values()}
    orders.write_segments(0, 50, records_per_segment=10)
    orders.write_segments(0, 10, records_per_segment=10, base_offset=50)
    orders.seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=orders.segment_object_key(0, 50, ObjectKind.INDEX))
    orders.write_segments(0, 10, records_per_segment=10, base_offset=60)
    sources = world.sources()
    sources.orphan_grace_seconds = 0
    publish_watermarks(world, sources)  # 70: beyond the segments before the orphan, which end at 50
    scan = scan_namespace(sources, tables)
    for _ in range(2):  # the first scan from the committed offset, then from the cursor
        state = scan.topics[orders.topic].partitions[0]
        assert state.segments_end == 50
        assert state.error is not None and orders.segment_object_key(0, 50) in state.error
        listed = record_listings(sources)
        scan = scan_namespace(sources, tables, {topic: s.cursors for topic, s in scan.topics.items()})
        assert partition_of(orders, 0) in listed
