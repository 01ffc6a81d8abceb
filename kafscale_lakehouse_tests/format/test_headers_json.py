"""The headers column is byte-identical to Go's json.Marshal of [{"key":K,"value":V}] (the Go processor's output).

Expected strings follow Go's encoding/json (appendString, escapeHTML on, Go ≥ 1.22) rule by rule.
"""

from __future__ import annotations

import json

import pytest

from kafscale_lakehouse.format import go_headers_json


def one_header_value(raw: bytes) -> str:
    """The JSON-escaped text Go writes for a header value `raw`, cut out of the full headers string."""
    encoded = go_headers_json([(b"k", raw)])
    prefix, suffix = '[{"key":"k","value":"', '"}]'
    assert encoded.startswith(prefix) and encoded.endswith(suffix)
    return encoded[len(prefix):-len(suffix)]


def test_no_headers_is_an_empty_string_not_an_empty_list():
    assert go_headers_json([]) == ""


def test_null_value_is_an_empty_string_and_order_is_kept():
    assert go_headers_json([(b"h1", None), (b"h2", b"a"), (b"", b"")]) == (
        '[{"key":"h1","value":""},{"key":"h2","value":"a"},{"key":"","value":""}]')


@pytest.mark.parametrize(("raw", "escaped"), [
    (b'"', '\\"'),
    (b"\\", "\\\\"),
    (b"\b\f\n\r\t", "\\b\\f\\n\\r\\t"),
    (b"\x00\x01\x1f", "\\u0000\\u0001\\u001f"),
    (b"\x7f", "\x7f"),  # DEL is not escaped
    (b"<b>&", "\\u003cb\\u003e\\u0026"),
    ("\u2028\u2029".encode(), "\\u2028\\u2029"),
    ("é✓😀".encode(), "é✓😀"),  # other non-ASCII stays raw
    ("\ufffd".encode(), "\ufffd"),  # a real U+FFFD is valid UTF-8 and stays raw
    (b"/", "/"),
])
def test_escapes_like_go(raw, escaped):
    assert one_header_value(raw) == escaped


@pytest.mark.parametrize(("raw", "escaped"), [
    (b"\xff", "\\ufffd"),
    (b"a\xe2\x82b", "a\\ufffd\\ufffdb"),  # truncated 3-byte sequence: Go replaces byte by byte
    (b"\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd"),  # UTF-8-encoded surrogate
    (b"\xc0\xaf", "\\ufffd\\ufffd"),  # overlong encoding
    (b"\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd"),  # above U+10FFFF
    (b"ok\x80<", "ok\\ufffd\\u003c"),
])
def test_invalid_utf8_becomes_one_escaped_replacement_per_byte(raw, escaped):
    assert one_header_value(raw) == escaped


def test_header_keys_are_escaped_the_same_way():
    assert go_headers_json([(b"a<\xff", b"v")]) == '[{"key":"a\\u003c\\ufffd","value":"v"}]'


def test_output_is_compact_json_that_parses_back():
    headers = [(b"trace", "✓\n\"x\"".encode()), (b"empty", None)]
    encoded = go_headers_json(headers)
    assert " " not in encoded
    assert json.loads(encoded) == [{"key": "trace", "value": "✓\n\"x\""}, {"key": "empty", "value": ""}]
