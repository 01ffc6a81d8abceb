"""What one ingestion task saw of the `kafscale` source: the rows to write, and what must not be written.

An ingestion task (`engine/ingest_job.py`) writes the rows of one `SegmentRunPartition`, so one Kafka partition. Before
the rows reach Parquet, error-marker rows (a segment that could not be read) and invalid records (a required mapped
column missing or not coercible, or a value violating the topic's JSON Schema) are taken out and accounted for here,
so the driver can decide what to commit: offsets up to the first failed segment, and nothing at all while invalid
records have nowhere to go.

With a dead-letter target, the held-back invalid records are written by the same task as Parquet data files of the
dead-letter table (`DEAD_LETTER_SCHEMA`), returned uncommitted in the task's stats; `engine/dead_letter.py` builds
the target on the driver and commits those files.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import pyarrow_to_schema, schema_to_pyarrow, write_file
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import WriteTask
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField, StringType, TimestamptzType

from kafscale_lakehouse.engine.kafscale_source import (
    INVALID_REASON_COLUMN,
    INVALID_SCHEMA_PATH_COLUMN,
    SOURCE_STATUS_COLUMNS,
    SegmentReadFailure,
    error_markers,
    is_error_marker,
)

log = logging.getLogger(__name__)

MAX_INVALID_SAMPLES = 20

# The dead-letter table: each invalid record with its raw value, why it is invalid and which run held it back.
DEAD_LETTER_SCHEMA = Schema(
    NestedField(1, "record_id", StringType(), required=True),
    NestedField(2, "topic", StringType(), required=True),
    NestedField(3, "partition", IntegerType(), required=True),
    NestedField(4, "offset", LongType(), required=True),
    NestedField(5, "timestamp_ms", LongType(), required=True),
    NestedField(6, "value", BinaryType(), required=False),
    NestedField(7, "error", StringType(), required=True),
    NestedField(8, "schema_path", StringType(), required=False),  # JSON Pointer of the violated schema keyword
    NestedField(9, "run_id", StringType(), required=True),
    NestedField(10, "ingested_at", TimestamptzType(), required=True),
)
_DEAD_LETTER_ARROW_SCHEMA = schema_to_pyarrow(DEAD_LETTER_SCHEMA, include_field_ids=False)


@dataclass(frozen=True)
class InvalidRecord:
    record_id: str
    reason: str
    schema_path: str | None = None  # the violated JSON Schema keyword; None for a coercion failure

    def describe(self) -> str:
        """`<record_id> (<reason>[; schema <path>])`, for error messages."""
        where = f"; schema {self.schema_path}" if self.schema_path else ""
        return f"{self.record_id} ({self.reason}{where})"


@dataclass
class SourceTaskStats:
    """Per Kafka partition: offsets and rows of the valid records a task wrote, plus what it held back."""

    first_offset: dict[int, int] = field(default_factory=dict)
    last_offset: dict[int, int] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    value_bytes: dict[int, int] = field(default_factory=dict)
    max_timestamp_ms: dict[int, int] = field(default_factory=dict)
    failures: list[SegmentReadFailure] = field(default_factory=list)
    invalid_count: int = 0
    invalid_samples: list[InvalidRecord] = field(default_factory=list)
    invalid_by_partition: dict[int, int] = field(default_factory=dict)
    invalid_first_offset: dict[int, int] = field(default_factory=dict)
    dead_letter_files: list[DataFile] = field(default_factory=list)  # uncommitted, in the dead-letter table

    @property
    def partitions(self) -> set[int]:
        return set(self.rows) | set(self.invalid_by_partition) | {f.partition for f in self.failures}


@dataclass(frozen=True)
class DeadLetterTarget:
    """Where a run's tasks write dead-letter data files (pickled into the ingestion job's tasks).

    `file_name_prefix` is the run's data file prefix (`iceberg_sink.data_file_prefix`), so crash leftovers are found
    by the same cleanup as the table's own; `ingested_at_us` (UTC microseconds) is the same for every row of a run.
    """

    table_name: str
    table_metadata_json: str
    file_io_properties: Mapping[str, str] = field(repr=False)
    run_id: str
    file_name_prefix: str
    ingested_at_us: int
    target_file_size_bytes: int

    def file_io(self) -> FileIO:
        location = TableMetadataUtil.parse_raw(self.table_metadata_json).location
        return load_file_io(dict(self.file_io_properties), location)


@dataclass(frozen=True)
class _DeadLetterWriteTask(WriteTask):
    """pyiceberg's write task named like the sink's files: `<run prefix><spark partition>-<seq>-<uuid>.parquet`."""

    file_name_prefix: str = ""

    def generate_data_file_filename(self, extension: str) -> str:
        return f"{self.file_name_prefix}{self.task_id:05d}-{self.write_uuid}.{extension}"


class DeadLetterFileWriter:
    """Turns one task's invalid records into dead-letter rows and writes them as Parquet data files of the
    dead-letter table, a file each time `target_file_size_bytes` of rows are buffered and at `close()`."""

    def __init__(self, target: DeadLetterTarget, spark_partition_id: int):
        self._target = target
        self._metadata = TableMetadataUtil.parse_raw(target.table_metadata_json)
        self._io = target.file_io()
        self._task_schema = pyarrow_to_schema(_DEAD_LETTER_ARROW_SCHEMA,
                                              name_mapping=self._metadata.schema().name_mapping,
                                              format_version=self._metadata.format_version)
        self._file_name_prefix = f"{target.file_name_prefix}{spark_partition_id:05d}-"
        self._write_uuid = uuid.uuid4()  # differs per task attempt, so a retried task never reuses a name
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._sequence = 0
        self.files: list[DataFile] = []

    def add(self, invalid: pa.RecordBatch) -> None:
        """`invalid`: source rows with a non-null `_kafscale_invalid_reason`."""
        rows = invalid.num_rows
        has_schema_paths = INVALID_SCHEMA_PATH_COLUMN in invalid.schema.names
        columns = {
            **{name: invalid.column(name) for name in ("record_id", "topic", "partition", "offset", "timestamp_ms",
                                                       "value")},
            "error": invalid.column(INVALID_REASON_COLUMN),
            "schema_path": invalid.column(INVALID_SCHEMA_PATH_COLUMN) if has_schema_paths else pa.nulls(rows),
            "run_id": pa.repeat(self._target.run_id, rows),
            "ingested_at": pa.repeat(pa.scalar(self._target.ingested_at_us, pa.int64()), rows),
        }
        # Spark may hand over large or differently-zoned variants of these types; the table's are fixed.
        batch = pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) for f in _DEAD_LETTER_ARROW_SCHEMA],
                                           schema=_DEAD_LETTER_ARROW_SCHEMA)
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self._target.target_file_size_bytes:
            self._flush()

    def close(self) -> list[DataFile]:
        self._flush()
        return self.files

    def discard(self) -> None:
        """Delete every file written so far (the task failed); a file that cannot be deleted is left to cleanup."""
        for data_file in self.files:
            try:
                self._io.delete(data_file.file_path)
            except Exception:  # noqa: BLE001 - keep deleting the rest; orphan cleanup removes it later
                log.warning("could not delete dead-letter data file %s of table %s", data_file.file_path,
                            self._target.table_name, exc_info=True)
        self.files = []

    def _flush(self) -> None:
        if not self._pending:
            return
        task = _DeadLetterWriteTask(write_uuid=self._write_uuid, task_id=self._sequence, schema=self._task_schema,
                                    record_batches=self._pending, file_name_prefix=self._file_name_prefix)
        self._sequence += 1
        self.files.extend(write_file(self._io, self._metadata, iter([task])))
        self._pending, self._pending_bytes = [], 0


class SourceRowSplitter:
    """Filters a task's Arrow batches down to the valid records (without the status columns) and keeps stats;
    with a dead-letter target, writes the invalid records to dead-letter data files (`stats.dead_letter_files`)."""

    def __init__(self, dead_letters: DeadLetterTarget | None = None, spark_partition_id: int = 0) -> None:
        self.stats = SourceTaskStats()
        self._dead_letters = DeadLetterFileWriter(dead_letters, spark_partition_id) if dead_letters else None

    def rows_to_write(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The valid rows; once `batches` is exhausted, the dead-letter files are closed into the stats."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            markers = is_error_marker(batch)
            if pc.any(markers).as_py():
                self.stats.failures.extend(error_markers(batch))
                batch = batch.filter(pc.invert(markers))
            if INVALID_REASON_COLUMN in batch.schema.names:
                reasons = batch.column(INVALID_REASON_COLUMN)
                if reasons.null_count < batch.num_rows:
                    self._hold_back_invalid(batch.filter(pc.is_valid(reasons)))
                    batch = batch.filter(pc.is_null(reasons))
                batch = batch.drop_columns([name for name in SOURCE_STATUS_COLUMNS if name in batch.schema.names])
            if batch.num_rows:
                self._count(batch)
                yield batch
        if self._dead_letters is not None:
            self.stats.dead_letter_files = self._dead_letters.close()

    def discard_dead_letters(self) -> None:
        """The task failed: delete the dead-letter files it wrote."""
        if self._dead_letters is not None:
            self._dead_letters.discard()
            self.stats.dead_letter_files = []

    def _hold_back_invalid(self, invalid: pa.RecordBatch) -> None:
        s = self.stats
        s.invalid_count += invalid.num_rows
        for partition in pc.unique(invalid.column("partition")).to_pylist():
            offsets = invalid.column("offset").filter(pc.equal(invalid.column("partition"), partition))
            first = pc.min(offsets).as_py()
            s.invalid_first_offset[partition] = min(first, s.invalid_first_offset.get(partition, first))
            s.invalid_by_partition[partition] = s.invalid_by_partition.get(partition, 0) + len(offsets)
        room = MAX_INVALID_SAMPLES - len(s.invalid_samples)
        if room > 0:
            names = ["record_id", INVALID_REASON_COLUMN]
            if INVALID_SCHEMA_PATH_COLUMN in invalid.schema.names:
                names.append(INVALID_SCHEMA_PATH_COLUMN)
            for row in invalid.select(names).slice(0, room).to_pylist():
                s.invalid_samples.append(InvalidRecord(row["record_id"], row[INVALID_REASON_COLUMN],
                                                       row.get(INVALID_SCHEMA_PATH_COLUMN)))
        if self._dead_letters is not None:
            self._dead_letters.add(invalid)

    def _count(self, batch: pa.RecordBatch) -> None:
        s = self.stats
        partitions = pc.unique(batch.column("partition")).to_pylist()
        for partition in partitions:
            rows = batch if len(partitions) == 1 else batch.filter(pc.equal(batch.column("partition"), partition))
            offsets = pc.min_max(rows.column("offset"))
            first, last = offsets["min"].as_py(), offsets["max"].as_py()
            s.first_offset[partition] = min(first, s.first_offset.get(partition, first))
            s.last_offset[partition] = max(last, s.last_offset.get(partition, last))
            s.rows[partition] = s.rows.get(partition, 0) + rows.num_rows
            value_bytes = pc.sum(pc.binary_length(rows.column("value"))).as_py() or 0
            s.value_bytes[partition] = s.value_bytes.get(partition, 0) + value_bytes
            max_ts = pc.max(rows.column("timestamp_ms")).as_py()
            s.max_timestamp_ms[partition] = max(max_ts, s.max_timestamp_ms.get(partition, max_ts))
