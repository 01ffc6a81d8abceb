"""Typed errors of the offsets layer; each names the store location (etcd endpoints or sqlite file) and the key."""

from __future__ import annotations


class OffsetStoreError(Exception):
    """Base class of errors raised by an offset store (etcd's own errors come from `kafscale_lakehouse.etcd`)."""


class LeaseHeldError(OffsetStoreError):
    """Another owner holds the lease of (topic, partition)."""

    def __init__(self, location: str, key: str, topic: str, partition: int, current_owner: str) -> None:
        self.key = key
        self.topic = topic
        self.partition = partition
        self.current_owner = current_owner
        super().__init__(f"{location}: lease {key} on {topic}/{partition} is held by {current_owner!r}")


class LeaseLostError(OffsetStoreError):
    """Our lease of (topic, partition) expired, was released or was taken over; we must not commit."""

    def __init__(self, location: str, key: str, topic: str, partition: int, reason: str) -> None:
        self.key = key
        self.topic = topic
        self.partition = partition
        self.reason = reason
        super().__init__(f"{location}: lease {key} on {topic}/{partition} lost: {reason}")


class OffsetRegressionError(OffsetStoreError):
    """A commit would move a committed offset backwards (use `repair_offsets` to reset it from the table)."""

    def __init__(self, location: str, key: str, committed: int, requested: int) -> None:
        self.key = key
        self.committed = committed
        self.requested = requested
        super().__init__(
            f"{location}: {key} holds offset {committed}; refusing to commit the lower offset {requested}"
        )


class CorruptOffsetRecordError(OffsetStoreError):
    """A stored key or value does not follow docs/kafscale-format.md §6-7."""

    def __init__(self, location: str, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{location}: {key}: {reason}")


class CommitConflictError(OffsetStoreError):
    """Other writers kept changing the topic's keys, so a fenced commit could not be applied in bounded retries."""


class OffsetStoreUnavailableError(OffsetStoreError):
    """The local sqlite store could not be opened or stayed locked."""
