"""Retention set through KafScale's broker (Kafka AlterConfigs) shows as headroom, and segments deleted as a
lifecycle rule deletes them (oldest first) as a certain gap (storage/retention.py)."""

from __future__ import annotations

import dagster as dg
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from kafscale_lakehouse.engine.ingestion import WatchSources, scan_retention, scan_topic
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.orchestration.checks import evaluate_retention_headroom
from kafscale_lakehouse.storage import RetentionPolicy, partition_prefix
from kafscale_lakehouse.storage.retention import read_retention
from kafscale_lakehouse_tests.real_broker.clients import produce, records
from kafscale_lakehouse_tests.real_broker.conftest import PARTITIONS
from kafscale_lakehouse_tests.support.servers import S3_BUCKET

pytestmark = pytest.mark.integration

DAY = 24 * 3600


def alter_topic(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    """Kafka's AlterConfigs (the broker serves no IncrementalAlterConfigs)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.alter_configs([ConfigResource(ResourceType.TOPIC, topic, set_config=configs)])
    for future in futures.values():
        future.result(30)


def check_now(world) -> dg.AssetCheckResult:
    sources = WatchSources.from_config(world.config())
    scan = scan_topic(sources, world.topic, table=world.table_name, lag_only=True)
    return evaluate_retention_headroom(*scan_retention(sources, world.topic, scan), warn_seconds=DAY)


def test_retention_set_through_the_broker_is_headroom_and_a_lifecycle_deletion_a_certain_gap(
        broker_world, kafscale_broker, broker_etcd, seaweedfs):
    world = broker_world("retained")
    produce(kafscale_broker.bootstrap, world.topic, records(30, PARTITIONS, seed=21), compression="lz4")
    world.land_with_cli()
    for seed in (22, 23):  # two produce requests: two segments per partition not landed
        produce(kafscale_broker.bootstrap, world.topic, records(30, PARTITIONS, seed=seed), compression="zstd")

    assert check_now(world).passed  # no retention set: KafScale's default is unlimited
    alter_topic(kafscale_broker.bootstrap, world.topic, {"retention.ms": "3600000"})
    with EtcdClient([broker_etcd.endpoint]) as etcd:
        assert read_retention(etcd, world.topic) == RetentionPolicy(retention_ms=3_600_000)

    short = check_now(world)
    assert not short.passed and short.severity == dg.AssetCheckSeverity.WARN, short.description
    assert f"partitions {list(range(PARTITIONS))} have less than {DAY} s" in short.description
    assert 3000 < short.metadata["min_headroom_seconds"].value <= 3600

    # A lifecycle rule deletes partition 0's oldest segments, up to the first one not landed.
    s3 = seaweedfs.s3_client()
    rows = {r.data["partition"]: r.data for r in short.metadata["retention_by_partition"].value.records}
    at_risk = rows[0]["at_risk_segment"]
    listed = s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=partition_prefix(kafscale_broker.namespace, world.topic, 0))
    doomed = sorted(o["Key"] for o in listed["Contents"] if o["Key"].endswith(".kfs") and o["Key"] <= at_risk)
    for key in doomed:
        s3.delete_objects(Bucket=S3_BUCKET, Delete={"Objects": [{"Key": key}, {"Key": key[:-4] + ".index"}]})

    gone = check_now(world)
    assert not gone.passed and gone.severity == dg.AssetCheckSeverity.ERROR, gone.description
    assert "partition 0: offsets" in gone.description and "are not landed and no longer in the log" in gone.description
    assert "partition 1" not in gone.description
