"""Iceberg append sink on the PySpark Python Data Source write API.

Executors turn their Arrow batches into Parquet data files with pyiceberg's own file writer (Iceberg field ids,
column statistics, partition values) and return the `DataFile`s as commit messages. The Iceberg commit is *not*
done by Spark's job commit: our commit has to re-check the table's offsets first (`table_offsets.commit_append`),
so the job commit only hands the files to the driver and the caller commits them (or deletes them).

Spark runs a data source's `commit`/`abort` in a Python worker process that the driver JVM starts, not in the
driver's own interpreter, so `commit` stages the pickled `DataFile`s in a driver-local directory that
`write_data_files` reads once `save()` returns. `abort` (a task or the job failed) deletes what the finished tasks
wrote; a task that fails deletes its own files before it re-raises.

Data file names start with `data_file_prefix(run_id)` so that files left by a crash can be found and removed
(`table_offsets.cleanup_uncommitted_files`).

Relies on pyiceberg's private writer helpers in `pyiceberg.io.pyarrow` (`write_file`, `bin_pack_record_batches`,
`_determine_partitions`, `_check_pyarrow_schema_compatible`): pyiceberg is pinned and the tests pin this behaviour.
"""

from __future__ import annotations

import logging
import pickle
import re
import tempfile
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    _determine_partitions,
    bin_pack_record_batches,
    pyarrow_to_schema,
    write_file,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, WriteTask
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from kafscale_lakehouse.engine.kafscale_source import SOURCE_STATUS_COLUMNS
from kafscale_lakehouse.engine.source_rows import DeadLetterTarget, SourceRowSplitter, SourceTaskStats

log = logging.getLogger(__name__)

SINK_FORMAT = "kafscale_iceberg_append"
DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024
DATA_FILE_PREFIX = "kafscale-"
STAGED_MESSAGES = "commit-messages.pickle"

# FileIO settings the executors need; catalog settings (uri, credential, token, warehouse) stay on the driver.
_FILE_IO_PROPERTY_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "hf.", "py-io-impl")
_OPTION_FILE_IO_PREFIX = "io."
_RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Registering again works but makes Spark warn about replacing the source, so once per session.
_sessions_with_sink: weakref.WeakSet[SparkSession] = weakref.WeakSet()


class IcebergSinkError(RuntimeError):
    """Writing data files for an Iceberg table failed; the message names the table (and run)."""


class SinkSchemaError(IcebergSinkError):
    """The DataFrame does not fit the table schema (unknown column, missing required column, wrong type)."""


class RequiredColumnNullError(IcebergSinkError):
    """A batch has nulls in a column the table declares required."""


def data_file_prefix(run_id: str) -> str:
    """Prefix of every data file name written for `run_id` (the trailing dash keeps run `a1` apart from `a10`)."""
    if not _RUN_ID_PATTERN.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} must match {_RUN_ID_PATTERN.pattern} (it becomes part of file names)")
    return f"{DATA_FILE_PREFIX}{run_id}-"


def file_io_properties(table: Table) -> dict[str, str]:
    """The table's FileIO settings (endpoint, region, keys, vended credentials) without catalog secrets."""
    return {k: v for k, v in table.io.properties.items() if k.startswith(_FILE_IO_PROPERTY_PREFIXES)}


def delete_data_files(io: FileIO, paths: Iterable[str]) -> list[str]:
    """Delete each file, logging (not raising) a failure so one bad path does not keep the others.

    Returns the paths that could not be deleted; a missing file counts as deleted.
    """
    failed = []
    for path in paths:
        try:
            io.delete(path)
        except FileNotFoundError:
            pass
        except Exception:  # noqa: BLE001 - keep deleting the rest; orphan cleanup retries later
            log.warning("could not delete data file %s", path, exc_info=True)
            failed.append(path)
    return failed


