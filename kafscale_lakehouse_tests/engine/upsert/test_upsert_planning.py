"""The pure parts of an upsert: which record wins per key, and which data files may hold the changed keys (on a real
pyiceberg table in a sqlite catalog)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType, NestedField, StringType

from kafscale_lakehouse.engine.tables.data_files import SinkJob, write_batches_as_data_files
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.engine.tables.upserts import (
    ChangeEvents,
    UpsertError,
    UpsertKey,
    UpsertOptions,
    commit_upsert,
    files_to_rewrite,
    latest_changes,
    upsert_rows,
)
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.schema.columns import Column

COLUMNS = (Column("id", "long", required=True), Column("status", "string"))


def _rows(records: list[tuple[int, int, int, int | None, str | None, bytes | None]]) -> pa.Table:
    """(partition, offset, timestamp_ms, id, status, value) per record; the key is `{"id": <id>}` when the id is
    given in the key column (tombstones), see the callers."""
    return pa.table({
        "record_id": [f"t:{p}:{o}" for p, o, *_ in records],
        "partition": pa.array([r[0] for r in records], pa.int32()),
        "offset": pa.array([r[1] for r in records], pa.int64()),
        "timestamp_ms": pa.array([r[2] for r in records], pa.int64()),
        "key": pa.array([json.dumps({"id": r[3]}).encode() if r[3] is not None else None for r in records],
                        pa.binary()),
        "value": pa.array([r[5] for r in records], pa.binary()),
        "id": pa.array([r[3] if r[5] is not None else None for r in records], pa.int64()),
        "status": pa.array([r[4] for r in records], pa.string()),
    })


def test_the_highest_offset_wins_per_key_and_a_tombstone_deletes_it():
    rows = _rows([
        (0, 10, 5, 1, "b", b"{}"),
        (0, 3, 9, 1, "a", b"{}"),  # later timestamp, lower offset: loses within its partition
        (0, 11, 1, 2, "x", b"{}"),
        (0, 12, 1, 2, None, None),  # tombstone: id from the JSON record key
        (1, 4, 1, 3, "c", b"{}"),
        (1, 2, 1, 3, "d", b"{}"),
    ])
    changes = latest_changes(rows, UpsertKey(("id",), COLUMNS))
    assert sorted(zip(changes.upserts["id"].to_pylist(), changes.upserts["status"].to_pylist(),
                      strict=True)) == [(1, "b"), (3, "c")]
    assert sorted(changes.keys["id"].to_pylist()) == [1, 2, 3]
    assert changes.deleted == 1 and changes.keyless == 0


def test_a_key_in_two_partitions_keeps_the_latest_timestamp():
    rows = _rows([(0, 50, 100, 7, "old", b"{}"), (1, 1, 200, 7, "new", b"{}")])
    assert latest_changes(rows, UpsertKey(("id",), COLUMNS)).upserts["status"].to_pylist() == ["new"]


def test_debezium_events_and_records_that_are_none():
    def event(op, before=None, after=None, wrapped=False):
        document = {"op": op, "before": before, "after": after, "source": {}}
        return json.dumps({"schema": {}, "payload": document} if wrapped else document).encode()

    rows = _rows([
        (0, 0, 1, 1, None, event("c", after={"id": 1, "status": "open"})),
        (0, 1, 1, 2, None, event("r", after={"id": 2, "status": "busy"}, wrapped=True)),
        (0, 2, 1, 1, None, event("u", before={"id": 1}, after={"id": 1, "status": "closed"})),
        (0, 3, 1, 2, None, event("d", before={"id": 2})),
        (0, 4, 1, 2, None, None),
    ])
    rows = rows.set_column(rows.schema.get_field_index("id"), "id", pa.nulls(rows.num_rows, pa.int64()))
    changes = latest_changes(rows, UpsertKey(("id",), COLUMNS), ChangeEvents("debezium"))
    assert changes.upserts.select(["id", "status", "offset"]).to_pylist() == [{"id": 1, "status": "closed",
                                                                                "offset": 2}]
    assert sorted(changes.keys["id"].to_pylist()) == [1, 2] and changes.deleted == 1
    bad = _rows([(0, 9, 1, 1, None, event("t"))])
    with pytest.raises(UpsertError, match=r"t:0:9: Debezium op 't' is not one of c, u, r, d"):
        latest_changes(bad, UpsertKey(("id",), COLUMNS), ChangeEvents("debezium"))
    missing = _rows([(0, 9, 1, 1, None, event("c", after={"status": "open"}))])
    with pytest.raises(UpsertError, match=r"t:0:9: id"):
        latest_changes(missing, UpsertKey(("id",), COLUMNS), ChangeEvents("debezium"))


@pytest.fixture
def catalog(tmp_path):
    return SqlCatalog("upserts", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")


SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "status", StringType(),
                                                                            required=False))


def _append_ranges(table, ranges):
    for low, high in ranges:
        table.append(pa.table({"id": pa.array(range(low, high), pa.int64()),
                               "status": pa.array(["s"] * (high - low))}))


def test_only_files_whose_bounds_hold_a_changed_key_are_candidates(catalog):
    catalog.create_namespace("n")
    table = catalog.create_table("n.stores", SCHEMA)
    _append_ranges(table, [(0, 100), (100, 200), (200, 300), (300, 400)])
    files = {f.lower_bounds[1]: f for f in (t.file for t in table.scan().plan_files())}
    assert len(files) == 4
    keys = pa.table({"id": pa.array([150, 160, 399], pa.int64())})
    candidates = sorted(_low(f) for f in files_to_rewrite(table, keys))
    assert candidates == [100, 300]
    assert files_to_rewrite(table, pa.table({"id": pa.array([1000], pa.int64())})) == []


def test_a_bucketed_table_prunes_by_the_keys_buckets(catalog):
    catalog.create_namespace("n")
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(8), name="id_bucket"))
    table = catalog.create_table("n.stores", SCHEMA, partition_spec=spec)
    _append_ranges(table, [(0, 400)])  # one file per bucket, every file spans about the whole id range
    all_files = [t.file for t in table.scan().plan_files()]
    assert len(all_files) == 8
    keys = pa.table({"id": pa.array([5], pa.int64())})
    [candidate] = files_to_rewrite(table, keys)
    bucket = BucketTransform(8).transform(LongType())(5)
    assert candidate.partition[0] == bucket


def _low(data_file) -> int:
    return int.from_bytes(data_file.lower_bounds[1], "little", signed=True)


def test_commit_upsert_keyed_by_the_record_key(catalog):
    """`id_columns: [key]` on a sqlite-catalog table: the binary record key is the id; two runs, offsets carried."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.keyed", table_schema(COLUMNS))
    key = UpsertKey(("key",), COLUMNS)

    def run(run_id: str, start: int, records: list[tuple[bytes, bytes | None]]) -> None:
        rows = pa.table({
            "record_id": [f"t:0:{start + i}" for i in range(len(records))],
            "topic": ["t"] * len(records),
            "partition": pa.array([0] * len(records), pa.int32()),
            "offset": pa.array(range(start, start + len(records)), pa.int64()),
            "timestamp_ms": pa.array([0] * len(records), pa.int64()),
            "key": pa.array([k for k, _ in records], pa.binary()),
            "value": pa.array([v for _, v in records], pa.binary()),
            "headers": pa.nulls(len(records), pa.string()),
            "id": pa.array([1] * len(records), pa.int64()),
            "status": [None if v is None else v.decode() for _, v in records],
        })
        files = write_batches_as_data_files(SinkJob.for_table(table, run_id, 1 << 20), rows.to_batches(), 0)
        commit_upsert(table, files, key, "t", {0: start}, {0: start + len(records)}, run_id,
                      target_file_size_bytes=1 << 20)

    run("r1", 0, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1")])
    run("r2", 4, [(b"b", None), (b"c", b"2"), (b"d", b"1")])
    rows = table.scan(selected_fields=("key", "status", "offset")).to_arrow().to_pylist()
    assert sorted((r["key"], r["status"], r["offset"]) for r in rows) == [
        (b"a", "2", 2), (b"c", "2", 5), (b"d", "1", 6)]
    assert read_topic_offsets(table, "t") == {0: 7}


def test_a_compaction_landing_before_the_commit_makes_the_upsert_plan_again(catalog):
    """Another writer (a compaction: same rows, new files) commits between the upsert's plan and its commit: the
    commit is refused, the files it rewrote are gone, so it plans again on the new files; no key ends twice."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.compacted", table_schema(COLUMNS))
    key = UpsertKey(("id",), COLUMNS)

    def changes(run_id: str, start: int, ids: list[int], status: str) -> list:
        rows = pa.table({
            "record_id": [f"t:0:{start + i}" for i in range(len(ids))],
            "topic": ["t"] * len(ids),
            "partition": pa.array([0] * len(ids), pa.int32()),
            "offset": pa.array(range(start, start + len(ids)), pa.int64()),
            "timestamp_ms": pa.array([0] * len(ids), pa.int64()),
            "key": pa.nulls(len(ids), pa.binary()),
            "value": pa.array([b"{}"] * len(ids), pa.binary()),
            "headers": pa.nulls(len(ids), pa.string()),
            "id": pa.array(ids, pa.int64()),
            "status": [status] * len(ids),
        })
        return write_batches_as_data_files(SinkJob.for_table(table, run_id, 1 << 20), rows.to_batches(), 0)

    commit_upsert(table, changes("r1", 0, list(range(10)), "v1"), key, "t", {0: 0}, {0: 10}, "r1",
                  target_file_size_bytes=1 << 20)
    compactions = []

    def compact_once(_current) -> None:
        if not compactions:
            other = catalog.load_table("n.compacted")
            before = {t.file.file_path for t in other.scan().plan_files()}
            with other.transaction() as transaction:
                transaction.overwrite(other.scan().to_arrow(), snapshot_properties={"kafscale.offsets.t": '{"0":10}'})
            compactions.append(before)

    result = commit_upsert(table, changes("r2", 10, [2, 3], "v2"), key, "t", {0: 10}, {0: 12}, "r2",
                           target_file_size_bytes=1 << 20, before_attempt=compact_once)
    assert compactions and result.attempts >= 1
    rows = table.scan(selected_fields=("id", "status")).to_arrow().to_pylist()
    assert sorted((r["id"], r["status"]) for r in rows) == [(i, "v2" if i in (2, 3) else "v1") for i in range(10)]
    assert read_topic_offsets(table, "t") == {0: 12}
    assert not compactions[0] & {t.file.file_path for t in table.scan().plan_files()}


ORDERED_COLUMNS = (*COLUMNS, Column("updated_ms", "long"))


def _run_files(table, run_id: str, records: list[tuple[int, int, int, str | None, int | None]]) -> list:
    """A run's uncommitted data files of (partition, offset, id, status, updated_ms) records (None status: a
    tombstone, its id in the JSON record key)."""
    rows = pa.table({
        "record_id": [f"t:{p}:{o}" for p, o, *_ in records],
        "topic": ["t"] * len(records),
        "partition": pa.array([r[0] for r in records], pa.int32()),
        "offset": pa.array([r[1] for r in records], pa.int64()),
        "timestamp_ms": pa.array([0] * len(records), pa.int64()),
        "key": pa.array([json.dumps({"id": r[2]}).encode() for r in records], pa.binary()),
        "value": pa.array([None if r[3] is None else b"{}" for r in records], pa.binary()),
        "headers": pa.nulls(len(records), pa.string()),
        "id": pa.array([None if r[3] is None else r[2] for r in records], pa.int64()),
        "status": pa.array([r[3] for r in records], pa.string()),
        "updated_ms": pa.array([r[4] for r in records], pa.int64()),
    })
    return write_batches_as_data_files(SinkJob.for_table(table, run_id, 1 << 20), rows.to_batches(), 0)


def _state(table) -> list[tuple]:
    return sorted((r["id"], r["status"]) for r in table.scan(selected_fields=("id", "status")).to_arrow().to_pylist())


def test_two_upserts_planned_on_one_snapshot_insert_a_new_key_once(catalog):
    """Two runs over disjoint partitions both insert key 7, planned on the same snapshot (each holds the table as it
    was loaded; the plan is made on that state) and committed one after the other: the second commit finds the row
    the first added since its plan, plans again and replaces it, so the key is held once."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.concurrent", table_schema(ORDERED_COLUMNS))
    key = UpsertKey(("id",), ORDERED_COLUMNS)
    commit_upsert(table, _run_files(table, "r0", [(0, 0, 1, "base", None)]), key, "t", {0: 0}, {0: 1}, "r0",
                  target_file_size_bytes=1 << 20)
    first, second = catalog.load_table("n.concurrent"), catalog.load_table("n.concurrent")
    files_a = _run_files(first, "ra", [(0, 1, 7, "a", None)])
    files_b = _run_files(second, "rb", [(1, 0, 7, "b", None)])
    commit_upsert(first, files_a, key, "t", {0: 1}, {0: 2}, "ra", target_file_size_bytes=1 << 20)
    commit_upsert(second, files_b, key, "t", {1: 0}, {1: 1}, "rb", target_file_size_bytes=1 << 20)
    table.refresh()
    assert _state(table) == [(1, "base"), (7, "b")]
    assert read_topic_offsets(table, "t") == {0: 2, 1: 1}


