"""What one ingestion task read from its segments: the rows to write, and what must not be written.

An ingestion task (`engine/ingestion/spark_job.py`) writes the rows of one `SegmentRunPartition`, so one Kafka
partition. Before the rows reach Parquet, invalid records (a required mapped column missing or not coercible, or a value
violating the topic's JSON Schema) are taken out and accounted for here, so the driver can decide what to commit:
nothing at all while invalid records have nowhere to go. (A segment that cannot be read ends the task's rows; the
task reports it beside its stats, `spark_job.IngestionTaskOutput.failure`.)

With a dead-letter target, the held-back invalid records are written by the same task as Parquet data files of the
dead-letter table (`DEAD_LETTER_SCHEMA`), returned uncommitted in the task's stats; `engine/tables/dead_letters.py`
builds the target on the driver and commits those files.

Values in the Confluent wire format (`with_framed_value_columns`: Avro, Protobuf): the task decodes the values of the
base-column batches into the table's value columns (value_formats/framed.py). A value that does not decode is an invalid
record when the run has a dead-letter target, else its partition stops there; a schema id the run does not know, or
whose schema could not evolve the table, always stops the partition at its first record, as an unreadable segment
does (`SegmentReadError`, `key` the record id, `error_type` `<Format>SchemaError` for a schema id or
`<Format>DecodeError` for a value, e.g. `ProtobufDecodeError`; `decode_error_types`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile

from kafscale_lakehouse.engine.ingestion.segment_reader import (
    INVALID_REASON_COLUMN,
    INVALID_SCHEMA_PATH_COLUMN,
    SOURCE_STATUS_COLUMNS,
    SegmentReadError,
    SegmentReadFailure,
    SegmentRunPartition,
)
from kafscale_lakehouse.engine.tables.data_files import RollingDataFiles
from kafscale_lakehouse.engine.tables.dead_letters import DEAD_LETTER_ARROW_SCHEMA, DeadLetterTarget
from kafscale_lakehouse.engine.tables.summary import LfsStats
from kafscale_lakehouse.format import BASE_SCHEMA
from kafscale_lakehouse.schema.columns import KAFKA_TIMESTAMP_ARROW_TYPE, KAFKA_TIMESTAMP_COLUMN
from kafscale_lakehouse.value_formats.framed import DecodedValues, DecodeStop, FramedValueSchemas, ValueDecoder
from kafscale_lakehouse.value_formats.keys import KeyDecoder, KeyDecoding

log = logging.getLogger(__name__)

MAX_INVALID_SAMPLES = 20
# The `error_type` prefix of a stopped partition, by the format of what did not decode (`key_format` json: "Json").
_ERROR_TYPE_FORMATS = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JsonSchema", "json": "Json"}


def decode_error_types(data_format: str) -> tuple[str, str]:
    """(`error_type` of a schema id unknown to the run or whose schema cannot evolve the table, `error_type` of a
    value or key that does not decode, without a dead-letter target) for values or keys in `data_format`."""
    prefix = _ERROR_TYPE_FORMATS[data_format]
    return f"{prefix}SchemaError", f"{prefix}DecodeError"


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
    # The timestamp of the record at `last_offset`: the Go processor's watermark timestamp (its last written record).
    last_timestamp_ms: dict[int, int] = field(default_factory=dict)
    invalid_count: int = 0
    invalid_samples: list[InvalidRecord] = field(default_factory=list)
    invalid_by_partition: dict[int, int] = field(default_factory=dict)
    invalid_first_offset: dict[int, int] = field(default_factory=dict)
    dead_letter_files: list[DataFile] = field(default_factory=list)  # uncommitted, in the dead-letter table
    lfs: LfsStats = field(default_factory=LfsStats)  # what the task did with LFS envelopes


class DeadLetterFileWriter:
    """Turns one task's invalid records into dead-letter rows, written as Parquet data files of the dead-letter
    table as they come (`RollingDataFiles`)."""

    def __init__(self, target: DeadLetterTarget, task_id: int) -> None:
        self._target = target
        self._files = RollingDataFiles(target.sink, task_id)

    def add(self, invalid: pa.RecordBatch) -> None:
        """`invalid`: source rows with a non-null `_kafscale_invalid_reason`."""
        rows = invalid.num_rows
        has_schema_paths = INVALID_SCHEMA_PATH_COLUMN in invalid.schema.names
        columns = {
            **{name: invalid.column(name) for name in ("record_id", "topic", "partition", "offset", "timestamp_ms",
                                                       "value")},
            "error": invalid.column(INVALID_REASON_COLUMN),
            "schema_path": invalid.column(INVALID_SCHEMA_PATH_COLUMN) if has_schema_paths else pa.nulls(rows),
            "run_id": pa.repeat(self._target.sink.run_id, rows),
            "ingested_at": pa.repeat(pa.scalar(self._target.ingested_at_us, pa.int64()), rows),
        }
        # The source's large or differently-zoned variants of these types; the table's are fixed.
        self._files.write(pa.Table.from_arrays([columns[f.name].cast(f.type) for f in DEAD_LETTER_ARROW_SCHEMA],
                                               schema=DEAD_LETTER_ARROW_SCHEMA))

    def close(self) -> list[DataFile]:
        return self._files.close()

    def discard(self) -> None:
        """Delete every file written so far (the task failed)."""
        self._files.discard()


class SourceRowSplitter:
    """Filters a task's Arrow batches down to the valid records (without the status columns) and keeps stats;
    with a dead-letter target, writes the invalid records to dead-letter data files (`stats.dead_letter_files`)."""

    def __init__(self, dead_letters: DeadLetterTarget | None = None, task_id: int = 0) -> None:
        self.stats = SourceTaskStats()
        self._dead_letters = DeadLetterFileWriter(dead_letters, task_id) if dead_letters else None

    def rows_to_write(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The valid rows; once `batches` is exhausted, the dead-letter files are closed into the stats."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
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
            if last >= s.last_offset.get(partition, last):
                at_last = pc.index(rows.column("offset"), last).as_py()
                s.last_timestamp_ms[partition] = rows.column("timestamp_ms")[at_last].as_py()
            s.first_offset[partition] = min(first, s.first_offset.get(partition, first))
            s.last_offset[partition] = max(last, s.last_offset.get(partition, last))
            s.rows[partition] = s.rows.get(partition, 0) + rows.num_rows
            value_bytes = pc.sum(pc.binary_length(rows.column("value"))).as_py() or 0
            s.value_bytes[partition] = s.value_bytes.get(partition, 0) + value_bytes


def framed_source_schema(schemas: FramedValueSchemas) -> pa.Schema:
    """The batches `with_framed_value_columns` yields: base columns, the table's value columns, the invalid reason."""
    return pa.schema([*BASE_SCHEMA, *schemas.value_schema,
                      pa.field(INVALID_REASON_COLUMN, pa.string(), nullable=True)])


