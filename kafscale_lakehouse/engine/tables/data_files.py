"""Parquet data files of an Iceberg table, written on Spark executors and committed by the driver.

Executors turn Arrow batches into Parquet data files with pyiceberg's own file writer (Iceberg field ids, column
statistics, partition values): `RollingDataFiles` (one task's open files, rolled at the target size) and
`write_batches_as_data_files` (a whole task's batches). A `SinkJob` carries what they need (table metadata without
history, FileIO settings, run id) into the tasks, pickled. The ingestion Spark job (`engine/ingestion/spark_job.py`)
uses them through `mapInArrow`; any job that writes Arrow batches of a table's columns can.

Nothing is committed here: the caller commits the files with its own checks (`appends.commit_append`) or deletes
them (`delete_data_files`). A task that fails deletes its own files before it re-raises. Data file names start with
`data_file_prefix(run_id)` and lie in the writer's own directory (`writer_data_dir`: one per table a run writes, per
attempt), so that files left by a crash can be found and removed without listing the table, and without touching
another writer's files (`run_files.clean_ended_runs`).

Relies on pyiceberg's writer internals in `pyiceberg.io.pyarrow` (`ParquetFormatWriter` and its `_fos`,
`_to_requested_schema`, `bin_pack_record_batches`, `_determine_partitions`, `_check_pyarrow_schema_compatible`): a
rolling writer that closes a file at its on-disk target size is what `write_file` does not offer yet (iceberg-python
#2998): pyiceberg is pinned and the tests pin this behaviour.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.io import FileIO, OutputFile, load_file_io
from pyiceberg.io.fileformat import DataFileStatistics
from pyiceberg.io.pyarrow import (
    FileFormatFactory,
    ParquetFormatWriter,
    bin_pack_record_batches,
    pyarrow_to_schema,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionKey
from pyiceberg.schema import sanitize_column_names
from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE, Table
from pyiceberg.table.locations import LocationProvider, load_location_provider
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.typedef import Record
from pyiceberg.utils.config import Config

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.commits import (
    check_pyarrow_schema_compatible,
    delete_data_files,
    determine_partitions,
    to_requested_schema,
)

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024
DATA_FILE_PREFIX = "kafscale-"

# FileIO settings the executors need; catalog settings (uri, credential, token, warehouse) stay on the driver.
_FILE_IO_PROPERTY_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "hf.", "py-io-impl")
_RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class IcebergSinkError(EngineError):
    """Writing data files for an Iceberg table failed; the message names the table (and run)."""


class SinkSchemaError(IcebergSinkError):
    """The rows do not fit the table schema (unknown column, missing required column, wrong type)."""


class RequiredColumnNullError(IcebergSinkError):
    """A batch has nulls in a column the table declares required."""


def data_file_prefix(run_id: str) -> str:
    """Prefix of every data file name written for `run_id` (the trailing dash keeps run `a1` apart from `a10`)."""
    if not _RUN_ID_PATTERN.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} must match {_RUN_ID_PATTERN.pattern} (it becomes part of file names)")
    return f"{DATA_FILE_PREFIX}{run_id}-"


def writer_data_dir(data_path: str, run_id: str) -> str:
    """A new directory under a table's data path for one writer of `run_id`: `kafscale-<run id>-w<random>`.

    Every writer (each table and dead-letter table of a run, each IO manager write, each rewrite, each attempt of a
    retried step) gets a directory of its own, so the files of a writer that ended without committing are found by
    listing that directory alone (engine/tables/run_files.py), never the whole table, and deleting them can never
    take a file another writer of the same run committed. Readers do not care: manifests hold absolute paths.
    """
    return f"{data_path.rstrip('/')}/{data_file_prefix(run_id)}w{uuid.uuid4().hex[:12]}"


def table_data_path(table: Table) -> str:
    """Where the table's location provider puts data files (`write.data.path`, else `<location>/data`)."""
    return load_location_provider(table.location(), table.properties).data_path


def writer_data_location(location_provider: LocationProvider, data_dir: str, provided: str) -> str:
    """`provided` (the table's location provider's path for a new file) moved into the writer's directory."""
    data_path = location_provider.data_path.rstrip("/")
    if not provided.startswith(data_path + "/"):
        raise IcebergSinkError(f"location provider put data file {provided} outside the data path {data_path}")
    return f"{data_dir}/{provided[len(data_path) + 1:]}"


