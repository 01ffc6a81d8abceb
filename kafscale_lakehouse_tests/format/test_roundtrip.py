"""Encode → decode gives back exactly the records, for every codec and record shape; kafka-python agrees."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale_lakehouse.format import (
    BASE_SCHEMA,
    CODEC_IDS,
    Record,
    check_index_matches_segment,
    decode_segment,
    encode_segment,
    parse_index,
)
from kafscale_lakehouse_tests.support.kafka_python_reference import cramjam_codec_patches, read_segment_records

TOPIC = "round.trip-topic"
PARTITION = 3
BASE_TIME_MS = 1_700_000_000_000

optional_bytes = st.none() | st.binary(max_size=64)
header_values = st.none() | st.text(max_size=12).map(str.encode)
headers = st.lists(st.tuples(st.text(max_size=8), header_values), max_size=3).map(tuple)
# Deltas from the first record reach multi-byte varlongs in both directions.
timestamps = st.integers(min_value=BASE_TIME_MS - 2**40, max_value=BASE_TIME_MS + 2**40)
records = st.builds(Record, key=optional_bytes, value=optional_bytes | st.binary(min_size=100, max_size=400),
                    headers=headers, timestamp_ms=timestamps)

segment_options = st.fixed_dictionaries({
    "codec": st.sampled_from(sorted(CODEC_IDS)) | st.lists(st.sampled_from(sorted(CODEC_IDS)), min_size=1,
                                                            max_size=5),
    "snappy_framing": st.sampled_from(["xerial", "raw"]),
    "records_per_batch": st.integers(min_value=1, max_value=20),
    "log_append_time_ms": st.none() | timestamps,
    "transactional": st.booleans(),
    "base_offset": st.integers(min_value=0, max_value=2**40),
})


def expected_rows(batch_records, encoded, log_append_time_ms):
    return [{
        "record_id": f"{TOPIC}:{PARTITION}:{offset}", "topic": TOPIC, "partition": PARTITION, "offset": offset,
        "timestamp_ms": record.timestamp_ms if log_append_time_ms is None else log_append_time_ms,
        "key": record.key, "value": record.value,
        # Decoded independently of our JSON encoder: the column must parse back to the header pairs.
        "headers": [{"key": name, "value": "" if value is None else value.decode()} for name, value in record.headers],
    } for record, offset in zip(batch_records, encoded.record_offsets, strict=False)]


def parsed_headers(rows):
    return [{**row, "headers": json.loads(row["headers"]) if row["headers"] else []} for row in rows]


@pytest.fixture(scope="module")
def kafka_python_codecs():
    with pytest.MonkeyPatch.context() as patch:
        for target, attribute, value in cramjam_codec_patches():
            patch.setattr(target, attribute, value)
        yield


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_records=st.lists(records, min_size=1, max_size=60), options=segment_options)
def test_decode_gives_back_exactly_what_was_encoded(batch_records, options):
    options = dict(options)
    base_offset = options.pop("base_offset")
    encoded = encode_segment(batch_records, base_offset=base_offset, created_ms=BASE_TIME_MS, **options)
    segment = decode_segment(encoded.kfs, key="rt.kfs", topic=TOPIC, partition=PARTITION)

    assert segment.records.schema == BASE_SCHEMA
    assert parsed_headers(segment.records.to_pylist()) == expected_rows(batch_records, encoded,
                                                                        options["log_append_time_ms"])
    assert segment.header.message_count == encoded.message_count
    assert segment.footer.last_offset == encoded.last_offset
    control_batches = [batch for batch in segment.batches if batch.control]
    assert len(control_batches) == (len(segment.batches) // 2 if options["transactional"] else 0)
    entries = parse_index(encoded.index, key="rt.index")
    check_index_matches_segment(entries, segment.batches, index_key="rt.index")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_records=st.lists(records, min_size=1, max_size=30), options=segment_options)
def test_kafka_python_reads_what_we_encode(kafka_python_codecs, batch_records, options):
    options = dict(options)
    base_offset = options.pop("base_offset")
    encoded = encode_segment(batch_records, base_offset=base_offset, **options)
    ours = decode_segment(encoded.kfs, key="rt.kfs", topic=TOPIC, partition=PARTITION).records.to_pylist()
    theirs = read_segment_records(encoded.kfs)
    assert [(row["offset"], row["timestamp_ms"], row["key"], row["value"]) for row in ours] == [
        (offset, timestamp, key, value) for offset, timestamp, key, value, _ in theirs]
    assert [json.loads(row["headers"]) if row["headers"] else [] for row in ours] == [
        [{"key": name, "value": (value or b"").decode()} for name, value in header_pairs]
        for *_, header_pairs in theirs]


@settings(max_examples=80, deadline=None)
@given(batch_records=st.lists(records, min_size=1, max_size=40),
       records_per_batch=st.integers(min_value=1, max_value=7), transactional=st.booleans(),
       bounds=st.tuples(st.none() | st.integers(min_value=-3, max_value=90),
                        st.none() | st.integers(min_value=-3, max_value=90)))
def test_offset_range_keeps_exactly_the_offsets_asked_for(batch_records, records_per_batch, transactional, bounds):
    start_offset, end_offset = bounds
    encoded = encode_segment(batch_records, base_offset=0, records_per_batch=records_per_batch,
                             transactional=transactional, codec=["none", "zstd"])
    full = decode_segment(encoded.kfs, key="rt.kfs", topic=TOPIC, partition=PARTITION).records.to_pylist()
    ranged = decode_segment(encoded.kfs, key="rt.kfs", topic=TOPIC, partition=PARTITION, start_offset=start_offset,
                            end_offset=end_offset)
    assert ranged.records.to_pylist() == [
        row
        for row in full
        if (start_offset is None or row["offset"] >= start_offset)
        and (end_offset is None or row["offset"] < end_offset)
    ]
    for batch in ranged.batches:
        overlaps = (start_offset is None or batch.last_offset >= start_offset) and (
            end_offset is None or batch.base_offset < end_offset
        )
        assert batch.decoded == (overlaps and not batch.control)


def test_many_batches_and_log_append_time():
    batch_records = [Record(f"k{i}".encode(), b"v" * (i % 300), ((b"n", None),), BASE_TIME_MS + i) for i in range(5000)]
    encoded = encode_segment(
        batch_records,
        base_offset=7,
        records_per_batch=3,
        codec=sorted(CODEC_IDS),
        log_append_time_ms=BASE_TIME_MS + 99,
        transactional=True,
    )
    segment = decode_segment(encoded.kfs, key="rt.kfs", topic=TOPIC, partition=PARTITION)
    assert len(segment.batches) == 2 * 1667
    assert segment.records.column("offset").to_pylist() == list(encoded.record_offsets)
    assert set(segment.records.column("timestamp_ms").to_pylist()) == {BASE_TIME_MS + 99}
    assert segment.records.column("value").to_pylist() == [record.value for record in batch_records]
    assert set(segment.records.column("headers").to_pylist()) == {'[{"key":"n","value":""}]'}
