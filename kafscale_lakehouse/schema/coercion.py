"""JSON record values → Arrow arrays of the mapped columns, plus which records are invalid and why.

The rules for one value are in `json_values.py`. A value that cannot be coerced is null in an optional column
(counted in `nulled_counts`; the raw value stays in the `value` column) and makes the record invalid in a
required column, as does a missing or null required value, and a value that is not a JSON object (not JSON,
or other JSON) when any column is required. The reason names the column (`invalid_column` is null when the
whole value is at fault). A null value is a tombstone (KafScale has no compaction, so they stay in the log): a
record like any other, with null mapped columns, never invalid, whatever the columns require.

Hot path: values from `{` to `}` in valid UTF-8 are joined with newlines by an Arrow kernel and parsed by
pyarrow's JSON reader (parallel blocks) with an explicit schema of the mapped keys (exact top-level key match;
other keys are skipped), then converted with Arrow compute kernels. When that read fails:
- if a key mostly holds another JSON type than its parse type (epoch numbers for a timestamp,
  strings for a long), the parse type is learned from a sample and kept for later batches; read again;
- values where a key holds another JSON type, or a number int64 cannot take (the reader reports those without
  a row), are found with one regular expression per key and take the reference rules; read the rest again;
- what still fails is read again window by window as single blocks, whose parse errors name the row: the rows
  before it stay on the hot path, the row takes the reference rules; errors without a row halve the range.
  Pretty-printed values get here only when one straddles a parallel block boundary.
The reference rules also take values that are not `{...}` and single values outside the vectorized
conversions (a float for a string column, a timestamp string with a day its month does not have).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from kafscale_lakehouse.schema.columns import ARROW_TYPES, Column
from kafscale_lakehouse.schema.json_values import (
    INT_RANGES,
    MAX_DATE_DAYS,
    MAX_TIMESTAMP_MICROS,
    MIN_DATE_DAYS,
    MIN_TIMESTAMP_MICROS,
    NotCoercibleError,
    NumericTimestampUnit,
    coerce_json_value,
    parse_json_object,
)

log = logging.getLogger(__name__)

_PYTHON_BLOCK_ROWS = 32
_SCAN_WINDOW_ROWS = 4096
_SAMPLE_ROWS = 256
_MIN_BLOCK_BYTES = 1 << 20
_REJECTED_ROW = re.compile(r"in row (\d+)$")
# After `"key":`, the start of a value the reader's parse type rejects (null is fine for every type).
_UNEXPECTED_VALUE_START = {
    pa.int64(): r"(-?[0-9]+([.eE]|[0-9]{18})|[^-0-9n\s])",
    pa.float64(): r"[^-0-9n\s]",
    pa.string(): r"[^\"n\s]",
    pa.bool_(): r"[^tfn\s]",
}
MISSING_REQUIRED_REASON = "required value is missing or null"

# JSON parse types a column may be declared with in the reader's schema; the first is the default.
_PARSE_TYPES: dict[str, tuple[pa.DataType, ...]] = {
    "boolean": (pa.bool_(), pa.string()),
    "int": (pa.int64(), pa.string()),
    "long": (pa.int64(), pa.string()),
    "float": (pa.float64(), pa.string()),
    "double": (pa.float64(), pa.string()),
    "string": (pa.string(), pa.int64(), pa.float64(), pa.bool_()),
    "binary": (pa.string(), pa.int64(), pa.float64(), pa.bool_()),
    "timestamp": (pa.string(), pa.int64()),
    "date": (pa.string(), pa.int64()),
}

# Regular expressions for Arrow's RE2 kernels.
_INTEGER_TEXT = r"^-?(0|[1-9][0-9]{0,17})$"  # at most 18 digits: always fits int64
_NUMBER_TEXT = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$"
_DATE_TEXT = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
# What Arrow's timestamp casts parse exactly like the reference: <= 6 fraction digits, and a zone (cast to a
# UTC timestamp) or none (cast to a naive one, which is UTC by our rule).
_TIMESTAMP_TEXT = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[T ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):?[0-5][0-9])?$"
)
# Rewrites of the other accepted spellings into those, applied in order.
_TIMESTAMP_REWRITES = (
    (r"^([0-9]{4}-[0-9]{2}-[0-9]{2})$", r"\1T00:00:00"),
    (r"^([0-9]{4}-[0-9]{2}-[0-9]{2})t", r"\1T"),
    (r"(\.[0-9]{6})[0-9]+", r"\1"),
    (r"z$", "Z"),
)
_DAYS_IN_MONTH = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])


@dataclass(frozen=True)
class CoercionResult:
    """Mapped columns of a batch and the verdict per record.

    `columns` maps each mapped column name (in spec order) to an array of its Arrow type (`columns.ARROW_TYPES`);
    in invalid records, required columns may hold nulls. `invalid_reason` is null for valid records.
    """

    columns: dict[str, pa.Array]
    invalid_column: pa.StringArray
    invalid_reason: pa.StringArray
    nulled_counts: dict[str, int]  # per optional column: present values that were not coercible, stored as null
    unparsed_count: int  # non-null values that are not a JSON object (invalid JSON, other JSON); 0 without columns

    @property
    def invalid_mask(self) -> pa.BooleanArray:
        return pc.is_valid(self.invalid_reason)

    @property
    def invalid_count(self) -> int:
        return len(self.invalid_reason) - self.invalid_reason.null_count


@dataclass
class _Part:
    """Coerced columns for some rows of the batch, before they are put back in row order."""

    rows: np.ndarray  # row numbers in the batch
    arrays: list[pa.Array]  # per column
    failures: list[dict[int, str]]  # per column: position in `rows` → why the present value is not coercible
    value_problems: dict[int, str] = field(default_factory=dict)  # position in `rows` → why the value is no JSON object
    tombstones: set[int] = field(default_factory=set)  # positions in `rows` of null values: never invalid


class JsonColumnCoercer:
    """Coerces batches of JSON values into `columns`. Keep one per mapping and thread (it learns the JSON types
    of keys across batches).

    `use_arrow_reader=False` applies the reference rules to every row (slow; to verify the fast path). A JSON number
    in a timestamp column counts `numeric_timestamp_unit`s (default: microseconds, as the Go processor stores it).
    """

    def __init__(self, columns: Sequence[Column], *, use_arrow_reader: bool = True,
                 numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS) -> None:
        self.columns = tuple(columns)
        self._use_arrow_reader = use_arrow_reader
        self._unit = numeric_timestamp_unit
        self._parse_types = {column.name: _PARSE_TYPES[column.type][0] for column in self.columns}

    def coerce(self, values: pa.Array | pa.ChunkedArray) -> CoercionResult:
        """Coerce the record values (`binary`, one JSON document per record, nulls allowed)."""
        values = _as_binary_array(values)
        row_count = len(values)
        if not self.columns:
            nulls = pa.nulls(row_count, pa.string())
            return CoercionResult({}, nulls, nulls, {}, 0)
        parts: list[_Part] = []
        fast_rows = np.empty(0, dtype=np.int64)
        if self._use_arrow_reader:
            fast_rows, candidates = _object_like_values(values)
            if len(fast_rows):
                parts = self._fast_parts(candidates, fast_rows)
        if len(fast_rows) < row_count:
            other_rows = np.setdiff1d(np.arange(row_count, dtype=np.int64), fast_rows, assume_unique=True)
            parts.append(self._python_part(other_rows, values.take(other_rows).to_pylist()))
        return self._assemble(parts, row_count)

    # ----------------------------------------------------------------------------------------- fast path

    def _fast_parts(self, candidates: pa.BinaryArray, rows: np.ndarray, *, screened: bool = False) -> list[_Part]:
        joined = pc.binary_join_element_wise(candidates, pa.scalar(b"", pa.binary()), b"\n")
        offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset : joined.offset + len(joined) + 1]
        data = joined.buffers()[2]
        parallel_block_bytes = max(_MIN_BLOCK_BYTES, 2 * int(np.max(np.diff(offsets))))
        parse_options = self._parse_options()

        def parse(start: int, stop: int, *, one_block: bool) -> tuple[pa.Table | None, int | None]:
            """The rows' table, or None and (when the reader says) which row, counted from `start`, it rejected.
            Only a single block numbers rows from the start: parallel blocks number them from each block's start."""
            size = int(offsets[stop] - offsets[start])
            read_options = pa_json.ReadOptions(block_size=size + 1 if one_block else parallel_block_bytes,
            use_threads=not one_block)
            try:
                table = pa_json.read_json(
                    pa.BufferReader(data.slice(int(offsets[start]), size)),
                    read_options=read_options,
                    parse_options=parse_options,
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                return None, _rejected_row(exc, stop - start) if one_block else None
            # Every candidate runs from `{` to `}`, so rows cannot merge: a count mismatch means one held several
            # objects.
            return (table, None) if table.num_rows == stop - start else (None, None)

        whole, _ = parse(0, len(candidates), one_block=False)
        if whole is None and self._learn_parse_types(candidates):
            parse_options = self._parse_options()
            whole, _ = parse(0, len(candidates), one_block=False)
        if whole is not None:
            return [self._arrow_part(whole, rows)]
        if not screened:
            # Values of another JSON type than a key's parse type, and conversion errors (1.5 or 2^64 for an int64
            # key, which name no row), are found for all rows at once; the rest of the rows are read again.
            suspicious = self._suspicious_values(candidates)
            if suspicious.any():
                parts = [self._python_part(rows[suspicious], candidates.filter(pa.array(suspicious)).to_pylist())]
                if not suspicious.all():
                    parts += self._fast_parts(
                        candidates.filter(pa.array(~suspicious)), rows[~suspicious], screened=True
                    )
                return parts

        # Isolate the rows the reader rejects, window by window (a read costs time in proportion to its input even
        # when it fails early). A parse error names its row: the rows before it parse, that one takes the
        # reference path, and so do the next rows when rejected rows come thick (a read per few rows costs more
        # than the reference rules). Other errors name no row: halve the range.
        tables, table_rows, python_positions = [], [], []
        pending = [
            (start, min(start + _SCAN_WINDOW_ROWS, len(candidates)))
            for start in range(0, len(candidates), _SCAN_WINDOW_ROWS)
        ][::-1]
        reference_run = _PYTHON_BLOCK_ROWS
        while pending:
            start, stop = pending.pop()
            if stop - start > _PYTHON_BLOCK_ROWS:
                table, rejected = parse(start, stop, one_block=True)
                if table is not None:
                    tables.append(table)
                    table_rows.append(rows[start:stop])
                    reference_run = _PYTHON_BLOCK_ROWS
                    continue
                if rejected is None:
                    middle = (start + stop) // 2
                    pending.extend([(middle, stop), (start, middle)])
                    continue
                first_rejected = start + rejected
                if rejected >= _PYTHON_BLOCK_ROWS:
                    pending.extend([(first_rejected + 1, stop), (start, first_rejected)])
                    start = first_rejected
                    stop = first_rejected + 1
                else:
                    pending.append((min(stop, max(first_rejected + 1, start + reference_run)), stop))
                    stop = pending[-1][0]
                    reference_run = min(2 * reference_run, _SCAN_WINDOW_ROWS)
            python_positions.append(np.arange(start, stop, dtype=np.int64))
        log.debug(
            "JSON batch of %d values: %d blocks on the Arrow reader, %d values by the reference rules",
            len(candidates),
            len(tables),
            sum(map(len, python_positions)),
        )
        parts = [self._arrow_part(pa.concat_tables(tables), np.concatenate(table_rows))] if tables else []
        if python_positions:
            positions = np.concatenate(python_positions)
            parts.append(self._python_part(rows[positions], candidates.take(positions).to_pylist()))
        return parts

    def _suspicious_values(self, candidates: pa.BinaryArray) -> np.ndarray:
        """Values where a mapped key holds what its parse type rejects: another JSON type, or for int64 a number with
        a fraction, an exponent or 19+ digits. One regular expression per key; a nested key of the same name may
        flag a value needlessly (it then takes the reference path), an escaped key name goes unflagged."""
        suspicious = np.zeros(len(candidates), dtype=bool)
        for name, parse_type in self._parse_types.items():
            pattern = re.escape(json.dumps(name, ensure_ascii=False)) + r"\s*:\s*" + _UNEXPECTED_VALUE_START[parse_type]
            suspicious |= pc.match_substring_regex(candidates, pattern).fill_null(False).to_numpy(zero_copy_only=False)
        return suspicious

    def _parse_options(self) -> pa_json.ParseOptions:
        schema = pa.schema([(name, parse_type) for name, parse_type in self._parse_types.items()])
        # newlines_in_values=True aborts the process on some invalid input (pyarrow 26: std::out_of_range in its
        # chunker). Without it, a pretty-printed value fails a parallel read when it straddles a block boundary
        # (and only then), and parses in the single-block re-read.
        return pa_json.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False
        )

    def _learn_parse_types(self, candidates: pa.BinaryArray) -> bool:
        """Declare each key with the JSON type most of a sample of values has; True if anything changed."""
        step = max(1, len(candidates) // _SAMPLE_ROWS)
        sample = candidates.take(np.arange(0, len(candidates), step, dtype=np.int64)[:_SAMPLE_ROWS]).to_pylist()
        documents = [document for document in (parse_json_object(raw)[0] for raw in sample) if document is not None]
        changed = False
        for column in self.columns:
            counts: dict[pa.DataType, int] = {}
            for document in documents:
                parse_type = _parse_type_of(document.get(column.name))
                if parse_type in _PARSE_TYPES[column.type]:
                    counts[parse_type] = counts.get(parse_type, 0) + 1
            if counts:
                learned = max(counts, key=counts.__getitem__)
                if learned != self._parse_types[column.name]:
                    log.info("column %s: most values are JSON %s, parsing it as such", column.name, learned)
                    self._parse_types[column.name] = learned
                    changed = True
        return changed

    def _arrow_part(self, table: pa.Table, rows: np.ndarray) -> _Part:
        arrays, failures = [], []
        for column in self.columns:
            array, column_failures = _convert_column(table.column(column.name).combine_chunks(), column.type,
                                                     self._unit)
            arrays.append(array)
            failures.append(column_failures)
        return _Part(rows=rows, arrays=arrays, failures=failures)

    # -------------------------------------------------------------------------------------- reference path

    def _python_part(self, rows: np.ndarray, raws: list[bytes | None]) -> _Part:
        column_values: list[list[object]] = [[] for _ in self.columns]
        failures: list[dict[int, str]] = [{} for _ in self.columns]
        value_problems: dict[int, str] = {}
        tombstones: set[int] = set()
        for position, raw in enumerate(raws):
            document, problem = parse_json_object(raw)
            if document is None:
                if raw is None:
                    tombstones.add(position)
                else:
                    value_problems[position] = cast(str, problem)  # no object comes with the reason why
                for values in column_values:
                    values.append(None)
                continue
            for index, column in enumerate(self.columns):
                try:
                    column_values[index].append(coerce_json_value(document.get(column.name), column.type,
                                                                  self._unit))
                except NotCoercibleError as exc:
                    column_values[index].append(None)
                    failures[index][position] = str(exc)
        arrays = [
            _python_values_to_arrow(values, column.type)
            for values, column in zip(column_values, self.columns, strict=False)
        ]
        return _Part(rows=rows, arrays=arrays, failures=failures, value_problems=value_problems, tombstones=tombstones)

    # ----------------------------------------------------------------------------------------- assembly

    def _assemble(self, parts: list[_Part], row_count: int) -> CoercionResult:
        problems: dict[int, tuple[str | None, str]] = {}  # row → first problem (column, reason)
        nulled_counts = {column.name: 0 for column in self.columns if not column.required}
        unparsed_count = 0
        any_required = any(column.required for column in self.columns)
        for part in parts:
            unparsed_count += len(part.value_problems)
            if any_required:
                for position, reason in part.value_problems.items():
                    problems[int(part.rows[position])] = (None, reason)
            for column, array, failures in zip(self.columns, part.arrays, part.failures, strict=False):
                if not column.required:
                    nulled_counts[column.name] += len(failures)
                    continue
                for position, reason in failures.items():
                    problems.setdefault(int(part.rows[position]), (column.name, reason))
                if array.null_count:
                    for null_position in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)):
                        if not _reported_or_tombstone(part, int(null_position), failures):
                            problems.setdefault(int(part.rows[null_position]), (column.name, MISSING_REQUIRED_REASON))

        columns = {
            column.name: _in_row_order(parts, index, column.type, row_count)
            for index, column in enumerate(self.columns)
        }
        if problems:
            invalid_columns: list[str | None] = [None] * row_count
            invalid_reasons: list[str | None] = [None] * row_count
            for row, (column_name, reason) in problems.items():
                invalid_columns[row] = column_name
                invalid_reasons[row] = reason
            invalid_column, invalid_reason = (
                pa.array(invalid_columns, pa.string()),
                pa.array(invalid_reasons, pa.string()),
            )
        else:
            invalid_column = invalid_reason = pa.nulls(row_count, pa.string())
        return CoercionResult(columns, invalid_column, invalid_reason, nulled_counts, unparsed_count)


