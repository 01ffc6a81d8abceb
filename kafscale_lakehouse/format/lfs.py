"""KafScale Large File Support envelopes (docs/kafscale-format.md §9): detection, parsing, checksums. Pure, no I/O.

A producer going through KafScale's LFS proxy stores a large payload as an S3 object and puts a small JSON envelope
in the record value instead (`pkg/lfs/envelope.go`). Detection follows Go's `IsLfsEnvelope` and is vectorized over an
Arrow binary column, so records that are not envelopes cost no Python per record. Parsing follows `DecodeEnvelope`
(encoding/json into the Go struct: wrong JSON types are errors, unknown keys are ignored, keys match ignoring case,
`kfs_lfs` ≠ 0 and non-empty `bucket`, `key`, `sha256` are required). Checksums follow `EnvelopeChecksum` and are
computed incrementally (`ChecksumVerifier`), so a blob can be verified while it streams.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MIN_ENVELOPE_SIZE = 15
MARKER_WINDOW = 50
MARKER = b'"kfs_lfs"'
CHECKSUM_ALGORITHMS = ("sha256", "md5", "crc32", "none")
# The six `store_metadata` columns, in Go's order, with their Arrow types.
LFS_METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field("lfs_content_type", pa.string()),
    pa.field("lfs_blob_size", pa.int64()),
    pa.field("lfs_checksum", pa.string()),
    pa.field("lfs_checksum_alg", pa.string()),
    pa.field("lfs_bucket", pa.string()),
    pa.field("lfs_key", pa.string()),
)
LFS_METADATA_COLUMNS = tuple(f.name for f in LFS_METADATA_FIELDS)


class LfsEnvelopeError(ValueError):
    """A value detected as an LFS envelope is not a valid one (Go's decode error)."""


class LfsChecksumError(ValueError):
    """A blob's checksum differs from its envelope's."""


def lfs_envelope_mask(values: pa.Array | pa.ChunkedArray) -> pa.BooleanArray | pa.ChunkedArray:
    """Per value, Go's `IsLfsEnvelope`: at least 15 bytes, starts with `{`, first 50 bytes contain `"kfs_lfs"`.
    Null values are not envelopes (false, never null)."""
    head = pc.binary_slice(values, 0, MARKER_WINDOW)
    mask = pc.and_kleene(pc.greater_equal(pc.binary_length(values), MIN_ENVELOPE_SIZE),
                         pc.and_kleene(pc.starts_with(head, "{"), pc.match_substring(head, MARKER.decode())))
    return pc.fill_null(mask, False)


def is_lfs_envelope(value: bytes | None) -> bool:
    """`lfs_envelope_mask` for one value."""
    return value is not None and len(value) >= MIN_ENVELOPE_SIZE and value[:1] == b"{" \
        and MARKER in value[:MARKER_WINDOW]


@dataclass(frozen=True)
class LfsEnvelope:
    version: int
    bucket: str
    key: str
    size: int
    sha256: str
    checksum: str = ""
    checksum_alg: str = ""
    content_type: str = ""
    original_headers: tuple[tuple[str, str], ...] = ()
    created_at: str = ""
    proxy_id: str = ""

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def metadata(self) -> dict[str, Any]:
        """The `lfs_*` column values of a record left as its envelope (Go's `lfsMetadataFromEnvelope`)."""
        checksum, alg = self.checksum, self.checksum_alg
        if not checksum:
            checksum, alg = self.sha256, alg or "sha256"
        return {"lfs_content_type": self.content_type, "lfs_blob_size": self.size, "lfs_checksum": checksum,
                "lfs_checksum_alg": alg, "lfs_bucket": self.bucket, "lfs_key": self.key}

    def resolved_metadata(self, blob_size: int) -> dict[str, Any]:
        """The `lfs_*` column values of a resolved record (Go's `lfsMetadataFromResolved`): the blob's real size and
        the checksum that was (or would have been) checked."""
        alg, expected = envelope_checksum(self)
        return {"lfs_content_type": self.content_type, "lfs_blob_size": blob_size,
                "lfs_checksum": expected or self.sha256, "lfs_checksum_alg": alg, "lfs_bucket": self.bucket,
                "lfs_key": self.key}


# Go struct fields: JSON key → (attribute, expected Python type).
_FIELDS: dict[str, tuple[str, type]] = {
    "kfs_lfs": ("version", int), "bucket": ("bucket", str), "key": ("key", str), "size": ("size", int),
    "sha256": ("sha256", str), "checksum": ("checksum", str), "checksum_alg": ("checksum_alg", str),
    "content_type": ("content_type", str), "original_headers": ("original_headers", dict),
    "created_at": ("created_at", str), "proxy_id": ("proxy_id", str),
}


def parse_envelope(data: bytes) -> LfsEnvelope:
    """Go's `DecodeEnvelope`; `LfsEnvelopeError` says what is wrong."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LfsEnvelopeError(f"invalid LFS envelope: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise LfsEnvelopeError("invalid LFS envelope: not a JSON object")
    # encoding/json: an exact key match wins, else a case-insensitive one.
    folded = {key.lower(): value for key, value in document.items() if key.lower() in _FIELDS}
    folded.update({key: value for key, value in document.items() if key in _FIELDS})
    values: dict[str, Any] = {}
    for name, (attribute, expected) in _FIELDS.items():
        value = folded.get(name)
        if value is None:  # absent or JSON null: Go's zero value
            continue
        if type(value) is not expected:
            what = {int: "an integer", str: "a string", dict: "an object"}[expected]
            raise LfsEnvelopeError(f"invalid LFS envelope: {name} is {json.dumps(value)[:40]}, expected {what}")
        if isinstance(value, dict):
            if not all(isinstance(v, str) for v in value.values()):
                raise LfsEnvelopeError("invalid LFS envelope: original_headers values must be strings")
            value = tuple(value.items())
        values[attribute] = value
    missing = [name for name, attribute in (("kfs_lfs", "version"), ("bucket", "bucket"), ("key", "key"),
                                            ("sha256", "sha256")) if not values.get(attribute)]
    if missing:
        raise LfsEnvelopeError(f"invalid LFS envelope: missing required fields {', '.join(missing)}")
    values.setdefault("size", 0)
    return LfsEnvelope(**values)


def envelope_checksum(envelope: LfsEnvelope) -> tuple[str, str | None]:
    """Go's `EnvelopeChecksum`: (algorithm, expected lower-case hex), expected None when nothing is checked.

    Algorithm = `checksum_alg` lower-cased and trimmed (empty → sha256); expected = `checksum`, else `sha256`; md5 or
    crc32 without `checksum` checks the `sha256` field with sha256; `none` checks nothing. An unknown algorithm is an
    `LfsEnvelopeError`."""
    alg = envelope.checksum_alg.strip().lower() or "sha256"
    if alg not in CHECKSUM_ALGORITHMS:
        raise LfsEnvelopeError(f"invalid LFS envelope: unsupported checksum_alg {envelope.checksum_alg!r} "
                               f"(expected one of {', '.join(CHECKSUM_ALGORITHMS)})")
    if alg == "none":
        return alg, None
    if envelope.checksum:
        return alg, envelope.checksum.lower()
    return "sha256", envelope.sha256.lower()  # md5/crc32 without checksum: Go's backward-compatible fallback


class _Crc32:
    """crc32 IEEE with hashlib's update/hexdigest (4 bytes big-endian as hex, like Go's hash/crc32)."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return self._value.to_bytes(4, "big").hex()


