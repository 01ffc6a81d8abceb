"""The vectorized headers column (record_columns' header walk + go_headers_json_column) gives, for any headers,
exactly the bytes of the per-record reference `go_headers_json`, and needs no per-string Python for valid text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale_lakehouse.format import Record, decode_segment, encode_segment, go_headers_json, headers_json
from kafscale_lakehouse.format.headers_json import go_headers_json_column

# Characters Go's encoder treats specially, mixed into generated text so each rule is hit often.
_SPECIAL = st.sampled_from(['"', "\\", "<", ">", "&", "\u2028", "\u2029", "\x00", "\x1f", "\x7f", "\b", "\f", "\n",
                            "\r", "\t", "é", "✓", "😀", "\ufffd", "/"])
_TEXT = st.lists(st.one_of(st.characters(codec="utf-8"), _SPECIAL), max_size=24).map("".join)
_BYTES = st.one_of(
    _TEXT.map(str.encode),
    st.binary(max_size=24),  # mostly invalid UTF-8
    st.sampled_from([b"\xff", b"a\xe2\x82b", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"ok\x80<", b"",
                     "\u2028".encode()[:2]]),
)
_HEADERS = st.lists(st.tuples(_BYTES, st.one_of(st.none(), _BYTES)), max_size=12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_HEADERS, min_size=1, max_size=20))
def test_column_matches_the_reference(records):
    keys = [key for headers in records for key, _ in headers]
    values = [b"" if value is None else value for headers in records for _, value in headers]
    column = go_headers_json_column(pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                                    np.array([len(headers) for headers in records], dtype=np.int64))
    assert column.type == pa.string()
    assert column.to_pylist() == [go_headers_json(headers) for headers in records]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_HEADERS, min_size=1, max_size=30), st.integers(min_value=1, max_value=7))
def test_decoded_segment_headers_match_the_reference(records, records_per_batch):
    segment = encode_segment([Record(b"k", b"v", tuple(headers), 1_700_000_000_000 + i)
                              for i, headers in enumerate(records)],
                             base_offset=0, records_per_batch=records_per_batch)
    decoded = decode_segment(segment.kfs, key="t/0/s.kfs", topic="t", partition=0)
    assert decoded.records.column("headers").to_pylist() == [go_headers_json(headers) for headers in records]


def test_many_headers_and_repeated_and_unique_sections():
    # One record with 500 headers, records sharing a section, records without headers, one with only a null value.
    many = tuple((f"h{i}".encode(), f"v<{i}>".encode()) for i in range(500))
    shared = ((b"source", b"pizza-svc"),)
    records = [many, shared, (), shared, ((b"", None),),
               *(((b"traceparent", f"00-{i:032x}-{i:016x}-01".encode()),) for i in range(50))]
    segment = encode_segment([Record(None, b"", headers, 0) for headers in records], base_offset=7,
                             records_per_batch=16, codec="zstd")
    decoded = decode_segment(segment.kfs, key="t/0/s.kfs", topic="t", partition=0)
    assert decoded.records.column("headers").to_pylist() == [go_headers_json(headers) for headers in records]


def test_valid_text_is_escaped_without_per_string_python(monkeypatch):
    def refuse(raw):
        raise AssertionError(f"per-string Python used for valid UTF-8 {raw!r}")

    monkeypatch.setattr(headers_json, "go_json_string", refuse)
    records = [(("trace\u2028".encode(), f"é<{i}>&\n\"\\\x01\u2029".encode()), (b"b", None))
               for i in range(100)]
    segment = encode_segment([Record(None, b"", headers, 0) for headers in records], base_offset=0)
    column = decode_segment(segment.kfs, key="t/0/s.kfs", topic="t", partition=0).records.column("headers")
    monkeypatch.undo()
    assert column.to_pylist() == [go_headers_json(headers) for headers in records]
    assert column[0].as_py() == ('[{"key":"trace\\u2028","value":"é\\u003c0\\u003e\\u0026\\n\\"\\\\\\u0001\\u2029"},'
                                 '{"key":"b","value":""}]')
