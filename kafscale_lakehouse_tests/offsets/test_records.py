"""Pure unit tests of the key layout and the Go-compatible JSON values (no servers)."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.offsets.errors import CorruptOffsetRecordError, OffsetRegressionError
from kafscale_lakehouse.offsets.records import (
    CommittedOffset,
    OffsetKeys,
    decode_broker_watermarks,
    decode_offset,
    decode_partition_offsets,
    encode_lease,
    encode_offset,
    plan_offset_writes,
    validate_partition,
    validate_topic,
)

KEYS = OffsetKeys("processors")


def test_keys_follow_the_go_processor_layout():
    assert KEYS.lease("orders", 3) == "processors/leases/orders/3"
    assert KEYS.offset("orders", 3) == "processors/offsets/orders/3"
    assert KEYS.partition_watermark("orders", 3) == "processors/watermarks/orders/3"
    assert KEYS.topic_watermark("orders") == "processors/watermarks/orders"


def test_values_are_compact_json_in_go_field_order():
    assert encode_offset(CommittedOffset(42, 1234, 1700000000000)) == (
        b'{"offset":42,"last_timestamp_ms":1234,"updated_at":1700000000000}')
    assert encode_lease("worker-a", 1700000030000) == (
        b'{"owner_id":"worker-a","lease_expires_at":1700000030000,"generation":1}')


def test_owner_ids_are_escaped_like_go_encoding_json():
    # Go's HTML-safe escapes, raw non-ASCII
    assert encode_lease('pod<1>&"é"\u2028', 5) == (
        '{"owner_id":"pod\\u003c1\\u003e\\u0026\\"é\\"\\u2028","lease_expires_at":5,"generation":1}'.encode())


def test_decoding_accepts_go_bytes_and_treats_missing_fields_as_zero_like_go():
    assert decode_offset("loc", "k", b'{"offset":7,"last_timestamp_ms":9,"updated_at":11}') == CommittedOffset(7, 9, 11)
    assert decode_offset("loc", "k", b'{"offset":7}') == CommittedOffset(7, 0, 0)


@pytest.mark.parametrize("value", [b"not json", b"[1]", b'{"offset":"7"}', b'{"offset":true}', b"\xff"])
def test_corrupt_values_name_location_and_key(value):
    with pytest.raises(CorruptOffsetRecordError, match=r"^etcd http://h:1: processors/offsets/orders/0: "):
        decode_offset("etcd http://h:1", "processors/offsets/orders/0", value)


def test_a_non_numeric_partition_key_is_an_error_not_skipped():
    entries = [("processors/offsets/orders/0", encode_offset(CommittedOffset(1, 0, 0))),
               ("processors/offsets/orders/x", encode_offset(CommittedOffset(1, 0, 0)))]
    with pytest.raises(CorruptOffsetRecordError, match="processors/offsets/orders/x"):
        decode_partition_offsets("loc", "processors/offsets/orders/", entries)


def test_broker_watermarks_read_next_offset_keys_only():
    entries = [
        ("/kafscale/topics/orders/partitions/0", b"\x08\x01protobuf-partition-state"),
        ("/kafscale/topics/orders/partitions/0/next_offset", b"120"),
        ("/kafscale/topics/orders/partitions/11/next_offset", b"7"),
    ]
    assert decode_broker_watermarks("loc", "orders", entries) == {0: 120, 11: 7}
    with pytest.raises(CorruptOffsetRecordError, match="partitions/2/next_offset"):
        decode_broker_watermarks("loc", "orders", [("/kafscale/topics/orders/partitions/2/next_offset", b"-1x")])


def test_topic_watermark_is_the_first_minimum_in_etcd_key_order():
    # "10" sorts before "2" as etcd keys; on a tie Go keeps the first one it saw.
    existing = {2: CommittedOffset(5, 200, 1), 10: CommittedOffset(5, 100, 2), 3: CommittedOffset(9, 0, 3)}
    writes = plan_offset_writes("loc", KEYS, "orders", {3: (7, 60)}, committed={}, partition_watermarks=existing,
                                now_ms=99, allow_backwards=False)
    assert writes == {
        "processors/offsets/orders/3": b'{"offset":6,"last_timestamp_ms":60,"updated_at":99}',
        "processors/watermarks/orders/3": b'{"offset":6,"last_timestamp_ms":60,"updated_at":99}',
        "processors/watermarks/orders": b'{"offset":5,"last_timestamp_ms":100,"updated_at":2}',
    }


def test_plan_refuses_to_move_offsets_backwards_unless_repairing():
    committed = {0: CommittedOffset(10, 0, 0)}
    with pytest.raises(OffsetRegressionError, match="processors/offsets/orders/0 holds offset 10"):
        plan_offset_writes("loc", KEYS, "orders", {0: (5, 0)}, committed, {}, now_ms=1, allow_backwards=False)
    writes = plan_offset_writes("loc", KEYS, "orders", {0: (5, 0)}, committed, {}, now_ms=1, allow_backwards=True)
    assert writes["processors/offsets/orders/0"] == b'{"offset":4,"last_timestamp_ms":0,"updated_at":1}'


@pytest.mark.parametrize("topic", ["", "a/b"])
def test_topics_that_would_break_the_key_layout_are_rejected(topic):
    with pytest.raises(ValueError, match="topic"):
        validate_topic(topic)


@pytest.mark.parametrize("partition", [-1, True, "0"])
def test_partitions_must_be_non_negative_integers(partition):
    with pytest.raises(ValueError, match="partition"):
        validate_partition(partition)
