"""Typed storage errors; every message names the store location (bucket + endpoint, or root directory) and the key.

Each error is built from one message string so it pickles across Spark workers with its attributes intact.
"""

from __future__ import annotations


class StorageError(Exception):
    """A segment store operation failed. `location` is e.g. `s3://lake at http://127.0.0.1:9000`; `key` the object."""

    def __init__(self, message: str, *, location: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.location = location
        self.key = key


class StorageAuthError(StorageError):
    """The store rejected the credentials, or none were found (never carries the secret)."""


class BucketNotFoundError(StorageError):
    """The configured bucket (or local root directory) does not exist."""


class StorageUnreachableError(StorageError):
    """The endpoint did not answer (connection refused, timeout, interrupted transfer) after bounded retries."""


class ObjectNotFoundError(StorageError):
    """An object that was listed or named does not exist (any more)."""


class StorageRequestError(StorageError):
    """Any other failed request (invalid range, server error, throttling after retries)."""


class DuplicateSegmentError(StorageError):
    """Two `.kfs` (or two `.index`) keys of one partition carry the same numeric base offset (padded and unpadded)."""


class SegmentOverlapError(StorageError):
    """A segment starts at or before the last offset of the previous segment of the same partition."""


class OffsetBeyondSegmentsError(StorageError):
    """A committed next offset lies beyond the end of the partition's newest completed segment: segments were deleted
    or re-cut, or the topic was recreated, after the offsets were committed. Nothing can be read from there."""


class MetadataSnapshotError(StorageError):
    """`/kafscale/metadata/snapshot` in etcd is missing (when required) or does not parse."""
