"""Reading KafScale segments for an ingestion run: exact Kafka offset ranges of one topic, straight from segments.

Planning (driver): the ingestion run plans whole segments per Kafka partition and groups them into input partitions
with `segment_run_partitions`; `plan_read` resolves explicit offset ranges (EARLIEST/LATEST, gap and range checks)
the same way. An input partition (`SegmentRunPartition`) is a run of consecutive segments of one Kafka partition,
up to a byte budget of `.kfs` bytes (a larger segment is a run of its own), and carries its own offset sub-range.
`plan_read` lists from the segment holding the start offset on only (up to the end offset), so segments below the
range cost nothing but their share of the key listing. A gap inside the range, or between the start offset and the
first segment, fails (`OffsetGapError`); an end beyond the last completed segment fails (`OffsetRangeError`).

Reading (one Spark task of `engine/spark_ingestion.py`, `read_input_partition`): each segment is fetched once and
decoded with CRC checks, limited to the range. A segment in which the start offset falls mid-way is range-read: its
`.index` (one GET), then one ranged GET from the index entry at or before the start offset to the end of the object,
decoded with `decode_batches`. Arrow batches of at most `MAX_ROWS_PER_BATCH` rows are yielded in
`source_arrow_schema`: the base columns (`BASE_SCHEMA`), the mapped columns (types from the schema layer, all
nullable: a required column is null in an invalid record), then `_kafscale_invalid_reason` (string, nullable),
then, only with a JSON Schema, `_kafscale_invalid_schema_path` (string, nullable).

Invalid records (a required mapped column missing or not coercible, or a value that is no JSON object while a column
is required, or with a JSON Schema a value that violates it) are kept: `_kafscale_invalid_reason` says why
(`<column>: <reason>`; the reason alone when the whole value is at fault; `<value path>: <reason>` for a schema
violation, which wins over a coercion failure of the same record) and is null for valid records.
`_kafscale_invalid_schema_path` is the JSON Pointer of the violated schema keyword (`#/properties/store_id/type`),
null unless the record violates the schema. The task splits on them (table vs dead letters) and drops them.

Segment errors: a segment that cannot be read (`SegmentFormatError` / `StorageError`) ends the input partition with
`SegmentReadError`, raised after the batches of the segments before it were yielded. Its `failure`
(`SegmentReadFailure`) names the object at fault and the byte offset, and the first offset of the Kafka partition
not delivered (`next_offset`); the ingestion task returns it beside the files it wrote, and the run commits that
partition only below it. Other input partitions of the same Kafka partition (later segments) still run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from kafscale_lakehouse.config import ColumnConfig
from kafscale_lakehouse.format import (
    BASE_SCHEMA,
    FOOTER_SIZE,
    HEADER_SIZE,
    BadIndexError,
    SegmentFormatError,
    SegmentMismatchError,
    decode_batches,
    decode_segment,
    entry_for_offset,
    parse_footer,
    parse_index,
)
from kafscale_lakehouse.format.segment_index import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE
from kafscale_lakehouse.schema import JsonColumnCoercer, record_arrow_schema
from kafscale_lakehouse.schema.validation import CompiledJsonSchema, ValidationResult, validate_values
from kafscale_lakehouse.storage import (
    Gap,
    IncompleteSegment,
    ObjectKind,
    SegmentRef,
    SegmentStore,
    StorageError,
    find_gaps,
    parse_segment_key,
    partition_prefix,
    segment_key,
)

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
INVALID_REASON_COLUMN = "_kafscale_invalid_reason"
INVALID_SCHEMA_PATH_COLUMN = "_kafscale_invalid_schema_path"
# Columns that describe a record rather than belong to it: never written to the table.
SOURCE_STATUS_COLUMNS = (INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN)
DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024
MAX_ROWS_PER_BATCH = 65_536


class KafscaleSourceError(Exception):
    """Segments cannot be read as asked; the message names the topic and partition."""


class OffsetRangeError(KafscaleSourceError):
    """A requested offset range does not lie within the completed segments of its partition."""


class OffsetGapError(KafscaleSourceError):
    """Offsets inside a requested range are missing from storage (deleted before they were ingested)."""

    def __init__(self, message: str, *, gaps: Sequence[Gap] = ()) -> None:
        super().__init__(message)
        self.gaps = tuple(gaps)


# ----------------------------------------------------------------------------------------------------- schema


def source_arrow_schema(columns: Sequence[ColumnConfig], *, validated: bool = False) -> pa.Schema:
    """Base columns, mapped columns (nullable: invalid records keep nulls there), then `_kafscale_invalid_reason`,
    then (`validated`: the read has a `jsonSchema`) `_kafscale_invalid_schema_path`."""
    record_schema = record_arrow_schema(columns)
    mapped = [record_schema.field(name).with_nullable(True) for name in record_schema.names[len(BASE_SCHEMA):]]
    status = [pa.field(INVALID_REASON_COLUMN, pa.string(), nullable=True)]
    if validated:
        status.append(pa.field(INVALID_SCHEMA_PATH_COLUMN, pa.string(), nullable=True))
    return pa.schema([*BASE_SCHEMA, *mapped, *status])


# --------------------------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class OffsetRange:
    start: int  # inclusive
    end: int  # exclusive

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


@dataclass(frozen=True)
class SegmentRunPartition:
    """One ingestion task's input: consecutive segments of one Kafka partition and the offsets to take from them."""

    topic: str
    partition: int
    offsets: OffsetRange
    segments: tuple[SegmentRef, ...]


