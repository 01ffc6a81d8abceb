"""The pizza workload is deterministic per record and lands as complete, contiguous KafScale segments."""

from __future__ import annotations

import json

from kafscale_lakehouse.apps.workload import (
    ALL_CODECS,
    PIZZA_TOPIC,
    pizza_order,
    pizza_orders,
    write_partition_segments,
)
from kafscale_lakehouse.format import check_index_matches_segment, decode_segment, go_headers_json, parse_index


def test_orders_are_deterministic_per_index_and_vary_with_seed_and_partition():
    assert pizza_orders(10, 5) == [pizza_order(index) for index in range(10, 15)]
    assert pizza_order(3) == pizza_order(3)
    assert pizza_order(3) != pizza_order(3, seed=1)
    assert pizza_order(3) != pizza_order(3, partition=1)
    assert len({pizza_order(index).value for index in range(200)}) == 200


def test_order_looks_like_the_classic_example():
    record = pizza_order(61)
    order = json.loads(record.value)
    assert list(order) == ["order_id", "store_id", "sauce", "cheese", "meats", "veggies", "date_ordered"]
    assert record.key == f"store-{order['store_id']}".encode()
    assert order["date_ordered"] == "2024-01-01 00:01:01"
    assert record.timestamp_ms == 1_704_067_200_000 + 61_000
    assert record.headers == (("source", b"pizza-svc"),)
    assert 150 <= len(record.value) <= 230


def test_writes_contiguous_complete_segments_with_a_codec_mix(tmp_path):
    written = write_partition_segments(tmp_path, record_count=2_345, partition=4, base_offset=100,
                                       records_per_segment=500, records_per_batch=64, index_interval=100)
    directory = tmp_path / "default" / PIZZA_TOPIC / "4"
    assert sorted(path.name for path in directory.iterdir()) == sorted(
        name for segment in written for name in (segment.kfs_path.name, segment.index_path.name))
    assert [segment.kfs_path.name for segment in written][:2] == ["segment-00000000000000000100.kfs",
                                                                   "segment-00000000000000000600.kfs"]
    assert [segment.codec for segment in written] == list(ALL_CODECS)
    next_offset = 100
    for segment in written:
        assert segment.base_offset == next_offset
        decoded = decode_segment(segment.kfs_path.read_bytes(), key=str(segment.kfs_path), topic=PIZZA_TOPIC,
                                 partition=4)
        check_index_matches_segment(parse_index(segment.index_path.read_bytes(), key=str(segment.index_path)),
                                    decoded.batches, index_key=str(segment.index_path))
        assert {batch.codec for batch in decoded.batches} == {segment.codec}
        expected = pizza_orders(segment.base_offset, segment.last_offset - segment.base_offset + 1, partition=4)
        assert decoded.records.column("value").to_pylist() == [record.value for record in expected]
        assert decoded.records.column("offset").to_pylist() == list(range(segment.base_offset,
                                                                          segment.last_offset + 1))
        next_offset = segment.last_offset + 1
    assert next_offset == 100 + 2_345


def test_empty_namespace_puts_the_topic_at_the_root(tmp_path):
    (segment,) = write_partition_segments(tmp_path, record_count=3, namespace="", topic="orders", codecs=["lz4"])
    assert segment.kfs_path == tmp_path / "orders" / "0" / "segment-00000000000000000000.kfs"


def test_realistic_orders_carry_unique_trace_headers_keys_and_mixed_value_sizes():
    records = pizza_orders(0, 4_000, partition=2, workload="realistic")
    assert records == pizza_orders(0, 4_000, partition=2, workload="realistic")
    assert [json.loads(record.value)["order_id"] for record in records[:3]] == [
        json.loads(record.value)["order_id"] for record in pizza_orders(0, 3, partition=2)]  # same orders
    assert len({record.key for record in records}) == len(records)
    assert {len(record.headers) for record in records} == {1, 2, 3}
    traceparents = [record.headers[0] for record in records]
    assert all(name == "traceparent" and len(value) == 55 and value.startswith(b"00-") for name, value in traceparents)
    assert len(set(traceparents)) == len(records)
    sizes = [len(record.value) for record in records]
    assert min(sizes) >= 150 and max(sizes) <= 100_000
    assert 0.03 < sum(size > 1_000 for size in sizes) / len(sizes) < 0.07
    assert sum(size > 10_000 for size in sizes) >= 5
    order = json.loads(records[0].value)
    assert list(order)[:7] == ["order_id", "store_id", "sauce", "cheese", "meats", "veggies", "date_ordered"]


def test_segments_of_the_realistic_workload_decode_to_its_records(tmp_path):
    (segment,) = write_partition_segments(tmp_path, record_count=300, records_per_segment=300, codecs=["zstd"],
                                          workload="realistic")
    decoded = decode_segment(segment.kfs_path.read_bytes(), key="k", topic=PIZZA_TOPIC, partition=0).records
    expected = pizza_orders(0, 300, workload="realistic")
    assert decoded.column("value").to_pylist() == [record.value for record in expected]
    assert decoded.column("headers").to_pylist() == [
        go_headers_json([(name.encode(), value) for name, value in record.headers]) for record in expected]
