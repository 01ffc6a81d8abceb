"""How one JSON value becomes a value of a mapped column type: the reference rules.

The batch coercion (`coercion.py`) does the common cases vectorized and hands everything else to these
functions, so the rules live here once. Differences from KafScale's Go processor are marked (Go).

- null or a missing key: a missing value (null; makes the record invalid for a required column).
- boolean: JSON true/false, or the strings "true"/"false" in any case (Go: null for strings). Numbers are not
  booleans.
- int (32-bit) and long (64-bit): a JSON integer, exact at any size (Go: rounded through float64 above 2^53);
  out of range is not coercible (Go: int silently wraps). A number with a fraction or exponent counts when its
  value is integral (`3.0`, `1e3`); `3.7` is not coercible (Go: truncated to 3). A string holding a JSON number
  counts as that number (`"42"`; JavaScript producers write longs above 2^53 that way; Go: null).
- float and double: a JSON number (or a string holding one), rounded to the nearest value; a number that does
  not fit (`1e39` for float) is not coercible.
- string: a JSON string as is; any other value is stored as its compact JSON text (`42`, `true`, `{"a":1}`;
  numbers as Python's json module writes them, so `1.50` becomes `1.5`). (Go: null for non-strings.)
- binary: JSON has no bytes type: the UTF-8 bytes of what the string rule gives (as in Go for strings; no
  base64 decoding).
- timestamp: Iceberg `timestamp` (microseconds, without zone; the Go processor's type) holding the UTC time.
  A string `YYYY-MM-DD[T| ]HH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]` (RFC 3339; `t`, `z` and `+HHMM` accepted; no
  offset means UTC; fraction digits beyond microseconds are truncated) or `YYYY-MM-DD` (midnight UTC).
  A JSON number counts `NumericTimestampUnit`s since the epoch: microseconds by default, as the Go processor
  stores the raw number, so rows of one table agree across a cut-over; milliseconds when the mapping says
  `numeric_timestamp_unit: millis`. (Go stores RFC 3339 strings as milliseconds in a microsecond column, 1000x too
  small; we do not.) Seconds 60 (leap seconds) are not coercible, nor instants outside the years 0001-9999
  (the range Python, Java and Spark parse; Arrow could hold more, but most readers could not).
- date: a string `YYYY-MM-DD` (Go: null), or a timestamp string as above, giving the UTC date of that instant
  (as Go does); a JSON integer is days since 1970-01-01 (as in Go; `1.5` is not coercible, Go truncates it to day 1);
  years 0001-9999 as for timestamps.
Values that are not JSON numbers/strings of these shapes are not coercible; the reason names the value.
"""

from __future__ import annotations

import json
import math
import re
import struct
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
# Timestamps and dates are kept within 0001-01-01 .. 9999-12-31 (UTC).
class NumericTimestampUnit(Enum):
    """What a JSON number in a `timestamp` column counts since the epoch (the mapping's
    `schema.numeric_timestamp_unit`)."""

    MICROS = "micros"  # the Go processor's: it stores the raw number in its microsecond column
    MILLIS = "millis"

    @property
    def micros(self) -> int:
        """Microseconds per unit."""
        return 1 if self is NumericTimestampUnit.MICROS else 1000

    @property
    def description(self) -> str:
        return "epoch microseconds" if self is NumericTimestampUnit.MICROS else "epoch milliseconds"


MIN_TIMESTAMP_MICROS = -62_135_596_800_000_000
MAX_TIMESTAMP_MICROS = 253_402_300_799_999_999
MIN_DATE_DAYS = -719_162
MAX_DATE_DAYS = 2_932_896

JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
JSON_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
# The accepted timestamp grammar (see the module docstring); field ranges are checked here, days per month by datetime.
TIMESTAMP_TEXT = re.compile(
    r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"(?:[Tt ]([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])(?:\.([0-9]+))?"
    r"(?:([Zz])|([+-])([01][0-9]|2[0-3]):?([0-5][0-9]))?)?"
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)
_MICROS_PER_DAY = 86_400_000_000
_SHOWN_TEXT_CHARS = 40


class NotCoercibleError(ValueError):
    """A present JSON value that cannot be stored in the column type; the message says why."""


