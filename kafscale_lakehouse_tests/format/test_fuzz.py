"""Byte mutations of valid segments and indexes: every outcome is a valid result or a SegmentFormatError.

With CRC verification on, a mutation can only go unnoticed where no checksum covers it (header flags, created
time, reserved bytes), so a successful decode must give back the original records. With verification off,
a successful decode must still be a well-formed BASE_SCHEMA table.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale_lakehouse.format import (
    BASE_SCHEMA,
    FOOTER_SIZE,
    HEADER_SIZE,
    Record,
    SegmentFormatError,
    decode_batches,
    decode_segment,
    encode_segment,
    parse_index,
)

KEY = "fuzz/topic/0/segment-00000000000000000100.kfs"


def _records(count: int) -> list[Record]:
    return [Record(None if i % 5 == 0 else f"key-{i}".encode(), b"" if i % 7 == 0 else b"value %d " % i * 9,
                   ((("trace", f"t{i % 3}".encode()), ("null", None)) if i % 2 else ()), 1_700_000_000_000 + 37 * i)
            for i in range(count)]


SEGMENTS = {
    "none": encode_segment(_records(12), base_offset=100, records_per_batch=4),
    "gzip": encode_segment(_records(12), base_offset=100, records_per_batch=6, codec="gzip"),
    "snappy-xerial": encode_segment(_records(12), base_offset=100, records_per_batch=6, codec="snappy"),
    "snappy-raw": encode_segment(_records(12), base_offset=100, records_per_batch=6, codec="snappy",
                                 snappy_framing="raw"),
    "lz4": encode_segment(_records(12), base_offset=100, records_per_batch=6, codec="lz4"),
    "zstd-transactional": encode_segment(_records(12), base_offset=100, records_per_batch=5, codec="zstd",
                                         transactional=True),
    "mixed-log-append-time": encode_segment(_records(12), base_offset=100, records_per_batch=3,
                                            codec=["none", "lz4", "gzip"], log_append_time_ms=1_800_000_000_000),
}


def decode(kfs: bytes, verify_crc: bool):
    return decode_segment(kfs, key=KEY, topic="topic", partition=0, verify_crc=verify_crc)


ORIGINAL_ROWS = {name: decode(segment.kfs, True).records for name, segment in SEGMENTS.items()}


@st.composite
def mutations(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
    position = draw(st.integers(min_value=0, max_value=len(data) - 1))
    if kind == "flip":
        bit = draw(st.integers(min_value=0, max_value=7))
        return data[:position] + bytes([data[position] ^ (1 << bit)]) + data[position + 1:]
    if kind == "set":
        return data[:position] + bytes([draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))]) + data[position + 1:]
    if kind == "insert":
        return data[:position] + draw(st.binary(min_size=1, max_size=8)) + data[position:]
    if kind == "delete":
        length = draw(st.integers(min_value=1, max_value=8))
        return data[:position] + data[position + length:]
    return data[:position]


def assert_well_formed(table):
    assert table.schema == BASE_SCHEMA
    for column in ("record_id", "topic", "partition", "offset", "timestamp_ms"):
        assert table.column(column).null_count == 0
    offsets = table.column("offset").to_pylist()
    assert offsets == sorted(set(offsets))
    assert table.column("record_id").to_pylist() == [f"topic:0:{offset}" for offset in offsets]
    for headers in table.column("headers").to_pylist():
        assert headers == "" or all(set(pair) == {"key", "value"} for pair in json.loads(headers))


FUZZ_SETTINGS = settings(max_examples=250, deadline=timedelta(seconds=5),
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name", sorted(SEGMENTS))
@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc", "no-crc"])
@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_segment_decodes_validly_or_raises_a_format_error(name, verify_crc, data):
    original = SEGMENTS[name].kfs
    mutated = data.draw(mutations(original))
    try:
        segment = decode(mutated, verify_crc)
    except SegmentFormatError as error:
        assert error.key == KEY
        assert 0 <= error.position <= len(mutated)
        return
    assert_well_formed(segment.records)
    if verify_crc:
        assert segment.records.equals(ORIGINAL_ROWS[name])


@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc", "no-crc"])
@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_batch_run_decodes_validly_or_raises_a_format_error(verify_crc, data):
    kfs = SEGMENTS["mixed-log-append-time"].kfs
    body = data.draw(mutations(kfs[HEADER_SIZE:len(kfs) - FOOTER_SIZE]))
    try:
        decoded = decode_batches(body, key=KEY, position=HEADER_SIZE, topic="topic", partition=0,
                                 verify_crc=verify_crc)
    except SegmentFormatError as error:
        assert error.key == KEY
        assert HEADER_SIZE <= error.position <= HEADER_SIZE + len(body)
        return
    assert_well_formed(decoded.records)


@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_index_parses_validly_or_raises_a_format_error(data):
    index = encode_segment(_records(40), base_offset=5, records_per_batch=3, index_interval=7).index
    mutated = data.draw(mutations(index))
    try:
        entries = parse_index(mutated, key="fuzz.index")
    except SegmentFormatError as error:
        assert error.key == "fuzz.index"
        return
    assert entries and all(entry.position >= HEADER_SIZE for entry in entries)
    assert [entry.offset for entry in entries] == sorted({entry.offset for entry in entries})
