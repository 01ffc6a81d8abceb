"""The `headers` base column: Kafka record headers as the JSON string KafScale's Go processor writes.

The Go processor marshals `[]struct{Key string `json:"key"`; Value string `json:"value"`}` with
`encoding/json` (Go ≥ 1.22), so we reproduce that encoder byte for byte:
- no headers → `""` (not `[]`); a null header value → `""`;
- `"`, `\\`, `\\b`, `\\f`, `\\n`, `\\r`, `\\t` short escapes, other control characters `\\u00xx`;
- `<`, `>`, `&`, U+2028, U+2029 escaped as `\\u003c`, `\\u003e`, `\\u0026`, `\\u2028`, `\\u2029`;
- other non-ASCII written raw; each byte of invalid UTF-8 becomes the six characters `\\ufffd`.

`go_headers_json` builds one record's value in Python; `go_headers_json_column` builds the column for many
records at once with Arrow and numpy, escaping only the strings that contain a byte needing it, and gives the
same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# json.dumps(ensure_ascii=False) already matches Go for quotes, backslashes and control characters.
_GO_HTML_SAFE_ESCAPES = str.maketrans({
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
})
_GO_INVALID_UTF8_BYTE = "\\ufffd"


def go_json_string(raw: bytes) -> str:
    """`raw` as a quoted JSON string, exactly as Go's json.Marshal writes `string(raw)`."""
    try:
        return json.dumps(raw.decode("utf-8"), ensure_ascii=False).translate(_GO_HTML_SAFE_ESCAPES)
    except UnicodeDecodeError:
        pass
    # Go's decoder rejects one byte at a time (utf8.DecodeRune returns size 1 on error), so skip exactly one.
    parts = []
    start = 0
    while start < len(raw):
        try:
            parts.append(_escape_valid(raw[start:].decode("utf-8")))
            break
        except UnicodeDecodeError as exc:
            parts.append(_escape_valid(raw[start:start + exc.start].decode("utf-8")))
            parts.append(_GO_INVALID_UTF8_BYTE)
            start += exc.start + 1
    return '"' + "".join(parts) + '"'


def _escape_valid(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1].translate(_GO_HTML_SAFE_ESCAPES)


def go_headers_json(headers: Sequence[tuple[bytes, bytes | None]]) -> str:
    """The Go processor's `headers` column value for a record's `(key, value)` header pairs."""
    if not headers:
        return ""
    return "[" + ",".join(
        '{"key":' + go_json_string(key) + ',"value":' + go_json_string(b"" if value is None else value) + "}"
        for key, value in headers
    ) + "]"


# Bytes other than these may need more than themselves between quotes: control characters and non-ASCII bytes
# (invalid UTF-8, U+2028 and U+2029 are found among those), and these ASCII characters.
_ESCAPED_ASCII = b'"\\<>&'
_MAY_NEED_ESCAPE = np.zeros(256, dtype=bool)
_MAY_NEED_ESCAPE[:0x20] = True
_MAY_NEED_ESCAPE[list(_ESCAPED_ASCII)] = True
_MAY_NEED_ESCAPE[0x80:] = True
# Replacements in the order they are applied: the backslash first, as later ones insert backslashes.
_REPLACEMENTS = (
    ("\\", "\\\\"), ('"', '\\"'), ("\b", "\\b"), ("\f", "\\f"), ("\n", "\\n"), ("\r", "\\r"),
    ("\t", "\\t"),
    *((chr(code), f"\\u{code:04x}") for code in range(0x20) if chr(code) not in "\b\f\n\r\t"),
    ("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
)


def go_json_string_contents(strings: pa.Array) -> pa.Array:
    """Every binary string of `strings` (no nulls) as the text Go's json.Marshal writes between the quotes."""
    data, offsets = _data_and_offsets(strings)
    # Counting each kind of byte is a fast pass over the bytes, combining masks is not; most headers need none.
    if not (np.count_nonzero((data - np.uint8(0x20)) >= 0x60)  # below 0x20 or from 0x80: uint8 wraps around
            or any(np.count_nonzero(data == character) for character in _ESCAPED_ASCII)):
        return strings.cast(pa.string())  # ASCII without anything to escape: the bytes as they are
    special_at = np.flatnonzero(np.take(_MAY_NEED_ESCAPE, data))
    string_of = np.searchsorted(offsets, special_at, side="right") - 1
    present = np.zeros(256, dtype=bool)
    present[data[special_at]] = True
    flagged = np.zeros(len(strings), dtype=bool)
    flagged[string_of] = True
    non_ascii = np.zeros(len(strings), dtype=bool)
    non_ascii[string_of[data[special_at] >= 0x80]] = True
    groups = [np.flatnonzero(~flagged), np.flatnonzero(flagged & ~non_ascii), np.flatnonzero(non_ascii)]
    plain, ascii_escaping, non_ascii_escaping = (strings.take(pa.array(group)) for group in groups)
    escaping = [ascii_escaping.cast(pa.string())]
    invalid_utf8 = None
    try:
        escaping.append(non_ascii_escaping.cast(pa.string()))
    except pa.ArrowInvalid:
        # Go replaces invalid UTF-8 byte by byte, which Arrow cannot do; such strings are rare (headers are
        # text), so these go one by one through the reference encoder.
        invalid_utf8 = pa.array([go_json_string(raw)[1:-1] for raw in non_ascii_escaping.to_pylist()], pa.string())
    escaped = pa.concat_arrays(escaping)
    for character, replacement in _REPLACEMENTS:
        if present[character.encode()[0]]:
            escaped = pc.replace_substring(escaped, character, replacement)
    together = pa.concat_arrays([plain.cast(pa.string()), escaped, *([] if invalid_utf8 is None else [invalid_utf8])])
    position = np.empty(len(strings), dtype=np.int64)
    position[np.concatenate(groups)] = np.arange(len(strings))
    return together.take(pa.array(position))


def go_headers_json_column(keys: pa.Array, values: pa.Array, header_counts: np.ndarray) -> pa.Array:
    """The headers column: `go_headers_json` of each record, from all records' header keys and values in order
    (binary, no nulls: a null value is given as empty) and each record's header count."""
    strings = go_json_string_contents(pa.concat_arrays([keys.cast(pa.binary()), values.cast(pa.binary())]))
    key_count = len(keys)
    pairs = pc.binary_join_element_wise('{"key":"', strings.slice(0, key_count), '","value":"',
                                        strings.slice(key_count), '"}', "")
    list_offsets = np.zeros(len(header_counts) + 1, dtype=np.int32)
    np.cumsum(header_counts, out=list_offsets[1:])
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(list_offsets), pairs), ",")
    return pc.if_else(pa.array(header_counts > 0), pc.binary_join_element_wise("[", joined, "]", ""), "")


def _data_and_offsets(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The bytes and the int64 offsets (into those bytes) of a binary or string array."""
    offset_type = np.int64 if pa.types.is_large_binary(strings.type) or pa.types.is_large_string(strings.type) \
        else np.int32
    _, offsets_buffer, data_buffer = strings.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[strings.offset:strings.offset + len(strings) + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return data[offsets[0]:offsets[-1]], offsets - offsets[0]
