"""Helpers for corrupting segments on purpose: edit bytes, then re-seal CRCs so a later check is the one to fail."""

from __future__ import annotations

import struct

import crc32c

from kafscale_lakehouse.format import FOOTER_SIZE, HEADER_SIZE

FIRST_BATCH = HEADER_SIZE
FIRST_RECORDS = HEADER_SIZE + 61


def reseal(kfs: bytes | bytearray, *, batches: bool = True, body: bool = True) -> bytes:
    """Recompute every batch CRC that can still be found by walking batch lengths, then the footer body CRC."""
    data = bytearray(kfs)
    stop = len(data) - FOOTER_SIZE
    position = HEADER_SIZE
    while batches and position + 61 <= stop:
        (batch_length,) = struct.unpack_from(">i", data, position + 8)
        end = position + 12 + batch_length
        if batch_length < 49 or end > stop:
            break
        struct.pack_into(">I", data, position + 17, crc32c.crc32c(bytes(data[position + 21:end])))
        position = end
    if body:
        struct.pack_into(">I", data, stop, crc32c.crc32c(bytes(data[HEADER_SIZE:stop])))
    return bytes(data)


def patched(kfs: bytes, position: int, fmt: str, value: int) -> bytes:
    """`kfs` with the big-endian struct `fmt` at `position` replaced by `value` (CRCs left stale)."""
    data = bytearray(kfs)
    struct.pack_into(">" + fmt, data, position, value)
    return bytes(data)
