"""The golden segments of fixtures/segments decode to their expected.jsonl exactly, by us and by kafka-python."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from kafscale_lakehouse.format import (
    FOOTER_SIZE,
    Record,
    build_index_entries,
    check_index_matches_segment,
    decode_batches,
    decode_segment,
    encode_segment,
    go_headers_json,
    parse_index,
)
from kafscale_lakehouse_tests.support.kafka_python_reference import cramjam_codec_patches, read_segment_records

GOLDEN = ["edge-cases", "pizzas-gzip", "pizzas-lz4", "pizzas-snappy", "pizzas-uncompressed", "pizzas-zstd",
          "worked-example"]


class Golden:
    def __init__(self, directory):
        self.fixture = json.loads((directory / "fixture.json").read_text())
        (kfs_path,) = directory.glob("*.kfs")
        self.kfs = kfs_path.read_bytes()
        self.index = kfs_path.with_suffix(".index").read_bytes()
        self.index_key = self.fixture["s3_key"].removesuffix(".kfs") + ".index"
        self.expected = [json.loads(line) for line in (directory / "expected.jsonl").read_text().splitlines()]

    def decode(self, **options):
        return decode_segment(self.kfs, key=self.fixture["s3_key"], topic=self.fixture["topic"],
                              partition=self.fixture["partition"], **options)


@pytest.fixture(params=GOLDEN)
def golden(request, fixture_segments_dir) -> Golden:
    return Golden(fixture_segments_dir / request.param)


def as_expected_rows(table) -> list[dict]:
    return [{
        "record_id": row["record_id"], "topic": row["topic"], "partition": row["partition"], "offset": row["offset"],
        "timestamp_ms": row["timestamp_ms"],
        "key_b64": None if row["key"] is None else base64.b64encode(row["key"]).decode(),
        "value_b64": None if row["value"] is None else base64.b64encode(row["value"]).decode(),
        "headers": row["headers"],
    } for row in table.to_pylist()]


def test_every_fixture_is_covered(fixture_segments_dir):
    assert sorted(path.name for path in fixture_segments_dir.iterdir() if path.is_dir()) == GOLDEN


def test_decodes_to_expected_rows(golden):
    segment = golden.decode()
    assert as_expected_rows(segment.records) == golden.expected
    assert len(golden.expected) == golden.fixture["records"]
    assert segment.header.base_offset == golden.fixture["base_offset"]
    assert segment.footer.last_offset == golden.fixture["last_offset"]
    assert {batch.codec for batch in segment.batches} == {golden.fixture["codec"]}
    assert all(batch.crc_verified and batch.decoded for batch in segment.batches)


def test_index_points_at_batches_as_the_broker_chooses_them(golden):
    segment = golden.decode()
    entries = parse_index(golden.index, key=golden.index_key)
    check_index_matches_segment(entries, segment.batches, index_key=golden.index_key)
    (interval,) = struct.unpack_from(">i", golden.index, 10)
    assert entries == build_index_entries(
        [(batch.base_offset, batch.position, batch.record_count) for batch in segment.batches], interval)


def test_ranged_read_from_each_index_entry_gives_the_tail(golden):
    full = golden.decode().records
    for entry in parse_index(golden.index, key=golden.index_key):
        tail = decode_batches(golden.kfs[entry.position:len(golden.kfs) - FOOTER_SIZE], key=golden.fixture["s3_key"],
                              position=entry.position, topic=golden.fixture["topic"],
                              partition=golden.fixture["partition"])
        assert tail.records.to_pylist() == [row for row in full.to_pylist() if row["offset"] >= entry.offset]
        assert tail.batches[0].position == entry.position


def test_kafka_python_reads_the_same_records(golden, monkeypatch):
    for target, attribute, value in cramjam_codec_patches():
        monkeypatch.setattr(target, attribute, value)
    ours = golden.decode().records.to_pylist()
    theirs = read_segment_records(golden.kfs)
    assert [(row["offset"], row["timestamp_ms"], row["key"], row["value"], row["headers"]) for row in ours] == [
        (offset, timestamp, key, value, go_headers_json([(name.encode(), header) for name, header in headers]))
        for offset, timestamp, key, value, headers in theirs]


def test_encoder_reproduces_the_worked_example_byte_for_byte(fixture_segments_dir):
    golden = Golden(fixture_segments_dir / "worked-example")
    encoded = encode_segment([Record(b"k1", b"v1", timestamp_ms=1_700_000_000_000)], base_offset=10,
                             created_ms=1_700_000_000_000)
    assert encoded.kfs == golden.kfs
    assert encoded.index == golden.index
    assert (encoded.base_offset, encoded.last_offset, encoded.message_count, encoded.record_offsets) == (
        10,
        10,
        1,
        (10,),
    )
