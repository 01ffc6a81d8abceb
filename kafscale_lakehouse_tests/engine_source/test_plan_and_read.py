"""Planning and reading of segments in-process, where every request of the store can be observed.

The ingestion Spark job's tasks run the same `read_input_partition` in their Python workers (see
test_spark_ingestion.py).
"""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.config import ColumnConfig
from kafscale_lakehouse.engine.kafscale_source import (
    EARLIEST,
    INVALID_REASON_COLUMN,
    LATEST,
    MAX_ROWS_PER_BATCH,
    OffsetGapError,
    OffsetRange,
    OffsetRangeError,
    SegmentReadError,
    plan_read,
    read_input_partition,
)
from kafscale_lakehouse.format import CrcMismatchError, encode_segment, entry_for_offset, go_headers_json, parse_index
from kafscale_lakehouse.storage import LocalSegmentStore, ObjectKind, ObjectNotFoundError, S3SegmentStore, segment_key
from kafscale_lakehouse_tests.engine_source.conftest import (
    PIZZA_COLUMNS,
    TOPIC,
    ReadRequest,
    corrupt_segment,
    write_pizza_segments,
)


def assert_pizza_rows(table: pa.Table, partition: int, first: int, end: int) -> None:
    """The rows of `partition` are exactly orders first..end-1, byte for byte."""
    rows = table.filter(pc.equal(table["partition"], partition)).to_pylist()
    expected = pizza_orders(first, end - first, partition=partition)
    assert [row["offset"] for row in rows] == list(range(first, end))
    assert [row["record_id"] for row in rows] == [f"{TOPIC}:{partition}:{offset}" for offset in range(first, end)]
    assert [(row["key"], row["value"], row["timestamp_ms"], row["headers"]) for row in rows] == [
        (record.key, record.value, record.timestamp_ms,
         go_headers_json([(name.encode(), value) for name, value in record.headers])) for record in expected]


def segment_path(store, partition: int, base_offset: int, kind: ObjectKind):
    return store.root / segment_key(store.namespace, TOPIC, partition, base_offset, kind)


def test_exact_ranges_of_several_partitions_with_mixed_codecs_come_out_exactly(local_store):
    write_pizza_segments(local_store, 0, [100] * 5)  # none, gzip, snappy, lz4, zstd
    write_pizza_segments(local_store, 1, [60, 60, 60], first_offset=1000, codecs=["zstd", "lz4", "gzip"])
    write_pizza_segments(local_store, 2, [50, 50], codecs=["snappy"])
    options = ReadRequest(starting={0: 135, 1: 1000, 2: EARLIEST},
                          ending={0: 367, 1: 1130, 2: LATEST})

    plan = options.plan(local_store)
    table = options.read_all(local_store)

    assert plan.ranges == {0: OffsetRange(135, 367), 1: OffsetRange(1000, 1130), 2: OffsetRange(0, 100)}
    assert table.num_rows == (367 - 135) + 130 + 100
    assert_pizza_rows(table, 0, 135, 367)  # starts and ends mid-segment
    assert_pizza_rows(table, 1, 1000, 1130)
    assert_pizza_rows(table, 2, 0, 100)
    assert table[INVALID_REASON_COLUMN].null_count == table.num_rows


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_segments_below_the_range_are_not_fetched(request, store_kind):
    store = request.getfixturevalue(f"{store_kind}_store")
    write_pizza_segments(store, 0, [40] * 10)  # segments at 0, 40, ..., 360
    options = ReadRequest(starting={0: 265}, ending={0: 330})
    before = store.request_counts

    table = options.read_all(store)

    assert_pizza_rows(table, 0, 265, 330)
    used = store.request_counts - before
    # One key listing + one resumed listing; footers of the 3 segments holding 240..359 only; then the index and
    # one ranged read of segment 240 (265 is mid-way), and segments 280 and 320 whole.
    assert used == {"list": 2, "get": 3 + 2 + 2}
    if store_kind == "local":
        read_keys = {read.key for read in store.reads}
        for base in range(0, 240, 40):
            assert not {segment_key(store.namespace, TOPIC, 0, base, kind) for kind in ObjectKind} & read_keys


