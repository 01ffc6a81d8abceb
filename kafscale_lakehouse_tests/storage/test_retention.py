"""Retention headroom and replay window (storage/retention.py) against both backends, and the topic config as
KafScale stores it in etcd (protobuf `TopicConfig`)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.storage import RetentionPolicy, TopicConfigError, topic_prefix, topic_retention
from kafscale_lakehouse.storage.retention import (
    parse_topic_config,
    partition_retention,
    read_partition_log,
    read_retention,
    topic_config_key,
)
from kafscale_lakehouse_tests.storage.conftest import write_segments

TOPIC = "orders"


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def topic_config(name: str = TOPIC, retention_ms: int | None = None, retention_bytes: int | None = None,
                 config: dict[str, str] | None = None) -> bytes:
    raw = field(1, name.encode()) + field(2, 3) + field(3, 1)
    if retention_ms is not None:
        raw += field(4, retention_ms)
    if retention_bytes is not None:
        raw += field(5, retention_bytes)
    raw += field(6, 4 << 20) + field(7, b"2026-12-02T10:00:00Z")
    for key, value in (config or {}).items():
        raw += field(8, field(1, key.encode()) + field(2, value.encode()))
    return raw


def test_topic_config_fields_give_the_retention():
    assert parse_topic_config(topic_config(retention_ms=3_600_000, retention_bytes=1 << 30), "k") == \
        RetentionPolicy(3_600_000, 1 << 30)


def test_minus_one_and_zero_mean_unlimited():
    assert parse_topic_config(topic_config(retention_ms=-1, retention_bytes=0), "k") == RetentionPolicy(None, None)
    assert not parse_topic_config(topic_config(), "k").limited


def test_the_config_map_counts_where_a_typed_field_is_unset():
    raw = topic_config(retention_bytes=500, config={"retention.ms": "60000", "retention.bytes": "7"})
    assert parse_topic_config(raw, "k") == RetentionPolicy(60_000, 500)


def test_a_value_that_is_not_a_topic_config_names_the_key():
    with pytest.raises(TopicConfigError, match="etcd key /kafscale/topics/orders/config"):
        parse_topic_config(topic_config(retention_ms=5)[:-3] + b"\x82", f"etcd key {topic_config_key(TOPIC)}")
    with pytest.raises(TopicConfigError, match=r"retention\.ms is 'soon'"):
        parse_topic_config(topic_config(config={"retention.ms": "soon"}), "k")


def test_read_retention_from_etcd(etcd_server, unique_prefix):
    topic = f"{unique_prefix}-t"
    with EtcdClient([etcd_server.endpoint]) as etcd:
        assert read_retention(etcd, topic) == RetentionPolicy()  # no config stored: KafScale's default
        etcd.put(topic_config_key(topic), topic_config(topic, retention_ms=86_400_000))
        assert read_retention(etcd, topic) == RetentionPolicy(86_400_000, None)


def topic_objects(store) -> list:
    return list(store.list_objects(topic_prefix(store.namespace, TOPIC)))


def listed_at(store) -> object:
    return max(info.last_modified for info in topic_objects(store))


def test_headroom_counts_from_the_oldest_segment_holding_records_not_landed(store):
    write_segments(store, TOPIC, 0, [0, 10, 20])
    now = listed_at(store) + timedelta(seconds=100)
    log = read_partition_log(store, TOPIC, 0, 10, 30)
    assert [s.base_offset for s in log.pending] == [10, 20] and log.oldest.base_offset == 0
    found = partition_retention(0, log, 10, RetentionPolicy(retention_ms=3_600_000), now)
    assert found.at_risk_key.endswith("segment-00000000000000000010.kfs")
    assert 3490 < found.headroom_seconds <= 3500
    assert found.log_start_offset == 0 and found.replay_window_records == 10 and found.gap is None
    assert found.replay_window_seconds >= 100


def test_a_partition_with_everything_landed_has_nothing_at_risk(store):
    write_segments(store, TOPIC, 0, [0, 10, 20])
    now = listed_at(store)
    found = partition_retention(0, read_partition_log(store, TOPIC, 0, 30, 30), 30,
                                RetentionPolicy(retention_ms=1), now)
    assert found.headroom_seconds is None and found.gap is None and found.replay_window_records == 30


def test_a_next_offset_inside_a_segment_puts_that_segment_at_risk(store):
    write_segments(store, TOPIC, 0, [0, 10, 20])
    log = read_partition_log(store, TOPIC, 0, 15, 30)
    assert [s.base_offset for s in log.pending] == [10, 20]


def test_records_already_deleted_are_a_certain_gap(store):
    write_segments(store, TOPIC, 0, [10, 20])  # offsets 0..9 went before they landed
    found = partition_retention(0, read_partition_log(store, TOPIC, 0, 5, 30), 5, RetentionPolicy(), listed_at(store))
    assert found.gap is not None and "offsets 5..9 are not landed and no longer in the log" in found.gap


def test_past_retention_ms_is_a_certain_gap_and_unlimited_is_none(store):
    write_segments(store, TOPIC, 0, [0, 10])
    now = listed_at(store) + timedelta(hours=2)
    log = read_partition_log(store, TOPIC, 0, 0, 20)
    found = partition_retention(0, log, 0, RetentionPolicy(retention_ms=3_600_000), now)
    assert found.headroom_seconds < 0 and "past retention.ms 3600000" in found.gap
    assert partition_retention(0, log, 0, RetentionPolicy(), now).headroom_seconds is None


def test_retention_bytes_counts_the_newer_segments(store):
    write_segments(store, TOPIC, 0, [0, 10, 20, 30])
    sizes = {info.key: info.size for info in topic_objects(store) if info.key.endswith(".kfs")}
    size = next(iter(sizes.values()))
    log = read_partition_log(store, TOPIC, 0, 10, 40)
    roomy = partition_retention(0, log, 10, RetentionPolicy(retention_bytes=3 * size), listed_at(store))
    assert roomy.headroom_bytes == size and roomy.gap is None
    full = partition_retention(0, log, 10, RetentionPolicy(retention_bytes=2 * size), listed_at(store))
    assert full.headroom_bytes == 0 and "over retention.bytes" in full.gap


def test_nothing_committed_puts_the_oldest_segment_at_risk(store):
    write_segments(store, TOPIC, 0, [40, 50])
    found = partition_retention(0, read_partition_log(store, TOPIC, 0, None, None), None,
                                RetentionPolicy(retention_ms=10_000_000), listed_at(store))
    assert found.at_risk_key.endswith("segment-00000000000000000040.kfs") and found.gap is None
    assert found.replay_window_records is None


def test_topic_retention_without_etcd_is_unlimited(store):
    write_segments(store, TOPIC, 0, [0])
    write_segments(store, TOPIC, 1, [0, 10])
    found = topic_retention(store, None, TOPIC, {0: (10, 10), 1: (10, None)}, listed_at(store))
    assert found.policy == RetentionPolicy()
    assert found.partitions[0].headroom_seconds is None and found.partitions[1].at_risk_key is not None
    assert found.gaps == {}


def test_a_batch_lists_nothing_of_a_topic_with_unlimited_retention(store, monkeypatch):
    write_segments(store, TOPIC, 0, [0, 10])
    now = listed_at(store)
    listed: list[str] = []
    list_objects = type(store).list_objects
    monkeypatch.setattr(type(store), "list_objects",
                        lambda self, prefix, **kw: listed.append(prefix) or list_objects(self, prefix, **kw))
    found = topic_retention(store, None, TOPIC, {0: (0, 20)}, now, list_unlimited=False)
    assert found.partitions == {} and listed == []
