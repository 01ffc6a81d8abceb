"""Listing, completeness and incremental discovery of segments, against both backends (local dir, SeaweedFS S3)."""

from __future__ import annotations

from collections import Counter

import pytest

from kafscale_lakehouse.format.errors import SegmentMismatchError
from kafscale_lakehouse.storage import (
    DuplicateSegmentError,
    LocalSegmentStore,
    ObjectKind,
    S3SegmentStore,
    SegmentRef,
    segment_key,
)
from kafscale_lakehouse_tests.storage.conftest import INDEX_BYTES, segment_bytes, write_segments
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, SECRET_KEY

TOPIC = "weird.topic-name_1"


def kfs_key(store, base: int, partition: int = 0, topic: str = TOPIC) -> str:
    return segment_key(store.namespace, topic, partition, base, ObjectKind.SEGMENT)


def index_key(store, base: int, partition: int = 0, topic: str = TOPIC) -> str:
    return segment_key(store.namespace, topic, partition, base, ObjectKind.INDEX)


def bases(listing) -> list[int]:
    return [segment.base_offset for segment in listing.segments]


def test_complete_segments_in_offset_order_with_footer_offsets(store):
    write_segments(store, TOPIC, 3, [20, 0, 10], size=10)
    listing = store.list_segments(TOPIC, 3)
    assert listing.segments == [
        SegmentRef(TOPIC, 3, base, base + 9, kfs_key(store, base, 3), index_key(store, base, 3),
                   len(segment_bytes(base, base + 9)))
        for base in (0, 10, 20)
    ]
    assert listing.incomplete == []
    assert listing.cursor == kfs_key(store, 20, 3)


def test_orphan_kfs_is_reported_never_returned_and_picked_up_once_complete(store):
    write_segments(store, TOPIC, 0, [0])
    store.put(kfs_key(store, 10), segment_bytes(10, 19))  # the broker uploads .kfs first ...
    listing = store.list_segments(TOPIC, 0)
    assert bases(listing) == [0]
    [orphan] = listing.incomplete
    assert (orphan.base_offset, orphan.kfs_key, orphan.index_key) == (10, kfs_key(store, 10), None)
    assert "orphan .kfs" in orphan.reason
    assert listing.cursor == kfs_key(store, 0)

    store.put(index_key(store, 10), INDEX_BYTES)  # ... and the .index second
    later = store.list_segments(TOPIC, 0, after=listing.cursor)
    assert bases(later) == [10]
    assert later.incomplete == []


def test_cursor_never_moves_past_an_incomplete_segment(store):
    write_segments(store, TOPIC, 0, [0, 20, 30])
    store.put(kfs_key(store, 10), segment_bytes(10, 19))
    first = store.list_segments(TOPIC, 0)
    assert bases(first) == [0]  # 20 and 30 are complete but wait behind 10
    assert first.cursor == kfs_key(store, 0)
    assert store.list_segments(TOPIC, 0, after=first.cursor).segments == []

    store.put(index_key(store, 10), INDEX_BYTES)
    second = store.list_segments(TOPIC, 0, after=first.cursor)
    assert bases(second) == [10, 20, 30]
    assert store.list_segments(TOPIC, 0, after=second.cursor).segments == []


def test_kfs_without_end_magic_is_never_returned(store):
    write_segments(store, TOPIC, 0, [0])
    truncated = segment_bytes(10, 19)[:-3]
    store.put(kfs_key(store, 10), truncated)
    store.put(index_key(store, 10), INDEX_BYTES)
    store.put(kfs_key(store, 20), b"KAFS")  # too small to hold a footer at all
    store.put(index_key(store, 20), INDEX_BYTES)
    listing = store.list_segments(TOPIC, 0)
    assert bases(listing) == [0]
    [not_finished] = listing.incomplete  # 20 is not examined: it waits behind 10 anyway
    assert not_finished.kfs_key == kfs_key(store, 10)
    assert f"{kfs_key(store, 10)} at byte {len(truncated) - 16 + 12}" in not_finished.reason
    assert "END!" in not_finished.reason

    store.put(kfs_key(store, 10), segment_bytes(10, 19))  # a corrected upload of the same key
    listing = store.list_segments(TOPIC, 0, after=listing.cursor)
    assert bases(listing) == [10]
    [tiny] = listing.incomplete
    assert tiny.kfs_key == kfs_key(store, 20) and "object has 4 bytes" in tiny.reason


