"""Listing a partition's completed segments from a next offset: the one implementation the sensor and the run use."""

from __future__ import annotations

from dataclasses import replace

from kafscale_lakehouse.format.errors import SegmentFormatError
from kafscale_lakehouse.storage.errors import OffsetBeyondSegmentsError
from kafscale_lakehouse.storage.keys import ObjectKind, parse_segment_key, partition_prefix, segment_key
from kafscale_lakehouse.storage.store import SegmentListing, SegmentRef, SegmentStore


def segments_from(store: SegmentStore, topic: str, partition: int, next_offset: int | None, *,
                  limit: int | None = None, newest_footer_only: bool = False) -> SegmentListing:
    """The completed segments of one partition that hold offsets >= `next_offset` (every one when it is None:
    nothing committed), in offset order; the listing's `cursor` resumes after the last segment listed.

    Runs commit whole segments, so the next segment normally starts exactly at `next_offset` and the listing starts
    at its key. Otherwise `next_offset` may lie inside an earlier segment (offsets committed by the Go processor, a
    segment re-cut by the broker), also the newest one: then the partition's keys are listed (no footer reads) to
    find the segment holding it, and the listing resumes there, so that segment is never skipped. `limit` caps
    the segments (and footer reads) of one call; `newest_footer_only` as for `SegmentStore.list_segments` (a segment
    followed by a complete one ends where it begins), except that the segment holding `next_offset` has its footer
    read: a partition stopped at a gap after that segment resumes past its real end, where the gap shows.

    `OffsetBeyondSegmentsError` when every completed segment ends before `next_offset` (runs commit whole segments,
    so the newest one ends exactly at it): reading on would silently wait for offsets that will never come.
    """
    if next_offset is None:
        return store.list_segments(topic, partition, limit=limit, newest_footer_only=newest_footer_only)
    if next_offset < 0:
        raise ValueError(f"{topic}/{partition}: next offset {next_offset} is below 0")
    listing = store.list_segments(topic, partition, after=_key_before(store, topic, partition, next_offset),
                                  limit=limit, newest_footer_only=newest_footer_only)
    if next_offset == 0 or (listing.segments and listing.segments[0].base_offset == next_offset):
        return listing
    holder = _newest_base_below(store, topic, partition, next_offset)
    if holder is None:
        return listing  # nothing below `next_offset`: what was listed is all there is (after a gap, if any)
    listing = store.list_segments(topic, partition, after=_key_before(store, topic, partition, holder), limit=limit,
                                  newest_footer_only=newest_footer_only)
    segments = [s for s in _holder_end_read(store, listing.segments) if s.last_offset >= next_offset]
    if not segments and listing.segments and not listing.incomplete:
        newest = listing.segments[-1]
        if newest.last_offset + 1 < next_offset:
            raise OffsetBeyondSegmentsError(
                f"topic {topic} partition {partition}: the committed next offset {next_offset} lies beyond the newest "
                f"completed segment {newest.kfs_key} (offsets {newest.base_offset}..{newest.last_offset}) in "
                f"{store.location}: its segments were deleted or re-cut, or the topic was recreated, after that "
                "offset was committed; nothing is read from it until the committed offset is set right",
                location=store.location, key=newest.kfs_key)
    return replace(listing, segments=segments)


def _holder_end_read(store: SegmentStore, segments: list[SegmentRef]) -> list[SegmentRef]:
    """`segments` with the first one's end read from its footer when it was inferred from its successor: `next_offset`
    lies inside it or past its real end (a partition stopped at a gap after it), and only its footer tells which.
    An unreadable footer leaves the inferred end: reading the segment then stops the partition naming the object."""
    if not segments or segments[0].end_from_footer:
        return segments
    first = segments[0]
    try:
        footer = store.read_footer(first.kfs_key, first.kfs_size)
    except SegmentFormatError:
        return segments
    return [replace(first, last_offset=footer.last_offset, end_from_footer=True), *segments[1:]]


def _key_before(store: SegmentStore, topic: str, partition: int, offset: int) -> str | None:
    """A listing cursor that resumes at the segment starting at `offset` (keys sort by their padded base offset)."""
    return segment_key(store.namespace, topic, partition, offset - 1, ObjectKind.SEGMENT) if offset > 0 else None


def _newest_base_below(store: SegmentStore, topic: str, partition: int, offset: int) -> int | None:
    bases = (parsed.base_offset for info in store.list_objects(partition_prefix(store.namespace, topic, partition))
             if (parsed := parse_segment_key(info.key, store.namespace)) is not None
             and parsed.kind is ObjectKind.SEGMENT)
    return max((base for base in bases if base < offset), default=None)
