"""The `.index` object: broker-identical entry choice, strict validation, lookups for ranged reads."""

from __future__ import annotations

import struct

import pytest

from kafscale_lakehouse.format import (
    FOOTER_SIZE,
    BadIndexError,
    BadMagicError,
    IndexEntry,
    Record,
    SegmentFormatError,
    TruncatedSegmentError,
    build_index_entries,
    check_index_matches_segment,
    decode_batches,
    decode_segment,
    encode_index,
    encode_segment,
    entry_for_offset,
    parse_index,
)

KEY = "default/t/0/segment-00000000000000000000.index"


def index_bytes(entries, interval=100, count=None) -> bytes:
    data = encode_index([IndexEntry(offset, position) for offset, position in entries], interval)
    return data if count is None else data[:6] + struct.pack(">i", count) + data[10:]


def test_broker_entry_choice_counts_messages_before_each_batch():
    batches = [(offset, 32 + offset, 60) for offset in range(0, 600, 60)]
    # 60 messages since the first entry are not enough; 120 are: every second batch gets an entry.
    assert [entry.offset for entry in build_index_entries(batches, 100)] == [0, 120, 240, 360, 480]
    assert [entry.offset for entry in build_index_entries(batches, 1)] == list(range(0, 600, 60))
    assert [entry.offset for entry in build_index_entries(batches, 10_000)] == [0]


def test_parse_gives_back_the_encoded_entries():
    entries = [(0, 32), (150, 4000), (301, 9000)]
    assert parse_index(index_bytes(entries, interval=150), key=KEY) == [IndexEntry(*entry) for entry in entries]


@pytest.mark.parametrize(("data", "error_type", "position"), [
    (b"IDX\x00\x00\x01", TruncatedSegmentError, 6),
    (b"IDY\x00" + index_bytes([(0, 32)])[4:], BadMagicError, 0),
    (index_bytes([(0, 32)])[:4] + b"\x00\x02" + index_bytes([(0, 32)])[6:], BadIndexError, 4),
    (index_bytes([(0, 32)], count=2), BadIndexError, 28),
    (index_bytes([(0, 32)], count=0), BadIndexError, 6),
    (index_bytes([(0, 32), (5, 90)])[:-3], BadIndexError, 37),
    (index_bytes([(0, 32)]) + b"\x00", BadIndexError, 28),
    (index_bytes([(0, 32)], interval=0), BadIndexError, 10),
    (index_bytes([(0, 31)]), BadIndexError, 24),
    (index_bytes([(0, 32), (0, 90)]), BadIndexError, 28),
    (index_bytes([(0, 32), (5, 32)]), BadIndexError, 28),
])
def test_invalid_index_names_the_byte_at_fault(data, error_type, position):
    with pytest.raises(error_type) as caught:
        parse_index(data, key=KEY)
    assert (caught.value.key, caught.value.position) == (KEY, position)


def test_entry_for_offset_picks_the_last_entry_at_or_before():
    entries = [IndexEntry(10, 32), IndexEntry(110, 5000), IndexEntry(230, 9000)]
    assert [entry_for_offset(entries, offset).offset for offset in (0, 10, 109, 110, 229, 230, 10**9)] == [
        10, 10, 10, 110, 110, 230, 230]


def test_check_against_segment_rejects_entries_that_miss_batches():
    encoded = encode_segment([Record(b"k", b"v" * 50) for _ in range(50)], base_offset=0, records_per_batch=5,
                             index_interval=10)
    segment = decode_segment(encoded.kfs, key="s.kfs", topic="t", partition=0)
    entries = parse_index(encoded.index, key=KEY)
    assert len(entries) == 5
    check_index_matches_segment(entries, segment.batches, index_key=KEY)
    shifted = [*entries[:2], IndexEntry(entries[2].offset, entries[2].position + 1), *entries[3:]]
    with pytest.raises(BadIndexError) as caught:
        check_index_matches_segment(shifted, segment.batches, index_key=KEY)
    assert caught.value.position == 16 + 2 * 12
    with pytest.raises(BadIndexError):
        check_index_matches_segment([IndexEntry(entries[1].offset, entries[1].position)], segment.batches,
                                    index_key=KEY)


def test_ranged_read_from_the_index_returns_exactly_the_requested_offsets():
    batch_records = [Record(f"k{i}".encode(), f"v{i}".encode(), timestamp_ms=i) for i in range(300)]
    encoded = encode_segment(batch_records, base_offset=1000, records_per_batch=7, codec=["zstd", "none"],
                             index_interval=25)
    entries = parse_index(encoded.index, key=KEY)
    for start_offset, end_offset in ((1000, 1001), (1040, 1100), (1299, 1300), (1150, 1150), (1100, 5000)):
        entry = entry_for_offset(entries, start_offset)
        ranged = decode_batches(encoded.kfs[entry.position:len(encoded.kfs) - FOOTER_SIZE], key="s.kfs",
                                position=entry.position, topic="t", partition=0, start_offset=start_offset,
                                end_offset=end_offset)
        assert ranged.records.column("offset").to_pylist() == list(range(start_offset, min(end_offset, 1300)))
        assert ranged.records.column("value").to_pylist() == [
            f"v{offset - 1000}".encode() for offset in range(start_offset, min(end_offset, 1300))]


def test_ranged_read_that_does_not_start_on_a_batch_is_an_error():
    encoded = encode_segment([Record(b"k", b"v")] * 10, base_offset=0, records_per_batch=2)
    with pytest.raises(SegmentFormatError) as caught:
        decode_batches(encoded.kfs[40:-FOOTER_SIZE], key="s.kfs", position=40, topic="t", partition=0)
    assert caught.value.position >= 40
