"""Issue 19 hole 5: a merge-on-read delete that another engine (Trino, Spark) commits while a compaction runs must
not be undone by the compaction's commit (Java's `validateNoNewDeletesForDataFiles`)."""

from __future__ import annotations

import random
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

import kafscale_lakehouse.engine.maintenance as maintenance
import kafscale_lakehouse.engine.tables.rewrites as table_rewrites
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.maintenance import compact

pytestmark = pytest.mark.integration

FILE_PATH_FIELD_ID = 2147483546  # the reserved field ids of a position-delete file (Iceberg spec)
POS_FIELD_ID = 2147483545


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of content `deletes` (pyiceberg 0.12 writes only data manifests)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def add_position_deletes(table: Table, data_file: DataFile, positions: list[int]) -> str:
    """What Trino or Spark do for a merge-on-read DELETE: a position-delete Parquet file for `data_file`, in a delete
    manifest of a new `delete` snapshot committed through the catalog. Returns the delete file's path."""
    table.refresh()
    current = table.current_snapshot()
    assert current is not None
    location = table.location().rstrip("/")
    path = f"{location}/data/other-engine-deletes-{uuid.uuid4().hex}.parquet"
    schema = pa.schema([
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_FIELD_ID)}),
    ])
    rows = pa.table({"file_path": [data_file.file_path] * len(positions), "pos": positions}, schema=schema)
    output = table.io.new_output(path)
    with output.create(overwrite=False) as stream:
        pq.write_table(rows, stream)
    size = len(table.io.new_input(path))
    path_bound = data_file.file_path.encode()
    delete_file = DataFile.from_args(
        _table_format_version=2, content=DataFileContent.POSITION_DELETES, file_path=path,
        file_format=FileFormat.PARQUET, partition=data_file.partition, record_count=len(positions),
        file_size_in_bytes=size, lower_bounds={FILE_PATH_FIELD_ID: path_bound},
        upper_bounds={FILE_PATH_FIELD_ID: path_bound}, spec_id=data_file.spec_id)
    snapshot_id = random.getrandbits(62)
    sequence_number = table.metadata.next_sequence_number()
    manifest_path = f"{location}/metadata/other-engine-{uuid.uuid4().hex}-m0.avro"
    writer = _DeleteManifestWriter(table.specs()[data_file.spec_id], table.schema(), table.io.new_output(manifest_path),
                                   snapshot_id, "deflate")
    with writer:
        writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                                           data_file=delete_file))
    manifest = writer.to_manifest_file()
    list_path = f"{location}/metadata/snap-{snapshot_id}-other-engine.avro"
    with write_manifest_list(2, table.io.new_output(list_path), snapshot_id, current.snapshot_id, sequence_number,
                             "deflate") as manifest_list:
        manifest_list.add_manifests([*current.manifests(table.io), manifest])
    snapshot = Snapshot(snapshot_id=snapshot_id, parent_snapshot_id=current.snapshot_id,
                        sequence_number=sequence_number, timestamp_ms=int(time.time() * 1000),
                        manifest_list=list_path, summary=Summary(operation=Operation.DELETE),
                        schema_id=table.schema().schema_id)
    table.catalog.commit_table(
        table, requirements=(AssertRefSnapshotId(ref="main", snapshot_id=current.snapshot_id),),
        updates=(AddSnapshotUpdate(snapshot=snapshot),
                 SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot_id)))
    return path


def _record_ids(table: Table) -> list[str]:
    return table.scan(selected_fields=("record_id",)).to_arrow().column("record_id").to_pylist()


def test_compaction_refuses_when_another_engine_deletes_rows_of_its_inputs_meanwhile(embedded_world, spark,
                                                                                      monkeypatch):
    world = embedded_world
    for i in range(2):
        for partition in (0, 1):
            world.write_segments(partition, 40, base_offset=i * 40, records_per_segment=40)
        ingest(world.config(), spark)
    before = world.table()
    rows_before = _record_ids(before)
    real_job = maintenance.run_rewrite_job
    deleted: dict[str, str] = {}

    def job_then_another_engine_deletes(spark_, table, rewrite_id, groups, **kwargs):
        written = real_job(spark_, table, rewrite_id, groups, **kwargs)
        victim = groups[0][0]  # planned without delete files; another engine deletes its first row meanwhile
        first = pq.read_table(table.io.new_input(victim.file_path).open(), columns=["record_id"])
        deleted["record_id"] = first.column("record_id")[0].as_py()
        deleted["delete_file"] = add_position_deletes(world.table(), victim, [0])
        deleted["data_file"] = victim.file_path
        assert deleted["record_id"] not in _record_ids(world.table()), "the delete file applies"
        return written

    monkeypatch.setattr(maintenance, "run_rewrite_job", job_then_another_engine_deletes)
    refused: Exception | None = None
    try:
        compact(spark, world.table(), target_file_size_bytes=64 * 1024 * 1024, min_input_files=2)
    except table_rewrites.RewriteAbandonedError as exc:
        refused = exc

    table = world.table()
    rows_after = _record_ids(table)
    assert deleted["record_id"] not in rows_after, "the row another engine deleted came back"
    assert sorted(rows_after) == sorted(r for r in rows_before if r != deleted["record_id"])
    assert type(refused).__name__ == "DeletesAddedError", refused
    assert deleted["data_file"] in str(refused) and deleted["delete_file"] in str(refused)
    assert not table.current_snapshot().summary.get(maintenance.COMPACTION_PROPERTY), "nothing committed"
    tasks = list(table.scan().plan_files())
    referenced = {t.file.file_path for t in tasks} | {d.file_path for t in tasks for d in t.delete_files}
    assert deleted["delete_file"] in referenced
    assert referenced <= world.table_data_files(table), "every referenced file exists"
    assert world.table_data_files(table) == referenced, "the compaction's own files were deleted"
