"""Which incomplete segment a partition waits behind past the grace period, and the offsets it should hold
(storage/stalls.py), against both backends."""

from __future__ import annotations

from datetime import timedelta

from kafscale_lakehouse.storage import ObjectKind, find_stalled_segment, segment_key
from kafscale_lakehouse_tests.storage.conftest import INDEX_BYTES, segment_bytes, write_segments

TOPIC = "orders"


def key(store, base: int, kind: ObjectKind) -> str:
    return segment_key(store.namespace, TOPIC, 0, base, kind)


def stalled(store, after: str | None = None, grace_seconds: float = 0, **clock):
    listing = store.list_segments(TOPIC, 0, after=after)
    now = None
    if clock:
        [incomplete] = listing.incomplete[:1]
        now = incomplete.last_modified + timedelta(**clock)
    return find_stalled_segment(store, listing, grace_seconds=grace_seconds, now=now)


def test_an_orphan_kfs_holds_the_offsets_of_its_footer_and_stalls_only_after_the_grace(store):
    write_segments(store, TOPIC, 0, [0, 20])
    store.put(key(store, 10, ObjectKind.SEGMENT), segment_bytes(10, 19))  # its .index upload failed
    assert stalled(store, grace_seconds=300, seconds=299) is None, "within the grace: its upload may complete"
    found = stalled(store, grace_seconds=300, seconds=301)
    assert (found.key, found.start_offset, found.end_offset) == (key(store, 10, ObjectKind.SEGMENT), 10, 20)
    assert found.age_seconds == 301 and "offsets 10..19" in found.describe() and "orphan .kfs" in found.describe()
    assert found.kfs_finished and "an .index rebuilt from it lands them" in found.describe()


def test_an_orphan_index_holds_the_offsets_up_to_the_next_segment_or_unknown_ones(store):
    store.put(key(store, 0, ObjectKind.INDEX), INDEX_BYTES)  # its .kfs upload failed
    found = stalled(store)
    assert (found.key, found.end_offset, found.kfs_finished) == (key(store, 0, ObjectKind.INDEX), None, False)
    assert "offsets from 0 on" in found.describe()
    write_segments(store, TOPIC, 0, [25])
    assert stalled(store).end_offset == 25


def test_the_newest_object_after_segments_still_to_read_does_not_stall_the_partition_yet(store):
    write_segments(store, TOPIC, 0, [0])
    store.put(key(store, 10, ObjectKind.SEGMENT), segment_bytes(10, 19))
    assert stalled(store) is None, "the partition reads segment 0 first"
    assert stalled(store, after=key(store, 0, ObjectKind.SEGMENT)).key == key(store, 10, ObjectKind.SEGMENT)
