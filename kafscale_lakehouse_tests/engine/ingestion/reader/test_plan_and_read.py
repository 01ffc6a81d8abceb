"""Planning and reading of segments in-process, where every request of the store can be observed.

Planning is the ingestion run's (`engine/ingestion/run.py`: `segments_from`, `find_gaps`, then
`segment_run_partitions`); the ingestion Spark job's tasks run the same `read_input_partition` in their Python
workers (see test_spark_job.py).
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.config import ProcessorConfig
from kafscale_lakehouse.engine.ingestion.planning import plan_partition
from kafscale_lakehouse.engine.ingestion.segment_reader import (
    INVALID_REASON_COLUMN,
    MAX_ROWS_PER_BATCH,
    SEGMENT_GAP_ERROR_TYPE,
    SegmentReadError,
    read_input_partition,
    segment_run_partitions,
)
from kafscale_lakehouse.format import (
    CrcMismatchError,
    encode_index,
    encode_segment,
    entry_for_offset,
    go_headers_json,
    parse_index,
)
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.storage import LocalSegmentStore, ObjectKind, ObjectNotFoundError, S3SegmentStore, segment_key
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import (
    INDEX_INTERVAL,
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
    options = ReadRequest(starting={0: 135, 1: 1000, 2: None},
                          ending={0: 367, 1: 1130})

    plan = options.plan(local_store)
    table = options.read_all(local_store)

    assert plan.ranges == {0: OffsetRange(0, 135, 367), 1: OffsetRange(1, 1000, 1130), 2: OffsetRange(2, 0, 100)}
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
    # `segments_from` (265 is mid-way into segment 240): a listing resumed at 265 (footers of 280, 320, 360), a
    # key listing (no footers) finding 240, a listing resumed at 240 (footers of 240..360); then the index and one
    # ranged read of segment 240, and segments 280 and 320 whole. Nothing of segments 0..200.
    assert used == {"list": 3, "get": 3 + 4 + 2 + 2}
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


def plan_run(store, partition: int, start: int | None, *, allow_gaps: bool = False):
    """The ingestion run's plan of one partition from its next offset `start` (None: nothing committed), and the
    planning's outcome (the gap it skips or stops at)."""
    planning = plan_partition(store, TOPIC, partition, start, 1 << 40, allow_gaps,
                              orphan_grace_seconds=ProcessorConfig().orphan_segment_grace_seconds)
    return planning.plan, planning


def read_run(store, partition: int, plan) -> pa.Table:
    """The rows the run's Spark tasks read for `plan`."""
    return pa.Table.from_batches([batch for run in segment_run_partitions(TOPIC, plan.read, plan.segments,
                                                                          1 << 40)
                                  for batch in read_input_partition(store, run, ())])


def delete_segment(store, partition: int, base_offset: int) -> None:
    for kind in ObjectKind:
        segment_path(store, partition, base_offset, kind).unlink()


def land_runs(store, start: int | None, allow_gaps: bool) -> tuple[list[int], list[str], list[OffsetRange]]:
    """Consecutive runs of partition 0 from `start`, as the ingestion run chains them: plan, read until the
    partition stops, commit what was read, the next run from there; until a run has nothing to read. Returns the
    offsets delivered, the partition's errors (the plans' and the reads' stops at a gap), the ranges skipped."""
    delivered: list[int] = []
    errors: list[str] = []
    skipped: list[OffsetRange] = []
    for _ in range(5):
        plan, outcome = plan_run(store, 0, start, allow_gaps=allow_gaps)
        skipped += [outcome.skipped] if outcome.skipped else []
        errors += [outcome.error] if outcome.error else []
        if plan is None:
            return delivered, errors, skipped
        batches: list[pa.RecordBatch] = []
        start = plan.read.end
        try:
            for run in segment_run_partitions(TOPIC, plan.read, plan.segments, 1 << 40):
                batches.extend(read_input_partition(store, run, ()))
        except SegmentReadError as exc:
            assert exc.failure.error_type == SEGMENT_GAP_ERROR_TYPE, exc
            errors.append(exc.failure.message)
            start = exc.failure.next_offset
        delivered += pa.Table.from_batches(batches, schema=batches[0].schema)["offset"].to_pylist()
    raise AssertionError(f"still reading after 5 runs: {delivered}, {errors}")


