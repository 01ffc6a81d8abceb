"""The offset vocabulary: `OffsetRange`, its JSON form (run tags, run metadata), and the one conversion between next
offsets and KafScale's last offsets."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.engine.ingestion.lag import lag, lag_and_reference
from kafscale_lakehouse.offsets import NOT_COMMITTED, CommittedOffset
from kafscale_lakehouse.offsets.ranges import OffsetRange, format_ranges, parse_ranges, ranges_by_partition
from kafscale_lakehouse.offsets.records import last_offset_of, next_offset_of


def test_offset_ranges_are_exclusive_at_the_end_and_round_trip_through_json():
    ranges = {2: OffsetRange(2, 10, 40), 0: OffsetRange(0, 0, 0)}
    assert ranges[2].count == 30 and str(ranges[2]) == "2:[10, 40)"
    assert format_ranges(ranges) == '{"0":[0,0],"2":[10,40]}'
    assert parse_ranges(format_ranges(ranges), where="tag") == ranges
    assert ranges_by_partition(ranges.values()) == ranges


@pytest.mark.parametrize("text", ['{"0": [5, 1]}', '{"0": [1]}', '{"x": [0, 1]}', '[0, 1]', '{"0": [-1, 3]}', "{"])
def test_bad_range_text_names_where_it_came_from(text):
    with pytest.raises(ValueError, match=r"^run tag kafscale/planned_ranges: "):
        parse_ranges(text, where="run tag kafscale/planned_ranges")


def test_bad_ranges_are_refused():
    with pytest.raises(ValueError, match="ends before it starts"):
        OffsetRange(0, 5, 4)
    with pytest.raises(ValueError, match="two offset ranges of partition 1"):
        ranges_by_partition([OffsetRange(1, 0, 1), OffsetRange(1, 1, 2)])


def test_next_and_last_offsets_convert_in_one_place():
    assert next_offset_of(-1) is None and NOT_COMMITTED.next_offset is None  # KafScale's "nothing committed"
    assert next_offset_of(41) == 42 and CommittedOffset(41, 0, 0).next_offset == 42
    assert last_offset_of(42) == 41 and last_offset_of(0) == -1


def test_lag_counts_from_the_next_offset_and_from_zero_when_nothing_is_committed():
    assert lag(120, 100) == 20 and lag(120, None) == 120 and lag(100, 120) == 0 and lag(None, 5) is None
    assert lag_and_reference(120, 110, 100) == (20, "broker watermark")
    assert lag_and_reference(None, 110, 100) == (10, "completed segments")
    assert lag_and_reference(None, None, None) == (0, "completed segments")