def _reported_or_tombstone(part: _Part, position: int, failures: dict[int, str]) -> bool:
    """Whether a null at `position` of a required column is already explained, or the record is a tombstone."""
    return position in failures or position in part.value_problems or position in part.tombstones


def coerce_json_values(values: pa.Array | pa.ChunkedArray, columns: Sequence[Column],
                       numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS) -> CoercionResult:
    """Coerce one batch (a fresh coercer: use `JsonColumnCoercer` across batches to keep learned parse types)."""
    return JsonColumnCoercer(columns, numeric_timestamp_unit=numeric_timestamp_unit).coerce(values)


def _as_binary_array(values: pa.Array | pa.ChunkedArray) -> pa.BinaryArray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    return values


def _object_like_values(values: pa.BinaryArray) -> tuple[np.ndarray, pa.BinaryArray]:
    """The rows (and their values) the Arrow reader may parse: from `{` to `}`, valid UTF-8."""
    object_like = pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}")).fill_null(False)
    rows = np.flatnonzero(object_like.to_numpy(zero_copy_only=False)).astype(np.int64)
    candidates = values if len(rows) == len(values) else values.take(rows)
    try:
        candidates.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:  # some value is not UTF-8 (rare): find which; the reference path reports them
        keep = np.array([_is_utf8(raw) for raw in candidates.to_pylist()], dtype=bool)
        rows, candidates = rows[keep], candidates.filter(pa.array(keep))
    return rows, candidates