def test_a_delete_planned_before_a_concurrent_insert_of_its_key_deletes_it(catalog):
    """A tombstone of key 7 planned when no file held it, committed after another run inserted 7: it deletes the
    inserted row instead of leaving it behind a delete that matched nothing."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.concurrent", table_schema(ORDERED_COLUMNS))
    key = UpsertKey(("id",), ORDERED_COLUMNS)
    commit_upsert(table, _run_files(table, "r0", [(0, 0, 1, "base", None)]), key, "t", {0: 0}, {0: 1}, "r0",
                  target_file_size_bytes=1 << 20)
    first, second = catalog.load_table("n.concurrent"), catalog.load_table("n.concurrent")
    files_a = _run_files(first, "ra", [(0, 1, 7, "a", None)])
    files_b = _run_files(second, "rb", [(1, 0, 7, None, None)])
    commit_upsert(first, files_a, key, "t", {0: 1}, {0: 2}, "ra", target_file_size_bytes=1 << 20)
    commit_upsert(second, files_b, key, "t", {1: 0}, {1: 1}, "rb", target_file_size_bytes=1 << 20)
    table.refresh()
    assert _state(table) == [(1, "base")]


def test_an_older_change_of_a_later_run_does_not_overwrite_a_newer_row(catalog):
    """`order_column`: run 1 commits the newer change of key 7 (partition 1, updated_ms 200); run 2 commits an older
    change of it (partition 0, updated_ms 100) and an older tombstone: the table keeps the newer row. A change of the
    same partition as the table's row follows Kafka order whatever its value."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.ordered", table_schema(ORDERED_COLUMNS))
    key = UpsertKey(("id",), ORDERED_COLUMNS, order_column="updated_ms")
    commit_upsert(table, _run_files(table, "r1", [(1, 0, 7, "new", 200), (1, 1, 8, "new", 200)]), key, "t",
                  {1: 0}, {1: 2}, "r1", target_file_size_bytes=1 << 20)
    result = commit_upsert(
        table, _run_files(table, "r2", [(0, 0, 7, "old", 100), (0, 1, 8, "old", 100), (0, 2, 8, None, 150),
                                        (0, 3, 9, "first", 50)]),
        key, "t", {0: 0}, {0: 4}, "r2", target_file_size_bytes=1 << 20)
    assert _state(table) == [(7, "new"), (8, "new"), (9, "first")]
    assert table.snapshot_by_id(result.snapshot_id).summary["kafscale.upsert.superseded-changes"] == "2"
    commit_upsert(table, _run_files(table, "r3", [(1, 2, 7, "later", 10)]), key, "t", {1: 2}, {1: 3}, "r3",
                  target_file_size_bytes=1 << 20)
    assert _state(table) == [(7, "later"), (8, "new"), (9, "first")]
    # A newer change of another partition replaces it; equal values: the higher partition wins.
    commit_upsert(table, _run_files(table, "r4", [(0, 4, 7, "newest", 300), (0, 5, 9, "tie", 50)]), key, "t",
                  {0: 4}, {0: 6}, "r4", target_file_size_bytes=1 << 20)
    assert _state(table) == [(7, "newest"), (8, "new"), (9, "tie")]


