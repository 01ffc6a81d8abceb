"""Reading KafScale segments for an ingestion run: exact Kafka offset ranges of one topic, straight from segments.

Planning happens in the ingestion run (`engine/ingestion/run.py`, with `storage.segments_from` and `storage.find_gaps`);
`segment_run_partitions` cuts a partition's planned segments into input partitions. An input partition
(`SegmentRunPartition`) is a run of consecutive segments of one Kafka partition, up to a byte budget of `.kfs`
bytes (a larger segment is a run of its own), and carries its own offset sub-range.

Reading (one Spark task of `engine/ingestion/spark_job.py`, `read_input_partition`): each segment is fetched once and
checked with its CRCs (`frame_segment`), limited to the range; the records of consecutive segments are then decoded
together (`decode_framed`). A segment in which the start offset falls mid-way is range-read: its
`.index` (one GET), then one ranged GET from the index entry at or before the start offset to the end of the object;
when the `.index` is missing or corrupt (or the range it points at is not a batch) the whole `.kfs` is read instead.
Arrow batches of at most `MAX_ROWS_PER_BATCH` rows are yielded in
`source_arrow_schema`: the base columns (`BASE_SCHEMA`), the mapped columns (types from the schema layer, all
nullable: a required column is null in an invalid record), then `_kafscale_invalid_reason` (string, nullable),
then, only with a JSON Schema, `_kafscale_invalid_schema_path` (string, nullable).

LFS (`lfs`, `lfs.LfsReadSettings`, from the task spec): envelope records are resolved, referenced or
skipped before the mapped columns are computed (engine/ingestion/lfs.py); with `store_metadata` the `lfs_*`
columns (`schema.columns.LFS_METADATA_COLUMNS`) end `columns` and are filled by that stage. A record that fails
there is an invalid record (on_error dead_letter, schema mode lenient) or stops its partition like a failing
segment: `SegmentReadError` whose failure has `error_type` `LfsResolutionError`, `key` the blob (or the record id
when the envelope does not decode) and `next_offset` the record's offset.

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
An object that is not the segment planned (replaced after planning: other base offset, last offset or size) is such
a segment too (`SegmentChangedError`, naming what was planned and what was found): the run commits up to the
planned end, so reading it as it is now could skip offsets silently.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.ingestion.lfs import LFS_ERROR_TYPE, LfsFailure, LfsReadSettings, LfsResolver, LfsStats
from kafscale_lakehouse.format import (
    BASE_SCHEMA,
    FOOTER_SIZE,
    HEADER_SIZE,
    BadIndexError,
    FramedBatches,
    SegmentFormatError,
    SegmentMismatchError,
    decode_framed,
    entry_for_offset,
    frame_batch_run,
    frame_segment,
    parse_footer,
    parse_header,
    parse_index,
)
from kafscale_lakehouse.format.segment_index import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema import JsonColumnCoercer, NumericTimestampUnit, record_arrow_schema
from kafscale_lakehouse.schema.columns import LFS_METADATA_COLUMNS, Column
from kafscale_lakehouse.schema.validation import CompiledJsonSchema, ValidationResult, validate_values
from kafscale_lakehouse.storage import SegmentOverlapError, SegmentRef, SegmentStore, StorageError

log = logging.getLogger(__name__)

INVALID_REASON_COLUMN = "_kafscale_invalid_reason"
INVALID_SCHEMA_PATH_COLUMN = "_kafscale_invalid_schema_path"
# Columns that describe a record rather than belong to it: never written to the table.
SOURCE_STATUS_COLUMNS = (INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN)
MAX_ROWS_PER_BATCH = 65_536
# A run's next segments are fetched and decoded while the current one is handled: a segment is one GET, and a run of
# small segments fetched one after another waited a round trip each (at 200 topics, most of a batch's Spark job).
# At most READ_AHEAD_SEGMENTS at once and, beyond the current one, READ_AHEAD_BYTES of `.kfs` (a large segment is
# fetched alone, as before: bounded memory).
READ_AHEAD_SEGMENTS = 4
READ_AHEAD_BYTES = 16 << 20
# The records of consecutive segments are decoded and mapped (coerced, validated) together up to this many bytes of
# (decompressed) records: decoding costs a fixed ~2 ms per call and mapping ~1 ms per batch (numpy and Arrow kernels,
# JSON parsing set-up), as much as the 40 records of a segment per 10 s of realistic traffic cost
# (benchmarks/batch_cost.py --segments 13). A larger segment is decoded and mapped alone.
DECODED_TOGETHER_BYTES = 4 << 20


# A segment planned to end where its successor begins ended before it (`FetchedSegment.ends_early_at`): its partition
# stops there.
SEGMENT_GAP_ERROR_TYPE = "SegmentGap"


class KafscaleSourceError(EngineError):
    """Segments cannot be read as asked; the message names the topic and partition."""


# ----------------------------------------------------------------------------------------------------- schema


def source_arrow_schema(columns: Sequence[Column], *, validated: bool = False) -> pa.Schema:
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
class SegmentRunPartition:
    """One ingestion task's input: consecutive segments of one Kafka partition and the offsets to take from them."""

    topic: str
    offsets: OffsetRange
    segments: tuple[SegmentRef, ...]

    @property
    def partition(self) -> int:
        return self.offsets.partition


