"""`segments_from`: a partition's completed segments from a next offset, on both backends (local dir, SeaweedFS S3)."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.storage import ObjectKind, OffsetBeyondSegmentsError, segment_key, segments_from
from kafscale_lakehouse_tests.storage.conftest import write_segments

TOPIC = "orders"


def bases(listing) -> list[int]:
    return [segment.base_offset for segment in listing.segments]


@pytest.fixture
def three_segments(store):
    write_segments(store, TOPIC, 0, [0, 10, 20], size=10)  # offsets 0..9, 10..19, 20..29
    return store


def test_nothing_committed_lists_every_segment(three_segments):
    assert bases(segments_from(three_segments, TOPIC, 0, None)) == [0, 10, 20]


def test_a_next_offset_at_a_segment_start_lists_from_that_segment_without_reading_older_footers(three_segments):
    store = three_segments
    before = store.request_counts
    listing = segments_from(store, TOPIC, 0, 10)
    assert bases(listing) == [10, 20]
    assert store.request_counts - before == {"list": 1, "get": 2}  # no footer read of 0..9
    assert bases(segments_from(store, TOPIC, 0, 0)) == [0, 10, 20]  # offset 0 is not "nothing committed" ...
    assert listing.cursor == segment_key(store.namespace, TOPIC, 0, 20, ObjectKind.SEGMENT)


def test_a_next_offset_inside_an_older_segment_keeps_that_segment(three_segments):
    assert bases(segments_from(three_segments, TOPIC, 0, 15)) == [10, 20]


def test_a_next_offset_inside_the_newest_segment_keeps_it(three_segments):
    # Listing from the key of offset 24 finds nothing; the segment holding it starts at 20.
    store = three_segments
    listing = segments_from(store, TOPIC, 0, 25)
    assert bases(listing) == [20]
    assert listing.cursor == segment_key(store.namespace, TOPIC, 0, 20, ObjectKind.SEGMENT)


def test_caught_up_and_gaps(three_segments):
    store = three_segments
    caught_up = segments_from(store, TOPIC, 0, 30)
    assert bases(caught_up) == []
    assert caught_up.cursor == segment_key(store.namespace, TOPIC, 0, 20, ObjectKind.SEGMENT)  # resumes after it
    write_segments(store, TOPIC, 0, [50], size=10)  # 30..49 deleted before ingestion
    assert bases(segments_from(store, TOPIC, 0, 30)) == [50]
    assert bases(segments_from(store, TOPIC, 0, 60)) == []
    write_segments(store, TOPIC, 1, [100], size=10)  # retention removed everything below 100
    assert bases(segments_from(store, TOPIC, 1, 40)) == [100]


def test_a_next_offset_beyond_the_newest_segment_is_an_error_naming_it(three_segments):
    # Offsets 0..29 exist; a committed next offset of 45 cannot be reached (segments re-cut, topic recreated).
    store = three_segments
    newest = segment_key(store.namespace, TOPIC, 0, 20, ObjectKind.SEGMENT)
    with pytest.raises(OffsetBeyondSegmentsError, match=r"next offset 45 lies beyond the newest completed segment "
                                                        r".*offsets 20\.\.29") as raised:
        segments_from(store, TOPIC, 0, 45)
    assert raised.value.key == newest and newest in str(raised.value)
    assert bases(segments_from(store, TOPIC, 0, 30)) == []  # exactly at the end: caught up, no error


def test_limit_and_bad_offsets(three_segments):
    assert bases(segments_from(three_segments, TOPIC, 0, 10, limit=1)) == [10]
    with pytest.raises(ValueError, match="next offset -1"):
        segments_from(three_segments, TOPIC, 0, -1)