@dataclass(frozen=True)
class ReadPlan:
    """`ranges`: the resolved range per Kafka partition (earliest/latest replaced by offsets); a partition with
    no completed segment whose start was `EARLIEST` has nothing to read and no range."""

    ranges: dict[int, OffsetRange]
    input_partitions: list[SegmentRunPartition]


def plan_read(store: SegmentStore, topic: str, ending_offsets: Mapping[int, int],
              starting_offsets: Mapping[int, int] | None = None, *,
              max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION) -> ReadPlan:
    """Resolve the offset ranges and group the segments to read into input partitions (see module docstring).

    `ending_offsets`: partition → exclusive end offset, or `LATEST` (the end of the latest completed segment); the
    partitions read are these. `starting_offsets`: partition → inclusive start, or `EARLIEST` (the default).
    """
    starting_offsets = starting_offsets or {}
    _check_ranges(topic, ending_offsets, starting_offsets, max_bytes_per_partition)
    ranges: dict[int, OffsetRange] = {}
    input_partitions: list[SegmentRunPartition] = []
    for partition in sorted(ending_offsets):
        start = starting_offsets.get(partition, EARLIEST)
        resolved, segments = _plan_partition(store, topic, partition, start, ending_offsets[partition])
        if resolved is None:
            log.info("topic %s partition %d: no completed segment in %s, nothing to read", topic, partition,
                     store.location)
            continue
        ranges[partition] = resolved
        input_partitions.extend(segment_run_partitions(topic, partition, resolved, segments,
                                                       max_bytes_per_partition))
    log.info("kafscale read of topic %s from %s: ranges %s in %d input partitions (%d segments, %d bytes)",
             topic, store.location, {p: str(r) for p, r in ranges.items()}, len(input_partitions),
             sum(len(p.segments) for p in input_partitions),
             sum(s.kfs_size for p in input_partitions for s in p.segments))
    return ReadPlan(ranges, input_partitions)


