"""Planning one Kafka partition of a run: which completed segments it reads from its start offset.

`positions.py` decides where the partition starts; here that start becomes whole completed segments (listed from the
start offset, so the cost follows new data) up to the run's byte budget, stopping before a gap: data deleted before
ingestion is never skipped silently (only with `allow_gaps`, and then recorded in the commit). Only the newest
segment's footer is read (and that of the segment holding the start, when it lies inside one): the others end where
their successors begin, so a gap after one of them is found by the reader, which stops the partition at it
(`segment_reader.SEGMENT_GAP_ERROR_TYPE`); the next run's plan starts there and reports or skips it.

The sensor's own plan (from the offsets store) is only re-checked against the table's start, never used in its place.
A partition whose segments cannot be planned (`PARTITION_PLANNING_ERRORS`: overlapping segments, two keys for one base
offset, a start beyond the newest segment) stops alone, naming the objects; the run's other partitions go on. So does
a partition waiting behind an incomplete segment (an orphan `.kfs` or `.index`) for longer than
`processor.orphan_segment_grace_seconds` (storage/stalls.py): it reads up to that segment and reports it, naming the
object and its offsets, until an operator skips them (`offsets skip`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.storage import (
    DuplicateSegmentError,
    OffsetBeyondSegmentsError,
    SegmentOverlapError,
    SegmentRef,
    SegmentStore,
    StalledSegment,
    find_gaps,
    find_stalled_segment,
    segments_from,
)

log = logging.getLogger(__name__)

# What `plan_partition` raises about one partition's segments: the run records it as that partition's error.
PARTITION_PLANNING_ERRORS = (OffsetBeyondSegmentsError, SegmentOverlapError, DuplicateSegmentError)


@dataclass(frozen=True)
class SegmentPlan:
    """What a run reads of one partition."""

    commit_start: int  # the table's next offset, what the commit re-checks (the oldest segment's: nothing committed)
    read: OffsetRange  # what the Spark tasks read: from `commit_start`, or past a skipped gap, to the planned end
    segments: list[SegmentRef]


@dataclass(frozen=True)
class PartitionPlanning:
    """The plan (None: nothing to read now), the gap it skips (`allow_gaps`) and the gap it stops at."""

    plan: SegmentPlan | None = None
    skipped: OffsetRange | None = None
    error: str | None = None
    segments_end: int | None = None  # the offset after the newest completed segment listed (None: none listed)


@timed("plan (list segments, newest footers)")
def plan_partition(
    store: SegmentStore,
    topic: str,
    partition: int,
    start: int | None,
    budget: int,
    allow_gaps: bool,
    *,
    orphan_grace_seconds: float,
) -> PartitionPlanning:
    """What to read of `partition` from `start` (None: its oldest segment): whole completed segments up to
    `budget` bytes of `.kfs` (at least one), stopping before a gap; a gap right at the start is skipped only with
    `allow_gaps` (and recorded), else the partition reports it (from the first run that sees it), as it reports an
    incomplete segment it waits behind for longer than `orphan_grace_seconds`."""
    # Only the newest segment's footer is read (and the one holding `start`, when it lies inside one): the segments
    # in between end where their successors begin, and the reader checks each footer against that end.
    listing = segments_from(store, topic, partition, start, newest_footer_only=True)
    stalled = find_stalled_segment(store, listing, grace_seconds=orphan_grace_seconds)
    stall_error = None if stalled is None else stalled.describe()
    segments = listing.segments
    if not segments:
        return PartitionPlanning(error=stall_error)
    segments_end = segments[-1].last_offset + 1
    skipped = error = None
    gaps = find_gaps(segments, next_offset=start)
    read_start = segments[0].base_offset if start is None else start
    commit_start = read_start if start is None else start
    if gaps and gaps[0].expected_offset == read_start and allow_gaps:
        gap = gaps.pop(0)
        skipped = OffsetRange(partition, gap.expected_offset, gap.found_offset)
        log.warning(
            "topic %s partition %d: offsets %d..%d were deleted before ingestion (%s); skipping them as "
            "allow_gaps says",
            topic,
            partition,
            gap.expected_offset,
            gap.found_offset - 1,
            gap.kfs_key,
        )
        read_start = gap.found_offset
        segments = [s for s in segments if s.last_offset >= read_start]
    if gaps:
        gap = gaps[0]
        if not allow_gaps:  # reported from the first run that sees it, not only once the partition reaches it
            error = gap_error(gap.expected_offset, gap.found_offset, gap.kfs_key)
        if gap.expected_offset == read_start:
            return PartitionPlanning(skipped=skipped, error=_either(error, stall_error), segments_end=segments_end)
        segments = [s for s in segments if s.last_offset < gap.expected_offset]  # read up to the gap this run
    chosen: list[SegmentRef] = []
    used = 0
    for segment in segments:
        if chosen and used + segment.kfs_size > budget:
            break
        chosen.append(segment)
        used += segment.kfs_size
    read = OffsetRange(partition, read_start, chosen[-1].last_offset + 1)
    return PartitionPlanning(SegmentPlan(commit_start, read, chosen), skipped, _either(error, stall_error),
                             segments_end)


def gap_error(start: int, end: int, following_key: str) -> str:
    """A partition's error for offsets `start..end - 1` missing before the segment `following_key`."""
    return (f"gap: offsets {start}..{end - 1} are missing before {following_key} (deleted before ingestion?); set "
            "allow_gaps to skip them")