# Segments 100..199, 200..299 (deleted), 300..399. Only the footers of the newest segment and of the one holding the
# next offset are planned from: a gap after any other segment is found by the read, which stops there, and the
# next run's plan from that offset reports it (or skips it with `allow_gaps`). Nothing is read past a gap unless it
# is skipped, and every offset that exists is read once.
@pytest.mark.parametrize(("start", "missing", "before_base", "read_first"), [
    (150, "200..299", 300, range(150, 200)),  # gap inside the pending offsets
    (250, "250..299", 300, range(0)),  # the next offset lies inside the gap
    (50, "50..99", 100, range(0)),  # the next offset is before the first segment
    (None, "200..299", 300, range(100, 200)),  # nothing committed: from the oldest segment
])
def test_a_gap_in_the_pending_offsets_fails_the_partition_naming_the_missing_offsets(
        local_store, start, missing, before_base, read_first):
    write_pizza_segments(local_store, 0, [100, 100, 100], first_offset=100)
    delete_segment(local_store, 0, 200)
    before_key = segment_key(local_store.namespace, TOPIC, 0, before_base, ObjectKind.SEGMENT)

    delivered, errors, skipped = land_runs(local_store, start, allow_gaps=False)

    assert f"offsets {missing} are missing before {before_key}" in errors[-1]
    assert delivered == list(read_first)  # up to the gap, and never past it

    delivered, errors, skipped = land_runs(local_store, start, allow_gaps=True)
    first = 100 if start is None else start
    gaps = [OffsetRange(0, max(first, 50), 100)] if first < 100 else []
    gaps.append(OffsetRange(0, max(first, 200), 300))
    assert skipped == gaps
    assert delivered == [*range(max(first, 100), 200), *range(300, 400)]  # every offset that exists, once
    assert all("are missing" in error for error in errors)


def test_a_gap_after_a_segment_planned_from_its_successor_is_found_by_the_read(local_store):
    """The plan reads no footer of a segment followed by a complete one; the read checks it and stops at the gap
    after its last offset, its records delivered; a segment claiming offsets past its successor's base is an
    overlap, nothing of it delivered."""
    write_pizza_segments(local_store, 0, [50, 50, 50])
    delete_segment(local_store, 0, 100)
    write_pizza_segments(local_store, 0, [50], first_offset=110)  # 100..109 are gone
    plan, outcome = plan_run(local_store, 0, None)
    assert outcome.error is None and (plan.read.start, plan.read.end) == (0, 160)
    assert [(s.base_offset, s.last_offset, s.end_from_footer) for s in plan.segments] == [
        (0, 49, False), (50, 109, False), (110, 159, True)]
    delivered: list[pa.RecordBatch] = []

    with pytest.raises(SegmentReadError) as raised:
        for run in segment_run_partitions(TOPIC, plan.read, plan.segments, 1 << 40):
            delivered.extend(read_input_partition(local_store, run, ()))

    assert_pizza_rows(pa.Table.from_batches(delivered), 0, 0, 100)
    failure = raised.value.failure
    key_50 = segment_key(local_store.namespace, TOPIC, 0, 50, ObjectKind.SEGMENT)
    assert (failure.error_type, failure.kfs_key, failure.base_offset, failure.next_offset) == (
        SEGMENT_GAP_ERROR_TYPE, key_50, 50, 100)
    assert failure.message == (f"{key_50} ends at offset 99, the next segment begins at 110: offsets 100..109 are "
                               "missing")

    overlapping = dataclasses.replace(plan.segments[0], last_offset=39)  # as if its successor began at 40
    [run] = segment_run_partitions(TOPIC, OffsetRange(0, 0, 40), [overlapping], 1 << 40)
    delivered.clear()
    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, run, ()))
    assert delivered == [] and raised.value.failure.next_offset == 0
    assert raised.value.failure.error_type == "SegmentOverlapError"
    assert "two segments claim offsets 40..49" in raised.value.failure.message


