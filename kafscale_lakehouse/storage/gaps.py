"""Offset continuity of a partition's segments (docs/kafscale-format.md §1): next base = previous last offset + 1.

A gap means data was deleted (retention, lifecycle) before it was ingested; it is reported, never skipped here.
An overlap means two segments claim the same offsets; that cannot be resolved automatically and is an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kafscale_lakehouse.storage.errors import SegmentOverlapError
from kafscale_lakehouse.storage.store import SegmentRef


@dataclass(frozen=True)
class Gap:
    """Offsets `expected_offset .. found_offset - 1` are missing before the segment `kfs_key`."""

    topic: str
    partition: int
    expected_offset: int
    found_offset: int
    kfs_key: str

    @property
    def missing_count(self) -> int:
        return self.found_offset - self.expected_offset

    def __str__(self) -> str:
        return (f"{self.topic}/{self.partition}: offsets {self.expected_offset}..{self.found_offset - 1} missing "
                f"before {self.kfs_key}")


def find_gaps(segments: Iterable[SegmentRef], next_offset: int | None = None) -> list[Gap]:
    """Gaps among the pending segments of one partition, in offset order.

    `next_offset` is the first offset not committed yet; segments ending before it are already consumed and not
    checked. With None (nothing committed) the partition starts wherever its oldest segment starts (like a Kafka
    consumer with `auto.offset.reset=earliest`); otherwise the first pending segment must contain `next_offset`.
    Raises `SegmentOverlapError` when a segment starts at or before the previous segment's last offset.
    """
    ordered = sorted(segments, key=lambda segment: segment.base_offset)
    if len({(segment.topic, segment.partition) for segment in ordered}) > 1:
        raise ValueError("find_gaps takes the segments of one partition; got "
                         f"{sorted({(s.topic, s.partition) for s in ordered})}")
    if next_offset is not None and next_offset < 0:
        raise ValueError(f"next offset {next_offset} is below 0 (use None for nothing committed)")
    pending = [segment for segment in ordered if next_offset is None or segment.last_offset >= next_offset]
    gaps: list[Gap] = []
    previous: SegmentRef | None = None
    for segment in pending:
        if previous is None:
            expected = next_offset
        else:
            expected = previous.last_offset + 1
            if segment.base_offset < expected:
                raise SegmentOverlapError(
                    f"{segment.kfs_key} starts at offset {segment.base_offset}, but {previous.kfs_key} already "
                    f"covers offsets up to {previous.last_offset}", key=segment.kfs_key)
        if expected is not None and segment.base_offset > expected:
            gaps.append(Gap(segment.topic, segment.partition, expected, segment.base_offset, segment.kfs_key))
        previous = segment
    return gaps
