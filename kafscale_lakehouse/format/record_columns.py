"""Kafka v2 records (docs/kafscale-format.md §3) decoded into BASE_SCHEMA columns, vectorized.

The records of all decoded batches of a run sit back to back in one buffer. Python touches each record only
to hop over its length varint (records are only findable one after another); every other field is decoded for
all records at once with numpy, and keys, values and header sections are cut out of the buffer by Arrow's
`take`. Header sections are walked the same way, one header number at a time across all records, and their
Go-compatible JSON is built with Arrow compute once per distinct section (sections often repeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafscale_lakehouse.format.base_columns import BASE_SCHEMA, build_base_table
from kafscale_lakehouse.format.errors import BadRecordError, BatchOverrunError, SegmentFormatError
from kafscale_lakehouse.format.headers_json import go_headers_json, go_headers_json_column

_VARINT_MAX_BYTES = 5
_VARLONG_MAX_BYTES = 10
_NO_HEADERS = b"\x00"
_REPEAT_SAMPLE_SIZE = 256  # header sections looked at to decide whether they repeat


@dataclass(frozen=True)
class RecordSection:
    """The records section of one batch of object `key`, at `buffer_start:buffer_stop` of the shared records buffer
    (which may hold the sections of several objects: `decode_framed`)."""

    key: str
    buffer_start: int
    buffer_stop: int
    record_count: int
    base_offset: int
    last_offset: int
    base_timestamp: int
    max_timestamp: int
    log_append_time: bool
    batch_position: int  # absolute byte position of the batch in the object
    codec: str
    object_start: int | None  # absolute object position of buffer_start when the batch is uncompressed

    def error(self, error_type: type[SegmentFormatError], buffer_position: int, reason: str) -> SegmentFormatError:
        """An error at `buffer_position`, named by its absolute object position (or, when compressed, by the
        batch position plus the byte within the decompressed records)."""
        if self.object_start is not None:
            return error_type(self.key, self.object_start + buffer_position - self.buffer_start, reason)
        return error_type(self.key, self.batch_position, f"{self.codec} batch, at byte "
                                                         f"{buffer_position - self.buffer_start} of its decompressed "
                                                         f"records: {reason}")


class _RecordError(Exception):
    """A malformed record at `position` of a buffer being parsed in Python; the caller locates it."""

    def __init__(self, position: int, reason: str, error_type: type[SegmentFormatError] = BadRecordError) -> None:
        super().__init__(reason)
        self.position = position
        self.reason = reason
        self.error_type = error_type


def decode_record_sections(buffer: bytes, sections: Sequence[RecordSection], *, topic: str, partition: int,
                           start_offset: int | None, end_offset: int | None) -> pa.Table:
    """BASE_SCHEMA rows of every record in `sections`, limited to offsets in [start_offset, end_offset). Offsets must
    rise from record to record across all sections (they may come from consecutive segments of one partition)."""
    record_starts = _walk_record_lengths(buffer, sections)
    if not record_starts:
        return BASE_SCHEMA.empty_table()
    buf = np.frombuffer(buffer, dtype=np.uint8)
    starts = np.array(record_starts, dtype=np.int64)
    counts = np.array([section.record_count for section in sections], dtype=np.int64)
    section_of = np.repeat(np.arange(len(sections)), counts)

    # A record ends where the next one starts; the last of each batch ends at the batch's end (checked by the walk).
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    last_rows = np.cumsum(counts)[counts > 0] - 1
    ends[last_rows] = [section.buffer_stop for section in sections if section.record_count]

    fields = _RecordFields(buf, starts, ends)
    first_bad = fields.first_bad_row()
    if first_bad is not None:
        error_type, position, reason = fields.describe(first_bad)
        raise sections[section_of[first_bad]].error(error_type, position, reason)

    def per_row(attribute: str, dtype: type) -> np.ndarray:
        return np.array([getattr(section, attribute) for section in sections], dtype=dtype)[section_of]

    base_offsets = per_row("base_offset", np.int64)
    offsets = base_offsets + fields.offset_delta
    # Batches are contiguous, so offsets in [base, last] of each batch and strictly increasing overall is the rule.
    out_of_order = (offsets < base_offsets) | (offsets > per_row("last_offset", np.int64))
    out_of_order[1:] |= offsets[1:] <= offsets[:-1]
    if out_of_order.any():
        row = int(np.argmax(out_of_order))
        section = sections[section_of[row]]
        raise section.error(BadRecordError, int(starts[row]), f"record offset {int(offsets[row])} is not above "
                            f"the previous record's and within the batch's offsets "
                            f"{section.base_offset}..{section.last_offset}")

    base_timestamps = per_row("base_timestamp", np.int64)
    with np.errstate(over="ignore"):
        timestamps = base_timestamps + fields.timestamp_delta
    overflowed = ((base_timestamps ^ timestamps) & (fields.timestamp_delta ^ timestamps)) < 0
    log_append_time = per_row("log_append_time", bool)
    # LogAppendTime: the broker's append time (maxTimestamp) is every record's timestamp.
    timestamps = np.where(log_append_time, per_row("max_timestamp", np.int64), timestamps)
    overflowed &= ~log_append_time
    if overflowed.any():
        row = int(np.argmax(overflowed))
        raise sections[section_of[row]].error(BadRecordError, int(starts[row]), "record timestamp (baseTimestamp + "
                                              "timestampDelta) is outside the int64 range")

    arrow_buffer = pa.py_buffer(buffer)
    # Headers of every decoded record are checked, not just of the rows kept.
    headers = _headers_column(_gather_binary(arrow_buffer, fields.value_end, ends), buffer_positions=fields.value_end,
                              sections=sections, section_of=section_of)
    keep = slice(0 if start_offset is None else int(np.searchsorted(offsets, start_offset)),
                 len(offsets) if end_offset is None else int(np.searchsorted(offsets, end_offset)))
    return build_base_table(
        topic, partition,
        offsets=pa.array(offsets[keep]),
        timestamps_ms=pa.array(timestamps[keep]),
        keys=_gather_binary(arrow_buffer, fields.key_start[keep], fields.key_end[keep],
                            nulls=fields.key_length[keep] == -1),
        values=_gather_binary(arrow_buffer, fields.value_start[keep], fields.value_end[keep],
                              nulls=fields.value_length[keep] == -1),
        headers=headers[keep.start:keep.stop],
    )


def _walk_record_lengths(buffer: bytes, sections: Sequence[RecordSection]) -> list[int]:
    """The start of every record: hop over each record by its length varint (the only per-record Python)."""
    record_starts: list[int] = []
    append = record_starts.append
    for section in sections:
        p = section.buffer_start
        first_row = len(record_starts)
        try:
            for _ in range(section.record_count):
                append(p)
                b = buffer[p]
                if b < 0x80:
                    if b & 1 or not b:
                        raise _RecordError(p, f"record length is {(b >> 1) ^ -(b & 1)}")
                    p += 1 + (b >> 1)
                elif buffer[p + 1] < 0x80:
                    b = (b & 0x7F) | (buffer[p + 1] << 7)
                    if b & 1:
                        raise _RecordError(p, f"record length is {(b >> 1) ^ -(b & 1)}")
                    p += 2 + (b >> 1)
                else:
                    length, after = _read_varint(buffer, p, _VARINT_MAX_BYTES)
                    if length <= 0:
                        raise _RecordError(p, f"record length is {length}")
                    p = after + length
        except _RecordError as exc:
            if exc.position < section.buffer_stop:
                raise section.error(exc.error_type, exc.position, exc.reason) from None
            p = exc.position + 1  # a "record" past the batch end: the batch is overrun
        except IndexError:
            p = len(buffer) + 1  # the hops ran off the end of all records: the batch is overrun
        if p > section.buffer_stop:
            # The first record that does not fit: the last one starting inside the batch (or right at its end).
            overrunning = max((start for start in record_starts[first_row:] if start <= section.buffer_stop),
                              default=section.buffer_start)
            raise section.error(BatchOverrunError, overrunning, f"record lengths run past the end of the batch "
                                                                     f"({section.record_count} records announced)")
        if p < section.buffer_stop:
            raise section.error(BatchOverrunError, p, f"{section.buffer_stop - p} bytes follow the batch's last "
                                                           f"record (record count {section.record_count})")
    return record_starts


class _RecordFields:
    """Every field of every record, decoded at once; `*_bad` arrays flag records whose field does not fit."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts = starts
        self.ends = ends
        _length, body_start, _ = _decode_varints(buf, starts, ends, _VARINT_MAX_BYTES)
        # body_start is the record's attributes byte, which carries nothing.
        self.timestamp_delta, after, self.timestamp_bad = _decode_varints(buf, body_start + 1, ends,
                                                                          _VARLONG_MAX_BYTES)
        self.offset_delta, after, self.offset_bad = _decode_varints(buf, after, ends, _VARINT_MAX_BYTES)
        self.key_length, self.key_start, self.key_length_bad = _decode_varints(buf, after, ends, _VARINT_MAX_BYTES)
        self.key_end = self.key_start + np.maximum(self.key_length, 0)
        self.key_bad = (self.key_length < -1) | (self.key_end > ends)
        value_length_at = np.minimum(self.key_end, ends)
        self.value_length, self.value_start, self.value_length_bad = _decode_varints(buf, value_length_at, ends,
                                                                                     _VARINT_MAX_BYTES)
        self.value_end = self.value_start + np.maximum(self.value_length, 0)
        # At least the header count must follow the value.
        self.value_bad = (self.value_length < -1) | (self.value_end >= ends)

    def _checks(self) -> list[tuple[np.ndarray, str]]:
        return [
            (self.timestamp_bad, "timestamp delta varint"),
            (self.offset_bad, "offset delta varint"),
            (self.key_length_bad, "key length varint"),
            (self.key_bad, "key"),
            (self.value_length_bad, "value length varint"),
            (self.value_bad, "value"),
        ]

    def first_bad_row(self) -> int | None:
        bad = np.zeros(self.starts.size, dtype=bool)
        for flags, _ in self._checks():
            bad |= flags
        return int(np.argmax(bad)) if bad.any() else None

    def describe(self, row: int) -> tuple[type[SegmentFormatError], int, str]:
        """(error type, buffer position, reason) for the first field of `row` that does not fit."""
        field = next(name for flags, name in self._checks() if flags[row])
        if field in ("key", "value"):
            length = int((self.key_length if field == "key" else self.value_length)[row])
            if length < -1:
                return BadRecordError, int(self.starts[row]), f"record {field} length is {length}"
        return (BatchOverrunError, int(self.starts[row]),
                f"record {field} runs past the record's end (record of {int(self.ends[row] - self.starts[row])} bytes)")


