"""JSON Schema validation of record values: per-row validity, reasons with paths, summaries, dialects."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.schema.validation import (
    InvalidSchemaDocumentError,
    SchemaViolationError,
    compile_json_schema,
    validate_parsed,
    validate_values,
)
from kafscale_lakehouse_tests.schema_registry.pizza_schema import PIZZA_JSON_SCHEMA

TOPIC = "completed-pizzas"
PIZZA_SCHEMA = compile_json_schema(PIZZA_JSON_SCHEMA, "registry/completed-pizzas.json")
GOOD_ORDER = {"order_id": "0b7a", "store_id": 7, "sauce": "bbq", "date_ordered": "2024-01-01 00:00:01"}


def record_ids(count: int) -> list[str]:
    return [f"{TOPIC}:0:{offset}" for offset in range(count)]


def encoded(*orders) -> pa.BinaryArray:
    return pa.array([None if order is None else json.dumps(order).encode() for order in orders], type=pa.binary())


def test_workload_pizzas_are_valid():
    values = pa.array([record.value for record in pizza_orders(0, 500)], type=pa.binary())

    result = validate_values(values, record_ids(500), PIZZA_SCHEMA)

    assert result.invalid_records == ()
    assert result.valid.to_pylist() == [True] * 500
    assert (result.record_count, result.valid_count, result.invalid_count) == (500, 500, 0)


@pytest.mark.parametrize(
    ("order", "instance_path", "schema_path", "reason"),
    [
        ({**GOOD_ORDER, "store_id": "7"}, "$.store_id", "#/properties/store_id/type", "'7' is not of type 'integer'"),
        (
            {**GOOD_ORDER, "store_id": 2**70},
            "$.store_id",
            "#/properties/store_id/maximum",
            "is greater than the maximum of 100",
        ),
        ({**GOOD_ORDER, "sauce": "ketchup"}, "$.sauce", "#/properties/sauce/enum", "'ketchup' is not one of"),
        (
            {k: v for k, v in GOOD_ORDER.items() if k != "store_id"},
            "$",
            "#/required",
            "'store_id' is a required property",
        ),
        ({**GOOD_ORDER, "pineapple": True}, "$", "#/additionalProperties", "'pineapple' was unexpected"),
        (
            {**GOOD_ORDER, "toppings": ["ham", 3]},
            "$.toppings[1]",
            "#/properties/toppings/items/type",
            "3 is not of type 'string'",
        ),
        (
            {**GOOD_ORDER, "date_ordered": "2024-01-01T00:00:01Z"},
            "$.date_ordered",
            "#/properties/date_ordered/pattern",
            "does not match",
        ),
        (["not", "an", "object"], "$", "#/type", "is not of type 'object'"),
    ],
)
def test_invalid_orders_name_record_value_path_and_schema_path(order, instance_path, schema_path, reason):
    values = encoded(GOOD_ORDER, order, GOOD_ORDER)

    result = validate_values(values, record_ids(3), PIZZA_SCHEMA)

    assert result.valid.to_pylist() == [True, False, True]
    [invalid] = result.invalid_records
    assert (invalid.row, invalid.record_id, invalid.instance_path, invalid.schema_path) == (
        1,
        f"{TOPIC}:0:1",
        instance_path,
        schema_path,
    )
    assert reason in invalid.reason


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "value is not valid JSON"),
        (b'{"store_id": 7', "value is not valid JSON"),
        (b'{"store_id": NaN}', "NaN is not a JSON value"),
        (b'{"order_id": "caf\xe9"}', "value is not valid UTF-8 (byte 17)"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_values_that_are_not_json_are_invalid_records(raw, reason):
    result = validate_values(pa.array([raw], type=pa.binary()), ["t:3:9"], PIZZA_SCHEMA)
    [invalid] = result.invalid_records
    assert invalid.record_id == "t:3:9" and invalid.instance_path == "$" and invalid.schema_path is None
    assert reason in invalid.reason


def test_chunked_values_and_arrow_record_ids():
    orders = [GOOD_ORDER, {**GOOD_ORDER, "sauce": 1}, None, GOOD_ORDER]
    chunked = pa.chunked_array([encoded(*orders[:2]), encoded(*orders[2:])])
    ids = pa.chunked_array([pa.array(record_ids(4)[:3]), pa.array(record_ids(4)[3:])])

    result = validate_values(chunked, ids, PIZZA_SCHEMA)

    assert result.valid.to_pylist() == [True, False, True, True]  # row 2: a tombstone
    assert [record.record_id for record in result.invalid_records] == [f"{TOPIC}:0:1"]
    assert result.reasons().to_pylist() == [
        None,
        "$.sauce: 1 is not one of ['regular', 'light', 'extra', 'none', 'bbq', 'alfredo']",
        None,
        None,
    ]


def test_tombstones_are_valid_and_never_judged_by_the_schema():
    # A null value is a tombstone: the schema is not applied to it, even one requiring an object.
    result = validate_values(pa.array([None, b"null"], type=pa.binary()), record_ids(2), PIZZA_SCHEMA)
    assert result.valid.to_pylist() == [True, False] and result.invalid_count == 1


def test_string_values_are_accepted_like_binary():
    values = pa.array([json.dumps(GOOD_ORDER), "{}"], type=pa.string())
    assert validate_values(values, record_ids(2), PIZZA_SCHEMA).valid.to_pylist() == [True, False]


def test_parsed_entry_point_matches_raw_values():
    orders = [GOOD_ORDER, {**GOOD_ORDER, "store_id": 0}, {"order_id": 1}, [], None]
    from_raw = validate_values(
        pa.array([json.dumps(order).encode() for order in orders], type=pa.binary()), record_ids(5), PIZZA_SCHEMA
    )
    from_parsed = validate_parsed(orders, record_ids(5), PIZZA_SCHEMA)
    assert from_parsed == from_raw
    # JSON null is judged by the schema (not an object here), unlike a null record value.
    assert from_parsed.invalid_records[-1].schema_path == "#/type"


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 values but 1 record_ids"):
        validate_values(encoded(GOOD_ORDER, GOOD_ORDER), ["only-one"], PIZZA_SCHEMA)


def test_summary_metadata_samples_and_merge():
    orders = [{**GOOD_ORDER, "store_id": -offset} if offset % 3 == 0 else GOOD_ORDER for offset in range(30)]
    result = validate_values(encoded(*orders), record_ids(30), PIZZA_SCHEMA)

    summary = result.summary(sample_limit=4)
    metadata = summary.metadata()
    assert (metadata["records"], metadata["valid"], metadata["invalid"]) == (30, 20, 10)
    assert metadata["schema"] == "registry/completed-pizzas.json"
    assert [sample["record_id"] for sample in metadata["invalid_samples"]] == [
        f"{TOPIC}:0:{offset}" for offset in (0, 3, 6, 9)
    ]
    assert metadata["invalid_samples"][1] == {
        "record_id": f"{TOPIC}:0:3",
        "reason": "-3 is less than the minimum of 1",
        "instance_path": "$.store_id",
        "schema_path": "#/properties/store_id/minimum",
    }
    json.dumps(metadata)  # asset check metadata must be plain JSON

    merged = summary.merge(result.summary(sample_limit=4), sample_limit=6)
    assert (merged.record_count, merged.invalid_count, len(merged.samples)) == (60, 20, 6)


def test_strict_failure_names_record_id_and_paths():
    result = validate_values(encoded(GOOD_ORDER, {**GOOD_ORDER, "store_id": "seven"}), record_ids(2), PIZZA_SCHEMA)
    with pytest.raises(SchemaViolationError) as caught:
        result.summary().raise_if_invalid()
    message = str(caught.value)
    assert "1 of 2 records violate JSON Schema registry/completed-pizzas.json" in message
    assert f"record {TOPIC}:0:1 at $.store_id (schema #/properties/store_id/type)" in message
    assert pickle.loads(pickle.dumps(caught.value)).summary == caught.value.summary

    validate_values(encoded(GOOD_ORDER), record_ids(1), PIZZA_SCHEMA).summary().raise_if_invalid()


def test_dialect_follows_dollar_schema():
    tuple_items = {"type": "array", "items": [{"type": "integer"}, {"type": "string"}]}
    draft7 = compile_json_schema({"$schema": "http://json-schema.org/draft-07/schema#", **tuple_items}, "draft7")
    assert isinstance(draft7.validator, Draft7Validator)
    assert validate_parsed([[1, "a"], ["a", 1]], ["r0", "r1"], draft7).valid.to_pylist() == [True, False]

    # Without $schema it is Draft 2020-12, where `items` must be one schema.
    with pytest.raises(InvalidSchemaDocumentError, match=r"at \$\.items"):
        compile_json_schema(tuple_items, "inline")
    assert isinstance(compile_json_schema({"type": "object"}, "inline").validator, Draft202012Validator)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"$schema": "https://example.com/dialect"}, "is not a JSON Schema dialect"),
        ({"$schema": 7}, "is not a JSON Schema dialect"),
        ("object", "not a string"),
        ({"type": "objekt"}, "at $.type"),
    ],
)
def test_invalid_documents(document, problem):
    with pytest.raises(InvalidSchemaDocumentError, match="JSON Schema inline") as caught:
        compile_json_schema(document, "inline")
    assert problem in str(caught.value)


def test_local_refs_resolve_and_remote_refs_fail_the_schema_not_the_record():
    local = compile_json_schema(
        {"$defs": {"id": {"type": "integer"}}, "properties": {"store_id": {"$ref": "#/$defs/id"}}}, "inline"
    )
    result = validate_parsed([{"store_id": 1}, {"store_id": "x"}], ["r0", "r1"], local)
    assert result.valid.to_pylist() == [True, False]
    # jsonschema follows $ref transparently: the path is the keyword as reached from the root.
    assert result.invalid_records[0].schema_path == "#/properties/store_id/type"

    remote = compile_json_schema({"properties": {"a": {"$ref": "https://example.com/a.json"}}}, "inline")
    with pytest.raises(InvalidSchemaDocumentError, match=r"https://example\.com/a\.json"):
        validate_parsed([{"a": 1}], ["r0"], remote)


def test_format_is_an_annotation():
    schema = compile_json_schema(
        {"properties": {"at": {"type": "string", "format": "date-time"}, "id": {"format": "uuid"}}}, "inline"
    )
    assert validate_parsed([{"at": "not a time", "id": "not a uuid"}], ["r0"], schema).valid.to_pylist() == [True]


def test_long_reasons_are_shortened():
    schema = compile_json_schema({"type": "object"}, "inline")
    [invalid] = validate_parsed(["x" * 10_000], ["r0"], schema).invalid_records
    assert len(invalid.reason) == 300 and invalid.reason.endswith("...")


def test_compiled_schema_pickles_for_spark_workers():
    copy = pickle.loads(pickle.dumps(PIZZA_SCHEMA))
    assert copy.document == PIZZA_JSON_SCHEMA and copy.source == PIZZA_SCHEMA.source
    assert validate_values(encoded(GOOD_ORDER, {}), record_ids(2), copy).valid.to_pylist() == [True, False]


_json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5)
)
_orders = st.dictionaries(
    st.sampled_from(["order_id", "store_id", "sauce", "date_ordered", "toppings", "extra"]),
    _json_scalars | st.lists(_json_scalars, max_size=3),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_orders, max_size=20))
def test_validity_and_invalid_rows_agree_with_jsonschema(orders):
    result = validate_values(encoded(*orders), record_ids(len(orders)), PIZZA_SCHEMA)
    expected = [PIZZA_SCHEMA.validator.is_valid(order) for order in orders]
    assert result.valid.to_pylist() == expected
    assert [record.row for record in result.invalid_records] == [row for row, ok in enumerate(expected) if not ok]