def file_io_properties(table: Table) -> dict[str, str]:
    """The table's FileIO settings (endpoint, region, keys, vended credentials) without catalog secrets."""
    return {k: v for k, v in table.io.properties.items() if k.startswith(_FILE_IO_PROPERTY_PREFIXES)}


@dataclass(frozen=True)
class SinkJob:
    """Everything an executor needs to write data files for one table (pickled into a Spark job's tasks)."""

    table_name: str
    table_metadata_json: str
    file_io_properties: Mapping[str, str] = field(repr=False)
    run_id: str
    target_file_size_bytes: int
    data_dir: str  # the writer's own directory (`writer_data_dir`): every file of this job goes under it

    @classmethod
    def for_table(cls, table: Table, run_id: str, target_file_size_bytes: int,
                  data_dir: str | None = None) -> SinkJob:
        """A sink writing into `data_dir` (a directory a run record names), else into a new writer directory."""
        if target_file_size_bytes <= 0:
            raise ValueError(f"target_file_size_bytes must be positive, got {target_file_size_bytes}")
        data_path = table_data_path(table).rstrip("/")
        if data_dir is None:
            data_dir = writer_data_dir(data_path, run_id)  # also validates the run id, on the driver
        elif not data_dir.startswith(data_path + "/"):
            raise IcebergSinkError(f"table {_table_name(table)}: writer directory {data_dir} is not under the "
                                   f"table's data path {data_path}")
        data_file_prefix(run_id)
        return cls(table_name=_table_name(table), table_metadata_json=writer_metadata_json(table),
                   file_io_properties=file_io_properties(table), run_id=run_id,
                   target_file_size_bytes=target_file_size_bytes, data_dir=data_dir.rstrip("/"))

    def file_io(self) -> FileIO:
        location = TableMetadataUtil.parse_raw(self.table_metadata_json).location
        return executor_file_io(self.file_io_properties, location)


def executor_file_io(properties: Mapping[str, str], location: str) -> FileIO:
    """The FileIO of these settings for a table at `location`, one per settings and bucket in a process: the tasks
    of an engine's Python worker share it (and its S3 filesystem, whose creation was ~4% of a batch's task time at
    50 tables, benchmarks/fanout.py) instead of each creating its own. Rotated or vended credentials are other
    settings, so another FileIO."""
    scheme, _, rest = location.partition("://")
    bucket = f"{scheme}://{rest.split('/', 1)[0]}" if rest else location
    return _file_io(tuple(sorted(properties.items())), bucket)


@functools.lru_cache(maxsize=64)
def _file_io(properties: tuple[tuple[str, str], ...], bucket: str) -> FileIO:
    return load_file_io(dict(properties), bucket)


def write_batches_as_data_files(job: SinkJob, batches: Iterable[pa.RecordBatch], task_id: int) -> list[DataFile]:
    """Write `batches` as Parquet data files of the job's table and return them, uncommitted.

    A file rolls over once it holds `target_file_size_bytes` on disk (Iceberg's meaning of the target size), one
    open file per partition value; batches are written in row groups of at most `ROW_GROUP_ARROW_BYTES` of Arrow
    data, so memory stays bounded whatever the file size. If anything fails, the files written so far are deleted
    before the error propagates. `task_id` (the Spark partition id) goes into the file names.
    """
    files = RollingDataFiles(job, task_id)
    try:
        for chunk in bin_pack_record_batches(files.checked(batches), files.chunk_bytes):
            files.write(pa.Table.from_batches(chunk))
        written = files.close()
    except BaseException:
        files.discard()
        raise
    log.info("table %s run %s: task %d wrote %d data files (%d rows, %d bytes)", job.table_name, job.run_id, task_id,
             len(written), sum(f.record_count for f in written), sum(f.file_size_in_bytes for f in written))
    return written


_PARQUET = FileFormatFactory.get(FileFormat.PARQUET)
# Arrow bytes handed to one Parquet write call (one row group or more); bounds a task's memory, not the file size.
ROW_GROUP_ARROW_BYTES = 64 * 1024 * 1024


class _SizedParquetWriter(ParquetFormatWriter):
    """pyiceberg's Parquet writer (field ids, column statistics), telling how many bytes it has written so far, and
    after `close` the file's size: the stream's position once the footer is written, so no HEAD request asks the
    object store for it (`len(OutputFile)`, one per data file)."""

    file_size: int | None = None

    def bytes_written(self) -> int:
        return 0 if self._fos is None else self._fos.tell()

    def close(self) -> DataFileStatistics:
        if self._writer is not None and self._fos is not None and self.file_size is None:
            self._writer.close()  # writes the footer (pyiceberg's close closes it again: a no-op once closed)
            self.file_size = self._fos.tell()
        return super().close()


