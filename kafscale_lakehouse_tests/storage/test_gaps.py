"""Gap and overlap detection between segments of a partition (pure logic)."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.storage import Gap, SegmentOverlapError, SegmentRef, find_gaps


def ref(base: int, last: int, topic: str = "orders", partition: int = 0) -> SegmentRef:
    return SegmentRef(topic, partition, base, last, f"default/{topic}/{partition}/segment-{base:020d}.kfs",
                      f"default/{topic}/{partition}/segment-{base:020d}.index", 100)


def test_contiguous_segments_have_no_gaps():
    assert find_gaps([ref(0, 9), ref(10, 19), ref(20, 20), ref(21, 99)]) == []


def test_gap_between_segments_names_the_offsets_and_the_segment_after_it():
    gaps = find_gaps([ref(0, 9), ref(15, 19), ref(20, 29), ref(40, 49)])
    assert gaps == [Gap("orders", 0, 10, 15, ref(15, 19).kfs_key), Gap("orders", 0, 30, 40, ref(40, 49).kfs_key)]
    assert gaps[0].missing_count == 5
    assert "offsets 10..14 missing" in str(gaps[0])


def test_input_order_does_not_matter():
    assert find_gaps([ref(40, 49), ref(0, 9), ref(20, 39)]) == [Gap("orders", 0, 10, 20, ref(20, 39).kfs_key)]


def test_gap_between_committed_offset_and_first_pending_segment():
    # Committed up to 99; the next segment starts at 150: 100..149 were deleted before ingestion.
    assert find_gaps([ref(150, 199)], next_offset=100) == [Gap("orders", 0, 100, 150, ref(150, 199).kfs_key)]


def test_committed_offset_inside_first_pending_segment_is_no_gap():
    assert find_gaps([ref(100, 199), ref(200, 299)], next_offset=151) == []
    assert find_gaps([ref(100, 199)], next_offset=100) == []


def test_consumed_segments_are_not_checked():
    # 0..9 and 30..39 are fully committed; the hole between them was consumed history and is not pending.
    assert find_gaps([ref(0, 9), ref(30, 39), ref(40, 49)], next_offset=40) == []
    assert find_gaps([ref(0, 9), ref(30, 39)], next_offset=40) == []


def test_nothing_committed_starts_at_the_oldest_segment():
    assert find_gaps([ref(500, 503), ref(504, 600)], next_offset=None) == []
    assert find_gaps([ref(500, 503), ref(505, 600)]) == [Gap("orders", 0, 504, 505, ref(505, 600).kfs_key)]


def test_committed_offset_zero_is_checked():
    assert find_gaps([ref(5, 9)], next_offset=1) == [Gap("orders", 0, 1, 5, ref(5, 9).kfs_key)]


def test_next_offset_zero_is_not_nothing_committed():
    # Offset 0 must be read, so a partition whose oldest segment starts later has lost 0..4.
    assert find_gaps([ref(5, 9)], next_offset=0) == [Gap("orders", 0, 0, 5, ref(5, 9).kfs_key)]


@pytest.mark.parametrize("second", [ref(5, 19), ref(9, 19), ref(0, 9)])
def test_overlapping_segments_are_an_error(second):
    with pytest.raises(SegmentOverlapError) as raised:
        find_gaps([ref(0, 9), second])
    assert second.kfs_key in str(raised.value) or ref(0, 9).kfs_key in str(raised.value)
    assert "covers offsets up to 9" in str(raised.value)


def test_empty_input():
    assert find_gaps([]) == []
    assert find_gaps([], next_offset=11) == []


def test_rejects_mixed_partitions_and_invalid_committed_offsets():
    with pytest.raises(ValueError, match="one partition"):
        find_gaps([ref(0, 9), ref(10, 19, partition=1)])
    with pytest.raises(ValueError, match="below 0"):
        find_gaps([ref(0, 9)], next_offset=-1)