def _check_ranges(topic: str, ending_offsets: Mapping[int, int], starting_offsets: Mapping[int, int],
                  max_bytes_per_partition: int) -> None:
    if not ending_offsets:
        raise ValueError(f"ending offsets name no partition of topic {topic!r}")
    if max_bytes_per_partition < 1:
        raise ValueError(f"max_bytes_per_partition is {max_bytes_per_partition}; it must be positive")
    extra = sorted(set(starting_offsets) - set(ending_offsets))
    if extra:
        raise ValueError(f"starting offsets name partitions {extra} of topic {topic!r} that the ending offsets do "
                         "not; the ending offsets list the partitions to read")
    for partition, end in ending_offsets.items():
        start = starting_offsets.get(partition, EARLIEST)
        if partition < 0 or start < EARLIEST or start == LATEST or end < LATEST:
            raise ValueError(f"topic {topic!r} partition {partition}: offsets {start}..{end} are invalid (start >= 0 "
                             f"or {EARLIEST} = earliest, end >= 0 or {LATEST} = latest)")
        if start >= 0 and end >= 0 and start > end:
            raise ValueError(f"topic {topic!r} partition {partition}: starting offset {start} is after ending "
                             f"offset {end}")


def _plan_partition(store: SegmentStore, topic: str, partition: int, start: int,
                    end: int) -> tuple[OffsetRange | None, list[SegmentRef]]:
    if start >= 0 and start == end:
        return OffsetRange(start, end), []
    segments, incomplete = _segments_from(store, topic, partition, start, end)
    # Operators need to know why the log "ends" early: an upload in flight, or a broker that died mid-upload.
    not_complete = f"; not complete: {incomplete[0].kfs_key or incomplete[0].index_key}: {incomplete[0].reason}" \
        if incomplete else ""
    if start == EARLIEST:
        if not segments:
            if end == LATEST:
                return None, []
            raise OffsetRangeError(f"topic {topic} partition {partition}: no completed segment in {store.location} "
                                   f"holds offsets below the ending offset {end}{not_complete}")
        start = segments[0].base_offset
    available_end = segments[-1].last_offset + 1 if segments else None
    if end == LATEST:
        if available_end is not None and start > available_end:
            raise OffsetRangeError(f"topic {topic} partition {partition}: starting offset {start} is beyond the "
                                   f"end of the latest completed segment ({available_end}) in {store.location}")
        end = available_end if available_end is not None else start
    offsets = OffsetRange(start, end)
    if start == end:
        return offsets, []
    if available_end is None or available_end < end:
        have = f"completed segments end at offset {available_end}" if available_end is not None else \
            "there is no completed segment at or after the starting offset"
        raise OffsetRangeError(f"topic {topic} partition {partition}: ending offset {end} is beyond the completed "
                               f"segments in {store.location} ({have}{not_complete})")
    in_range = [segment for segment in segments if segment.last_offset >= start and segment.base_offset < end]
    gaps = find_gaps(in_range)
    # The first segment reaching `start` must hold it (it may begin at or beyond `end` when a gap spans the range).
    first = next(segment for segment in segments if segment.last_offset >= start)
    if first.base_offset > start:
        gaps.insert(0, Gap(topic, partition, start, first.base_offset, first.kfs_key))
    if gaps:
        raise OffsetGapError(f"topic {topic} partition {partition}: offsets missing from {store.location} inside "
                             f"the requested range {offsets}: " + "; ".join(map(str, gaps)), gaps=gaps)
    return offsets, in_range


def _segments_from(store: SegmentStore, topic: str, partition: int, start: int,
                   end: int) -> tuple[list[SegmentRef], list[IncompleteSegment]]:
    """Completed segments from the one holding `start` (the first one for EARLIEST) up to the one holding `end - 1`,
    and the incomplete segments seen after them.

    One key listing gives every base offset; `list_segments` then resumes after the segment before the one holding
    `start` and stops after the last base offset below `end`, so footers are read only for segments that matter.
    """
    prefix = partition_prefix(store.namespace, topic, partition)
    parsed_keys = (parse_segment_key(info.key, store.namespace) for info in store.list_objects(prefix))
    bases = sorted({parsed.base_offset for parsed in parsed_keys if parsed is not None})
    first = max((base for base in bases if base <= start), default=None) if start != EARLIEST else None
    earlier = [base for base in bases if base < first] if first is not None else []
    after = segment_key(store.namespace, topic, partition, earlier[-1], ObjectKind.SEGMENT) if earlier else None
    limit = None
    if end != LATEST:
        limit = sum(1 for base in bases if (first is None or base >= first) and base < end)
        if limit == 0:
            return [], []
    listing = store.list_segments(topic, partition, after=after, limit=limit)
    return listing.segments, listing.incomplete