def _rejected_row(error: Exception, row_count: int) -> int | None:
    """The row a JSON reader parse error names ("... in row 12"), None for conversion errors and odd numbers."""
    match = _REJECTED_ROW.search(str(error))
    return int(match.group(1)) if match and int(match.group(1)) < row_count else None


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _parse_type_of(value: object) -> pa.DataType | None:
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64() if INT_RANGES["long"][0] <= value <= INT_RANGES["long"][1] else None
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    return None


def _in_row_order(parts: list[_Part], index: int, column_type: str, row_count: int) -> pa.Array:
    if not parts:
        return pa.array([], ARROW_TYPES[column_type])
    combined = pa.concat_arrays([part.arrays[index] for part in parts]) if len(parts) > 1 else parts[0].arrays[index]
    order = np.concatenate([part.rows for part in parts]) if len(parts) > 1 else parts[0].rows
    if np.array_equal(order, np.arange(row_count)):
        return combined
    inverse = np.empty(row_count, dtype=np.int64)
    inverse[order] = np.arange(row_count, dtype=np.int64)
    return combined.take(inverse)


def _python_values_to_arrow(values: list[object], column_type: str) -> pa.Array:
    if column_type == "timestamp":
        return pa.array(values, pa.int64()).cast(ARROW_TYPES["timestamp"])
    if column_type == "date":
        return pa.array(values, pa.int32()).cast(ARROW_TYPES["date"])
    return pa.array(values, ARROW_TYPES[column_type])


