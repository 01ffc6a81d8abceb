"""The sparse `.index` object (docs/kafscale-format.md §4): parse, validate, build, encode, look up."""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from kafscale_lakehouse.format.errors import BadIndexError, BadMagicError, TruncatedSegmentError
from kafscale_lakehouse.format.segment_frame import HEADER_SIZE

INDEX_MAGIC = b"IDX\x00"
INDEX_VERSION = 1
INDEX_HEADER_SIZE = 16
INDEX_ENTRY_SIZE = 12
# The broker writes an entry every 100 messages.
DEFAULT_INDEX_INTERVAL = 100

_INDEX_HEADER = struct.Struct(">4sHiiH")
_INDEX_ENTRY = struct.Struct(">qi")


@dataclass(frozen=True)
class IndexEntry:
    """A batch that starts at absolute `offset` and absolute byte `position` of the `.kfs`."""

    offset: int
    position: int


def parse_index(data: bytes | memoryview, *, key: str) -> list[IndexEntry]:
    """Parse and validate a `.index` object named `key`.

    Checks magic, version, size against the entry count, positions (≥ 32, increasing) and offsets (increasing).
    """
    if len(data) < INDEX_HEADER_SIZE:
        raise TruncatedSegmentError(key, len(data), f"index header needs {INDEX_HEADER_SIZE} bytes, "
                                                    f"object has {len(data)}")
    magic, version, count, interval, _reserved = _INDEX_HEADER.unpack_from(data, 0)
    if magic != INDEX_MAGIC:
        raise BadMagicError(key, 0, f"index magic is {bytes(magic)!r}, expected {INDEX_MAGIC!r}")
    if version != INDEX_VERSION:
        raise BadIndexError(key, 4, f"unsupported index version {version}, expected {INDEX_VERSION}")
    if count < 1:
        raise BadIndexError(key, 6, f"index entry count is {count}; the broker always indexes the first batch")
    if interval < 1:
        raise BadIndexError(key, 10, f"index interval is {interval}, must be at least 1")
    expected_size = INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE
    if len(data) != expected_size:
        raise BadIndexError(key, min(len(data), expected_size),
                            f"index announces {count} entries ({expected_size} bytes), object has {len(data)} bytes")
    entries = []
    previous = None
    for entry_position in range(INDEX_HEADER_SIZE, expected_size, INDEX_ENTRY_SIZE):
        offset, position = _INDEX_ENTRY.unpack_from(data, entry_position)
        if position < HEADER_SIZE:
            raise BadIndexError(key, entry_position + 8,
                                f"index entry points at segment byte {position}, before the end of the "
                                f"{HEADER_SIZE}-byte segment header")
        if previous is not None and (offset <= previous.offset or position <= previous.position):
            raise BadIndexError(key, entry_position,
                                f"index entry (offset {offset}, byte {position}) does not follow the previous "
                                f"entry (offset {previous.offset}, byte {previous.position})")
        previous = IndexEntry(offset, position)
        entries.append(previous)
    return entries


def build_index_entries(batches: Sequence[tuple[int, int, int]], interval: int = DEFAULT_INDEX_INTERVAL
                        ) -> list[IndexEntry]:
    """Index entries for `(base_offset, position, record_count)` batches, chosen exactly as the broker does.

    An entry for the first batch, then for the first batch after at least `interval` messages since the last entry.
    """
    if interval < 1:
        raise ValueError(f"index interval must be at least 1, got {interval}")
    entries: list[IndexEntry] = []
    messages_since_entry = 0
    for base_offset, position, record_count in batches:
        if not entries or messages_since_entry >= interval:
            entries.append(IndexEntry(base_offset, position))
            messages_since_entry = 0
        messages_since_entry += record_count
    return entries


def encode_index(entries: Sequence[IndexEntry], interval: int = DEFAULT_INDEX_INTERVAL) -> bytes:
    header = _INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, len(entries), interval, 0)
    return header + b"".join(_INDEX_ENTRY.pack(entry.offset, entry.position) for entry in entries)


def entry_for_offset(entries: Sequence[IndexEntry], offset: int) -> IndexEntry:
    """The entry to start a ranged read from so that `offset` is included: the last entry at or before it.

    Offsets before the first entry map to the first entry (which is the segment's first batch).
    """
    if not entries:
        raise ValueError("cannot look up an offset in an empty index")
    slot = bisect.bisect_right([entry.offset for entry in entries], offset) - 1
    return entries[max(slot, 0)]
