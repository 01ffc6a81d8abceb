"""Segment key parsing and building (docs/kafscale-format.md §1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale_lakehouse.storage import ObjectKind, SegmentKey, parse_segment_key, segment_key
from kafscale_lakehouse.storage.keys import namespace_prefix, parse_partition


@pytest.mark.parametrize(
    ("key", "namespace", "expected"),
    [
        ("default/orders/0/segment-00000000000000000042.kfs", "default",
         ("orders", 0, 42, ObjectKind.SEGMENT, True)),
        ("default/orders/3/segment-00000000000000000042.index", "default",
         ("orders", 3, 42, ObjectKind.INDEX, True)),
        ("orders/12/segment-7.index", "", ("orders", 12, 7, ObjectKind.INDEX, False)),
        ("prod/eu/weird.topic-name_1/7/segment-500.kfs", "prod/eu", ("weird.topic-name_1", 7, 500,
                                                                      ObjectKind.SEGMENT, False)),
        ("prod/orders/0/segment-9223372036854775807.kfs", "/prod/", ("orders", 0, 2**63 - 1,
                                                                     ObjectKind.SEGMENT, False)),
        ("default/t/2147483647/segment-0.kfs", "default", ("t", 2**31 - 1, 0, ObjectKind.SEGMENT, False)),
    ],
)
def test_parses_segment_and_index_keys(key, namespace, expected):
    parsed = parse_segment_key(key, namespace)
    assert parsed == SegmentKey(key, *expected)


@pytest.mark.parametrize(
    "key",
    [
        "default/manifest.json",
        "default/orders/manifest.json",
        "default/orders/0/segment-00000000000000000042.kfst",  # time-index sidecar
        "default/orders/0/segment-00000000000000000042.kfs.tmp",
        "default/orders/0/segment-00000000000000000042.tmp",
        "default/orders/0/segment-abc.kfs",
        "default/orders/0/segment-.kfs",
        "default/orders/0/segment--5.kfs",
        "default/orders/0/segment-+5.kfs",
        "default/orders/0/segment-1_000.kfs",
        "default/orders/0/segment-٣.kfs",  # non-ASCII digit
        "default/orders/0/segment-9223372036854775808.kfs",  # beyond int64
        "default/orders/-1/segment-00000000000000000042.kfs",
        "default/orders/01/segment-00000000000000000042.kfs",  # not how the broker writes partition 1
        "default/orders/2147483648/segment-00000000000000000042.kfs",
        "default/orders/x/segment-00000000000000000042.kfs",
        "default//0/segment-00000000000000000042.kfs",
        "default/orders/0/extra/segment-00000000000000000042.kfs",
        "other/orders/0/segment-00000000000000000042.kfs",  # different namespace
        "defaultx/orders/0/segment-00000000000000000042.kfs",
        "default/orders/0/Segment-00000000000000000042.kfs",
        "default/orders/0/segment-00000000000000000042.KFS",
    ],
)
def test_ignores_everything_else(key):
    assert parse_segment_key(key, "default") is None


def test_empty_namespace_keys_start_at_the_topic():
    assert parse_segment_key("default/orders/0/segment-1.kfs", "") is None  # four parts: not a segment key
    assert parse_segment_key("orders/0/segment-1.kfs", "").topic == "orders"
    assert namespace_prefix("") == namespace_prefix("/") == ""
    assert segment_key("", "orders", 0, 1, ObjectKind.SEGMENT) == "orders/0/segment-00000000000000000001.kfs"


def test_builder_writes_padded_keys():
    assert (segment_key("default", "weird.topic-name_1", 7, 500, ObjectKind.INDEX)
            == "default/weird.topic-name_1/7/segment-00000000000000000500.index")


@pytest.mark.parametrize(
    ("topic", "partition", "base"),
    [("", 0, 0), ("a/b", 0, 0), ("t", -1, 0), ("t", 2**31, 0), ("t", 0, -1), ("t", 0, 2**63)],
)
def test_builder_rejects_values_that_cannot_round_trip(topic, partition, base):
    with pytest.raises(ValueError):
        segment_key("default", topic, partition, base, ObjectKind.SEGMENT)


@given(
    namespace=st.sampled_from(["", "default", "prod/eu"]),
    topic=st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=40),
    partition=st.integers(0, 2**31 - 1),
    base=st.integers(0, 2**63 - 1),
    kind=st.sampled_from(ObjectKind),
)
def test_built_keys_parse_back(namespace, topic, partition, base, kind):
    key = segment_key(namespace, topic, partition, base, kind)
    assert parse_segment_key(key, namespace) == SegmentKey(key, topic, partition, base, kind, True)


def test_partition_directory_names():
    assert [parse_partition(text) for text in ["0", "7", "2147483647", "00", "-1", "+1", "1a", ""]] == [
        0, 7, 2**31 - 1, None, None, None, None, None]
