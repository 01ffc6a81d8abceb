"""Discovery modes auto | etcd | s3 against the real etcd and SeaweedFS (docs/kafscale-format.md §6)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from kafscale_lakehouse.etcd import EtcdClient, EtcdUnavailableError
from kafscale_lakehouse.storage import (
    METADATA_SNAPSHOT_KEY,
    Discovery,
    DiscoveryMode,
    MetadataSnapshotError,
    discover_partitions,
)
from kafscale_lakehouse_tests.storage.conftest import write_segments
from kafscale_lakehouse_tests.support.servers import free_ports

# What a broker writes: Go field names, null slices, an unhealthy topic and an unhealthy partition.
SNAPSHOT = {
    "Brokers": [{"NodeID": 0, "Host": "kafscale-broker-0", "Port": 9092, "Rack": None}],
    "ControllerID": 0,
    "Topics": [
        {"ErrorCode": 0, "Name": "orders", "TopicID": [0] * 16, "IsInternal": False,
         "Partitions": [{"ErrorCode": 0, "PartitionIndex": 0, "LeaderID": 0, "ReplicaNodes": None},
                        {"ErrorCode": 9, "PartitionIndex": 1, "LeaderID": -1, "ReplicaNodes": None},
                        {"ErrorCode": 0, "PartitionIndex": 2, "LeaderID": 0, "ReplicaNodes": [0]}]},
        {"ErrorCode": 3, "Name": "deleted-topic", "TopicID": None, "IsInternal": False,
         "Partitions": [{"ErrorCode": 0, "PartitionIndex": 0}]},
        {"ErrorCode": 0, "Name": "weird.topic-name_1", "TopicID": None, "IsInternal": False, "Partitions": None},
        {"ErrorCode": 0, "Name": "payments", "TopicID": None, "IsInternal": False,
         "Partitions": [{"ErrorCode": 0, "PartitionIndex": 4}]},
    ],
    "ClusterName": "kafscale",
    "ClusterID": "test-cluster",
}


@pytest.fixture
def etcd(private_etcd):
    client = EtcdClient([private_etcd.endpoint], timeout_seconds=2, retry_seconds=2)
    client.delete(METADATA_SNAPSHOT_KEY)
    yield client
    client.close()


@pytest.fixture
def s3_with_segments(s3_store):
    """S3 holds topics the snapshot calls unhealthy, and misses some it calls healthy: the sources differ."""
    for topic, partition in [("orders", 0), ("orders", 1), ("deleted-topic", 0), ("s3-only", 3)]:
        write_segments(s3_store, topic, partition, [0])
    return s3_store


def test_etcd_mode_keeps_only_healthy_topics_and_partitions(etcd, s3_with_segments):
    etcd.put(METADATA_SNAPSHOT_KEY, json.dumps(SNAPSHOT).encode())
    before = s3_with_segments.request_counts
    result = discover_partitions(DiscoveryMode.ETCD, s3_with_segments, etcd)
    assert result == Discovery(DiscoveryMode.ETCD, {"orders": [0, 2], "payments": [4]})
    assert s3_with_segments.request_counts - before == Counter()  # no S3 listing needed


def test_snapshot_keys_in_any_case(etcd, s3_with_segments):
    lowered = {"topics": [{"name": "orders", "errorcode": 0, "partitions": [{"partitionindex": 3}]}]}
    etcd.put(METADATA_SNAPSHOT_KEY, json.dumps(lowered).encode())
    assert discover_partitions(DiscoveryMode.AUTO, s3_with_segments, etcd).partitions == {"orders": [3]}


def test_auto_uses_the_snapshot_and_filters_to_the_mapped_topics(etcd, s3_with_segments):
    etcd.put(METADATA_SNAPSHOT_KEY, json.dumps(SNAPSHOT).encode())
    result = discover_partitions(DiscoveryMode.AUTO, s3_with_segments, etcd, topics=["orders", "absent"])
    assert result == Discovery(DiscoveryMode.ETCD, {"orders": [0, 2]})


def test_auto_falls_back_to_s3_when_the_snapshot_is_absent(etcd, s3_with_segments, caplog):
    with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.storage.discovery"):
        result = discover_partitions(DiscoveryMode.AUTO, s3_with_segments, etcd)
    assert result == Discovery(DiscoveryMode.S3, {"deleted-topic": [0], "orders": [0, 1], "s3-only": [3]})
    assert f"{METADATA_SNAPSHOT_KEY} in etcd at {etcd.endpoints[0]} does not exist" in caplog.text


def test_etcd_mode_without_a_snapshot_is_an_error(etcd, s3_with_segments):
    with pytest.raises(MetadataSnapshotError, match=f"{METADATA_SNAPSHOT_KEY} in etcd at {etcd.endpoints[0]} does "
                                                    "not exist"):
        discover_partitions(DiscoveryMode.ETCD, s3_with_segments, etcd)


def test_malformed_snapshot_fails_etcd_mode_and_auto_falls_back(etcd, s3_with_segments, caplog):
    etcd.put(METADATA_SNAPSHOT_KEY, b'{"Topics": [{"Name": "orders", "ErrorCode": "none"}]}')
    with pytest.raises(MetadataSnapshotError, match=r"Topics\[0\]\.ErrorCode"):
        discover_partitions(DiscoveryMode.ETCD, s3_with_segments, etcd)
    with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.storage.discovery"):
        result = discover_partitions(DiscoveryMode.AUTO, s3_with_segments, etcd, topics=["orders"])
    assert result == Discovery(DiscoveryMode.S3, {"orders": [0, 1]})
    assert "Topics[0].ErrorCode" in caplog.text


def test_s3_mode_lists_only_the_mapped_topics(etcd, s3_with_segments):
    etcd.put(METADATA_SNAPSHOT_KEY, json.dumps(SNAPSHOT).encode())  # ignored in s3 mode
    before = s3_with_segments.request_counts
    result = discover_partitions(DiscoveryMode.S3, s3_with_segments, etcd, topics=["orders", "absent"])
    assert result == Discovery(DiscoveryMode.S3, {"orders": [0, 1]})
    assert s3_with_segments.request_counts - before == Counter(list=2)  # one partition listing per topic
    everything = discover_partitions(DiscoveryMode.S3, s3_with_segments)
    assert everything.partitions == {"deleted-topic": [0], "orders": [0, 1], "s3-only": [3]}


def test_auto_without_etcd_is_s3_and_etcd_mode_needs_endpoints(s3_with_segments):
    assert discover_partitions(DiscoveryMode.AUTO, s3_with_segments).source is DiscoveryMode.S3
    with pytest.raises(ValueError, match="discovery mode etcd needs an etcd client"):
        discover_partitions(DiscoveryMode.ETCD, s3_with_segments)


def test_unreachable_etcd(s3_with_segments, caplog):
    [port] = free_ports(1)
    client = EtcdClient([f"127.0.0.1:{port}"], timeout_seconds=0.5, retry_seconds=0.5)
    try:
        with pytest.raises(EtcdUnavailableError, match=f"127.0.0.1:{port}"):
            discover_partitions(DiscoveryMode.ETCD, s3_with_segments, client)
        with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.storage.discovery"):
            result = discover_partitions(DiscoveryMode.AUTO, s3_with_segments, client, topics=["s3-only"])
        assert result == Discovery(DiscoveryMode.S3, {"s3-only": [3]})
        assert f"etcd unreachable at http://127.0.0.1:{port}" in caplog.text
    finally:
        client.close()


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("mode", [DiscoveryMode.ETCD, DiscoveryMode.AUTO])
@pytest.mark.parametrize("fixture", ["metadata_snapshot_v1.5.0.json", "metadata_snapshot_main.json"])
def test_both_broker_snapshot_shapes(etcd, s3_with_segments, caplog, fixture, mode):
    """A v1.5.0 broker and a broker built from KafScale main: the same healthy topics and partitions, no warning."""
    etcd.put(METADATA_SNAPSHOT_KEY, (FIXTURES / fixture).read_bytes())
    with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.storage.discovery"):
        result = discover_partitions(mode, s3_with_segments, etcd)
        mapped = discover_partitions(mode, s3_with_segments, etcd, topics=["orders", "deleted-topic"])
    assert result == Discovery(DiscoveryMode.ETCD, {"orders": [0, 2], "payments": [4]})
    assert mapped == Discovery(DiscoveryMode.ETCD, {"orders": [0, 2]})
    assert caplog.records == []


@pytest.mark.parametrize("mode", [DiscoveryMode.ETCD, DiscoveryMode.AUTO])
def test_a_snapshot_without_topics_while_s3_has_some_is_a_warning_naming_its_keys(etcd, s3_with_segments, caplog,
                                                                                   mode):
    # A shape we do not know: the Go processor (and we, before) found nothing and said nothing.
    unknown = {"Brokers": [], "Topics": [{"TopicName": "orders", "Parts": [{"Id": 0}]}], "ClusterID": "c"}
    etcd.put(METADATA_SNAPSHOT_KEY, json.dumps(unknown).encode())
    with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.storage.discovery"):
        result = discover_partitions(mode, s3_with_segments, etcd, topics=["orders"])
    assert result == Discovery(DiscoveryMode.ETCD, {})  # as Go: the snapshot is the truth, no fallback to S3
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert f"{METADATA_SNAPSHOT_KEY} in etcd at {etcd.endpoints[0]} lists no healthy topic" in message
    assert "holds 3 (deleted-topic, orders, s3-only)" in message
    assert "top level ['Brokers', 'ClusterID', 'Topics'], topics ['Parts', 'TopicName'], partitions []" in message


def test_an_empty_snapshot_with_an_empty_store_is_quiet(etcd, s3_store, caplog):
    etcd.put(METADATA_SNAPSHOT_KEY, b'{"Brokers": null, "Topics": null}')
    with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.storage.discovery"):
        assert discover_partitions(DiscoveryMode.ETCD, s3_store, etcd).partitions == {}
    assert caplog.records == []