def test_the_order_column_orders_a_key_across_partitions_within_a_run():
    rows = _rows([(0, 50, 900, 7, "old", b"{}"), (1, 1, 100, 7, "new", b"{}")])
    rows = rows.append_column("updated_ms", pa.array([100, 200], pa.int64()))
    key = UpsertKey(("id",), ORDERED_COLUMNS, order_column="updated_ms")
    changes = latest_changes(rows, key)
    assert changes.upserts["status"].to_pylist() == ["new"]
    assert changes.order is not None and changes.order.changes.to_pylist() == [
        {"id": 7, "partition": 1, "updated_ms": 200}]


def test_debezium_images_take_the_order_column_from_source_ts_ms():
    def event(op, before=None, after=None, ts_ms=None):
        return json.dumps({"op": op, "before": before, "after": after,
                           "source": {} if ts_ms is None else {"ts_ms": ts_ms}}).encode()

    rows = _rows([
        (0, 0, 1, 7, None, event("u", after={"id": 7, "status": "late"}, ts_ms=100)),
        (1, 0, 1, 7, None, event("u", after={"id": 7, "status": "early"}, ts_ms=200)),
        (1, 1, 1, 8, None, event("d", before={"id": 8}, ts_ms=300)),
        (1, 2, 1, 9, None, event("c", after={"id": 9, "status": "own", "updated_ms": 5}, ts_ms=400)),
    ])
    rows = rows.append_column("updated_ms", pa.nulls(rows.num_rows, pa.int64()))
    key = UpsertKey(("id",), ORDERED_COLUMNS, order_column="updated_ms")
    changes = latest_changes(rows, key, ChangeEvents("debezium"))
    assert sorted(changes.order.changes.select(["id", "updated_ms"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 7, "updated_ms": 200}, {"id": 8, "updated_ms": 300}, {"id": 9, "updated_ms": 5}]
    assert sorted(changes.upserts.select(["id", "status"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 7, "status": "early"}, {"id": 9, "status": "own"}]


@pytest.mark.parametrize(("options", "winner"), [
    (UpsertOptions(("id",)), "b"),
    (UpsertOptions(("id",), when_matched_update_all=False), "a"),  # insert only: the row found stays
], ids=["upsert", "insert-only"])
def test_two_downstream_upserts_planned_on_one_snapshot_insert_a_new_key_once(catalog, options, winner):
    """The IO manager's `write_mode: upsert` from two partitions of an asset: both write key 7, each planned on
    the snapshot its table was loaded at, committed one after the other: the key is held once."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.downstream", SCHEMA)
    _append_ranges(table, [(0, 5)])
    first, second = catalog.load_table("n.downstream"), catalog.load_table("n.downstream")

    def files(target, run_id: str, status: str) -> list:
        rows = pa.table({"id": pa.array([7, 100 + len(run_id)], pa.int64()), "status": [status, status]})
        return write_batches_as_data_files(SinkJob.for_table(target, run_id, 1 << 20), rows.to_batches(), 0)

    upsert_rows(first, files(first, "a", "a"), options, "a", target_file_size_bytes=1 << 20)
    upsert_rows(second, files(second, "bb", "b"), options, "bb", target_file_size_bytes=1 << 20)
    table.refresh()
    rows = sorted((r["id"], r["status"]) for r in table.scan().to_arrow().to_pylist())
    assert rows == [(i, "s") for i in range(5)] + [(7, winner), (101, "a"), (102, "b")]


def test_an_order_column_the_table_lacks_is_refused_naming_it(catalog):
    catalog.create_namespace("n")
    table = catalog.create_table("n.unordered", table_schema(COLUMNS))
    key = UpsertKey(("id",), COLUMNS, order_column="updated_ms")
    with pytest.raises(UpsertError, match=r"table n.unordered: mappings\[\].order_column 'updated_ms' is not a column"):
        commit_upsert(table, [], key, "t", {0: 0}, {0: 0}, "r1", target_file_size_bytes=1 << 20)


def test_debezium_changes_are_ordered_by_source_ts_ms_across_runs(catalog):
    """`cdc: debezium` without `order_column`: a change's `source.ts_ms` orders it, the table's row's read from the
    raw `value` it keeps. Run 1 lands store 7's newer change (partition 1, ts_ms 200); run 2 an older update and an
    older delete from partition 0 (ts_ms 100, 150): the newer row stays; a newer change of partition 0 then applies."""
    catalog.create_namespace("n")
    table = catalog.create_table("n.debezium", table_schema(COLUMNS))
    key = UpsertKey(("id",), COLUMNS)

    def run(run_id: str, partition: int, start: int, events: list[tuple[str, int, str | None, int]]) -> None:
        values = [json.dumps({"op": op, "before": {"id": store}, "after": None if op == "d" else
                              {"id": store, "status": status}, "source": {"ts_ms": ts_ms}}).encode()
                  for op, store, status, ts_ms in events]
        rows = pa.table({
            "record_id": [f"t:{partition}:{start + i}" for i in range(len(events))],
            "topic": ["t"] * len(events),
            "partition": pa.array([partition] * len(events), pa.int32()),
            "offset": pa.array(range(start, start + len(events)), pa.int64()),
            "timestamp_ms": pa.array([0] * len(events), pa.int64()),
            "key": pa.array([json.dumps({"id": e[1]}).encode() for e in events], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.nulls(len(events), pa.string()),
            "id": pa.nulls(len(events), pa.int64()),
            "status": pa.nulls(len(events), pa.string()),
        })
        files = write_batches_as_data_files(SinkJob.for_table(table, run_id, 1 << 20), rows.to_batches(), 0)
        commit_upsert(table, files, key, "t", {partition: start}, {partition: start + len(events)}, run_id,
                      target_file_size_bytes=1 << 20, events=ChangeEvents("debezium"))

    run("r1", 1, 0, [("u", 7, "newer", 200), ("u", 8, "newer", 200)])
    run("r2", 0, 0, [("u", 7, "older", 100), ("d", 8, None, 150), ("c", 9, "only", 50)])
    assert _state(table) == [(7, "newer"), (8, "newer"), (9, "only")]
    run("r3", 0, 3, [("u", 7, "newest", 300), ("d", 8, None, 400)])
    assert _state(table) == [(7, "newest"), (9, "only")]
