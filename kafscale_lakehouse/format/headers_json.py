"""The `headers` base column: Kafka record headers as the JSON string KafScale's Go processor writes.

The Go processor marshals `[]struct{Key string `json:"key"`; Value string `json:"value"`}` with
`encoding/json` (Go ≥ 1.22), so we reproduce that encoder byte for byte:
- no headers → `""` (not `[]`); a null header value → `""`;
- `"`, `\\`, `\\b`, `\\f`, `\\n`, `\\r`, `\\t` short escapes, other control characters `\\u00xx`;
- `<`, `>`, `&`, U+2028, U+2029 escaped as `\\u003c`, `\\u003e`, `\\u0026`, `\\u2028`, `\\u2029`;
- other non-ASCII written raw; each byte of invalid UTF-8 becomes the six characters `\\ufffd`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

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