def parse_json_object(raw: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse a record value: (the JSON object, None), or (None, why it is not a JSON object)."""
    if raw is None:
        return None, "value is null"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"value is not valid UTF-8 (byte {exc.start})"
    try:
        document = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        return None, f"value is not valid JSON: {exc}"
    except RecursionError:
        return None, "value is not valid JSON: nested too deeply"
    if not isinstance(document, dict):
        return None, f"value is not a JSON object (it is {json_kind(document)})"
    return document, None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def describe(value: Any) -> str:
    """A short description of a JSON value for error messages: `string '2024-13-01'`, `number 1.5`."""
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"number {text if len(text) <= _SHOWN_TEXT_CHARS else text[:_SHOWN_TEXT_CHARS] + '...'}"
    if isinstance(value, str):
        shown = value if len(value) <= _SHOWN_TEXT_CHARS else value[:_SHOWN_TEXT_CHARS] + "..."
        return f"string {shown!r}"
    return "array" if isinstance(value, list) else "object"


def coerce_json_value(value: Any, column_type: str,
                      numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS) -> Any:
    """The value for `column_type` as Python: bool, int, float, str, bytes, int microseconds (timestamp; a number
    counts `numeric_timestamp_unit`s) or int days (date); None for a missing value. Raises `NotCoercibleError` with
    the reason."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise NotCoercibleError(f"number beyond the range of a double cannot be stored as {column_type}")
    if column_type == "timestamp":
        return _to_timestamp(value, numeric_timestamp_unit)
    return _COERCERS[column_type](value, column_type)


def _to_boolean(value: Any, column_type: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise NotCoercibleError(f"cannot coerce {describe(value)} to boolean")


def _to_integer(value: Any, column_type: str) -> int:
    return _integral(value, column_type, *INT_RANGES[column_type])


def _integral(value: Any, column_type: str, low: int, high: int) -> int:
    number = _as_number(value, column_type)
    if isinstance(number, float):
        if not number.is_integer():
            raise NotCoercibleError(f"{describe(value)} is not an integer, so it cannot be stored as {column_type}")
        number = int(number)
    if not low <= number <= high:
        raise NotCoercibleError(f"{describe(value)} is out of range for {column_type} [{low}, {high}]")
    return number


def _to_floating(value: Any, column_type: str) -> float:
    number = _as_number(value, column_type)
    try:
        result = float(number)
        if column_type == "float":
            # Round to the nearest float32 the way Arrow's cast does; a finite double above float32's range overflows.
            result = struct.unpack("f", struct.pack("f", result))[0]
    except (OverflowError, struct.error):
        result = math.inf
    if not math.isfinite(result):
        raise NotCoercibleError(f"{describe(value)} is out of range for {column_type}")
    return result


def _as_number(value: Any, column_type: str) -> int | float:
    if isinstance(value, bool):
        raise NotCoercibleError(f"cannot coerce {describe(value)} to {column_type}")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and JSON_NUMBER.fullmatch(value):
        number = int(value) if JSON_INTEGER.fullmatch(value) else float(value)
        if isinstance(number, float) and not math.isfinite(number):
            raise NotCoercibleError(f"{describe(value)} is out of range for {column_type}")
        return number
    raise NotCoercibleError(f"cannot coerce {describe(value)} to {column_type}")


def _to_text(value: Any, column_type: str) -> str:
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotCoercibleError(f"{describe(value)} contains an unpaired UTF-16 surrogate escape") from exc
    return text


def _to_binary(value: Any, column_type: str) -> bytes:
    return _to_text(value, column_type).encode("utf-8")


def _to_timestamp(value: Any, unit: NumericTimestampUnit) -> int:
    if isinstance(value, str):
        return parse_timestamp_text(value, "timestamp")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotCoercibleError(f"cannot coerce {describe(value)} to timestamp")
    # Compare before multiplying: 1e308 * 1000 is no number any more.
    in_range = MIN_TIMESTAMP_MICROS / unit.micros <= value <= MAX_TIMESTAMP_MICROS / unit.micros
    micros = (value * unit.micros if isinstance(value, int) else round(value * unit.micros)) if in_range else None
    if micros is None or not MIN_TIMESTAMP_MICROS <= micros <= MAX_TIMESTAMP_MICROS:
        raise NotCoercibleError(f"{describe(value)} {unit.description} is outside the years 0001-9999")
    return micros


def _to_date(value: Any, column_type: str) -> int:
    if isinstance(value, str):
        return parse_timestamp_text(value, column_type) // _MICROS_PER_DAY
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotCoercibleError(f"cannot coerce {describe(value)} to date")
    return _integral(value, "date (days since 1970-01-01)", MIN_DATE_DAYS, MAX_DATE_DAYS)


def parse_timestamp_text(text: str, column_type: str = "timestamp") -> int:
    """Microseconds since the epoch (UTC) of a timestamp string in the accepted grammar."""
    match = TIMESTAMP_TEXT.fullmatch(text)
    if match is None:
        raise NotCoercibleError(f"cannot parse {describe(text)} as {column_type} (expected RFC 3339 or YYYY-MM-DD[ "
                                "HH:MM:SS])")
    year, month, day, hour, minute, second, fraction, _zulu, sign, offset_hours, offset_minutes = match.groups()
    offset = timedelta(0)
    if sign is not None:
        offset = timedelta(hours=int(offset_hours), minutes=int(offset_minutes))
        offset = -offset if sign == "-" else offset
    try:
        moment = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0),
        tzinfo=timezone(offset))
    except ValueError as exc:
        raise NotCoercibleError(f"cannot parse {describe(text)} as {column_type}: {exc}") from exc
    micros = (moment - _EPOCH) // _ONE_MICROSECOND
    if fraction:
        micros += int(fraction[:6].ljust(6, "0"))
    if not MIN_TIMESTAMP_MICROS <= micros <= MAX_TIMESTAMP_MICROS:
        raise NotCoercibleError(f"{describe(text)} is outside the years 0001-9999 in UTC")
    return micros


_COERCERS = {
    "boolean": _to_boolean,
    "int": _to_integer,
    "long": _to_integer,
    "float": _to_floating,
    "double": _to_floating,
    "string": _to_text,
    "binary": _to_binary,
    "date": _to_date,
}