def with_framed_value_columns(batches: Iterable[pa.RecordBatch], decoder: ValueDecoder,
                            partition: SegmentRunPartition, *, invalid_stops: bool) -> Iterator[pa.RecordBatch]:
    """`batches` (the base columns of one input partition's records, in offset order) with their values decoded
    into the value columns (`framed_source_schema`). Raises `SegmentReadError` at the first record of a schema id that
    stops the partition, or (`invalid_stops`: no dead-letter target) at the first value that does not decode, once
    the rows before it are yielded."""
    schema = framed_source_schema(decoder.settings)
    for batch in batches:
        decoded = decoder.decode(batch.column("value"))
        stop, error_type = _decode_stop(decoded, invalid_stops, decoder.settings.value_format)
        rows = batch.num_rows if stop is None else stop.row
        if rows:
            base = [batch.column(f.name).slice(0, rows) for f in BASE_SCHEMA]
            yield pa.RecordBatch.from_arrays([*base, *(c.slice(0, rows) for c in decoded.columns),
                                              decoded.invalid_reasons.slice(0, rows)], schema=schema)
        if stop is not None:
            raise _partition_stop(batch, stop, error_type, partition)


def schema_with_key_columns(schema: pa.Schema, keys: KeyDecoding) -> pa.Schema:
    """`schema` of source batches with the decoded key columns before the status columns."""
    at = _before_status_columns(schema)
    return pa.schema([*list(schema)[:at], *keys.arrow_fields(), *list(schema)[at:]])