def test_orphan_index_is_reported(store):
    store.put(index_key(store, 0), INDEX_BYTES)
    listing = store.list_segments(TOPIC, 0)
    assert listing.segments == [] and listing.cursor is None
    [orphan] = listing.incomplete
    assert orphan.kfs_key is None and orphan.index_key == index_key(store, 0) and "orphan .index" in orphan.reason


def test_footer_last_offset_below_base_is_an_error(store):
    store.write_segment(TOPIC, 0, 100, segment_bytes(100, 99), INDEX_BYTES)
    with pytest.raises(SegmentMismatchError, match=f"{kfs_key(store, 100)} at byte .*below the key's base"):
        store.list_segments(TOPIC, 0)


def test_other_objects_are_ignored(store):
    write_segments(store, TOPIC, 0, [0, 10])
    prefix = f"{store.namespace}/{TOPIC}/0/"
    for noise in ["manifest.json", "segment-00000000000000000000.kfst", "segment-00000000000000000010.kfs.tmp",
                  "segment-abc.kfs", "notes.txt"]:
        store.put(prefix + noise, b"noise")
    store.put(f"{store.namespace}/manifest.json", b"{}")
    listing = store.list_segments(TOPIC, 0)
    assert bases(listing) == [0, 10] and listing.incomplete == []


@pytest.mark.parametrize("page_size", [1000, 7])
def test_discovering_new_segments_costs_requests_proportional_to_them(store, page_size):
    store.list_page_size = page_size
    write_segments(store, TOPIC, 0, list(range(0, 500, 10)))  # 50 segments, 100 objects
    full = store.list_segments(TOPIC, 0)
    assert len(full.segments) == 50

    write_segments(store, TOPIC, 0, [500, 510, 520])
    before = store.request_counts
    new = store.list_segments(TOPIC, 0, after=full.cursor)
    cost = store.request_counts - before
    assert bases(new) == [500, 510, 520]
    # One listing page from the cursor (6 new keys) and one 16-byte footer read per new segment.
    assert cost == Counter(list=1, get=3)

    before = store.request_counts
    assert store.list_segments(TOPIC, 0, after=new.cursor).segments == []
    assert store.request_counts - before == Counter(list=1)


def test_limit_bounds_one_call_and_the_cursor_resumes_after_it(store):
    write_segments(store, TOPIC, 0, [0, 10, 20, 30, 40])
    before = store.request_counts
    first = store.list_segments(TOPIC, 0, limit=2)
    assert bases(first) == [0, 10] and first.cursor == kfs_key(store, 10)
    assert store.request_counts - before == Counter(list=1, get=2)
    second = store.list_segments(TOPIC, 0, after=first.cursor, limit=2)
    assert bases(second) == [20, 30]
    assert bases(store.list_segments(TOPIC, 0, after=second.cursor, limit=2)) == [40]
    with pytest.raises(ValueError, match="limit 0"):
        store.list_segments(TOPIC, 0, limit=0)


def test_listing_is_paginated(store):
    store.list_page_size = 7
    write_segments(store, TOPIC, 0, list(range(0, 200, 10)))  # 40 objects
    before = store.request_counts
    listing = store.list_segments(TOPIC, 0)
    assert bases(listing) == list(range(0, 200, 10))
    assert (store.request_counts - before)["list"] == 6  # ceil(40 / 7)
    keys = [info.key for info in store.list_objects(f"{store.namespace}/{TOPIC}/0/", start_after=kfs_key(store, 150))]
    assert keys == [key for base in range(160, 200, 10) for key in (index_key(store, base), kfs_key(store, base))]


