"""Typed errors for malformed KafScale objects; each names the object key and the byte offset at fault."""

from __future__ import annotations


class SegmentFormatError(ValueError):
    """A `.kfs` or `.index` object that does not follow docs/kafscale-format.md.

    `key` is the object key (or local path) and `position` the byte offset in that object where the problem is.
    """

    def __init__(self, key: str, position: int, reason: str) -> None:
        self.key = key
        self.position = position
        self.reason = reason
        super().__init__(f"{key} at byte {position}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:  # keep key/position when pickled across Spark workers
        return (type(self), (self.key, self.position, self.reason))


class TruncatedSegmentError(SegmentFormatError):
    """The object ends before a structure it announces (header, batch, record, footer)."""


class BadMagicError(SegmentFormatError):
    """Header `KAFS`, footer `END!`, index `IDX\\0` or batch magic 2 is wrong."""


class BatchOverrunError(SegmentFormatError):
    """A batch or record length runs past the end of its container."""


class BadRecordError(SegmentFormatError):
    """A batch or record field holds an impossible value (negative length, overlong varint, offset out of order)."""


class CrcMismatchError(SegmentFormatError):
    """A batch CRC or the footer's body CRC does not match the bytes."""


class UnknownCodecError(SegmentFormatError):
    """A batch uses a compression codec id outside 0-4, or its payload does not decompress."""


class CorruptCompressedPayloadError(UnknownCodecError):
    """A batch's compressed records section does not decompress with its (known) codec."""


class BadIndexError(SegmentFormatError):
    """The `.index` object has a bad version, size or entry."""


class SegmentMismatchError(SegmentFormatError):
    """Header/footer/batches disagree (message count, base offset, last offset, offset order)."""