def _either(*errors: str | None) -> str | None:
    return "; ".join(e for e in errors if e) or None


def recheck_planned(topic: str, partition: int, planned: OffsetRange | None, start: int | None) -> None:
    """The sensor planned from the offsets store; the table is the truth (a run or repair may have moved it since)."""
    if planned is not None and planned.start != (start or 0):
        log.warning(
            "topic %s partition %d: planned from next offset %d, but the committed offsets say %s (the "
            "table's, else the offsets store's); they win",
            topic,
            partition,
            planned.start,
            "nothing committed" if start is None else start,
        )


class SkipRefusedError(EngineError, ValueError):
    """`offsets skip` cannot skip what was asked: the message names the partition, the object and why."""


@dataclass(frozen=True)
class SkipPlan:
    """What `offsets skip` records as skipped: offsets `start..end - 1` of one partition, and the incomplete segment
    they were in (None: skipped up to an offset the operator gave)."""

    topic: str
    partition: int
    start: int
    end: int
    stalled: StalledSegment | None = None

    def describe(self) -> str:
        cause = "" if self.stalled is None else f" ({self.stalled.key}: {self.stalled.segment.reason})"
        return (f"topic {self.topic} partition {self.partition}: offsets {self.start}..{self.end - 1}{cause} are "
                f"recorded as skipped (kafscale.skipped.{self.topic}) and the next offset set to {self.end}, in one "
                "snapshot")


def plan_skip(store: SegmentStore, topic: str, partition: int, next_offset: int | None, *,
              segment_key: str | None = None, to: int | None = None) -> SkipPlan:
    """What skipping `segment_key` (the incomplete segment the partition waits behind now, whatever its age: the
    operator names it) or skipping up to `to` means from the partition's `next_offset` (None: nothing committed)."""
    where = f"topic {topic} partition {partition}"
    if to is not None:
        if next_offset is None:
            raise SkipRefusedError(f"{where}: nothing is committed, so there is nothing to skip from; name the "
                                   "segment it waits behind (--segment) or set its position (offsets reset "
                                   "--to-offset)")
        if to <= next_offset:
            raise SkipRefusedError(f"{where}: --to {to} is not beyond the next offset {next_offset}; a skip only "
                                   "moves forward (offsets reset --to-offset moves back)")
        return SkipPlan(topic, partition, next_offset, to)
    listing = segments_from(store, topic, partition, next_offset)
    stalled = find_stalled_segment(store, listing, grace_seconds=0)
    if stalled is None or segment_key not in (stalled.segment.kfs_key, stalled.segment.index_key):
        waits = "no incomplete segment" if stalled is None else f"{stalled.key}"
        raise SkipRefusedError(f"{where} does not wait behind {segment_key} (it waits behind {waits}, from next "
                               f"offset {next_offset}); nothing skipped")
    if listing.segments:
        raise SkipRefusedError(f"{where}: {segment_key} is not the next segment to read (offsets "
                               f"{listing.segments[0].base_offset}..{listing.segments[-1].last_offset} come first); "
                               "skip it once the partition has landed them")
    if stalled.end_offset is None:
        raise SkipRefusedError(f"{where}: where the offsets of {segment_key} end is unknown (no readable footer, no "
                               "later segment yet); wait for the next segment, or give --to OFFSET")
    start = stalled.start_offset if next_offset is None else next_offset
    return SkipPlan(topic, partition, start, stalled.end_offset, stalled)


@dataclass(frozen=True)
class ListedPartitions:
    """What `stalled_partitions` found: the stalled partitions, and where the completed segments end of those it
    listed whole."""

    stalled: dict[int, StalledSegment]
    segments_ends: dict[int, int]  # the offset after the newest completed segment (absent: none after the next offset)


def stalled_partitions(store: SegmentStore, topic: str, next_offsets: Mapping[int, int | None], *,
                       grace_seconds: float, listed_whole: Collection[int] = ()) -> ListedPartitions:
    """The partitions of `next_offsets` (partition -> next offset; None: nothing committed) that wait behind an
    incomplete segment for longer than `grace_seconds`: for `offsets show` and the metrics (a listing from the next
    offset and at most one footer read per partition; a partition that cannot be listed from there is left out, the
    run reports it). The partitions of `listed_whole` are listed to their newest completed segment (still one footer
    read), for their lag when the broker publishes no watermark."""
    found: dict[int, StalledSegment] = {}
    ends: dict[int, int] = {}
    for partition, next_offset in sorted(next_offsets.items()):
        whole = partition in listed_whole
        try:
            listing = segments_from(store, topic, partition, next_offset, limit=None if whole else 1,
                                    newest_footer_only=whole)
        except PARTITION_PLANNING_ERRORS:
            continue
        if whole and listing.segments:
            ends[partition] = listing.segments[-1].last_offset + 1
        stalled = find_stalled_segment(store, listing, grace_seconds=grace_seconds)
        if stalled is not None:
            found[partition] = stalled
    return ListedPartitions(found, ends)