def segment_run_partitions(topic: str, partition: int, offsets: OffsetRange, segments: Sequence[SegmentRef],
                           max_bytes: int) -> list[SegmentRunPartition]:
    """Consecutive `segments` grouped into input partitions of at most `max_bytes` of segment bytes each (a larger
    segment gets one of its own), each taking the offsets of `offsets` that its segments hold."""
    runs: list[list[SegmentRef]] = []
    run_bytes = 0
    for segment in segments:
        if not runs or run_bytes + segment.kfs_size > max_bytes:
            runs.append([])
            run_bytes = 0
        runs[-1].append(segment)
        run_bytes += segment.kfs_size
    return [SegmentRunPartition(topic, partition,
                                OffsetRange(max(offsets.start, run[0].base_offset),
                                            min(offsets.end, run[-1].last_offset + 1)), tuple(run))
            for run in runs]


# ---------------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class SegmentReadFailure:
    """Why `topic`/`partition` stopped at `next_offset`: the segment at `base_offset` could not be read."""

    topic: str
    partition: int
    kfs_key: str
    key: str  # the object at fault (`.kfs` or `.index`)
    position: int | None  # byte offset in `key`; None for storage errors
    error_type: str
    message: str
    base_offset: int  # of the failing segment
    next_offset: int  # first offset of the partition not delivered


class SegmentReadError(KafscaleSourceError):
    """A segment of an input partition could not be read; `failure` says where its Kafka partition stops."""

    def __init__(self, failure: SegmentReadFailure) -> None:
        super().__init__(f"topic {failure.topic} partition {failure.partition} stops at offset {failure.next_offset}: "
                         f"{failure.error_type}: {failure.message}")
        self.failure = failure

    def __reduce__(self) -> tuple[object, ...]:  # pickles (Spark ships executor errors) with its failure
        return (type(self), (self.failure,))