def with_key_columns(batches: Iterable[pa.RecordBatch], decoder: KeyDecoder, partition: SegmentRunPartition, *,
                     invalid_stops: bool) -> Iterator[pa.RecordBatch]:
    """`batches` (source batches with their invalid-reason column) with the record keys decoded into the key
    columns (`schema_with_key_columns`, value_formats/keys.py): a key that does not decode makes its record invalid (a
    value's reason comes first) or (`invalid_stops`) stops the partition there, as a key schema id the run does not
    know always does, once the rows before it are yielded."""
    fields = decoder.decoding.arrow_fields()
    for batch in batches:
        decoded = decoder.decode(batch.column("key"))
        framed = decoder.decoding.framed
        stop, error_type = _decode_stop(decoded, invalid_stops, "json" if framed is None else framed.value_format)
        rows = batch.num_rows if stop is None else stop.row
        if rows:
            rows_batch = batch.slice(0, rows)
            reasons = pc.coalesce(rows_batch.column(INVALID_REASON_COLUMN), decoded.invalid_reasons.slice(0, rows))
            at = _before_status_columns(rows_batch.schema)
            arrays = [*rows_batch.columns[:at], *(c.slice(0, rows) for c in decoded.columns),
                      *rows_batch.columns[at:]]
            arrays[at + len(fields) + rows_batch.schema.names[at:].index(INVALID_REASON_COLUMN)] = reasons
            yield pa.RecordBatch.from_arrays(arrays, schema=schema_with_key_columns(rows_batch.schema,
                                                                                     decoder.decoding))
        if stop is not None:
            raise _partition_stop(batch, stop, error_type, partition)


def _decode_stop(decoded: DecodedValues, invalid_stops: bool, data_format: str) -> tuple[DecodeStop | None, str]:
    """Where the partition stops in a decoded batch, and the error type (`decode_error_types` of `data_format`): the
    decoder's stop (a schema id), or (`invalid_stops`) the first record that does not decode when that comes first."""
    schema_error_type, decode_error_type = decode_error_types(data_format)
    stop, reasons = decoded.stop, decoded.invalid_reasons
    if invalid_stops and reasons.null_count < len(reasons):
        first_invalid = pc.index(pc.is_valid(reasons), True).as_py()
        if stop is None or first_invalid < stop.row:
            return DecodeStop(first_invalid, None, reasons[first_invalid].as_py()), decode_error_type
    return stop, schema_error_type


def _partition_stop(batch: pa.RecordBatch, stop: DecodeStop, error_type: str,
                    partition: SegmentRunPartition) -> SegmentReadError:
    offset = batch.column("offset")[stop.row].as_py()
    record_id = batch.column("record_id")[stop.row].as_py()
    segment = next(s for s in partition.segments if s.base_offset <= offset <= s.last_offset)
    log.error("topic %s partition %d stops at offset %d: %s", partition.topic, partition.partition, offset,
              stop.reason)
    return SegmentReadError(SegmentReadFailure(
        topic=partition.topic, partition=partition.partition, kfs_key=segment.kfs_key, key=record_id,
        position=None, error_type=error_type, message=f"record {record_id}: {stop.reason}",
        base_offset=segment.base_offset, next_offset=offset))


_KAFKA_TIMESTAMP_FIELD = pa.field(KAFKA_TIMESTAMP_COLUMN, KAFKA_TIMESTAMP_ARROW_TYPE, nullable=True)


def _before_status_columns(schema: pa.Schema) -> int:
    return next((i for i, name in enumerate(schema.names) if name in SOURCE_STATUS_COLUMNS), len(schema.names))


def schema_with_kafka_timestamp(schema: pa.Schema) -> pa.Schema:
    """`schema` of source batches with the `kafka_timestamp` column before the status columns."""
    return schema.insert(_before_status_columns(schema), _KAFKA_TIMESTAMP_FIELD)


def with_kafka_timestamp(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches` with `kafka_timestamp`: the record timestamp (`timestamp_ms`) as a UTC timestamp."""
    for batch in batches:
        milliseconds = pc.cast(batch.column("timestamp_ms"), pa.timestamp("ms", tz="UTC"))
        yield batch.add_column(_before_status_columns(batch.schema), _KAFKA_TIMESTAMP_FIELD,
                               pc.cast(milliseconds, KAFKA_TIMESTAMP_ARROW_TYPE))