# ------------------------------------------------------------------------------------ vectorized conversions
# Each takes the reader's array (one of the column type's parse types) and returns the converted array plus
# a mask of values it does not handle, which `_convert_column` hands to the reference rules.


def _convert_column(array: pa.Array, column_type: str,
                    unit: NumericTimestampUnit) -> tuple[pa.Array, dict[int, str]]:
    if column_type == "timestamp":
        converted, handled = _timestamp(array, unit)
    else:
        converted, handled = _VECTORIZED[column_type](array, column_type)
    delegated = pc.and_(pc.is_valid(array), pc.invert(handled.fill_null(False)))
    positions = np.flatnonzero(delegated.to_numpy(zero_copy_only=False))
    if not len(positions):
        return converted, {}
    results: list[object] = []
    failures: dict[int, str] = {}
    for position, value in zip(positions, array.take(positions).to_pylist(), strict=False):
        try:
            results.append(coerce_json_value(value, column_type, unit))
        except NotCoercibleError as exc:
            results.append(None)
            failures[int(position)] = str(exc)
    converted = pc.replace_with_mask(converted, delegated, _python_values_to_arrow(results, column_type))
    return converted, failures


def _between(array: pa.Array, low: int, high: int) -> pa.BooleanArray:
    return pc.and_(pc.greater_equal(array, low), pc.less_equal(array, high))