def test_start_mid_segment_range_reads_from_the_index_entry_at_or_before_it(local_store):
    [segment] = write_pizza_segments(local_store, 0, [100])
    entry = entry_for_offset(parse_index(segment.index, key="index"), 47)
    assert entry.position > 32 and entry.offset <= 47  # a later entry than the first batch

    table = ReadRequest(starting={0: 47}, ending={0: 90}).read_all(local_store)

    assert_pizza_rows(table, 0, 47, 90)
    kfs_key = segment_key(local_store.namespace, TOPIC, 0, 0, ObjectKind.SEGMENT)
    [kfs_read] = [read for read in local_store.reads if read.key == kfs_key and read.size > 16]
    assert kfs_read.byte_range == (entry.position, len(segment.kfs) - 1)
    assert kfs_read.size == len(segment.kfs) - entry.position < len(segment.kfs)


def test_start_within_the_first_index_interval_reads_the_whole_segment(local_store):
    [segment] = write_pizza_segments(local_store, 0, [100])

    table = ReadRequest(starting={0: 5}, ending={0: 100}).read_all(local_store)

    assert_pizza_rows(table, 0, 5, 100)
    kfs_key = segment_key(local_store.namespace, TOPIC, 0, 0, ObjectKind.SEGMENT)
    assert [read.size for read in local_store.reads if read.key == kfs_key and read.byte_range is None] == [
        len(segment.kfs)]


@pytest.mark.parametrize(("start", "end", "missing", "before_base"), [
    (150, 350, "200..299 missing", 300),  # gap inside the range
    (250, 350, "250..299 missing", 300),  # the range starts inside the gap
    (50, 150, "50..99 missing", 100),  # the range starts before the first segment
    (EARLIEST, LATEST, "200..299 missing", 300),
])
def test_a_gap_in_the_range_fails_naming_the_missing_offsets(local_store, start, end, missing, before_base):
    write_pizza_segments(local_store, 0, [100, 100, 100], first_offset=100)
    for kind in ObjectKind:
        segment_path(local_store, 0, 200, kind).unlink()

    with pytest.raises(OffsetGapError) as raised:
        ReadRequest(starting={0: start}, ending={0: end}).plan(local_store)

    assert missing in str(raised.value)
    assert f"topic {TOPIC} partition 0" in str(raised.value)
    [gap] = raised.value.gaps
    assert gap.kfs_key == segment_key(local_store.namespace, TOPIC, 0, before_base, ObjectKind.SEGMENT)
    assert f"before {gap.kfs_key}" in str(raised.value)


@pytest.mark.parametrize(("start", "end", "expected"), [
    (100, 200, OffsetRange(100, 200)),  # the gap is beyond the range
    (EARLIEST, 150, OffsetRange(100, 150)),
    (320, LATEST, OffsetRange(320, 400)),  # the gap is below the range
])
def test_a_gap_outside_the_range_does_not_matter(local_store, start, end, expected):
    write_pizza_segments(local_store, 0, [100, 100, 100], first_offset=100)
    for kind in ObjectKind:
        segment_path(local_store, 0, 200, kind).unlink()
    options = ReadRequest(starting={0: start}, ending={0: end})

    assert options.plan(local_store).ranges == {0: expected}
    assert_pizza_rows(options.read_all(local_store), 0, expected.start, expected.end)


def test_offsets_resolve_against_completed_segments_only(local_store):
    [_, last] = write_pizza_segments(local_store, 0, [50, 50])
    orphan = encode_segment(pizza_orders(100, 30), base_offset=100)  # its .index never arrives
    local_store.put(segment_key(local_store.namespace, TOPIC, 0, 100, ObjectKind.SEGMENT), orphan.kfs)
    def plan(starting, ending):
        return ReadRequest(starting=starting, ending=ending).plan(local_store)

    assert plan({}, {0: LATEST}).ranges == {0: OffsetRange(0, last.last_offset + 1)}
    assert plan({0: 100}, {0: LATEST}).ranges == {0: OffsetRange(100, 100)}  # nothing pending yet
    assert plan({0: 100}, {0: LATEST}).input_partitions == []
    assert plan({}, {5: LATEST}).ranges == {}  # a partition without segments
    with pytest.raises(OffsetRangeError, match=r"partition 0: ending offset 120 is beyond .* end at offset 100; "
                                               r"not complete: .*segment-00000000000000000100\.kfs: no \.index"):
        plan({0: 10}, {0: 120})
    # Beyond the in-flight segment nothing is known yet; once it completes, the next plan tells.
    assert plan({0: 150}, {0: LATEST}).ranges == {0: OffsetRange(150, 150)}
    write_pizza_segments(local_store, 1, [50])
    with pytest.raises(OffsetRangeError, match=r"partition 1: starting offset 80 is beyond .* \(50\)"):
        plan({1: 80}, {1: LATEST})
    with pytest.raises(OffsetRangeError, match=r"partition 5: no completed segment .* below the ending offset 10"):
        plan({}, {5: 10})