@dataclass
class _OpenDataFile:
    path: str
    output: OutputFile
    writer: _SizedParquetWriter
    partition_key: PartitionKey | None


class RollingDataFiles:
    """One task's data files of one table: one open Parquet file per partition value, closed when it reaches the
    target size. `write` Arrow tables of the table's columns, then `close()` for the files, or `discard()`."""

    def __init__(self, job: SinkJob, task_id: int) -> None:
        self._job = job
        self._metadata = TableMetadataUtil.parse_raw(job.table_metadata_json)
        self._io = executor_file_io(job.file_io_properties, self._metadata.location)
        self._schema = self._metadata.schema()
        sanitized = sanitize_column_names(self._schema)
        self._file_schema = sanitized if sanitized != self._schema else self._schema
        self._spec = self._metadata.spec()
        self._location_provider = load_location_provider(self._metadata.location, self._metadata.properties)
        self._write_uuid = uuid.uuid4()  # differs per task attempt, so a retried task never reuses a name
        self._file_name_prefix = f"{data_file_prefix(job.run_id)}{task_id:05d}-"
        self._task_id = task_id
        self._sequence = 0
        self._required_columns = [f.name for f in self._schema.fields if f.required]
        self._downcast_ns = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
        self._open: dict[str, _OpenDataFile] = {}
        self._written: list[DataFile] = []
        # Small targets (tests) roll over within a few row groups rather than after one large one.
        self.chunk_bytes = max(1, min(ROW_GROUP_ARROW_BYTES, job.target_file_size_bytes))

    def checked(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Non-empty batches no larger than a chunk, after checking required columns for nulls."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            batch = _with_plain_types(_with_utc_timestamps(batch))
            for name in self._required_columns:
                column = batch.column(name)
                if column.null_count:
                    raise RequiredColumnNullError(
                        f"table {self._job.table_name}: required column {name!r} has {column.null_count} null "
                        f"values in Spark partition {self._task_id} (run {self._job.run_id})"
                    )
            # Slicing (zero-copy) keeps each write call, and so the memory it needs, under one chunk.
            rows_per_slice = max(1, batch.num_rows * self.chunk_bytes // max(batch.nbytes, 1))
            for offset in range(0, batch.num_rows, rows_per_slice):
                yield batch.slice(offset, rows_per_slice)

    def write(self, chunk: pa.Table) -> None:
        task_schema = pyarrow_to_schema(chunk.schema, name_mapping=self._schema.name_mapping,
                                        format_version=self._metadata.format_version)
        if self._spec.is_unpartitioned():
            parts: list[tuple[PartitionKey | None, pa.Table]] = [(None, chunk)]
        else:
            parts = [(p.partition_key, p.arrow_table_partition)
                     for p in determine_partitions(spec=self._spec, schema=self._schema, arrow_table=chunk)]
        for partition_key, rows in parts:
            batches = [to_requested_schema(requested_schema=self._file_schema, file_schema=task_schema, batch=batch,
                                            downcast_ns_timestamp_to_us=self._downcast_ns, include_field_ids=True,
                                            format_model=_PARQUET)
                       for batch in rows.to_batches()]
            key = partition_key.to_path() if partition_key is not None else ""
            data_file = self._open.get(key) or self._new_file(key, partition_key)
            data_file.writer.write(pa.Table.from_batches(batches))
            if data_file.writer.bytes_written() >= self._job.target_file_size_bytes:
                self._finish(key)

    def close(self) -> list[DataFile]:
        for key in list(self._open):
            self._finish(key)
        return self._written

    def discard(self) -> None:
        """Delete every file this task started (the task failed)."""
        for data_file in self._open.values():
            with contextlib.suppress(Exception):  # the file is deleted below either way
                data_file.writer.close()
        delete_data_files(self._io, [f.file_path for f in self._written] + [f.path for f in self._open.values()])
        self._open.clear()
        self._written = []

    def _new_file(self, key: str, partition_key: PartitionKey | None) -> _OpenDataFile:
        name = f"{self._file_name_prefix}{self._sequence:05d}-{self._write_uuid}.parquet"
        self._sequence += 1
        path = writer_data_location(self._location_provider, self._job.data_dir,
                                 self._location_provider.new_data_location(data_file_name=name,
                                                                           partition_key=partition_key))
        output = self._io.new_output(path)
        self._open[key] = _OpenDataFile(path, output,
                                        _SizedParquetWriter(output, self._file_schema, self._metadata.properties),
                                        partition_key)
        return self._open[key]

    def _finish(self, key: str) -> None:
        data_file = self._open.pop(key)
        statistics = data_file.writer.close()
        written = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=data_file.path,
            file_format=FileFormat.PARQUET,
            partition=data_file.partition_key.partition if data_file.partition_key else Record(),
            file_size_in_bytes=data_file.writer.file_size if data_file.writer.file_size is not None
            else len(data_file.output),
            sort_order_id=None,
            spec_id=self._metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )
        written.spec_id = self._metadata.default_spec_id  # from_args drops it: it is no field of the file entry
        self._written.append(written)


def _with_plain_types(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Large string/binary/list types as their plain forms, the types our writers use.

    pyiceberg reads a file back in the Arrow types it was written with: files of pyiceberg's own writer (another
    engine's `table.append`) come back large, ours plain. A Parquet file is written with the Arrow schema of its first
    chunk, so a compaction group mixing both failed on the second ("Table schema does not match schema used to create
    file"). Parquet itself has no large types; chunks stay far below the 2 GiB a plain array can hold."""
    plain = pa.schema([f.with_type(_plain_type(f.type)) for f in batch.schema])
    return batch if plain.equals(batch.schema) else batch.cast(plain)


def _plain_type(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(arrow_type):
        return pa.string()
    if pa.types.is_large_binary(arrow_type):
        return pa.binary()
    if pa.types.is_large_list(arrow_type) or pa.types.is_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(_plain_type(arrow_type.value_type)))
    if pa.types.is_struct(arrow_type):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in arrow_type])
    if pa.types.is_map(arrow_type):
        return pa.map_(arrow_type.key_field.with_type(_plain_type(arrow_type.key_type)),
                       arrow_type.item_field.with_type(_plain_type(arrow_type.item_type)))
    return arrow_type


def _with_utc_timestamps(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Spark labels TimestampType columns with the session time zone; Iceberg's timestamptz accepts only UTC.

    The values are UTC instants either way, so relabelling changes no value.
    """
    utc = pa.schema([
        f.with_type(pa.timestamp(f.type.unit, "UTC")) if pa.types.is_timestamp(f.type) and f.type.tz else f
        for f in batch.schema
    ])
    return batch if utc.equals(batch.schema) else batch.cast(utc)


def check_arrow_schema(arrow_schema: pa.Schema, table: Table, *, what: str = "Arrow schema") -> None:
    """Fail before any file is written if rows of `arrow_schema` cannot be appended to the table.

    Columns are matched by name. Spark and our source (for invalid records) mark columns nullable even when the
    written rows never hold nulls, so a required table column only needs to be present here; nulls in it are caught
    per batch on the executors.
    """
    table_schema = table.schema()
    unknown = [name for name in arrow_schema.names if name not in table_schema.column_names]
    if unknown:
        raise SinkSchemaError(f"table {_table_name(table)} has no columns {unknown}; evolve the table schema first")
    required = {f.name for f in table_schema.fields if f.required}
    arrow_schema = pa.schema([f.with_nullable(f.name not in required) for f in arrow_schema])
    try:
        check_pyarrow_schema_compatible(table_schema, arrow_schema, format_version=table.format_version)
    except ValueError as exc:
        raise SinkSchemaError(f"{what} does not fit table {_table_name(table)}: {exc}") from exc


def root_cause(exc: BaseException) -> str:
    """The Python error raised in the executor, out of Spark's wrapping (last line of its traceback text)."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line.split(":", 1)[0]:
            return line.strip()
    return lines[-1].strip() if lines else type(exc).__name__


def writer_metadata_json(table: Table) -> str:
    """The table metadata writers need (schema, spec, properties, location), without the snapshot history (which
    only grows), as JSON for the executors."""
    return table.metadata.model_copy(update={
        "snapshots": [], "snapshot_log": [], "metadata_log": [], "refs": {}, "current_snapshot_id": None,
        "statistics": [], "partition_statistics": [],
    }).model_dump_json()


def _table_name(table: Table) -> str:
    return ".".join(table.name())
