"""Kafka record-batch compression codecs (docs/kafscale-format.md §3): pure functions on bytes.

gzip goes through zlib; snappy, lz4 (frame format) and zstd through cramjam's Rust bindings.
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from kafscale_lakehouse.format.errors import CorruptCompressedPayloadError, UnknownCodecError

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4

CODEC_NAMES = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}
CODEC_IDS = {name: codec_id for codec_id, name in CODEC_NAMES.items()}

SNAPPY_FRAMINGS = ("xerial", "raw")

# Java clients frame snappy the xerial way: 8-byte magic, int32 version, int32 compatible version, then blocks.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")
# xerial-snappy's default block size, which Kafka's Java producer uses.
_XERIAL_BLOCK_SIZE = 32 * 1024
_GZIP_WBITS = 16 + zlib.MAX_WBITS


def codec_id_for(name: str) -> int:
    """The attribute bits for a codec name (`none`, `gzip`, `snappy`, `lz4`, `zstd`)."""
    try:
        return CODEC_IDS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; expected one of {sorted(CODEC_IDS)}") from None


def decompress(codec_id: int, payload: bytes | memoryview, *, key: str, position: int) -> bytes:
    """Decompress a batch's records section; `position` is the batch's byte position in object `key`."""
    codec_name = CODEC_NAMES.get(codec_id)
    if codec_name is None:
        raise UnknownCodecError(key, position, f"record batch uses unknown compression codec id {codec_id}")
    try:
        if codec_id == CODEC_GZIP:
            return _gunzip(payload)
        if codec_id == CODEC_SNAPPY:
            if bytes(payload[:len(XERIAL_MAGIC)]) == XERIAL_MAGIC:
                return _xerial_snappy_decompress(payload)
            return bytes(cramjam.snappy.decompress_raw(payload))
        if codec_id == CODEC_LZ4:
            return bytes(cramjam.lz4.decompress(payload))
        if codec_id == CODEC_ZSTD:
            return bytes(cramjam.zstd.decompress(payload))
    except (cramjam.DecompressionError, zlib.error, _FramingError) as exc:
        raise CorruptCompressedPayloadError(
            key, position, f"{codec_name} payload of {len(payload)} bytes does not decompress: {exc}") from exc
    return bytes(payload)


def compress(codec_id: int, data: bytes, *, snappy_framing: str = "xerial") -> bytes:
    """Compress a records section the way Kafka producers do (lz4 frames with independent blocks, as Java requires)."""
    if codec_id == CODEC_NONE:
        return data
    if codec_id == CODEC_GZIP:
        compressor = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        return compressor.compress(data) + compressor.flush()
    if codec_id == CODEC_SNAPPY:
        if snappy_framing == "xerial":
            return _xerial_snappy_compress(data)
        if snappy_framing == "raw":
            return bytes(cramjam.snappy.compress_raw(data))
        raise ValueError(f"unknown snappy framing {snappy_framing!r}; expected one of {SNAPPY_FRAMINGS}")
    if codec_id == CODEC_LZ4:
        lz4_compressor = cramjam.lz4.Compressor(block_linked=False)
        lz4_compressor.compress(data)
        return bytes(lz4_compressor.finish())
    if codec_id == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec id {codec_id}")


class _FramingError(Exception):
    """A malformed gzip member sequence or xerial block list; turned into CorruptCompressedPayloadError."""


def _gunzip(payload: bytes | memoryview) -> bytes:
    # Java's GZIPInputStream reads concatenated members, so we do too.
    parts = []
    remaining = bytes(payload)
    while True:
        decompressor = zlib.decompressobj(_GZIP_WBITS)
        parts.append(decompressor.decompress(remaining))
        if not decompressor.eof:
            raise _FramingError("gzip stream ends before its end-of-member marker")
        remaining = decompressor.unused_data
        if not remaining:
            return b"".join(parts)


def _xerial_snappy_decompress(payload: bytes | memoryview) -> bytes:
    view = memoryview(payload)
    if len(view) < _XERIAL_HEADER.size:
        raise _FramingError(f"xerial snappy header needs {_XERIAL_HEADER.size} bytes, payload has {len(view)}")
    parts = []
    cursor = _XERIAL_HEADER.size
    while cursor < len(view):
        if len(view) - cursor < _XERIAL_BLOCK_LENGTH.size:
            raise _FramingError(f"xerial block length at payload byte {cursor} is cut off")
        (block_length,) = _XERIAL_BLOCK_LENGTH.unpack_from(view, cursor)
        cursor += _XERIAL_BLOCK_LENGTH.size
        if block_length < 0 or cursor + block_length > len(view):
            raise _FramingError(f"xerial block at payload byte {cursor} announces {block_length} bytes, "
                                f"{len(view) - cursor} remain")
        parts.append(bytes(cramjam.snappy.decompress_raw(view[cursor:cursor + block_length])))
        cursor += block_length
    return b"".join(parts)


def _xerial_snappy_compress(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(data), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(data[start:start + _XERIAL_BLOCK_SIZE]))
        parts.append(_XERIAL_BLOCK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)