def test_input_partitions_are_runs_of_one_kafka_partition_up_to_max_bytes(local_store):
    segments = write_pizza_segments(local_store, 0, [40] * 6, codecs=["none"])
    write_pizza_segments(local_store, 1, [40])
    size = len(segments[0].kfs)
    options = ReadRequest(starting={0: 10}, ending={0: 230, 1: LATEST},
                          max_bytes_per_partition=int(size * 2.5))

    plan = options.plan(local_store)

    assert [(p.partition, p.offsets, [s.base_offset for s in p.segments]) for p in plan.input_partitions] == [
        (0, OffsetRange(10, 80), [0, 40]), (0, OffsetRange(80, 160), [80, 120]), (0, OffsetRange(160, 230), [160, 200]),
        (1, OffsetRange(0, 40), [0]),
    ]
    assert all(len(pickle.dumps(partition)) < 2048 for partition in plan.input_partitions)
    one_each = ReadRequest(ending={0: LATEST}, max_bytes_per_partition=1).plan(local_store)
    assert [len(p.segments) for p in one_each.input_partitions] == [1] * 6


def test_a_corrupt_segment_ends_the_read_with_an_error_naming_the_object_and_byte(local_store):
    write_pizza_segments(local_store, 0, [30] * 4)
    bad_key = corrupt_segment(local_store, 0, 60)
    [partition] = ReadRequest(ending={0: LATEST}).plan(local_store).input_partitions
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, partition, ()))

    assert sum(batch.num_rows for batch in delivered) == 60  # the segments before the corrupt one
    failure = raised.value.failure
    assert isinstance(raised.value.__cause__, CrcMismatchError) and raised.value.__cause__.key == bad_key
    assert (failure.kfs_key, failure.key, failure.error_type, failure.base_offset, failure.next_offset) == (
        bad_key, bad_key, "CrcMismatchError", 60, 60)
    assert failure.message.startswith(f"{bad_key} at byte {failure.position}:")
    assert f"CrcMismatchError: {bad_key} at byte " in str(raised.value)
    assert pickle.loads(pickle.dumps(raised.value)).failure == failure  # Spark ships executor errors pickled


def test_a_failing_segment_stops_its_kafka_partition_and_other_partitions_read_on(local_store):
    write_pizza_segments(local_store, 0, [30] * 4)
    write_pizza_segments(local_store, 1, [30] * 2)
    bad_key = corrupt_segment(local_store, 0, 60)
    options = ReadRequest(ending={0: LATEST, 1: LATEST}, columns=PIZZA_COLUMNS)

    table, [failure] = options.read(local_store)

    assert_pizza_rows(table, 0, 0, 60)  # the segment after the corrupt one is not read either
    assert_pizza_rows(table, 1, 0, 60)
    assert table.num_rows == 120 and table[INVALID_REASON_COLUMN].null_count == 120
    assert (failure.topic, failure.partition, failure.kfs_key, failure.next_offset) == (TOPIC, 0, bad_key, 60)


def test_a_storage_error_reports_the_first_offset_not_delivered(local_store):
    write_pizza_segments(local_store, 0, [100])
    [partition] = ReadRequest(starting={0: 47}, ending={0: 100}).plan(local_store).input_partitions
    segment_path(local_store, 0, 0, ObjectKind.INDEX).unlink()  # gone between planning and reading

    with pytest.raises(SegmentReadError) as raised:
        list(read_input_partition(local_store, partition, ()))

    failure = raised.value.failure
    index_key = segment_key(local_store.namespace, TOPIC, 0, 0, ObjectKind.INDEX)
    assert (failure.key, failure.position, failure.error_type, failure.next_offset) == (
        index_key, None, ObjectNotFoundError.__name__, 47)
    assert index_key in failure.message