def _null_where_not(handled: pa.BooleanArray, array: pa.Array) -> pa.Array:
    return pc.if_else(handled.fill_null(False), array, pa.scalar(None, array.type))


def _boolean(array: pa.Array, column_type: str) -> tuple[pa.Array, pa.BooleanArray]:
    if array.type == pa.bool_():
        return array, pc.is_valid(array)
    lowered = pc.utf8_lower(array)
    is_true, is_false = pc.equal(lowered, "true"), pc.equal(lowered, "false")
    handled = pc.or_(is_true, is_false)
    return _null_where_not(handled, is_true), handled


def _integer(array: pa.Array, column_type: str) -> tuple[pa.Array, pa.BooleanArray]:
    if pa.types.is_string(array.type):
        handled = pc.match_substring_regex(array, _INTEGER_TEXT)
        array = _null_where_not(handled, array).cast(pa.int64())
    else:
        handled = pc.is_valid(array)
    if column_type == "int":
        handled = pc.and_(handled, _between(array, *INT_RANGES["int"]))
    return _null_where_not(handled, array).cast(ARROW_TYPES[column_type]), handled


def _floating(array: pa.Array, column_type: str) -> tuple[pa.Array, pa.BooleanArray]:
    if pa.types.is_string(array.type):
        handled = pc.match_substring_regex(array, _NUMBER_TEXT)
        array = _null_where_not(handled, array).cast(pa.float64())
        handled = pc.and_(handled, pc.is_finite(array))
    else:
        handled = pc.is_valid(array)
    if column_type == "float":
        array = array.cast(pa.float32(), safe=False)
        handled = pc.and_(handled, pc.is_finite(array))  # finite doubles beyond float32 become inf
    return _null_where_not(handled, array), handled


