"""The 32-byte `.kfs` header and 16-byte footer (docs/kafscale-format.md §2); pure functions on bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafscale_lakehouse.format.errors import BadMagicError, TruncatedSegmentError

HEADER_SIZE = 32
FOOTER_SIZE = 16
SEGMENT_MAGIC = b"KAFS"
FOOTER_MAGIC = b"END!"
SEGMENT_VERSION = 1

_HEADER = struct.Struct(">4sHHqiqI")
_FOOTER = struct.Struct(">Iq4s")


@dataclass(frozen=True)
class SegmentHeader:
    version: int
    flags: int
    base_offset: int
    message_count: int
    created_ms: int


@dataclass(frozen=True)
class SegmentFooter:
    body_crc: int
    last_offset: int


def parse_header(data: bytes | memoryview, key: str) -> SegmentHeader:
    if len(data) < HEADER_SIZE:
        raise TruncatedSegmentError(key, len(data), f"segment header needs {HEADER_SIZE} bytes, object has {len(data)}")
    magic, version, flags, base, count, created, _reserved = _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise BadMagicError(key, 0, f"segment magic is {bytes(magic)!r}, expected {SEGMENT_MAGIC!r}")
    if version != SEGMENT_VERSION:
        raise BadMagicError(key, 4, f"unsupported segment version {version}, expected {SEGMENT_VERSION}")
    return SegmentHeader(version, flags, base, count, created)


def parse_footer(tail: bytes | memoryview, key: str, position: int = 0) -> SegmentFooter:
    """Parse the last 16 bytes of a `.kfs`; `position` is where they start in the object (for error messages)."""
    if len(tail) < FOOTER_SIZE:
        raise TruncatedSegmentError(key, position, f"segment footer needs {FOOTER_SIZE} bytes, got {len(tail)}")
    crc, last, magic = _FOOTER.unpack_from(tail, len(tail) - FOOTER_SIZE)
    if magic != FOOTER_MAGIC:
        raise BadMagicError(key, position + 12, f"segment footer magic is {bytes(magic)!r}, expected {FOOTER_MAGIC!r} "
                            "(incomplete or truncated upload)")
    return SegmentFooter(crc, last)


def encode_header(header: SegmentHeader) -> bytes:
    return _HEADER.pack(SEGMENT_MAGIC, header.version, header.flags, header.base_offset, header.message_count,
                        header.created_ms, 0)


def encode_footer(footer: SegmentFooter) -> bytes:
    return _FOOTER.pack(footer.body_crc, footer.last_offset, FOOTER_MAGIC)
