"""Parsing the broker's `/kafscale/metadata/snapshot` (Go struct JSON without tags), pure logic."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kafscale_lakehouse.storage import DiscoveryMode, MetadataSnapshotError, parse_metadata_snapshot
from kafscale_lakehouse.storage.discovery import snapshot_keys


def snapshot(*topics: dict, **extra) -> bytes:
    document = {"Brokers": [{"NodeID": 0, "Host": "broker-0", "Port": 9092, "Rack": None}], "ControllerID": 0,
                "Topics": list(topics), "ClusterName": "kafscale", "ClusterID": "c-1", **extra}
    return json.dumps(document).encode()


def topic(name: str, *partitions: dict, error_code: int = 0) -> dict:
    return {"ErrorCode": error_code, "Name": name, "TopicID": list(range(16)), "IsInternal": False,
            "Partitions": list(partitions)}


def partition(index: int, error_code: int = 0) -> dict:
    return {"ErrorCode": error_code, "PartitionIndex": index, "LeaderID": 0, "LeaderEpoch": 0,
            "ReplicaNodes": [0], "ISRNodes": [0], "OfflineReplicas": None}


def test_healthy_topics_and_partitions_only():
    raw = snapshot(
        topic("orders", partition(1), partition(0)),
        topic("bad-topic", partition(0), error_code=3),
        topic("payments", partition(2, error_code=2), partition(3)),
        topic("all-partitions-down", partition(0, error_code=5)),
    )
    assert parse_metadata_snapshot(raw) == {"orders": [0, 1], "payments": [3]}


def test_null_slices_are_empty():
    raw = snapshot(topic("orders", partition(0)), {"ErrorCode": 0, "Name": "no-partitions", "Partitions": None})
    assert parse_metadata_snapshot(raw) == {"orders": [0]}
    assert parse_metadata_snapshot(json.dumps({"Brokers": None, "Topics": None}).encode()) == {}
    assert parse_metadata_snapshot(b"null") == {}
    assert parse_metadata_snapshot(json.dumps({"Topics": [None, topic("t", partition(4))]}).encode()) == {"t": [4]}


def test_field_names_match_ignoring_case():
    raw = json.dumps({"topics": [{"name": "orders", "errorCode": 0,
                                  "partitions": [{"partitionIndex": 2}, {"PARTITIONINDEX": 5, "errorcode": 1}]}]})
    assert parse_metadata_snapshot(raw.encode()) == {"orders": [2]}


def test_last_matching_key_wins_like_go():
    raw = '{"Topics": [{"Name": "stale", "Partitions": [{"PartitionIndex": 0}]}], "topics": [' \
          '{"Name": "fresh", "Partitions": [{"PartitionIndex": 1}]}]}'
    assert parse_metadata_snapshot(raw.encode()) == {"fresh": [1]}


def test_missing_fields_take_go_zero_values():
    # No ErrorCode means healthy; no PartitionIndex means partition 0.
    assert parse_metadata_snapshot(b'{"Topics": [{"Name": "t", "Partitions": [{}]}]}') == {"t": [0]}


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "the snapshot is list"),
        (b'{"Topics": {"Name": "t"}}', "Topics is dict"),
        (b'{"Topics": [{"Name": 5}]}', "Topics[0].Name is int"),
        (b'{"Topics": [{"Name": "t", "ErrorCode": "0"}]}', "Topics[0].ErrorCode"),
        (b'{"Topics": [{"Name": "t", "ErrorCode": 70000}]}', "Topics[0].ErrorCode"),
        (b'{"Topics": [{"Name": "t", "Partitions": [{"PartitionIndex": 1.5}]}]}', "Topics[0].Partitions[0].Part"),
        (b'{"Topics": [{"Name": "t", "Partitions": [{"PartitionIndex": true}]}]}', "Topics[0].Partitions[0].Part"),
        (b'{"Topics": [{"Name": "t", "Partitions": [3]}]}', "Topics[0].Partitions[0] is int"),
    ],
)
def test_malformed_snapshots_name_the_key_and_field(raw, path):
    with pytest.raises(MetadataSnapshotError) as raised:
        parse_metadata_snapshot(raw, "/kafscale/metadata/snapshot in etcd at http://127.0.0.1:2379")
    message = str(raised.value)
    assert message.startswith("/kafscale/metadata/snapshot in etcd at http://127.0.0.1:2379")
    assert path in message


def test_discovery_mode_parses_like_the_go_processor():
    assert DiscoveryMode.parse("") is DiscoveryMode.AUTO
    assert DiscoveryMode.parse("ETCD") is DiscoveryMode.ETCD
    assert DiscoveryMode.parse(" s3 ") is DiscoveryMode.S3
    with pytest.raises(ValueError, match=r"discovery mode 'kafka'"):
        DiscoveryMode.parse("kafka")


FIXTURES = Path(__file__).parent / "fixtures"
# Both broker shapes (docs/kafscale-format.md §6) hold the same cluster: an unhealthy topic, an unhealthy partition, a
# topic without partitions and (main only) a topic whose name is null.
SNAPSHOT_FIXTURES = ["metadata_snapshot_v1.5.0.json", "metadata_snapshot_main.json"]


@pytest.mark.parametrize("fixture", SNAPSHOT_FIXTURES)
def test_both_broker_shapes_give_the_healthy_topics(fixture):
    assert parse_metadata_snapshot((FIXTURES / fixture).read_bytes()) == {"orders": [0, 2], "payments": [4]}


def test_franz_go_names_in_any_case_and_partition_zero():
    raw = b'{"topics": [{"TOPIC": "orders", "partitions": [{"partition": 0}, {"Partition": 7, "errorCode": 1}]}]}'
    assert parse_metadata_snapshot(raw) == {"orders": [0]}


def test_franz_go_name_wins_over_the_v1_5_name_when_both_are_there():
    raw = b'{"Topics": [{"Name": "old", "Topic": "new", "Partitions": [{"PartitionIndex": 5, "Partition": 0}]}]}'
    assert parse_metadata_snapshot(raw) == {"new": [0]}
    # A null franz-go name falls back to the v1.5.0 one; neither (or both null) is a topic Go skips.
    assert parse_metadata_snapshot(b'{"Topics": [{"Topic": null, "Name": "t", "Partitions": [{}]}]}') == {"t": [0]}
    assert parse_metadata_snapshot(b'{"Topics": [{"Topic": null, "Partitions": [{"Partition": 1}]}]}') == {}


@pytest.mark.parametrize("raw, path", [
    (b'{"Topics": [{"Topic": 5}]}', "Topics[0].Topic"),
    (b'{"Topics": [{"Topic": "t", "Partitions": [{"Partition": "0"}]}]}', "Topics[0].Partitions[0].Partition"),
    (b'{"Topics": [{"Topic": "t", "Partitions": [{"Partition": 2147483648}]}]}',
     "Topics[0].Partitions[0].Partition"),
])
def test_malformed_franz_go_fields_are_named(raw, path):
    with pytest.raises(MetadataSnapshotError, match=re.escape(path)):
        parse_metadata_snapshot(raw)


def test_snapshot_keys_names_what_was_found():
    raw = b'{"Cluster": 1, "Topics": [{"TopicName": "x", "Parts": [{"Id": 0}]}]}'
    assert parse_metadata_snapshot(raw) == {}
    assert snapshot_keys(raw) == "top level ['Cluster', 'Topics'], topics ['Parts', 'TopicName'], partitions []"
    keys = snapshot_keys((FIXTURES / "metadata_snapshot_main.json").read_bytes())
    assert "topics ['AuthorizedOperations', 'ErrorCode', 'IsInternal', 'Partitions', 'Topic'" in keys
    assert "'Leader'" in keys and "'Partition'" in keys