def test_unpadded_keys_pair_by_number_and_an_unpadded_cursor_still_sees_everything(store):
    prefix = f"{store.namespace}/{TOPIC}/0/"

    def put_unpadded(base: int, last: int) -> None:
        store.put(f"{prefix}segment-{base}.kfs", segment_bytes(base, last))
        store.put(f"{prefix}segment-{base}.index", INDEX_BYTES)

    put_unpadded(5, 9)
    first = store.list_segments(TOPIC, 0)
    assert bases(first) == [5] and first.cursor == f"{prefix}segment-5.kfs"

    # "segment-10.kfs" and "segment-100.kfs" sort *before* the cursor "segment-5.kfs": a StartAfter listing would
    # never see them, so an unpadded cursor lists the partition in full and filters by base offset.
    put_unpadded(10, 99)
    put_unpadded(100, 104)
    store.write_segment(TOPIC, 0, 105, segment_bytes(105, 110), INDEX_BYTES)  # padded
    later = store.list_segments(TOPIC, 0, after=first.cursor)
    assert bases(later) == [10, 100, 105]  # numeric order, not key order
    assert later.cursor == kfs_key(store, 105)

    store.write_segment(TOPIC, 0, 111, segment_bytes(111, 111), INDEX_BYTES)
    before = store.request_counts
    assert bases(store.list_segments(TOPIC, 0, after=later.cursor)) == [111]
    assert store.request_counts - before == Counter(list=1, get=1)  # padded cursor: incremental again


def test_same_base_offset_in_padded_and_unpadded_keys_is_an_error(store):
    write_segments(store, TOPIC, 0, [7])
    duplicate = f"{store.namespace}/{TOPIC}/0/segment-7.kfs"
    store.put(duplicate, segment_bytes(7, 16))
    with pytest.raises(DuplicateSegmentError) as raised:
        store.list_segments(TOPIC, 0)
    assert kfs_key(store, 7) in str(raised.value) and duplicate in str(raised.value)


def test_cursor_must_be_a_kfs_key_of_the_partition(store):
    write_segments(store, TOPIC, 0, [0])
    for wrong in [kfs_key(store, 0, partition=1), index_key(store, 0), kfs_key(store, 0, topic="other"), "junk"]:
        with pytest.raises(ValueError, match=r"is not a \.kfs key of topic"):
            store.list_segments(TOPIC, 0, after=wrong)


def test_topics_and_partitions_of_a_namespace(store):
    for topic, partition in [(TOPIC, 0), (TOPIC, 10), (TOPIC, 2), ("orders", 0)]:
        write_segments(store, topic, partition, [0])
    store.put(f"{store.namespace}/{TOPIC}/not-a-partition/segment-00000000000000000000.kfs", b"x")
    store.put(f"{store.namespace}/{TOPIC}/-1/segment-00000000000000000000.kfs", b"x")
    store.put(f"{store.namespace}/manifest.json", b"{}")
    assert store.list_topics() == ["orders", TOPIC]
    assert store.list_partitions(TOPIC) == [0, 2, 10]
    assert store.list_partitions("absent") == []


def test_object_operations_count_their_requests(store):
    key = f"{store.namespace}/objects/blob"
    before = store.request_counts
    store.put(key, b"0123456789")
    assert store.read(key) == b"0123456789"
    assert store.read_range(key, 3, 4) == b"3456"
    assert store.size(key) == 10
    assert store.request_counts - before == Counter(put=1, get=2, head=1)


def test_empty_namespace_puts_topics_at_the_top(seaweedfs, unique_prefix, tmp_path):
    seaweedfs.s3_client().create_bucket(Bucket=unique_prefix)  # a bucket of its own: its top level is ours alone
    stores = [LocalSegmentStore(tmp_path, namespace=""),
              S3SegmentStore(unique_prefix, namespace="", endpoint=seaweedfs.s3_endpoint, region=REGION,
                             path_style=True, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)]
    for store in stores:
        write_segments(store, "orders", 2, [0, 10])
        assert store.list_topics() == ["orders"]
        assert store.list_partitions("orders") == [2]
        listing = store.list_segments("orders", 2)
        assert [s.kfs_key for s in listing.segments] == ["orders/2/segment-00000000000000000000.kfs",
                                                          "orders/2/segment-00000000000000000010.kfs"]
    assert (tmp_path / "orders" / "2" / "segment-00000000000000000010.index").is_file()
