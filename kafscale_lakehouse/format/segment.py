"""Whole `.kfs` segments (docs/kafscale-format.md §2): decode to Arrow with every consistency check, and encode."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import pyarrow as pa

from kafscale_lakehouse.format.errors import (
    BadIndexError,
    CrcMismatchError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from kafscale_lakehouse.format.record_batch import (
    BATCH_HEADER_SIZE,
    BatchInfo,
    FramedBatches,
    Record,
    decode_framed,
    encode_control_batch,
    encode_record_batch,
    frame_batch_run,
)
from kafscale_lakehouse.format.segment_frame import (
    FOOTER_SIZE,
    HEADER_SIZE,
    SEGMENT_VERSION,
    SegmentFooter,
    SegmentHeader,
    encode_footer,
    encode_header,
    parse_footer,
    parse_header,
)
from kafscale_lakehouse.format.segment_index import (
    DEFAULT_INDEX_INTERVAL,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    IndexEntry,
    build_index_entries,
    encode_index,
)

# A batch's baseOffset is at byte 0, lastOffsetDelta at byte 23 and recordCount at byte 57.
_BATCH_BASE_OFFSET = struct.Struct(">q")
_BATCH_INT32 = struct.Struct(">i")
# Transaction markers come from the transaction coordinator; any fixed producer identity serves the encoder.
_TRANSACTIONAL_PRODUCER_ID = 1
_TRANSACTIONAL_PRODUCER_EPOCH = 0


@dataclass(frozen=True)
class DecodedSegment:
    header: SegmentHeader
    footer: SegmentFooter
    records: pa.Table  # BASE_SCHEMA rows, in offset order, limited to the requested offset range
    batches: list[BatchInfo]  # every batch of the segment, in object order


@dataclass(frozen=True)
class EncodedSegment:
    kfs: bytes
    index: bytes
    base_offset: int
    last_offset: int
    message_count: int  # sum of recordCount over all batches, control batches included
    record_offsets: tuple[int, ...]  # the offset given to each input record, in input order


@dataclass(frozen=True)
class FramedSegment:
    """A `.kfs` object checked from header to footer, its records not decoded yet (`decode_framed`)."""

    header: SegmentHeader
    footer: SegmentFooter
    run: FramedBatches  # every batch of the segment


def decode_segment(data: bytes | bytearray | memoryview, *, key: str, topic: str, partition: int,
                   verify_crc: bool = True, start_offset: int | None = None, end_offset: int | None = None
                   ) -> DecodedSegment:
    """Decode a whole `.kfs` object named `key` into BASE_SCHEMA rows (`frame_segment`, then its records).

    Rows are limited to offsets in [`start_offset`, `end_offset`). Control batches yield no rows.
    Raises a `SegmentFormatError` subclass naming `key` and the byte position at fault.
    """
    framed = frame_segment(data, key=key, topic=topic, partition=partition, verify_crc=verify_crc,
                           start_offset=start_offset, end_offset=end_offset)
    return DecodedSegment(header=framed.header, footer=framed.footer, records=decode_framed([framed.run]),
                          batches=framed.run.batches)


def frame_segment(data: bytes | bytearray | memoryview, *, key: str, topic: str, partition: int,
                  verify_crc: bool = True, start_offset: int | None = None, end_offset: int | None = None
                  ) -> FramedSegment:
    """Check a whole `.kfs` object named `key` and decompress its records (limited to [`start_offset`,
    `end_offset`)), to be decoded with `decode_framed`, alone or with the segments that follow it.

    Checks header and footer magic and version, the body CRC-32C and every batch CRC (unless `verify_crc`
    is False), batch contiguity, header base offset and message count, and footer last offset.
    Raises a `SegmentFormatError` subclass naming `key` and the byte position at fault.
    """
    data = data if isinstance(data, bytes) else bytes(data)
    if len(data) < HEADER_SIZE + FOOTER_SIZE:
        raise TruncatedSegmentError(key, len(data), f"a segment needs at least {HEADER_SIZE + FOOTER_SIZE} bytes "
                                                    f"of header and footer, object has {len(data)}")
    header = parse_header(data, key)
    footer_position = len(data) - FOOTER_SIZE
    footer = parse_footer(data[footer_position:], key, footer_position)
    if verify_crc:
        body_crc = crc32c.crc32c(memoryview(data)[HEADER_SIZE:footer_position])
        if body_crc != footer.body_crc:
            raise CrcMismatchError(key, footer_position, f"footer body CRC-32C is {footer.body_crc:#010x} but bytes "
                                                         f"{HEADER_SIZE}..{footer_position} give {body_crc:#010x}")
    run = frame_batch_run(data, HEADER_SIZE, footer_position, key=key, origin=0, topic=topic, partition=partition,
                          verify_crc=verify_crc, start_offset=start_offset, end_offset=end_offset)
    batches = run.batches
    if not batches:
        raise SegmentMismatchError(key, HEADER_SIZE, "segment holds no record batches")
    if batches[0].base_offset != header.base_offset:
        raise SegmentMismatchError(key, HEADER_SIZE, f"first batch starts at offset {batches[0].base_offset}, "
                                                     f"the header's base offset (byte 8) is {header.base_offset}")
    message_count = sum(batch.record_count for batch in batches)
    if message_count != header.message_count:
        raise SegmentMismatchError(key, 16, f"header message count is {header.message_count}, the batches hold "
                                            f"{message_count} records")
    if footer.last_offset != batches[-1].last_offset:
        raise SegmentMismatchError(key, footer_position + 4, f"footer last offset is {footer.last_offset}, the last "
                                                             f"batch ends at offset {batches[-1].last_offset}")
    return FramedSegment(header=header, footer=footer, run=run)


def check_index_matches_segment(entries: Sequence[IndexEntry], batches: Sequence[BatchInfo], *, index_key: str
                                ) -> None:
    """Check a parsed `.index` against its decoded segment: the first entry is the first batch, and every entry
    names the byte position and base offset of a batch, so ranged reads from any entry start on a batch."""
    batch_offsets_by_position = {batch.position: batch.base_offset for batch in batches}
    for slot, entry in enumerate(entries):
        entry_position = INDEX_HEADER_SIZE + slot * INDEX_ENTRY_SIZE
        if slot == 0 and batches and entry.position != batches[0].position:
            raise BadIndexError(index_key, entry_position, f"first index entry points at byte {entry.position}, the "
                                                           f"first batch is at byte {batches[0].position}")
        if batch_offsets_by_position.get(entry.position) != entry.offset:
            raise BadIndexError(index_key, entry_position, f"index entry (offset {entry.offset}, byte "
                                                           f"{entry.position}) does not name a batch of the segment")


def assemble_segment(batches: Sequence[bytes], *, created_ms: int = 0,
                     index_interval: int = DEFAULT_INDEX_INTERVAL) -> EncodedSegment:
    """A `.kfs` and its `.index` around already-encoded record batches, exactly as the broker builds them."""
    if not batches:
        raise ValueError("a segment needs at least one record batch")
    placed = []
    position = HEADER_SIZE
    for batch in batches:
        if len(batch) < BATCH_HEADER_SIZE:
            raise ValueError(f"record batch of {len(batch)} bytes is shorter than its {BATCH_HEADER_SIZE}-byte header")
        (base_offset,) = _BATCH_BASE_OFFSET.unpack_from(batch, 0)
        (last_offset_delta,) = _BATCH_INT32.unpack_from(batch, 23)
        (record_count,) = _BATCH_INT32.unpack_from(batch, 57)
        placed.append((base_offset, position, record_count, base_offset + last_offset_delta))
        position += len(batch)
    body = b"".join(batches)
    base_offset, last_offset = placed[0][0], placed[-1][3]
    message_count = sum(record_count for _, _, record_count, _ in placed)
    header = SegmentHeader(SEGMENT_VERSION, 0, base_offset, message_count, created_ms)
    footer = SegmentFooter(crc32c.crc32c(body), last_offset)
    entries = build_index_entries([(base, pos, count) for base, pos, count, _ in placed], index_interval)
    return EncodedSegment(kfs=encode_header(header) + body + encode_footer(footer),
                          index=encode_index(entries, index_interval), base_offset=base_offset,
                          last_offset=last_offset, message_count=message_count, record_offsets=())


def encode_segment(records: Sequence[Record], *, base_offset: int, codec: str | Sequence[str] = "none",
                   records_per_batch: int = 100, created_ms: int = 0, index_interval: int = DEFAULT_INDEX_INTERVAL,
                   snappy_framing: str = "xerial", log_append_time_ms: int | None = None,
                   transactional: bool = False) -> EncodedSegment:
    """Encode `records` as a segment of batches of up to `records_per_batch` records.

    `codec` is one codec name or a sequence used round-robin per batch (real segments mix producers).
    With `transactional`, every batch is transactional and followed by a COMMIT control batch, which takes
    one offset of its own (so record offsets skip it). With `log_append_time_ms`, batches are LogAppendTime.
    """
    if not records:
        raise ValueError("a segment needs at least one record")
    if records_per_batch < 1:
        raise ValueError(f"records_per_batch must be at least 1, got {records_per_batch}")
    codecs = [codec] if isinstance(codec, str) else list(codec)
    batches = []
    record_offsets: list[int] = []
    next_offset = base_offset
    for batch_number, first in enumerate(range(0, len(records), records_per_batch)):
        chunk = records[first:first + records_per_batch]
        batches.append(encode_record_batch(
            chunk, base_offset=next_offset, codec=codecs[batch_number % len(codecs)], snappy_framing=snappy_framing,
            log_append_time_ms=log_append_time_ms, transactional=transactional,
            producer_id=_TRANSACTIONAL_PRODUCER_ID if transactional else -1,
            producer_epoch=_TRANSACTIONAL_PRODUCER_EPOCH if transactional else -1))
        record_offsets.extend(range(next_offset, next_offset + len(chunk)))
        next_offset += len(chunk)
        if transactional:
            batches.append(encode_control_batch(
                offset=next_offset, commit=True, timestamp_ms=max(record.timestamp_ms for record in chunk),
                producer_id=_TRANSACTIONAL_PRODUCER_ID, producer_epoch=_TRANSACTIONAL_PRODUCER_EPOCH))
            next_offset += 1
    segment = assemble_segment(batches, created_ms=created_ms, index_interval=index_interval)
    return EncodedSegment(kfs=segment.kfs, index=segment.index, base_offset=segment.base_offset,
                          last_offset=segment.last_offset, message_count=segment.message_count,
                          record_offsets=tuple(record_offsets))
