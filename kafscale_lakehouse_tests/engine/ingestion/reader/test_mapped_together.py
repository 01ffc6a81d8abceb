"""The records of consecutive small segments are mapped (coerced, validated) together, up to
`segment_reader.MAPPED_TOGETHER_BYTES`: mapping costs a fixed ~1 ms per batch, as much as the 40 records of a segment
of realistic traffic. What is delivered, and where a failing segment stops the read, stay what they were."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kafscale_lakehouse.engine.ingestion import segment_reader
from kafscale_lakehouse.engine.ingestion.segment_reader import SegmentReadError, read_input_partition
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import (
    PIZZA_COLUMNS,
    ReadRequest,
    corrupt_segment,
    write_pizza_segments,
)


def read_batches(store, request: ReadRequest) -> list[pa.RecordBatch]:
    [partition] = request.plan(store).input_partitions
    return list(read_input_partition(store, partition, request.columns))


def test_small_segments_are_mapped_in_one_batch_with_the_same_rows_as_one_by_one(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [40] * 13)  # every codec, 40 records each, as a segment per 10 s
    request = ReadRequest(starting={0: 15}, columns=PIZZA_COLUMNS)

    together = read_batches(local_store, request)
    monkeypatch.setattr(segment_reader, "MAPPED_TOGETHER_BYTES", 1)  # each segment mapped alone, as before
    one_by_one = read_batches(local_store, request)

    assert len(together) == 1 and len(one_by_one) == 13  # 13 mappings before
    assert pa.Table.from_batches(together).equals(pa.Table.from_batches(one_by_one))
    assert together[0].column("offset").to_pylist() == list(range(15, 520))
    assert together[0].column("store_id").null_count == 0  # the values were mapped, not only carried


def test_segments_beyond_the_mapping_budget_are_mapped_in_several_batches(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [40] * 6, codecs=["none"])
    request = ReadRequest(starting={0: None}, columns=PIZZA_COLUMNS)
    [partition] = request.plan(local_store).input_partitions
    one_segment = segment_reader.fetch_segment_records(local_store, partition.segments[0], partition.offsets)
    monkeypatch.setattr(segment_reader, "MAPPED_TOGETHER_BYTES", one_segment.records.nbytes * 3 // 2)

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