def test_mapped_columns_come_out_typed_and_invalid_records_are_kept_with_a_reason(local_store, fixture_segments_dir):
    fixture = fixture_segments_dir / "edge-cases"
    meta = json.loads((fixture / "fixture.json").read_text())
    kfs_key = segment_key(local_store.namespace, meta["topic"], meta["partition"], meta["base_offset"],
                          ObjectKind.SEGMENT)
    local_store.put(kfs_key, (fixture / kfs_key.rsplit("/", 1)[1]).read_bytes())
    local_store.put(kfs_key.removesuffix(".kfs") + ".index",
                    (fixture / kfs_key.rsplit("/", 1)[1]).with_suffix(".index").read_bytes())
    columns = (ColumnConfig(name="name", type="string", required=True), ColumnConfig(name="n", type="int"))
    options = ReadRequest(topic=meta["topic"], ending={meta["partition"]: LATEST},
                          columns=columns)

    table = options.read_all(local_store)

    assert table.schema.field("name").type == pa.string() and table.schema.field("n").type == pa.int32()
    rows = table.select(["offset", "name", "n", INVALID_REASON_COLUMN]).to_pylist()
    assert [(row["offset"], row["name"], row["n"]) for row in rows] == [
        (500, None, None), (501, None, None), (502, "Zoë <b>&</b>", 1), (503, None, None)]
    reasons = [row[INVALID_REASON_COLUMN] for row in rows]
    assert reasons[0] == "name: required value is missing or null"
    assert reasons[1] == "value is null"
    assert reasons[2] is None
    assert reasons[3].startswith("value is not valid JSON")


def test_pizza_columns_are_coerced_in_batches_of_bounded_size(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [250])
    monkeypatch.setattr("kafscale_lakehouse.engine.kafscale_source.MAX_ROWS_PER_BATCH", 100)
    options = ReadRequest(ending={0: LATEST}, columns=PIZZA_COLUMNS)
    [partition] = options.plan(local_store).input_partitions

    batches = list(read_input_partition(local_store, partition, PIZZA_COLUMNS))

    assert [batch.num_rows for batch in batches] == [100, 100, 50]
    table = pa.Table.from_batches(batches)
    orders = [json.loads(record.value) for record in pizza_orders(0, 250, partition=0)]
    assert table["order_id"].to_pylist() == [order["order_id"] for order in orders]
    assert table["store_id"].type == pa.int32()
    assert table["store_id"].to_pylist() == [order["store_id"] for order in orders]
    assert table["date_ordered"].type == pa.timestamp("us")
    assert [value.strftime("%Y-%m-%d %H:%M:%S") for value in table["date_ordered"].to_pylist()] == [
        order["date_ordered"] for order in orders]
    assert MAX_ROWS_PER_BATCH == 65_536


# ------------------------------------------------------------------------------------------- task inputs


def test_an_opened_store_pickles_so_each_task_opens_the_same(tmp_path):
    s3 = S3SegmentStore("lake", namespace="ns", endpoint="http://127.0.0.1:1", region="eu-west-1", path_style=True,
                        access_key_id="AKID", secret_access_key="SECRET", session_token="TOKEN")
    copy = pickle.loads(pickle.dumps(s3))
    assert (copy.bucket, copy.namespace, copy.endpoint, copy.region, copy.path_style) == (
        "lake", "ns", "http://127.0.0.1:1", "eu-west-1", True)
    assert copy.static_credentials == ("AKID", "SECRET", "TOKEN")
    assert "SECRET" not in repr(copy) and "TOKEN" not in repr(copy)
    local = LocalSegmentStore(tmp_path, namespace="ns")
    assert pickle.loads(pickle.dumps(local)).root == local.root


@pytest.mark.parametrize(("starting", "ending", "extra", "message"), [
    ({}, {}, {}, "ending offsets name no partition"),
    ({1: 0}, {0: 5}, {}, r"starting offsets name partitions \[1\]"),
    ({0: 9}, {0: 5}, {}, "starting offset 9 is after ending offset 5"),
    ({0: -1}, {0: 5}, {}, "partition 0: offsets -1..5 are invalid"),
    ({}, {0: -3}, {}, "partition 0: offsets -2..-3 are invalid"),
    ({}, {0: 5}, {"max_bytes_per_partition": 0}, "max_bytes_per_partition is 0"),
])
def test_invalid_offset_requests_are_refused_naming_the_partition(tmp_path, starting, ending, extra, message):
    store = LocalSegmentStore(tmp_path, namespace="ns")
    with pytest.raises(ValueError, match=message):
        plan_read(store, "orders", ending, starting, **extra)
    assert store.request_counts == {}  # refused before any request
