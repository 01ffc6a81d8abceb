"""The records of consecutive small segments are decoded and mapped (coerced, validated) together, up to
`segment_reader.DECODED_TOGETHER_BYTES`: decoding costs a fixed ~2 ms per call and mapping ~1 ms per batch, as much as
the 40 records of a segment of realistic traffic. What is delivered, and where a failing segment stops the read, stay
what they were."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kafscale_lakehouse.engine.ingestion import segment_reader
from kafscale_lakehouse.engine.ingestion.segment_reader import SegmentReadError, read_input_partition
from kafscale_lakehouse.format import BadRecordError, decode_segment
from kafscale_lakehouse.storage import ObjectKind, segment_key
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import (
    PIZZA_COLUMNS,
    TOPIC,
    ReadRequest,
    corrupt_segment,
    write_pizza_segments,
)
from kafscale_lakehouse_tests.format.segment_surgery import FIRST_RECORDS, reseal


def read_batches(store, request: ReadRequest) -> list[pa.RecordBatch]:
    [partition] = request.plan(store).input_partitions
    return list(read_input_partition(store, partition, request.columns))


def test_small_segments_are_mapped_in_one_batch_with_the_same_rows_as_one_by_one(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [40] * 13)  # every codec, 40 records each, as a segment per 10 s
    request = ReadRequest(starting={0: 15}, columns=PIZZA_COLUMNS)

    together = read_batches(local_store, request)
    monkeypatch.setattr(segment_reader, "DECODED_TOGETHER_BYTES", 1)  # each segment alone, as before
    one_by_one = read_batches(local_store, request)

    assert len(together) == 1 and len(one_by_one) == 13  # 13 mappings before
    assert pa.Table.from_batches(together).equals(pa.Table.from_batches(one_by_one))
    assert together[0].column("offset").to_pylist() == list(range(15, 520))
    assert together[0].column("store_id").null_count == 0  # the values were mapped, not only carried


def test_small_segments_are_decoded_in_one_pass(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [40] * 13)
    passes = []

    def counted(runs):
        passes.append(len(runs))
        return decode_framed(runs)

    decode_framed = segment_reader.decode_framed
    monkeypatch.setattr(segment_reader, "decode_framed", counted)
    batches = read_batches(local_store, ReadRequest(starting={0: 15}, columns=PIZZA_COLUMNS))

    assert passes == [13]  # one decode of the 13 segments' records, not one per segment
    assert [o for batch in batches for o in batch.column("offset").to_pylist()] == list(range(15, 520))


def test_segments_beyond_the_mapping_budget_are_mapped_in_several_batches(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [40] * 6, codecs=["none"])
    request = ReadRequest(starting={0: None}, columns=PIZZA_COLUMNS)
    [partition] = request.plan(local_store).input_partitions
    one_segment = segment_reader.fetch_segment(local_store, partition.segments[0], partition.offsets)
    monkeypatch.setattr(segment_reader, "DECODED_TOGETHER_BYTES", len(one_segment.framed.records) * 3 // 2)

    batches = read_batches(local_store, request)

    assert [batch.num_rows for batch in batches] == [80, 80, 80]  # two segments reach the budget


def test_a_corrupt_segment_delivers_the_records_mapped_together_before_it_then_stops(local_store):
    write_pizza_segments(local_store, 0, [40] * 5)
    bad_key = corrupt_segment(local_store, 0, 120)
    [partition] = ReadRequest(starting={0: None}).plan(local_store).input_partitions
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, partition, PIZZA_COLUMNS))

    assert [o for batch in delivered for o in batch.column("offset").to_pylist()] == list(range(120))
    assert delivered[0].column("order_id").null_count == 0
    assert (raised.value.failure.kfs_key, raised.value.failure.next_offset) == (bad_key, 120)


def resealed_with(store, base_offset: int, position: int, change) -> str:
    """The uncompressed segment at `base_offset` with byte `position` changed by `change`, CRCs resealed (the fault
    is found only when its records are decoded); returns its `.kfs` key."""
    key = segment_key(store.namespace, TOPIC, 0, base_offset, ObjectKind.SEGMENT)
    path = store.root / key
    data = bytearray(path.read_bytes())
    data[position] = change(data[position])
    path.write_bytes(reseal(data))
    return key


def test_a_record_that_does_not_decode_stops_the_read_at_its_segment_after_those_decoded_with_it(local_store):
    write_pizza_segments(local_store, 0, [40] * 5, codecs=["none"])
    # the first record's length varint (two bytes: records are longer than 63 bytes) made negative
    bad_key = resealed_with(local_store, 80, FIRST_RECORDS, lambda b: b | 1)
    with pytest.raises(BadRecordError):
        decode_segment((local_store.root / bad_key).read_bytes(), key=bad_key, topic=TOPIC, partition=0)
    [partition] = ReadRequest(starting={0: None}).plan(local_store).input_partitions
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, partition, PIZZA_COLUMNS))

    assert [o for batch in delivered for o in batch.column("offset").to_pylist()] == list(range(80))
    failure = raised.value.failure
    assert (failure.kfs_key, failure.key, failure.error_type, failure.next_offset) == (
        bad_key, bad_key, "BadRecordError", 80)


def test_a_fault_checked_late_in_an_earlier_segment_stops_the_read_before_a_fault_found_first_in_a_later_one(
        local_store):
    write_pizza_segments(local_store, 0, [40] * 5, codecs=["none"])
    # segment 40: its first record's offset delta (after a 2-byte length, the attributes and a 1-byte timestamp
    # delta) 0 -> 1, so its second record's offset repeats: found after every record's fields are decoded
    early_key = resealed_with(local_store, 40, FIRST_RECORDS + 4, lambda b: 0x02)
    # segment 120: a negative record length, found by the first walk over the records
    resealed_with(local_store, 120, FIRST_RECORDS, lambda b: b | 1)
    [partition] = ReadRequest(starting={0: None}).plan(local_store).input_partitions
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, partition, PIZZA_COLUMNS))

    assert [o for batch in delivered for o in batch.column("offset").to_pylist()] == list(range(40))
    assert (raised.value.failure.kfs_key, raised.value.failure.next_offset) == (early_key, 40)
    assert "record offset 41 is not above the previous record's" in raised.value.failure.message