def test_a_gap_below_the_next_offset_does_not_matter(local_store):
    write_pizza_segments(local_store, 0, [100, 100, 100], first_offset=100)
    delete_segment(local_store, 0, 200)

    plan, outcome = plan_run(local_store, 0, 320)

    assert outcome.error is None and outcome.skipped is None
    assert (plan.read.start, plan.read.end, [s.base_offset for s in plan.segments]) == (320, 400, [300])
    assert_pizza_rows(read_run(local_store, 0, plan), 0, 320, 400)


def test_the_run_plans_completed_segments_only(local_store):
    [_, last] = write_pizza_segments(local_store, 0, [50, 50])
    orphan = encode_segment(pizza_orders(100, 30), base_offset=100)  # its .index never arrives
    local_store.put(segment_key(local_store.namespace, TOPIC, 0, 100, ObjectKind.SEGMENT), orphan.kfs)

    plan, outcome = plan_run(local_store, 0, None)
    assert (plan.read.start, plan.read.end, plan.commit_start) == (0, last.last_offset + 1, 0)
    assert [s.base_offset for s in plan.segments] == [0, 50] and outcome.error is None
    plan, _ = plan_run(local_store, 0, 70)  # mid-way into the newest completed segment: that segment is read
    assert (plan.read.start, plan.read.end, [s.base_offset for s in plan.segments]) == (70, 100, [50])
    assert_pizza_rows(read_run(local_store, 0, plan), 0, 70, 100)
    assert plan_run(local_store, 0, 100)[0] is None  # nothing pending yet: the in-flight segment is not read
    # Beyond the in-flight segment nothing is known yet; once it completes, the next run plans it.
    assert plan_run(local_store, 0, 150)[0] is None
    assert plan_run(local_store, 5, None)[0] is None  # a partition without segments


def test_input_partitions_are_runs_of_one_kafka_partition_up_to_max_bytes(local_store):
    segments = write_pizza_segments(local_store, 0, [40] * 6, codecs=["none"])
    write_pizza_segments(local_store, 1, [40])
    size = len(segments[0].kfs)
    options = ReadRequest(starting={0: 10, 1: None}, ending={0: 230},
                          max_bytes_per_partition=int(size * 2.5))

    plan = options.plan(local_store)

    assert [(p.partition, p.offsets, [s.base_offset for s in p.segments]) for p in plan.input_partitions] == [
        (0, OffsetRange(0, 10, 80), [0, 40]), (0, OffsetRange(0, 80, 160), [80, 120]),
        (0, OffsetRange(0, 160, 230), [160, 200]), (1, OffsetRange(1, 0, 40), [0]),
    ]
    assert all(len(pickle.dumps(partition)) < 2048 for partition in plan.input_partitions)
    one_each = ReadRequest(starting={0: None}, max_bytes_per_partition=1).plan(local_store)
    assert [len(p.segments) for p in one_each.input_partitions] == [1] * 6


def test_a_corrupt_segment_ends_the_read_with_an_error_naming_the_object_and_byte(local_store):
    write_pizza_segments(local_store, 0, [30] * 4)
    bad_key = corrupt_segment(local_store, 0, 60)
    [partition] = ReadRequest(starting={0: None}).plan(local_store).input_partitions
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
    options = ReadRequest(starting={0: None, 1: None}, columns=PIZZA_COLUMNS)

    table, [failure] = options.read(local_store)

    assert_pizza_rows(table, 0, 0, 60)  # the segment after the corrupt one is not read either
    assert_pizza_rows(table, 1, 0, 60)
    assert table.num_rows == 120 and table[INVALID_REASON_COLUMN].null_count == 120
    assert (failure.topic, failure.partition, failure.kfs_key, failure.next_offset) == (TOPIC, 0, bad_key, 60)