def segment_run_partitions(topic: str, offsets: OffsetRange, segments: Sequence[SegmentRef],
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
    return [SegmentRunPartition(topic,
                                OffsetRange(offsets.partition, max(offsets.start, run[0].base_offset),
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


class SegmentChangedError(SegmentMismatchError):
    """The object at a planned segment's key is not the segment planned (other base offset, last offset or size):
    it was replaced (re-cut, rewritten) after planning. Its records are not delivered: the run's commit would advance
    to the planned end, so a shorter object would skip offsets silently."""

    @classmethod
    def of(cls, segment: SegmentRef, position: int, found: str) -> SegmentChangedError:
        """`found` says what the object read holds (`offsets 0..149 in 2000 bytes`)."""
        return cls(segment.kfs_key, position,
                   f"not the segment planned: planned offsets {segment.base_offset}..{segment.last_offset} in "
                   f"{segment.kfs_size} bytes, found {found} (replaced after planning)")


class FetchedSegment(NamedTuple):
    """What `fetch_segment` returns: the segment's batches asked for, checked, their records not decoded yet, and
    whether the segment ends before its plan."""

    framed: FramedBatches
    # A segment planned to end where its successor begins (`SegmentRef.end_from_footer` False) whose footer ends
    # before: the offset after its footer's last one; offsets from there to the successor exist in no segment.
    ends_early_at: int | None = None


def _gap_after(segment: SegmentRef, next_offset: int) -> str:
    """What is missing after `segment`, whose footer ends at `next_offset - 1`, before its planned successor."""
    return (f"{segment.kfs_key} ends at offset {next_offset - 1}, the next segment begins at "
            f"{segment.last_offset + 1}: offsets {next_offset}..{segment.last_offset} are missing")


class SegmentReadError(KafscaleSourceError):
    """A segment of an input partition could not be read; `failure` says where its Kafka partition stops."""

    def __init__(self, failure: SegmentReadFailure) -> None:
        super().__init__(f"topic {failure.topic} partition {failure.partition} stops at offset {failure.next_offset}: "
                         f"{failure.error_type}: {failure.message}")
        self.failure = failure

    def __reduce__(self) -> tuple[type[SegmentReadError], tuple[SegmentReadFailure]]:
        # Spark ships executor errors pickled: keep the failure
        return (type(self), (self.failure,))


def read_input_partition(store: SegmentStore, partition: SegmentRunPartition, columns: Sequence[Column],
                         json_schema: CompiledJsonSchema | None = None, lfs: LfsReadSettings | None = None,
                         lfs_stats: LfsStats | None = None, *,
                         numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS,
                         ) -> Iterator[pa.RecordBatch]:
    """Arrow batches (`source_arrow_schema(columns, validated=json_schema is not None)`) of the records of
    `partition`, in offset order, each value validated against `json_schema` when given; with `lfs`, envelope
    records handled first (what they did is added to `lfs_stats`). A JSON number in a timestamp column counts
    `numeric_timestamp_unit`s.

    A segment that cannot be read raises `SegmentReadError` (from the `SegmentFormatError` / `StorageError`) once
    the batches of the segments before it are yielded; so does a record whose LFS envelope or blob fails (with
    `lfs.on_error` stop), once the records before it are yielded."""
    schema = source_arrow_schema(columns, validated=json_schema is not None)
    if lfs is None:
        yield from _read_segments(store, partition, columns, json_schema, schema, None, numeric_timestamp_unit)
        return
    if lfs.config.store_metadata and tuple(columns[-len(LFS_METADATA_COLUMNS):]) != LFS_METADATA_COLUMNS:
        raise ValueError("lfs.store_metadata: columns must end with the lfs_* columns "
                         "(schema.columns.LFS_METADATA_COLUMNS)")
    resolver = LfsResolver(lfs, store, lfs_stats)
    try:
        yield from _read_segments(store, partition, columns, json_schema, schema, resolver, numeric_timestamp_unit)
    finally:
        resolver.close()


def _read_segments(store: SegmentStore, partition: SegmentRunPartition, columns: Sequence[Column],
                   json_schema: CompiledJsonSchema | None, schema: pa.Schema,
                   resolver: LfsResolver | None, unit: NumericTimestampUnit) -> Iterator[pa.RecordBatch]:
    lfs_columns = resolver is not None and resolver.settings.config.store_metadata
    coercer = JsonColumnCoercer(columns[:-len(LFS_METADATA_COLUMNS)] if lfs_columns else columns,
                                numeric_timestamp_unit=unit)
    # Segments fetched and checked, their records not decoded yet (`DECODED_TOGETHER_BYTES`).
    undecoded: list[tuple[SegmentRef, FramedBatches]] = []

    def decoded() -> Iterator[pa.RecordBatch]:
        """The records of `undecoded`, decoded together and mapped (without LFS: with it, each segment is handled as
        it comes); a segment whose records do not decode stops the read there, after the records of the segments
        before it."""
        records, failed = _decode_together(undecoded)
        undecoded.clear()
        for batch in records.to_batches(max_chunksize=MAX_ROWS_PER_BATCH):
            yield _with_mapped_columns(batch, coercer, schema, json_schema)
        if failed is not None:
            raise _read_error(partition, *failed)

    for segment, fetched in _fetched_ahead(store, partition):
        try:
            framed, ends_early_at = fetched()
        except (SegmentFormatError, StorageError) as exc:
            yield from decoded()  # the records of the segments before it are delivered first
            raise _read_error(partition, segment, exc) from exc
        undecoded.append((segment, framed))
        if resolver is None:
            if ends_early_at is not None or sum(len(f.records) for _, f in undecoded) >= DECODED_TOGETHER_BYTES:
                yield from decoded()
        else:  # envelopes are resolved per segment: a record that fails stops its partition in that segment
            records, failed = _decode_together(undecoded)
            undecoded.clear()
            for batch in records.to_batches(max_chunksize=MAX_ROWS_PER_BATCH):
                for handled in resolver.process(batch):
                    if handled.batch.num_rows:
                        yield _with_mapped_columns(handled.batch, coercer, schema, json_schema, handled.metadata,
                                                   handled.invalid_reasons)
                    if handled.stop is not None:
                        log.error("topic %s partition %d stops at offset %d: %s", partition.topic,
                                  partition.partition, handled.stop.offset, handled.stop.describe())
                        raise SegmentReadError(_lfs_failure(segment, handled.stop))
            if failed is not None:
                raise _read_error(partition, *failed)
        if ends_early_at is not None:
            # Its records are delivered; the partition stops at the gap after them, which the next run's plan starts
            # at and reports (or skips, `allow_gaps`): only the footer of the segment holding its start is read there.
            message = _gap_after(segment, ends_early_at)
            log.warning("topic %s partition %d stops at offset %d: %s", partition.topic, partition.partition,
                        ends_early_at, message)
            raise SegmentReadError(SegmentReadFailure(
                topic=segment.topic, partition=segment.partition, kfs_key=segment.kfs_key, key=segment.kfs_key,
                position=segment.kfs_size - FOOTER_SIZE, error_type=SEGMENT_GAP_ERROR_TYPE, message=message,
                base_offset=segment.base_offset, next_offset=ends_early_at))
    if undecoded:
        yield from decoded()


def _decode_together(segments: Sequence[tuple[SegmentRef, FramedBatches]]
                     ) -> tuple[pa.Table, tuple[SegmentRef, SegmentFormatError] | None]:
    """The records of `segments` decoded in one pass (`decode_framed`). When a record does not decode, the error names
    its segment: the records of the segments before it, and that segment with its error."""
    count = len(segments)
    failed: tuple[SegmentRef, SegmentFormatError] | None = None
    while count:
        try:
            return decode_framed([framed for _, framed in segments[:count]]), failed
        except SegmentFormatError as exc:
            # An earlier segment may hold a fault of a kind checked after this one: decode those before it again.
            count = next((i for i, (segment, framed) in enumerate(segments[:count]) if framed.key == exc.key), 0)
            failed = (segments[count][0], exc)
    return BASE_SCHEMA.empty_table(), failed


def _read_error(partition: SegmentRunPartition, segment: SegmentRef,
                exc: SegmentFormatError | StorageError) -> SegmentReadError:
    """The partition stops at `segment`, which cannot be read."""
    next_offset = max(segment.base_offset, partition.offsets.start)
    log.error("topic %s partition %d stops at offset %d: %s", partition.topic, partition.partition, next_offset, exc)
    return SegmentReadError(SegmentReadFailure(
        topic=segment.topic, partition=segment.partition, kfs_key=segment.kfs_key, key=exc.key or segment.kfs_key,
        position=exc.position if isinstance(exc, SegmentFormatError) else None, error_type=type(exc).__name__,
        message=str(exc), base_offset=segment.base_offset, next_offset=next_offset))


def _fetched_ahead(store: SegmentStore,
                   partition: SegmentRunPartition) -> Iterator[tuple[SegmentRef, Callable[[], FetchedSegment]]]:
    """Each segment of `partition` in order with what returns it fetched and checked (`fetch_segment`), the next ones
    fetched ahead on threads (`READ_AHEAD_SEGMENTS`, `READ_AHEAD_BYTES`). A fetch's error is raised when its
    segment is asked for, so a segment fails where it comes, after the segments before it; what is still ahead when
    the caller stops is cancelled."""
    segments = list(partition.segments)
    if len(segments) <= 1:
        for segment in segments:
            yield segment, partial(fetch_segment, store, segment, partition.offsets)
        return
    pool = ThreadPoolExecutor(min(READ_AHEAD_SEGMENTS, len(segments)), thread_name_prefix="segment-fetch")
    ahead: deque[tuple[SegmentRef, Future[FetchedSegment]]] = deque()
    submitted = 0
    try:
        while ahead or submitted < len(segments):
            while submitted < len(segments) and len(ahead) < READ_AHEAD_SEGMENTS:
                beyond_current = sum(s.kfs_size for s, _ in islice(ahead, 1, None))
                if ahead and beyond_current + segments[submitted].kfs_size > READ_AHEAD_BYTES:
                    break
                segment = segments[submitted]
                ahead.append((segment, pool.submit(fetch_segment, store, segment, partition.offsets)))
                submitted += 1
            segment, future = ahead.popleft()
            yield segment, future.result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _lfs_failure(segment: SegmentRef, failure: LfsFailure) -> SegmentReadFailure:
    """The partition stops at a record whose LFS envelope or blob failed, like at a segment that cannot be read."""
    return SegmentReadFailure(
        topic=segment.topic, partition=segment.partition, kfs_key=segment.kfs_key,
        key=failure.location or failure.record_id, position=None, error_type=LFS_ERROR_TYPE,
        message=failure.describe(), base_offset=segment.base_offset, next_offset=failure.offset)


def fetch_segment(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange) -> FetchedSegment:
    """The batches of `segment` within `offsets`, fetched once and checked with their CRCs (`frame_segment`), their
    records to be decoded (`decode_framed`).

    When `offsets.start` falls mid-way, only the bytes from the index entry at or before it are fetched; then the
    batch CRCs are verified but not the footer's body CRC, which covers bytes that were not fetched. Without a usable
    `.index` (gone, corrupt, pointing at no batch) the whole `.kfs` is fetched and checked instead.

    Invariant: records are delivered only from the segment planned (`segment`: base offset, `.kfs` size, and its
    last offset when planned from its footer), since the run commits up to the planned end. An object replaced
    after planning raises `SegmentChangedError` before any of its records are decoded (`_check_planned`); in a range
    read a shorter object fails the exact-length read and a different one the footer check at the planned end. A
    segment planned to end where its successor begins may end before (`FetchedSegment.ends_early_at`: a gap) but not
    after (an overlap: `SegmentOverlapError`).
    """
    if offsets.start > segment.base_offset:
        try:
            ranged = _fetch_from_index(store, segment, offsets)
        except (StorageError, SegmentFormatError) as exc:
            # The `.index` only saves bytes: a missing or corrupt one (or a range read it sent astray) never stops a
            # read the segment itself can serve. The Go processor never reads it (decoder.go:104).
            log.warning("%s: the range read from %s failed (%s: %s); reading the whole segment instead",
                        segment.kfs_key, segment.index_key, type(exc).__name__, exc)
        else:
            if ranged is not None:
                return ranged
    data = store.read(segment.kfs_key)
    ends_early_at = _check_planned(segment, data)
    framed = frame_segment(data, key=segment.kfs_key, topic=segment.topic, partition=segment.partition,
                           start_offset=offsets.start, end_offset=offsets.end)
    return FetchedSegment(framed.run, ends_early_at)


def _fetch_from_index(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange) -> FetchedSegment | None:
    """The batches from the index entry at or before `offsets.start` on (one GET of the `.index`, one ranged GET of
    the `.kfs`); None when that entry is the first batch (the whole segment is read then)."""
    entries = parse_index(store.read(segment.index_key), key=segment.index_key)
    entry = entry_for_offset(entries, offsets.start)
    if entry.position <= HEADER_SIZE:
        return None
    entry_position = INDEX_HEADER_SIZE + entries.index(entry) * INDEX_ENTRY_SIZE
    return _frame_from_index_entry(store, segment, offsets, entry.offset, entry.position, entry_position)


def _check_planned(segment: SegmentRef, data: bytes) -> int | None:
    """`data` (the whole `.kfs` fetched) is `segment` as planned: same size, header base offset and footer last
    offset (`_check_planned_end`); else `SegmentChangedError` naming both. A malformed header or footer raises its
    `SegmentFormatError`."""
    if len(data) < HEADER_SIZE + FOOTER_SIZE:
        return None  # not a segment at all: decode_segment names what is wrong with it
    footer_position = len(data) - FOOTER_SIZE
    base_offset = parse_header(data, segment.kfs_key).base_offset
    last_offset = parse_footer(data[footer_position:], segment.kfs_key, footer_position).last_offset
    if ((len(data), base_offset) != (segment.kfs_size, segment.base_offset)
            or (segment.end_from_footer and last_offset != segment.last_offset)):
        raise SegmentChangedError.of(segment, footer_position,
                                     f"offsets {base_offset}..{last_offset} in {len(data)} bytes")
    return _check_planned_end(segment, last_offset, footer_position)


def _check_planned_end(segment: SegmentRef, last_offset: int, footer_position: int) -> int | None:
    """The footer's `last_offset` against the planned one: equal (None), or (an end inferred from the successor) below
    it: the offset after the footer's last one."""
    if last_offset == segment.last_offset:
        return None
    if segment.end_from_footer:
        raise SegmentChangedError.of(segment, footer_position,
                                     f"last offset {last_offset} in the footer at byte {footer_position}")
    if last_offset > segment.last_offset:
        raise SegmentOverlapError(f"{segment.kfs_key} holds offsets up to {last_offset} (its footer at byte "
                                  f"{footer_position}), but the next segment begins at offset "
                                  f"{segment.last_offset + 1}: two segments claim offsets "
                                  f"{segment.last_offset + 1}..{last_offset}", key=segment.kfs_key)
    return last_offset + 1


def _frame_from_index_entry(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange, entry_offset: int,
                            byte_position: int, entry_position: int) -> FetchedSegment:
    """Range-read and check the batches from `byte_position` (an index entry for `entry_offset`) to the footer."""
    footer_position = segment.kfs_size - FOOTER_SIZE
    if byte_position >= footer_position:
        raise BadIndexError(segment.index_key, entry_position,
                            f"index entry (offset {entry_offset}, byte {byte_position}) points at or past the footer "
                            f"of {segment.kfs_key} (byte {footer_position})")
    data = store.read_range(segment.kfs_key, byte_position, segment.kfs_size - byte_position)
    footer = parse_footer(data[-FOOTER_SIZE:], segment.kfs_key, footer_position)
    # The size matched no further than the exact-length read shows: the footer says whether it is the segment planned.
    ends_early_at = _check_planned_end(segment, footer.last_offset, footer_position)
    framed = frame_batch_run(data, 0, len(data) - FOOTER_SIZE, key=segment.kfs_key, origin=byte_position,
                             topic=segment.topic, partition=segment.partition, verify_crc=True,
                             start_offset=offsets.start, end_offset=offsets.end)
    first_batch, last_batch = framed.batches[0], framed.batches[-1]
    if first_batch.base_offset != entry_offset:
        raise BadIndexError(segment.index_key, entry_position,
                            f"index entry says offset {entry_offset} starts at byte {byte_position} of "
                            f"{segment.kfs_key}, the batch there starts at offset {first_batch.base_offset}")
    if last_batch.last_offset != footer.last_offset:
        raise SegmentMismatchError(segment.kfs_key, footer_position + 4,
                                   f"footer last offset is {footer.last_offset}, the last batch ends at offset "
                                   f"{last_batch.last_offset}")
    return FetchedSegment(framed, ends_early_at)


def _with_mapped_columns(batch: pa.RecordBatch, coercer: JsonColumnCoercer, schema: pa.Schema,
                         json_schema: CompiledJsonSchema | None, lfs_metadata: Mapping[str, pa.Array] | None = None,
                         lfs_reasons: pa.Array | None = None) -> pa.RecordBatch:
    result = coercer.coerce(batch.column("value"))
    column_reasons = pc.binary_join_element_wise(result.invalid_column, result.invalid_reason, ": ")
    reasons = pc.coalesce(column_reasons, result.invalid_reason)
    mapped = [result.columns[column.name] for column in coercer.columns] + list((lfs_metadata or {}).values())
    status = [reasons]
    if json_schema is not None:
        violations = validate_values(batch.column("value"), batch.column("record_id"), json_schema)
        # The schema violation names the record's fault as the producer's contract states it, so it wins.
        status = [pc.coalesce(violations.reasons(), reasons), _schema_paths(violations)]
    if lfs_reasons is not None:  # the value is still the envelope of a blob that failed: that is the fault
        status[0] = pc.coalesce(lfs_reasons, status[0])
        if len(status) > 1:
            status[1] = pc.if_else(pc.is_valid(lfs_reasons), pa.scalar(None, pa.string()), status[1])
    return pa.RecordBatch.from_arrays([*batch.columns, *mapped, *status], schema=schema)


def _schema_paths(violations: ValidationResult) -> pa.StringArray:
    paths: list[str | None] = [None] * violations.record_count
    for record in violations.invalid_records:
        paths[record.row] = record.schema_path
    return pa.array(paths, type=pa.string())