class ChecksumVerifier:
    """Feed a blob chunk by chunk (`update`), then `verify()`; with `enabled=False` or algorithm `none`, nothing is
    computed. The envelope's algorithm is checked on construction (`LfsEnvelopeError`)."""

    def __init__(self, envelope: LfsEnvelope, *, enabled: bool = True) -> None:
        self.algorithm, self.expected = envelope_checksum(envelope)
        self._hasher: Any = None
        if enabled and self.expected is not None:
            self._hasher = _Crc32() if self.algorithm == "crc32" else hashlib.new(self.algorithm)

    def update(self, chunk: bytes) -> None:
        if self._hasher is not None:
            self._hasher.update(chunk)

    def verify(self) -> None:
        if self._hasher is None:
            return
        actual = self._hasher.hexdigest()
        if actual != self.expected:
            raise LfsChecksumError(f"{self.algorithm} checksum mismatch: envelope says {self.expected}, blob has "
                                   f"{actual}")


def checksum_hex(algorithm: str, data: bytes) -> str:
    """The checksum of `data` as an envelope carries it (for producers and tests)."""
    hasher: Any = _Crc32() if algorithm == "crc32" else hashlib.new(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def encode_envelope(bucket: str, key: str, blob: bytes, *, content_type: str = "", checksum_alg: str = "sha256",
                    created_at: str = "", proxy_id: str = "") -> bytes:
    """The envelope KafScale's LFS proxy writes for `blob` stored at `bucket`/`key` (Go's field order, compact)."""
    envelope: dict[str, Any] = {"kfs_lfs": 1, "bucket": bucket, "key": key, "size": len(blob),
                                "sha256": checksum_hex("sha256", blob)}
    if checksum_alg != "sha256":
        envelope["checksum"] = checksum_hex(checksum_alg, blob) if checksum_alg != "none" else ""
    else:
        envelope["checksum"] = envelope["sha256"]
    envelope["checksum_alg"] = checksum_alg
    envelope.update({name: value for name, value in (("content_type", content_type), ("created_at", created_at),
                                                      ("proxy_id", proxy_id)) if value})
    if not envelope["checksum"]:
        del envelope["checksum"]
    return json.dumps(envelope, separators=(",", ":")).encode()