@dataclass(frozen=True)
class SinkJob:
    """Everything an executor needs to write data files for one table, carried in data source options."""

    table_name: str
    table_metadata_json: str
    file_io_properties: Mapping[str, str]
    run_id: str
    target_file_size_bytes: int
    staging_dir: str
    kafscale_rows: bool = False  # rows of the `kafscale` source: hold back markers and invalid records
    dead_letters: DeadLetterTarget | None = None  # with kafscale_rows: write the invalid records there

    def to_options(self) -> dict[str, str]:
        # FileIO secrets go in keys of their own (`io.s3.secret-access-key`) so that Spark's redaction of option
        # keys matching spark.redaction.regex (secret|password|token by default) hides them in plans and logs.
        options = {
            "table": self.table_name,
            "table_metadata": self.table_metadata_json,
            "run_id": self.run_id,
            "target_file_size_bytes": str(self.target_file_size_bytes),
            "staging_dir": self.staging_dir,
            "kafscale_rows": "true" if self.kafscale_rows else "false",
        }
        options.update({_OPTION_FILE_IO_PREFIX + k: v for k, v in self.file_io_properties.items()})
        if self.dead_letters is not None:
            options.update(self.dead_letters.to_options())
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkJob:
        missing = {"table", "table_metadata", "run_id", "target_file_size_bytes", "staging_dir"} - set(options)
        if missing:
            raise IcebergSinkError(
                f"{SINK_FORMAT} data source is missing options {sorted(missing)}; write through write_data_files()"
            )
        return cls(
            table_name=options["table"],
            table_metadata_json=options["table_metadata"],
            file_io_properties={
                k[len(_OPTION_FILE_IO_PREFIX):]: v for k, v in options.items() if k.startswith(_OPTION_FILE_IO_PREFIX)
            },
            run_id=options["run_id"],
            target_file_size_bytes=int(options["target_file_size_bytes"]),
            staging_dir=options["staging_dir"],
            kafscale_rows=options.get("kafscale_rows", "false") == "true",
            dead_letters=DeadLetterTarget.from_options(options),
        )


@dataclass(frozen=True)
class IcebergAppendCommitMessage(WriterCommitMessage):
    """What one Spark task wrote."""

    spark_partition_id: int
    data_files: tuple[DataFile, ...]
    source_stats: SourceTaskStats | None = None  # with `kafscale_rows`: offsets written, failures, invalid records


@dataclass(frozen=True)
class _PrefixedWriteTask(WriteTask):
    """pyiceberg's write task with our file name: `kafscale-<run>-<spark partition>-<seq>-<uuid>.parquet`."""

    file_name_prefix: str = ""

    def generate_data_file_filename(self, extension: str) -> str:
        return f"{self.file_name_prefix}{self.task_id:05d}-{self.write_uuid}.{extension}"


class IcebergAppendDataSource(DataSource):
    """Append-only Iceberg sink; use `write_data_files`, which sets the options and collects the files."""

    @classmethod
    def name(cls) -> str:
        return SINK_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> IcebergAppendWriter:
        job = SinkJob.from_options(self.options)
        if overwrite:
            raise IcebergSinkError(f"{SINK_FORMAT} for table {job.table_name} only appends; use mode('append')")
        return IcebergAppendWriter(job)


class IcebergAppendWriter(DataSourceArrowWriter):
    def __init__(self, job: SinkJob):
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IcebergAppendCommitMessage:
        spark_partition_id = TaskContext.get().partitionId()
        metadata = TableMetadataUtil.parse_raw(self.job.table_metadata_json)
        io = load_file_io(dict(self.job.file_io_properties), metadata.location)
        planner = _DataFilePlanner(self.job, metadata, spark_partition_id)
        splitter = SourceRowSplitter(self.job.dead_letters, spark_partition_id) if self.job.kafscale_rows else None
        if splitter is not None:
            iterator = splitter.rows_to_write(iterator)
        written: list[DataFile] = []
        try:
            for chunk in bin_pack_record_batches(planner.checked(iterator), self.job.target_file_size_bytes):
                tasks = planner.tasks_for(pa.Table.from_batches(chunk))
                try:
                    # write_file maps tasks on a thread pool; list() waits for all of them before the next chunk.
                    written.extend(write_file(io, metadata, iter(tasks)))
                except BaseException:
                    # Some files of the chunk may exist already; the names are known before writing.
                    delete_data_files(io, (planner.path_of(task) for task in tasks))
                    raise
        except BaseException:
            delete_data_files(io, (f.file_path for f in written))
            if splitter is not None:
                splitter.discard_dead_letters()
            raise
        log.info(
            "table %s run %s: Spark partition %d wrote %d data files (%d rows)",
            self.job.table_name, self.job.run_id, spark_partition_id, len(written),
            sum(f.record_count for f in written),
        )
        return IcebergAppendCommitMessage(spark_partition_id=spark_partition_id, data_files=tuple(written),
                                          source_stats=splitter.stats if splitter is not None else None)

    def commit(self, messages: list[IcebergAppendCommitMessage | None]) -> None:
        staged = Path(self.job.staging_dir) / STAGED_MESSAGES
        with staged.open("wb") as out:
            pickle.dump([m for m in messages if m is not None], out, protocol=pickle.HIGHEST_PROTOCOL)

    def abort(self, messages: list[IcebergAppendCommitMessage | None]) -> None:
        paths = [f.file_path for m in messages if m is not None for f in m.data_files]
        metadata = TableMetadataUtil.parse_raw(self.job.table_metadata_json)
        io = load_file_io(dict(self.job.file_io_properties), metadata.location)
        failed = delete_data_files(io, paths)
        if self.job.dead_letters is not None:
            delete_data_files(self.job.dead_letters.file_io(),
                              (f.file_path for m in messages if m is not None and m.source_stats is not None
                               for f in m.source_stats.dead_letter_files))
        log.warning(
            "table %s run %s: Spark write aborted, deleted %d of %d data files written by finished tasks",
            self.job.table_name, self.job.run_id, len(paths) - len(failed), len(paths),
        )