def _decode_varints(buf: np.ndarray, positions: np.ndarray, limits: np.ndarray, max_bytes: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zigzag LEB128 varints starting at `positions`, each of which must end before `limits`.

    Returns (values, positions after each varint, bad) where bad marks varints that cross their limit or are
    longer than `max_bytes`. Most varints are one or two bytes, so the loop narrows to the few still going.
    """
    raw = np.zeros(positions.size, dtype=np.uint64)
    size = np.zeros(positions.size, dtype=np.int64)
    bad = np.zeros(positions.size, dtype=bool)
    last_index = buf.size - 1
    pending = np.arange(positions.size)
    for byte_number in range(max_bytes):
        at = positions[pending] + byte_number
        outside = at >= limits[pending]
        byte = buf[np.minimum(at, last_index)]
        raw[pending] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * byte_number)
        size[pending] += 1
        bad[pending[outside]] = True
        pending = pending[(byte >= 0x80) & ~outside]
        if pending.size == 0:
            break
    bad[pending] = True
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -((raw & np.uint64(1)).astype(np.int64))
    return values, positions + size, bad


def _gather_binary(arrow_buffer: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
                   nulls: np.ndarray | None = None) -> pa.Array:
    """`buffer[starts[i]:ends[i]]` for every i as a binary array (null where `nulls`).

    Ranges are in increasing order and do not overlap, so the buffer viewed as the alternating sequence
    gap, range, gap, range, ... is a valid Arrow array; taking its odd elements copies out the ranges in C++.
    """
    row_count = starts.size
    boundaries = np.empty(2 * row_count + 1, dtype=np.int64)
    boundaries[0] = 0
    boundaries[1::2] = starts
    boundaries[2::2] = ends
    alternating = pa.Array.from_buffers(pa.large_binary(), 2 * row_count,
                                        [None, pa.py_buffer(boundaries), arrow_buffer])
    ranges = alternating.take(pa.array(np.arange(1, 2 * row_count, 2)))
    if nulls is not None and nulls.any():
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
        ranges = pa.Array.from_buffers(pa.large_binary(), row_count, [validity, *ranges.buffers()[1:]],
                                       null_count=int(nulls.sum()))
    return ranges.cast(pa.binary())


def _headers_column(header_sections: pa.Array, *, buffer_positions: np.ndarray, sections: Sequence[RecordSection],
                    section_of: np.ndarray) -> pa.Array:
    sample = header_sections.slice(0, _REPEAT_SAMPLE_SIZE)
    if 2 * len(pc.unique(sample)) <= len(sample):
        # Sections repeat (the same headers on every record): build each distinct section's JSON once.
        encoded = header_sections.dictionary_encode()
        column = _headers_json_column(encoded.dictionary)
        if column is not None:
            return column.take(encoded.indices)
    else:
        column = _headers_json_column(header_sections)  # unique per record, as with trace headers
        if column is not None:
            return column
    encoded = header_sections.dictionary_encode()
    # Some section is malformed: find the first one in row order and report it as the per-section parser does.
    for slot, section_bytes in enumerate(encoded.dictionary.to_pylist()):
        try:
            _headers_json(section_bytes)
        except _RecordError as exc:
            row = int(np.argmax(encoded.indices.to_numpy(zero_copy_only=False) == slot))
            raise sections[section_of[row]].error(exc.error_type, int(buffer_positions[row]) + exc.position,
                                                   exc.reason) from None
    raise AssertionError("the vectorized header walk rejected header sections that all parse")


def _headers_json_column(header_sections: pa.Array) -> pa.Array | None:
    """The Go-compatible JSON of every header section (count, then key/value pairs) of a binary array, or None
    when a section is malformed. Walks header number j of every record that has one at once, as the record walk
    does for fields; a malformed section makes it stop and leave the exact error to `_headers_json`."""
    if len(header_sections) == 0:
        return pa.array([], pa.string())
    offsets = np.frombuffer(header_sections.buffers()[1], dtype=np.int32)
    offsets = offsets[header_sections.offset:header_sections.offset + len(header_sections) + 1].astype(np.int64)
    buf = np.frombuffer(header_sections.buffers()[2], dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    counts, positions, bad = _decode_varints(buf, starts, ends, _VARINT_MAX_BYTES)
    # Each header takes at least two bytes (key and value lengths), which bounds the loop below.
    if bad.any() or (counts < 0).any() or (2 * counts > ends - positions).any():
        return None
    header_rows, key_starts, key_ends, value_starts, value_ends = [], [], [], [], []
    pending = np.flatnonzero(counts)
    for header_number in range(int(counts.max(initial=0))):
        pending = pending[counts[pending] > header_number]
        limits = ends[pending]
        key_length, key_start, key_bad = _decode_varints(buf, positions[pending], limits, _VARINT_MAX_BYTES)
        key_end = key_start + key_length
        if key_bad.any() or (key_length < 0).any() or (key_end > limits).any():
            return None
        value_length, value_start, value_bad = _decode_varints(buf, key_end, limits, _VARINT_MAX_BYTES)
        value_end = value_start + np.maximum(value_length, 0)  # -1 is a null value, written as ""
        if value_bad.any() or (value_length < -1).any() or (value_end > limits).any():
            return None
        positions[pending] = value_end
        header_rows.append(pending)
        key_starts.append(key_start)
        key_ends.append(key_end)
        value_starts.append(value_start)
        value_ends.append(value_end)
    if (positions != ends).any():
        return None  # bytes follow a section's last header
    if not header_rows:
        return pa.repeat(pa.scalar("", pa.string()), len(header_sections))
    # Sections lie in order in the buffer, so buffer position orders headers by (section, header number).
    all_key_starts = np.concatenate(key_starts)
    order = np.argsort(all_key_starts, kind="stable")
    arrow_buffer = header_sections.buffers()[2]
    keys = _gather_binary(arrow_buffer, all_key_starts[order], np.concatenate(key_ends)[order])
    values = _gather_binary(arrow_buffer, np.concatenate(value_starts)[order], np.concatenate(value_ends)[order])
    return go_headers_json_column(keys, values, counts)


def _headers_json(section: bytes) -> str:
    """A record's header section (count, then key/value pairs) as the Go-compatible JSON string."""
    if section == _NO_HEADERS:
        return ""
    pairs: list[tuple[bytes, bytes | None]] = []
    p = 0
    try:
        header_count, p = _read_varint(section, p, _VARINT_MAX_BYTES)
        if header_count < 0:
            raise _RecordError(0, f"record header count is {header_count}")
        for _ in range(header_count):
            header_start = p
            key_length, p = _read_varint(section, p, _VARINT_MAX_BYTES)
            if key_length < 0 or p + key_length > len(section):
                raise _RecordError(header_start, f"header key length {key_length} does not fit the record",
                                   BatchOverrunError if key_length >= 0 else BadRecordError)
            header_key = section[p:p + key_length]
            p += key_length
            value_length, p = _read_varint(section, p, _VARINT_MAX_BYTES)
            if value_length < -1 or p + value_length > len(section):
                raise _RecordError(header_start, f"header value length {value_length} does not fit the record",
                                   BatchOverrunError if value_length >= 0 else BadRecordError)
            if value_length == -1:
                pairs.append((header_key, None))
            else:
                pairs.append((header_key, section[p:p + value_length]))
                p += value_length
    except IndexError:
        raise _RecordError(p, "record headers run past the record's end", BatchOverrunError) from None
    if p != len(section):
        raise _RecordError(p, f"{len(section) - p} bytes follow the record's headers", BatchOverrunError)
    return go_headers_json(pairs)


def _read_varint(data: bytes, p: int, max_bytes: int) -> tuple[int, int]:
    """A zigzag LEB128 varint at `data[p]` of at most `max_bytes` bytes: (value, position after it)."""
    result = 0
    shift = 0
    for _ in range(max_bytes):
        b = data[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), p
        shift += 7
    raise _RecordError(p - max_bytes, f"varint is longer than {max_bytes} bytes")