def test_a_storage_error_reports_the_first_offset_not_delivered(local_store):
    write_pizza_segments(local_store, 0, [100])
    [partition] = ReadRequest(starting={0: 47}, ending={0: 100}).plan(local_store).input_partitions
    segment_path(local_store, 0, 0, ObjectKind.SEGMENT).unlink()  # gone between planning and reading

    with pytest.raises(SegmentReadError) as raised:
        list(read_input_partition(local_store, partition, ()))

    failure = raised.value.failure
    kfs_key = segment_key(local_store.namespace, TOPIC, 0, 0, ObjectKind.SEGMENT)
    assert (failure.key, failure.position, failure.error_type, failure.next_offset) == (
        kfs_key, None, ObjectNotFoundError.__name__, 47)
    assert kfs_key in failure.message


@pytest.mark.parametrize("damage", ["deleted", "truncated", "points_astray"])
def test_a_missing_or_corrupt_index_does_not_stop_a_read_mid_segment(local_store, damage):
    """The `.index` only saves bytes: without a usable one the whole segment is read, as the Go processor always
    reads it."""
    [segment] = write_pizza_segments(local_store, 0, [100])
    [partition] = ReadRequest(starting={0: 47}, ending={0: 100}).plan(local_store).input_partitions
    index_path = segment_path(local_store, 0, 0, ObjectKind.INDEX)
    if damage == "deleted":
        index_path.unlink()  # gone between planning and reading
    elif damage == "truncated":
        index_path.write_bytes(segment.index[:-3])
    else:  # a well-formed entry at a byte where no batch starts
        entries = parse_index(segment.index, key="index")
        entry = entry_for_offset(entries, 47)
        astray = [dataclasses.replace(e, position=e.position + 7) if e == entry else e for e in entries]
        index_path.write_bytes(encode_index(astray, interval=INDEX_INTERVAL))

    table = pa.Table.from_batches(list(read_input_partition(local_store, partition, ())))

    assert_pizza_rows(table, 0, 47, 100)


def test_mapped_columns_come_out_typed_and_invalid_records_are_kept_with_a_reason(local_store, fixture_segments_dir):
    fixture = fixture_segments_dir / "edge-cases"
    meta = json.loads((fixture / "fixture.json").read_text())
    kfs_key = segment_key(local_store.namespace, meta["topic"], meta["partition"], meta["base_offset"],
                          ObjectKind.SEGMENT)
    local_store.put(kfs_key, (fixture / kfs_key.rsplit("/", 1)[1]).read_bytes())
    local_store.put(kfs_key.removesuffix(".kfs") + ".index",
                    (fixture / kfs_key.rsplit("/", 1)[1]).with_suffix(".index").read_bytes())
    columns = (Column(name="name", type="string", required=True), Column(name="n", type="int"))
    options = ReadRequest(topic=meta["topic"], starting={meta["partition"]: None},
                          columns=columns)

    table = options.read_all(local_store)

    assert table.schema.field("name").type == pa.string() and table.schema.field("n").type == pa.int32()
    rows = table.select(["offset", "name", "n", INVALID_REASON_COLUMN]).to_pylist()
    assert [(row["offset"], row["name"], row["n"]) for row in rows] == [
        (500, None, None), (501, None, None), (502, "Zoë <b>&</b>", 1), (503, None, None)]
    reasons = [row[INVALID_REASON_COLUMN] for row in rows]
    assert reasons[0] == "name: required value is missing or null"
    assert reasons[1] is None  # a tombstone (null value) is a record like any other
    assert reasons[2] is None
    assert reasons[3].startswith("value is not valid JSON")


def test_pizza_columns_are_coerced_in_batches_of_bounded_size(local_store, monkeypatch):
    write_pizza_segments(local_store, 0, [250])
    monkeypatch.setattr("kafscale_lakehouse.engine.ingestion.segment_reader.MAX_ROWS_PER_BATCH", 100)
    options = ReadRequest(starting={0: None}, columns=PIZZA_COLUMNS)
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
