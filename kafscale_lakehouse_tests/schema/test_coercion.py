"""JSON → Arrow coercion: every type's rules (incl. the Go processor's bugs, fixed), invalid records, fast path =
reference."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale_lakehouse.schema import ARROW_TYPES, JsonColumnCoercer, NumericTimestampUnit, coerce_json_values
from kafscale_lakehouse.schema.columns import Column

NOT_COERCIBLE = object()
REPEAT = 20  # more rows than a Python fallback block, so the vectorized conversions run

# (JSON text of the value, expected Python value or NOT_COERCIBLE) per column type.
TYPE_CASES: dict[str, list[tuple[str, object]]] = {
    "boolean": [
        ("true", True),
        ("false", False),
        ('"TRUE"', True),
        ('"false"', False),
        ("1", NOT_COERCIBLE),
        ('"yes"', NOT_COERCIBLE),
        ('{"a":1}', NOT_COERCIBLE),
    ],
    "int": [
        ("5", 5),
        ("-2147483648", -2147483648),
        ("2147483647", 2147483647),
        ("2147483648", NOT_COERCIBLE),
        ("-2147483649", NOT_COERCIBLE),  # out of range: never wrapped (Go wraps)
        ("3.0", 3),
        ("1e3", 1000),
        ("1.5", NOT_COERCIBLE),
        ('"42"', 42),
        ('"4.0"', 4),
        ('"x"', NOT_COERCIBLE),
        ("true", NOT_COERCIBLE),
        ("99999999999999999999", NOT_COERCIBLE),
    ],
    "long": [
        ("9007199254740993", 9007199254740993),  # 2^53 + 1, exact (Go rounds through float64)
        ("9223372036854775807", 9223372036854775807),
        ("-9223372036854775808", -9223372036854775808),
        ("9223372036854775808", NOT_COERCIBLE),
        ('"9007199254740993"', 9007199254740993),
        ('"18446744073709551616"', NOT_COERCIBLE),
        ("1e20", NOT_COERCIBLE),
        ("2.5", NOT_COERCIBLE),
        ("[1]", NOT_COERCIBLE),
    ],
    "float": [
        ("1.5", 1.5),
        ("3", 3.0),
        ('"2.5"', 2.5),
        ("0.1", 0.10000000149011612),
        ("1e39", NOT_COERCIBLE),
        ("3.4028234663852886e38", 3.4028234663852886e38),
        ("true", NOT_COERCIBLE),
        ('"NaN"', NOT_COERCIBLE),
    ],
    "double": [
        ("0.1", 0.1),
        ("12345678901234567890", 1.2345678901234567e19),
        ("1e308", 1e308),
        ("1e400", NOT_COERCIBLE),
        ('"1e2"', 100.0),
        ('"-0.5"', -0.5),
        ('"0x10"', NOT_COERCIBLE),
    ],
    "string": [
        ('"x"', "x"),
        ('"\\u00e9\\ud83d\\ude00"', "é😀"),
        ("42", "42"),
        ("1.5", "1.5"),
        ("true", "true"),
        ('{"a":[1,"b"]}', '{"a":[1,"b"]}'),
        ("[1, 2]", "[1,2]"),
        ('"\\ud800"', NOT_COERCIBLE),
    ],
    "binary": [('"ab"', b"ab"), ('"\\u00e9"', "é".encode()), ("5", b"5"), ("false", b"false")],
    "timestamp": [
        ('"2024-01-02T03:04:05Z"', datetime(2024, 1, 2, 3, 4, 5)),
        ('"2024-01-02T03:04:05.123456+05:30"', datetime(2024, 1, 1, 21, 34, 5, 123456)),
        ('"2024-01-02T03:04:05.123456789Z"', datetime(2024, 1, 2, 3, 4, 5, 123456)),  # ns: truncated to µs
        ('"2024-01-02T03:04:05.5-08:00"', datetime(2024, 1, 2, 11, 4, 5, 500000)),
        ('"2024-01-02t03:04:05.25z"', datetime(2024, 1, 2, 3, 4, 5, 250000)),
        ('"2024-01-02T03:04:05-0800"', datetime(2024, 1, 2, 11, 4, 5)),
        ('"2024-01-02 03:04:05"', datetime(2024, 1, 2, 3, 4, 5)),  # no offset: UTC
        ('"2024-01-02"', datetime(2024, 1, 2)),
        ("1700000000000000", datetime(2023, 11, 14, 22, 13, 20)),  # epoch µs by default, as Go stores numbers
        ("-1", datetime(1969, 12, 31, 23, 59, 59, 999999)),
        ("1700000000000000.4", datetime(2023, 11, 14, 22, 13, 20)),
        ('"2024-02-30T00:00:00Z"', NOT_COERCIBLE),
        ('"2023-02-29 00:00:00"', NOT_COERCIBLE),
        ('"2024-01-02T24:00:00Z"', NOT_COERCIBLE),
        ('"2024-01-02T03:04:60Z"', NOT_COERCIBLE),
        ('"0000-01-01T00:00:00Z"', NOT_COERCIBLE),
        ('"yesterday"', NOT_COERCIBLE),
        ('"1700000000000"', NOT_COERCIBLE),
        ("true", NOT_COERCIBLE),
        ("1e308", NOT_COERCIBLE),
        ("253402300800000000", NOT_COERCIBLE),
        ("253402300799999999", datetime(9999, 12, 31, 23, 59, 59, 999999)),
        ('"0001-01-01T00:30:00+01:00"', NOT_COERCIBLE),
        ('"9999-12-31T23:59:59.999999Z"', datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ],
    "date": [
        ('"2024-02-29"', date(2024, 2, 29)),  # Go: null
        ('"2023-02-29"', NOT_COERCIBLE),
        ('"2024-01-02T23:00:00-05:00"', date(2024, 1, 3)),  # the UTC date of the instant
        ('"1969-12-31T23:59:59.999Z"', date(1969, 12, 31)),
        ("19000", date(1970, 1, 1) + timedelta(days=19000)),
        ("-1", date(1969, 12, 31)),
        ("2932896", date(9999, 12, 31)),
        ("2932897", NOT_COERCIBLE),
        ('"not a date"', NOT_COERCIBLE),
        ("1.5", NOT_COERCIBLE),
        ('"0000-01-01"', NOT_COERCIBLE),
    ],
}
ALL_TYPE_CASES = [
    (column_type, text, expected) for column_type, cases in TYPE_CASES.items() for text, expected in cases
]


def run(values: list[bytes | None], columns: list[Column], arrow_reader: bool = True):
    return JsonColumnCoercer(columns, use_arrow_reader=arrow_reader).coerce(pa.array(values, pa.binary()))


def documents(value_texts: list[str], key: str = "v") -> list[bytes]:
    return [f'{{"{key}":{text},"other":{{"x":[1,"y"]}}}}'.encode() for text in value_texts]


def check_rows(result, column: Column, expectations: list[object]) -> None:
    got = result.columns[column.name].to_pylist()
    reasons = result.invalid_reason.to_pylist()
    for row, expected in enumerate(expectations):
        if expected is NOT_COERCIBLE:
            assert got[row] is None, (row, got[row])
            if column.required:
                assert result.invalid_column[row].as_py() == column.name and reasons[row], row
        else:
            assert got[row] == expected, (row, got[row], expected)
            assert reasons[row] is None, (row, reasons[row])
    bad = sum(expected is NOT_COERCIBLE for expected in expectations)
    if column.required:
        assert result.invalid_count == bad
    else:
        assert result.nulled_counts == {column.name: bad} and result.invalid_count == 0


@pytest.mark.parametrize("column_type", list(TYPE_CASES))
@pytest.mark.parametrize("required", [False, True], ids=["optional", "required"])
@pytest.mark.parametrize("arrow_reader", [True, False], ids=["arrow", "reference"])
def test_type_rules_in_a_mixed_batch(column_type, required, arrow_reader):
    column = Column(name="v", type=column_type, required=required)
    cases = TYPE_CASES[column_type] * REPEAT
    result = run(documents([text for text, _ in cases]), [column], arrow_reader)
    assert result.columns["v"].type == ARROW_TYPES[column_type]
    check_rows(result, column, [expected for _, expected in cases])


@pytest.mark.parametrize(
    ("column_type", "text", "expected"), ALL_TYPE_CASES, ids=[f"{t}:{x}" for t, x, _ in ALL_TYPE_CASES]
)
def test_type_rule_in_a_uniform_batch(column_type, text, expected):
    # A batch where every value has this JSON type: the reader parses it as that type (learned) and the
    # vectorized conversion handles it.
    column = Column(name="v", type=column_type)
    result = run(documents([text] * 2 * REPEAT), [column])
    check_rows(result, column, [expected] * 2 * REPEAT)


def test_not_coercible_reasons_name_the_value_and_type():
    columns = [Column(name="n", type="int", required=True)]
    result = run(documents(["2147483648", '"2024-13-01"', "1.5"], key="n"), columns)
    assert result.invalid_column.to_pylist() == ["n", "n", "n"]
    assert result.invalid_reason.to_pylist() == [
        "number 2147483648 is out of range for int [-2147483648, 2147483647]",
        "cannot coerce string '2024-13-01' to int",
        "number 1.5 is not an integer, so it cannot be stored as int",
    ]
    ts = run(documents(['"2024-02-30T00:00:00Z"'], key="t"), [Column(name="t", type="timestamp", required=True)])
    assert (
        ts.invalid_reason[0].as_py()
        == "cannot parse string '2024-02-30T00:00:00Z' as timestamp: day is out of range for month"
    )


@pytest.mark.parametrize("arrow_reader", [True, False], ids=["arrow", "reference"])
def test_required_columns_missing_or_null_make_the_record_invalid(arrow_reader):
    columns = [
        Column(name="id", type="long", required=True),
        Column(name="name", type="string", required=True),
        Column(name="note", type="string"),
    ]
    values = [
        b'{"id":1,"name":"a"}',
        b'{"name":"b"}',
        b'{"id":null,"name":"c"}',
        b'{"id":"x","note":"n"}',
        b'{"id":4}',
    ] * REPEAT
    result = run(values, columns, arrow_reader)
    assert result.invalid_column.to_pylist()[:5] == [None, "id", "id", "id", "name"]
    assert result.invalid_reason.to_pylist()[:5] == [
        None,
        "required value is missing or null",
        "required value is missing or null",
        "cannot coerce string 'x' to long",  # the first column at fault is reported
        "required value is missing or null",
    ]
    assert result.invalid_mask.to_pylist()[:5] == [False, True, True, True, True]
    assert result.invalid_count == 4 * REPEAT
    assert result.columns["note"].to_pylist()[:5] == [None, None, None, "n", None]


BAD_VALUES = [
    (b"not json", "value is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b'{"id":1', "value is not valid JSON: Expecting ',' delimiter: line 1 column 8 (char 7)"),
    (b'{"id":1} {"id":2}', "value is not valid JSON: Extra data: line 1 column 10 (char 9)"),
    (b"[1,2]", "value is not a JSON object (it is an array)"),
    (b'"text"', "value is not a JSON object (it is a string)"),
    (b"42", "value is not a JSON object (it is a number)"),
    (b"", "value is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b'{"id":"\xff"}', "value is not valid UTF-8 (byte 7)"),
    (b'{"id":NaN}', "value is not valid JSON: NaN is not a JSON value"),
]


@pytest.mark.parametrize("arrow_reader", [True, False], ids=["arrow", "reference"])
def test_values_that_are_not_json_objects(arrow_reader):
    good = [b'{"id":%d}' % i for i in range(40)]
    values = good[:20] + [raw for raw, _ in BAD_VALUES] + good[20:]
    bad_rows = range(20, 20 + len(BAD_VALUES))

    required = run(values, [Column(name="id", type="long", required=True)], arrow_reader)
    assert [required.invalid_reason[row].as_py() for row in bad_rows] == [reason for _, reason in BAD_VALUES]
    assert all(required.invalid_column[row].as_py() is None for row in bad_rows)  # the whole value is at fault
    assert required.invalid_count == len(BAD_VALUES) and required.unparsed_count == len(BAD_VALUES)
    ids = required.columns["id"].to_pylist()
    assert ids[:20] + ids[20 + len(BAD_VALUES) :] == list(range(40))  # rows stay aligned

    optional = run(values, [Column(name="id", type="long")], arrow_reader)
    assert optional.invalid_count == 0 and optional.unparsed_count == len(BAD_VALUES)
    assert [optional.columns["id"][row].as_py() for row in bad_rows] == [None] * len(BAD_VALUES)


@pytest.mark.parametrize("arrow_reader", [True, False], ids=["arrow", "reference"])
@pytest.mark.parametrize(("unit", "scale"), [(NumericTimestampUnit.MICROS, 1), (NumericTimestampUnit.MILLIS, 1000)])
def test_a_number_in_a_timestamp_column_counts_the_mapping_unit(arrow_reader, unit, scale):
    # The Go processor stores the raw number (microseconds); `millis` is the mapping's choice.
    out_of_range = 253_402_300_800_000_000 // scale  # 10000-01-01
    values = [b'{"at":%d}' % (1_700_000_000_000_000 // scale), b'{"at":-1}', b'{"at":%d}' % out_of_range]
    coercer = JsonColumnCoercer([Column(name="at", type="timestamp")], use_arrow_reader=arrow_reader,
                                numeric_timestamp_unit=unit)

    result = coercer.coerce(pa.array(values * 40, pa.binary()))

    assert result.columns["at"].to_pylist()[:3] == [
        datetime(2023, 11, 14, 22, 13, 20), datetime(1970, 1, 1) - timedelta(microseconds=scale), None]
    assert result.nulled_counts == {"at": 40}  # the year-10000 instant
    required = JsonColumnCoercer([Column(name="at", type="timestamp", required=True)], numeric_timestamp_unit=unit)
    assert required.coerce(pa.array(values[2:], pa.binary())).invalid_reason.to_pylist() == [
        f"number {out_of_range} {unit.description} is outside the years 0001-9999"]


@pytest.mark.parametrize("arrow_reader", [True, False], ids=["arrow", "reference"])
def test_tombstones_are_records_with_null_columns_never_invalid(arrow_reader):
    # KafScale has no compaction: null values (tombstones) stay in the log and land like any record.
    values = [b'{"id":1,"note":"a"}', None, b'{"id":3}', None]
    columns = [Column(name="id", type="long", required=True), Column(name="note", type="string", required=True)]

    result = run(values, columns, arrow_reader)

    assert result.invalid_reason.to_pylist() == [None, None, "required value is missing or null", None]
    assert result.invalid_column.to_pylist() == [None, None, "note", None]
    assert result.columns["id"].to_pylist() == [1, None, 3, None]
    assert result.columns["note"].to_pylist() == ["a", None, None, None]
    assert result.unparsed_count == 0


@pytest.mark.parametrize("arrow_reader", [True, False], ids=["arrow", "reference"])
def test_pretty_printed_values(arrow_reader):
    columns = [Column(name="id", type="long", required=True), Column(name="tags", type="string")]
    # Over 1 MiB, so pretty-printed values straddle the Arrow reader's block boundaries.
    count = 6000 if arrow_reader else 200
    documents_ = [{"id": i, "tags": ["a", {"b": i}], "nested": {"id": -1}, "pad": "x" * 100} for i in range(count)]
    values = [
        json.dumps(doc, indent=2 if i % 2 else None).replace("\n", "\r\n" if i % 3 == 0 else "\n").encode()
        for i, doc in enumerate(documents_)
    ]
    result = run(values, columns, arrow_reader)
    assert result.invalid_count == 0
    assert result.columns["id"].to_pylist() == list(range(count))  # the top-level key, not nested.id
    assert result.columns["tags"].to_pylist() == [f'["a",{{"b":{i}}}]' for i in range(count)]


def test_rows_stay_aligned_when_bad_rows_are_isolated_from_a_large_batch():
    columns = [Column(name="id", type="long", required=True), Column(name="at", type="timestamp")]
    values = []
    for row in range(5000):
        if row % 613 == 0:
            values.append(b'{"id": broken')
        elif row % 401 == 0:
            values.append(b'{"id":"%d","at":1700000000000000}' % row)  # other JSON types than the rest
        else:
            values.append(b'{"id":%d,"at":"2024-01-01T00:00:00Z"}' % row)
    result = run(values, columns)
    ids = result.columns["id"].to_pylist()
    invalid = {i for i, flag in enumerate(result.invalid_mask.to_pylist()) if flag}
    assert invalid == {row for row in range(5000) if row % 613 == 0}
    assert all(ids[row] == row for row in range(5000) if row not in invalid)
    at = result.columns["at"].to_pylist()
    assert at[401] == datetime(2023, 11, 14, 22, 13, 20) and at[1] == datetime(2024, 1, 1)


def test_parse_types_are_learned_and_kept_across_batches():
    column = Column(name="at", type="timestamp", required=True)
    coercer = JsonColumnCoercer([column], numeric_timestamp_unit=NumericTimestampUnit.MILLIS)
    epoch_ms = [b'{"at":%d}' % (1_700_000_000_000 + i) for i in range(100)]
    for _ in range(2):
        result = coercer.coerce(pa.array(epoch_ms, pa.binary()))
        assert result.invalid_count == 0
        assert result.columns["at"][99].as_py() == datetime(2023, 11, 14, 22, 13, 20, 99000)
    # A batch in the default shape again still works.
    result = coercer.coerce(pa.array([b'{"at":"2024-01-01T00:00:00Z"}'] * 100, pa.binary()))
    assert result.invalid_count == 0 and result.columns["at"][0].as_py() == datetime(2024, 1, 1)


def test_input_array_kinds_and_no_columns():
    columns = [Column(name="a", type="int")]
    chunked = pa.chunked_array([pa.array([b'{"a":1}'], pa.large_binary()), pa.array([b'{"a":2}'], pa.large_binary())])
    assert coerce_json_values(chunked, columns).columns["a"].to_pylist() == [1, 2]
    assert coerce_json_values(pa.array(['{"a":3}'], pa.string()), columns).columns["a"].to_pylist() == [3]
    empty = coerce_json_values(pa.array([], pa.binary()), columns)
    assert empty.columns["a"].to_pylist() == [] and empty.invalid_count == 0
    nothing = coerce_json_values(pa.array([b"not json", None], pa.binary()), [])
    assert nothing.columns == {} and nothing.invalid_count == 0 and len(nothing.invalid_reason) == 2


# ------------------------------------------------------------------------------- fast path = reference rules

HYPOTHESIS_COLUMNS = [Column(name=t, type=t, required=(t in ("long", "timestamp"))) for t in TYPE_CASES]
_special_texts = st.sampled_from([text for cases in TYPE_CASES.values() for text, _ in cases])
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**31) - 2, max_value=2**31 + 2),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        ["2024-01-02T03:04:05Z", "2024-01-02 03:04:05.1234567", "2023-02-29", "1e3", "-17", "TRUE", "\ud800"]
    ),
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _raw_values(draw) -> bytes | None:
    kind = draw(st.sampled_from(["object"] * 6 + ["special", "pretty", "other", "null"]))
    if kind == "null":
        return None
    if kind == "other":
        return draw(st.sampled_from([b"[1]", b"{broken", b"7", b'{"long":1}{"long":2}', b' {"long": 3} ', b"\xff"]))
    document = draw(st.dictionaries(st.sampled_from([*TYPE_CASES, "extra"]), _json_values, max_size=10))
    if kind == "special":
        texts = ",".join(
            f'"{name}":{draw(_special_texts)}'
            for name in draw(st.lists(st.sampled_from(list(TYPE_CASES)), unique=True))
        )
        return ("{" + texts + "}").encode()
    text = json.dumps(document, ensure_ascii=draw(st.booleans()), indent=2 if kind == "pretty" else None)
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(_raw_values(), min_size=1, max_size=120))
def test_arrow_fast_path_matches_the_reference_rules(values):
    assert_fast_path_matches_reference(values)


def assert_fast_path_matches_reference(values: list[bytes | None]) -> None:
    fast = run(values, HYPOTHESIS_COLUMNS, arrow_reader=True)
    reference = run(values, HYPOTHESIS_COLUMNS, arrow_reader=False)
    for name in fast.columns:
        assert fast.columns[name].to_pylist() == reference.columns[name].to_pylist(), name
    assert fast.invalid_reason.to_pylist() == reference.invalid_reason.to_pylist()
    assert fast.invalid_column.to_pylist() == reference.invalid_column.to_pylist()
    assert (fast.nulled_counts, fast.unparsed_count) == (reference.nulled_counts, reference.unparsed_count)


# Batches where each key mostly holds one JSON shape (as real producers write them), so the Arrow reader parses
# them and the vectorized conversions run on many random values, with some odd values mixed in.
_TIMESTAMP_FORMATS = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dt%H:%M:%S", "%Y-%m-%d"]
_moments = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))


@st.composite
def _timestamp_texts(draw) -> str:
    moment = draw(_moments)
    text = moment.strftime(draw(st.sampled_from(_TIMESTAMP_FORMATS))).rjust(4, "0")
    if "T" in text.upper() and len(text) > 10:
        text += draw(st.sampled_from(["", ".5", ".123456", ".123456789", ".0001"]))
        text += draw(st.sampled_from(["", "Z", "z", "+00:00", "-08:00", "+0530", "+23:59", "-23:59"]))
    return text


_finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# Per column type, the JSON shapes a producer might use for it; a batch picks one shape per key.
_SHAPES = {
    "boolean": [st.booleans(), st.sampled_from(["true", "FALSE", "True"])],
    "int": [st.integers(-(2**31) - 5, 2**31 + 5), st.integers(-(2**31) - 5, 2**31 + 5).map(str)],
    "long": [st.integers(-(2**63) - 5, 2**63 + 5), st.integers(-(2**63) - 5, 2**63 + 5).map(str)],
    "float": [_finite_floats, _finite_floats.map(repr)],
    "double": [_finite_floats, st.integers(-(2**64), 2**64)],
    "string": [st.text(max_size=8), st.integers(-(2**70), 2**70), st.booleans()],
    "binary": [st.text(max_size=8)],
    "timestamp": [_timestamp_texts(), st.integers(-62_135_596_800_001, 253_402_300_800_000)],
    "date": [_timestamp_texts(), st.integers(-719_163, 2_932_897)],
}


@st.composite
def _shaped_batches(draw) -> list[bytes | None]:
    shapes = {name: draw(st.sampled_from(options)) for name, options in _SHAPES.items()}
    values = []
    for _ in range(draw(st.integers(min_value=20, max_value=200))):
        if draw(st.integers(0, 30)) == 0:
            values.append(draw(_raw_values()))
        else:
            values.append(
                json.dumps({name: draw(shape) for name, shape in shapes.items() if draw(st.integers(0, 10))}).encode()
            )
    return values


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=_shaped_batches())
def test_vectorized_conversions_match_the_reference_rules(values):
    assert_fast_path_matches_reference(values)
