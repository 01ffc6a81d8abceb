"""What other engines write that pyiceberg 0.12 cannot: a merge-on-read DELETE's position-delete file (Trino, Spark)."""

from __future__ import annotations

import random
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
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