def _text(array: pa.Array, column_type: str) -> tuple[pa.Array, pa.BooleanArray]:
    if pa.types.is_floating(array.type):  # float formatting follows Python's json module: reference path
        return pa.nulls(len(array), ARROW_TYPES[column_type]), pc.is_null(array)
    return array.cast(pa.string()).cast(ARROW_TYPES[column_type]), pc.is_valid(array)


def _timestamp(array: pa.Array, unit: NumericTimestampUnit) -> tuple[pa.Array, pa.BooleanArray]:
    if pa.types.is_integer(array.type):
        handled = _between(array, MIN_TIMESTAMP_MICROS // unit.micros, MAX_TIMESTAMP_MICROS // unit.micros)
        micros = pc.multiply(_null_where_not(handled, array), unit.micros)
        return micros.cast(ARROW_TYPES["timestamp"]), handled
    return _timestamp_text(array)


def _date(array: pa.Array, column_type: str) -> tuple[pa.Array, pa.BooleanArray]:
    if pa.types.is_integer(array.type):
        handled = _between(array, MIN_DATE_DAYS, MAX_DATE_DAYS)
        return _null_where_not(handled, array).cast(pa.int32()).cast(ARROW_TYPES["date"]), handled
    date_only = pc.and_(pc.match_substring_regex(array, _DATE_TEXT), pc.invert(pc.starts_with(array, "0000")))
    if pc.all(date_only.fill_null(True)).as_py():
        return _cast_valid_days(array, date_only.fill_null(False), ARROW_TYPES["date"])
    timestamps, handled = _timestamp_text(array)
    return timestamps.cast(ARROW_TYPES["date"]), handled


def _timestamp_text(array: pa.Array) -> tuple[pa.Array, pa.BooleanArray]:
    """Parse timestamp strings in the accepted grammar to `timestamp[us]` (UTC); other strings are not handled."""
    zoned, naive = _timestamp_shapes(array)
    if not pc.all(pc.or_(pc.or_(zoned, naive), pc.is_null(array))).as_py():
        for pattern, replacement in _TIMESTAMP_REWRITES:
            array = pc.replace_substring_regex(array, pattern, replacement)
        zoned, naive = _timestamp_shapes(array)
    parsed_zoned, zoned = _cast_valid_days(array, zoned, pa.timestamp("us", tz="UTC"))
    parsed_naive, naive = _cast_valid_days(array, naive, ARROW_TYPES["timestamp"])
    parsed = pc.if_else(zoned, parsed_zoned.cast(ARROW_TYPES["timestamp"]), parsed_naive)
    # An offset can move 0001-01-01 or 9999-12-31 out of the supported years: the reference says so.
    handled = pc.and_(
        pc.or_(zoned, naive), _between(parsed.cast(pa.int64()), MIN_TIMESTAMP_MICROS, MAX_TIMESTAMP_MICROS)
    )
    return _null_where_not(handled, parsed), handled


def _timestamp_shapes(array: pa.Array) -> tuple[pa.BooleanArray, pa.BooleanArray]:
    """Which strings Arrow can cast as zoned and which as naive timestamps."""
    # Year 0000 exists for Arrow but not for the reference (Python's datetime): leave it to the reference.
    well_formed = pc.and_(
        pc.match_substring_regex(array, _TIMESTAMP_TEXT), pc.invert(pc.starts_with(array, "0000"))
    ).fill_null(False)
    # In a well-formed string, Z, + or a third - can only be the zone.
    has_zone = pc.or_(
        pc.or_(pc.match_substring(array, "Z"), pc.match_substring(array, "+")),
        pc.greater(pc.count_substring(array, "-"), 2),
    )
    return pc.and_(well_formed, has_zone.fill_null(False)), pc.and_(well_formed, pc.invert(has_zone).fill_null(False))


def _cast_valid_days(
    array: pa.Array,
    well_formed: pa.BooleanArray,
    target: pa.DataType,
) -> tuple[pa.Array, pa.BooleanArray]:
    """Cast the `well_formed` date/timestamp strings; Arrow fails the whole cast on a day the month does not have
    (2023-02-29), so then those are left out (to the reference rules, which say why) and the rest cast."""
    try:
        return _null_where_not(well_formed, array).cast(target), well_formed
    except pa.ArrowInvalid:
        handled = pc.and_(well_formed, _has_valid_day(array, well_formed))
        return _null_where_not(handled, array).cast(target), handled


def _has_valid_day(array: pa.Array, well_formed: pa.BooleanArray) -> pa.BooleanArray:
    """For strings starting `YYYY-MM-DD` (where `well_formed`): is DD a day of that month?"""
    texts = _null_where_not(well_formed, array).fill_null("0001-01-01")
    year = pc.utf8_slice_codeunits(texts, 0, 4).cast(pa.int32()).to_numpy()
    month = pc.utf8_slice_codeunits(texts, 5, 7).cast(pa.int32()).to_numpy()
    day = pc.utf8_slice_codeunits(texts, 8, 10).cast(pa.int32()).to_numpy()
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    last_day = _DAYS_IN_MONTH[month] + ((month == 2) & leap)
    return pc.and_(well_formed, pa.array(day <= last_day))


_VECTORIZED = {
    "boolean": _boolean,
    "int": _integer,
    "long": _integer,
    "float": _floating,
    "double": _floating,
    "string": _text,
    "binary": _text,
    "date": _date,
}