class _DataFilePlanner:
    """Turns Arrow chunks into pyiceberg write tasks for one Spark task."""

    def __init__(self, job: SinkJob, metadata: TableMetadata, spark_partition_id: int):
        self._job = job
        self._metadata = metadata
        self._schema = metadata.schema()
        self._spec = metadata.spec()
        self._location_provider = load_location_provider(metadata.location, metadata.properties)
        self._write_uuid = uuid.uuid4()  # differs per task attempt, so a retried task never reuses a name
        self._file_name_prefix = f"{data_file_prefix(job.run_id)}{spark_partition_id:05d}-"
        self._spark_partition_id = spark_partition_id
        self._sequence = 0
        self._required_columns = [f.name for f in self._schema.fields if f.required]

    def checked(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Non-empty batches no larger than the target file size, after checking required columns for nulls."""
        target = self._job.target_file_size_bytes
        for batch in batches:
            if batch.num_rows == 0:
                continue
            batch = _with_utc_timestamps(batch)
            for name in self._required_columns:
                column = batch.column(name)
                if column.null_count:
                    raise RequiredColumnNullError(
                        f"table {self._job.table_name}: required column {name!r} has {column.null_count} null "
                        f"values in Spark partition {self._spark_partition_id} (run {self._job.run_id})"
                    )
            # Spark hands over up to 10,000 rows per batch; slicing (zero-copy) lets a file roll over mid-batch.
            rows_per_slice = max(1, batch.num_rows * target // max(batch.nbytes, 1))
            for offset in range(0, batch.num_rows, rows_per_slice):
                yield batch.slice(offset, rows_per_slice)

    def tasks_for(self, chunk: pa.Table) -> list[_PrefixedWriteTask]:
        task_schema = pyarrow_to_schema(
            chunk.schema, name_mapping=self._schema.name_mapping, format_version=self._metadata.format_version
        )
        if self._spec.is_unpartitioned():
            parts = [(None, chunk)]
        else:
            parts = [(p.partition_key, p.arrow_table_partition)
                     for p in _determine_partitions(spec=self._spec, schema=self._schema, arrow_table=chunk)]
        tasks = []
        for partition_key, table in parts:
            tasks.append(_PrefixedWriteTask(
                write_uuid=self._write_uuid,
                task_id=self._sequence,
                schema=task_schema,
                record_batches=table.to_batches(),
                partition_key=partition_key,
                file_name_prefix=self._file_name_prefix,
            ))
            self._sequence += 1
        return tasks

    def path_of(self, task: _PrefixedWriteTask) -> str:
        return self._location_provider.new_data_location(
            data_file_name=task.generate_data_file_filename("parquet"), partition_key=task.partition_key
        )


def _with_utc_timestamps(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Spark labels TimestampType columns with the session time zone; Iceberg's timestamptz accepts only UTC.

    The values are UTC instants either way, so relabelling changes no value.
    """
    utc = pa.schema([
        f.with_type(pa.timestamp(f.type.unit, "UTC")) if pa.types.is_timestamp(f.type) and f.type.tz else f
        for f in batch.schema
    ])
    return batch if utc.equals(batch.schema) else batch.cast(utc)


def check_dataframe_schema(spark_schema: StructType, table: Table) -> None:
    """Fail before any file is written if the DataFrame cannot be appended to the table.

    Columns are matched by name. Spark marks most columns nullable even when they never hold nulls, so a required
    table column only needs to be present here; nulls in it are caught per batch on the executors.
    """
    table_schema = table.schema()
    # Spark hands TimestampType to Python as UTC instants (timestamptz); the zone name only affects the type.
    arrow_schema = to_arrow_schema(spark_schema, timezone="UTC")
    unknown = [name for name in arrow_schema.names if name not in table_schema.column_names]
    if unknown:
        raise SinkSchemaError(f"table {_table_name(table)} has no columns {unknown}; evolve the table schema first")
    required = {f.name for f in table_schema.fields if f.required}
    arrow_schema = pa.schema([f.with_nullable(f.name not in required) for f in arrow_schema])
    try:
        _check_pyarrow_schema_compatible(table_schema, arrow_schema, format_version=table.format_version)
    except ValueError as exc:
        raise SinkSchemaError(f"DataFrame does not fit table {_table_name(table)}: {exc}") from exc


def write_data_files(
    df: DataFrame,
    table: Table,
    run_id: str,
    *,
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES,
) -> list[DataFile]:
    """Write `df` as data files of `table` (one Spark job) and return them, uncommitted.

    Commit them with `table_offsets.commit_append`, which deletes them if the commit is refused. If the Spark job
    fails, the files of finished tasks are deleted (`abort`) and `IcebergSinkError` is raised. A file size roll-over
    happens every `target_file_size_bytes` of in-memory Arrow data (pyiceberg's measure; Parquet on disk is smaller).
    """
    messages = _write(df, table, run_id, target_file_size_bytes=target_file_size_bytes, kafscale_rows=False)
    return [f for m in messages for f in m.data_files]


def write_kafscale_rows(
    df: DataFrame,
    table: Table,
    run_id: str,
    *,
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES,
    dead_letters: DeadLetterTarget | None = None,
) -> list[IcebergAppendCommitMessage]:
    """Like `write_data_files` for a DataFrame of the `kafscale` source, per Spark task.

    Error markers and invalid records are not written; each message's `source_stats` says which offsets its files
    hold, which segment stopped its Kafka partition and which records were held back, so the caller commits only
    what is complete (and deletes the files of the rest). With `dead_letters`, the same tasks write the invalid
    records as data files of the dead-letter table (`source_stats.dead_letter_files`, uncommitted).
    """
    return _write(df, table, run_id, target_file_size_bytes=target_file_size_bytes, kafscale_rows=True,
                  dead_letters=dead_letters)


def _write(df: DataFrame, table: Table, run_id: str, *, target_file_size_bytes: int,
           kafscale_rows: bool, dead_letters: DeadLetterTarget | None = None) -> list[IcebergAppendCommitMessage]:
    if target_file_size_bytes <= 0:
        raise ValueError(f"target_file_size_bytes must be positive, got {target_file_size_bytes}")
    data_file_prefix(run_id)  # validates the run id on the driver rather than in every task
    written_schema = df.drop(*SOURCE_STATUS_COLUMNS).schema if kafscale_rows else df.schema
    check_dataframe_schema(written_schema, table)
    if df.sparkSession not in _sessions_with_sink:
        df.sparkSession.dataSource.register(IcebergAppendDataSource)
        _sessions_with_sink.add(df.sparkSession)
    with tempfile.TemporaryDirectory(prefix="kafscale-sink-") as staging_dir:
        job = SinkJob(
            table_name=_table_name(table),
            table_metadata_json=_metadata_for_writers(table.metadata).model_dump_json(),
            file_io_properties=file_io_properties(table),
            run_id=run_id,
            target_file_size_bytes=target_file_size_bytes,
            staging_dir=staging_dir,
            kafscale_rows=kafscale_rows,
            dead_letters=dead_letters,
        )
        try:
            df.write.format(SINK_FORMAT).mode("append").options(**job.to_options()).save()
        except Exception as exc:
            raise IcebergSinkError(f"writing data files for table {job.table_name} (run {run_id}) failed: "
                                   f"{_root_cause(exc)}") from exc
        with (Path(staging_dir) / STAGED_MESSAGES).open("rb") as staged:
            messages: list[IcebergAppendCommitMessage] = pickle.load(staged)
    data_files = [f for m in messages for f in m.data_files]
    log.info(
        "table %s run %s: %d data files written (%d rows, %d bytes), not yet committed",
        job.table_name, run_id, len(data_files), sum(f.record_count for f in data_files),
        sum(f.file_size_in_bytes for f in data_files),
    )
    return messages


def _root_cause(exc: BaseException) -> str:
    """The Python error raised in the executor, out of Spark's wrapping (last line of its traceback text)."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line.split(":", 1)[0]:
            return line.strip()
    return lines[-1].strip() if lines else type(exc).__name__


def _metadata_for_writers(metadata: TableMetadata) -> TableMetadata:
    """Writers need schema, spec, properties and location, not the snapshot history (which only grows)."""
    return metadata.model_copy(update={
        "snapshots": [], "snapshot_log": [], "metadata_log": [], "refs": {}, "current_snapshot_id": None,
        "statistics": [], "partition_statistics": [],
    })


def _table_name(table: Table) -> str:
    return ".".join(table.name())