def read_input_partition(store: SegmentStore, partition: SegmentRunPartition, columns: Sequence[ColumnConfig],
                         json_schema: CompiledJsonSchema | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches (`source_arrow_schema(columns, validated=json_schema is not None)`) of the records of
    `partition`, in offset order, each value validated against `json_schema` when given.

    A segment that cannot be read raises `SegmentReadError` (from the `SegmentFormatError` / `StorageError`) once
    the batches of the segments before it are yielded."""
    schema = source_arrow_schema(columns, validated=json_schema is not None)
    coercer = JsonColumnCoercer(columns)
    for segment in partition.segments:
        try:
            records = fetch_segment_records(store, segment, partition.offsets)
        except (SegmentFormatError, StorageError) as exc:
            next_offset = max(segment.base_offset, partition.offsets.start)
            log.error("topic %s partition %d stops at offset %d: %s", partition.topic, partition.partition,
                      next_offset, exc)
            raise SegmentReadError(SegmentReadFailure(
                topic=segment.topic, partition=segment.partition, kfs_key=segment.kfs_key,
                key=exc.key or segment.kfs_key,
                position=exc.position if isinstance(exc, SegmentFormatError) else None,
                error_type=type(exc).__name__, message=str(exc), base_offset=segment.base_offset,
                next_offset=next_offset)) from exc
        for batch in records.to_batches(max_chunksize=MAX_ROWS_PER_BATCH):
            yield _with_mapped_columns(batch, coercer, schema, json_schema)


def fetch_segment_records(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange) -> pa.Table:
    """The records of `segment` within `offsets` (BASE_SCHEMA), fetched once and decoded with CRC checks.

    When `offsets.start` falls mid-way, only the bytes from the index entry at or before it are fetched; then the
    batch CRCs are verified but not the footer's body CRC, which covers bytes that were not fetched.
    """
    if offsets.start > segment.base_offset:
        entries = parse_index(store.read(segment.index_key), key=segment.index_key)
        entry = entry_for_offset(entries, offsets.start)
        if entry.position > HEADER_SIZE:
            entry_position = INDEX_HEADER_SIZE + entries.index(entry) * INDEX_ENTRY_SIZE
            return _decode_from_index_entry(store, segment, offsets, entry.offset, entry.position, entry_position)
    decoded = decode_segment(store.read(segment.kfs_key), key=segment.kfs_key, topic=segment.topic,
                             partition=segment.partition, start_offset=offsets.start, end_offset=offsets.end)
    return decoded.records


def _decode_from_index_entry(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange, entry_offset: int,
                             byte_position: int, entry_position: int) -> pa.Table:
    """Range-read and decode the batches from `byte_position` (an index entry for `entry_offset`) to the footer."""
    footer_position = segment.kfs_size - FOOTER_SIZE
    if byte_position >= footer_position:
        raise BadIndexError(segment.index_key, entry_position,
                            f"index entry (offset {entry_offset}, byte {byte_position}) points at or past the footer "
                            f"of {segment.kfs_key} (byte {footer_position})")
    data = store.read_range(segment.kfs_key, byte_position, segment.kfs_size - byte_position)
    footer = parse_footer(data[-FOOTER_SIZE:], segment.kfs_key, footer_position)
    decoded = decode_batches(memoryview(data)[:-FOOTER_SIZE], key=segment.kfs_key, position=byte_position,
                             topic=segment.topic, partition=segment.partition, start_offset=offsets.start,
                             end_offset=offsets.end)
    first_batch, last_batch = decoded.batches[0], decoded.batches[-1]
    if first_batch.base_offset != entry_offset:
        raise BadIndexError(segment.index_key, entry_position,
                            f"index entry says offset {entry_offset} starts at byte {byte_position} of "
                            f"{segment.kfs_key}, the batch there starts at offset {first_batch.base_offset}")
    if last_batch.last_offset != footer.last_offset:
        raise SegmentMismatchError(segment.kfs_key, footer_position + 4,
                                   f"footer last offset is {footer.last_offset}, the last batch ends at offset "
                                   f"{last_batch.last_offset}")
    return decoded.records


def _with_mapped_columns(batch: pa.RecordBatch, coercer: JsonColumnCoercer, schema: pa.Schema,
                         json_schema: CompiledJsonSchema | None) -> pa.RecordBatch:
    result = coercer.coerce(batch.column("value"))
    column_reasons = pc.binary_join_element_wise(result.invalid_column, result.invalid_reason, ": ")
    reasons = pc.coalesce(column_reasons, result.invalid_reason)
    mapped = [result.columns[column.name] for column in coercer.columns]
    status = [reasons]
    if json_schema is not None:
        violations = validate_values(batch.column("value"), batch.column("record_id"), json_schema)
        # The schema violation names the record's fault as the producer's contract states it, so it wins.
        status = [pc.coalesce(violations.reasons(), reasons), _schema_paths(violations)]
    return pa.RecordBatch.from_arrays([*batch.columns, *mapped, *status], schema=schema)


def _schema_paths(violations: ValidationResult) -> pa.StringArray:
    paths: list[str | None] = [None] * violations.record_count
    for record in violations.invalid_records:
        paths[record.row] = record.schema_path
    return pa.array(paths, type=pa.string())
