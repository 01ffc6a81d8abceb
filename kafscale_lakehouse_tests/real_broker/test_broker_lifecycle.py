"""KafScale's broker changing under a running lakehouse: partitions added, a broker restart between acknowledged
records, a topic deleted and created again under its name. Every acknowledged offset lands once."""

from __future__ import annotations

import dagster as dg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.engine.ingestion import WatchSources
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.orchestration.naming import ingest_job_name
from kafscale_lakehouse.orchestration.sensors import build_sensors
from kafscale_lakehouse.storage import DiscoveryMode, discover_partitions
from kafscale_lakehouse_tests.real_broker.clients import Acked, produce, records
from kafscale_lakehouse_tests.real_broker.conftest import PARTITIONS, partitions_of
from kafscale_lakehouse_tests.real_broker.test_sensors_on_real_broker import evaluate

pytestmark = pytest.mark.integration


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def test_partitions_added_while_running_are_discovered_and_landed(broker_world, kafscale_broker):
    world = broker_world()
    config = world.config()
    sources = WatchSources.from_config(config)
    [sensor] = build_sensors(config, sources=lambda: sources)
    job = build_definitions(config).resolve_job_def(ingest_job_name(world.table_name))
    acked = produce(world.bootstrap, world.topic, records(30, PARTITIONS, seed=10), compression="lz4")
    with dg.instance_for_test() as instance:
        first = evaluate(sensor, instance, None)
        [request] = first.run_requests
        assert job.execute_in_process(instance=instance, tags=request.tags).success

        client = admin(world.bootstrap)  # kept: its futures fail once the client is collected
        client.create_partitions([NewPartitions(world.topic, PARTITIONS + 2)])[world.topic].result(30)
        assert discover_partitions(DiscoveryMode.ETCD, sources.store, sources.etcd, [world.topic]).partitions == {
            world.topic: list(range(PARTITIONS + 2))}, "the broker's metadata snapshot lists the new partitions"
        acked += produce(world.bootstrap, world.topic, records(50, PARTITIONS + 2, seed=11), compression="zstd")
        second = evaluate(sensor, instance, first.cursor)
        assert [list(r.partition_keys) for r in second.dynamic_partitions_requests] == [["3", "4"]]
        [request] = second.run_requests
        assert job.execute_in_process(instance=instance, tags=request.tags).success
    assert partitions_of(acked) == set(range(PARTITIONS + 2))
    world.assert_lands(acked, runs=2)


def test_a_broker_killed_and_restarted_between_produces_loses_and_doubles_nothing(broker_world, kafscale_broker):
    world = broker_world()
    producer = Producer({"bootstrap.servers": world.bootstrap, "acks": "all", "linger.ms": 20,
                         "enable.idempotence": False, "compression.type": "gzip"})
    acked: list[Acked] = []

    def send(seed: int) -> None:
        failures = []
        for record in records(40, PARTITIONS, seed=seed):
            producer.produce(world.topic, value=record.value, key=record.key, partition=record.partition,
                             headers=list(record.headers), timestamp=record.timestamp_ms,
                             on_delivery=lambda error, message, record=record: failures.append(error) if error
                             else acked.append(Acked(record, message.offset(), "gzip")))
        assert producer.flush(60) == 0 and not failures, failures

    send(12)
    world.land_with_cli()
    kafscale_broker.kill()  # SIGKILL: nothing acknowledged is lost, since every acknowledged produce was flushed
    kafscale_broker.start()
    send(13)  # the same producer, reconnected
    with EtcdClient([world.etcd_endpoint]) as etcd:
        watermarks = {p: int(etcd.get(broker_next_offset_key(world.topic, p))) for p in range(PARTITIONS)}
    assert watermarks == {p: 1 + max(a.offset for a in acked if a.partition == p) for p in range(PARTITIONS)}
    world.land_with_cli()
    world.assert_lands(acked, runs=2)


def test_a_topic_deleted_and_created_again_continues_after_the_old_offsets(broker_world, kafscale_broker):
    """KafScale keeps a deleted topic's segments and its log: created again, the topic's offsets go on from the old
    ones (its TopicID, a hash of the name, is the same too), and the table holds the old and the new records, each
    offset once."""
    world = broker_world()
    acked = produce(world.bootstrap, world.topic, records(30, PARTITIONS, seed=14), compression="snappy")
    world.land_with_cli()
    client = admin(world.bootstrap)
    client.delete_topics([world.topic])[world.topic].result(30)
    with EtcdClient([world.etcd_endpoint]) as etcd:
        assert etcd.get(broker_next_offset_key(world.topic, 0)) is None, "the broker dropped the watermarks"

    client.create_topics([NewTopic(world.topic, 2, 1)])[world.topic].result(30)
    again = produce(world.bootstrap, world.topic, records(20, 2, seed=15), compression="snappy")
    old_ends = {p: max(a.offset for a in acked if a.partition == p) for p in (0, 1)}
    assert all(a.offset > old_ends[a.partition] for a in again), "offsets continue after the old ones"
    world.land_with_cli()
    world.assert_lands(acked + again, runs=2)
