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
    commit_upsert,
    files_to_rewrite,
    latest_changes,
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
