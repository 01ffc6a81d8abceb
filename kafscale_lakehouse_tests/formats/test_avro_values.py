"""Avro value schemas → Iceberg columns, and Confluent-framed values → Arrow columns (value_formats/avro.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.value_formats.avro import AvroValueDecoder, avro_value_fields, parse_avro_schema
from kafscale_lakehouse.value_formats.framed import FramedValueSchemas
from kafscale_lakehouse_tests.formats.avro_orders import ORDER_V1, ORDER_V2, framed, order


def _value_schema(avro: dict) -> pa.Schema:
    return schema_to_pyarrow(Schema(*avro_value_fields(parse_avro_schema(json.dumps(avro), what="t"), what="t")))


def test_nested_avro_types_become_iceberg_types() -> None:
    fields = {f.name: f for f in avro_value_fields(parse_avro_schema(json.dumps(ORDER_V2), what="v2"), what="v2")}
    assert {name: str(f.field_type) for name, f in fields.items()} == {
        "order_id": "uuid",
        "placed_at": "timestamptz",
        "delivery_date": "date",
        "status": "string",
        "attributes": "map<string, string>",
        "signature": "binary",
        "store_id": "long",
        "lines": "list<struct<12: sku: optional string, 13: quantity: optional int, 14: unit_price: optional "
                 "decimal(9, 2), 15: discount: optional double>>",
        "coupon": "string",
    }
    assert not any(f.required for f in fields.values())  # tombstones and later fields need optional columns
    assert fields["lines"].field_type.element_required  # the items are not nullable in Avro


def test_unions_of_two_types_have_no_iceberg_type() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "either", "type": ["null", "int", "string"]}]}
    with pytest.raises(SchemaMappingError, match="field either is the union"):
        avro_value_fields(parse_avro_schema(json.dumps(schema), what="x"), what="x")


def test_a_record_without_fields_has_no_iceberg_type_and_the_error_names_the_field() -> None:
    # Before: pyiceberg's ListType raised KeyError('element_type') on the empty struct.
    empty = {"type": "record", "name": "Nothing", "fields": []}
    schema = {"type": "record", "name": "R", "fields": [{"name": "marks", "type": {"type": "array", "items": empty}}]}
    with pytest.raises(SchemaMappingError, match=r"field marks\.element is the record Nothing without fields"):
        avro_value_fields(parse_avro_schema(json.dumps(schema), what="x"), what="x")


def test_decoding_tombstones_bad_values_and_unknown_ids() -> None:
    value_schema = _value_schema(ORDER_V2)  # the table was evolved to v2; v1 values fill its columns
    decoder = AvroValueDecoder(FramedValueSchemas("orders-value", {1: json.dumps(ORDER_V1), 2: json.dumps(ORDER_V2)},
                                                value_schema, refused={3: "schema id 3 cannot evolve"}))
    good_v1, good_v2 = framed(1, ORDER_V1, order(1)), framed(2, ORDER_V2, order(2, version=2))
    values = pa.array([good_v1, None, b"{\"json\": 1}", good_v1[:-2], good_v2, framed(7, ORDER_V1, order(3)),
                       good_v1], pa.binary())
    decoded = decoder.decode(values)
    assert decoded.stop is not None and decoded.stop.row == 5 and decoded.stop.schema_id == 7
    assert "schema id 7 is not a version of subject orders-value" in decoded.stop.reason
    rows = pa.Table.from_arrays(decoded.columns, schema=value_schema).to_pylist()
    assert len(rows) == 5
    assert rows[0]["store_id"] == 1 and rows[0]["coupon"] is None and rows[0]["lines"][0]["discount"] is None
    assert str(rows[0]["order_id"]) == order(1)["order_id"]
    assert rows[0]["placed_at"] == order(1)["placed_at"]
    assert rows[0]["attributes"] == [("channel", "web")]
    assert rows[4]["coupon"] is None and rows[4]["lines"][0]["sku"] == "sku-2" and rows[4]["store_id"] == 2
    assert all(v is None for v in rows[1].values())  # the tombstone: a row of nulls, valid
    reasons = decoded.invalid_reasons.to_pylist()
    assert reasons[0] is None and reasons[1] is None and reasons[4] is None
    assert "not in the Confluent wire format (magic byte 123" in reasons[2]
    assert reasons[3].startswith("value does not decode as Avro schema id 1")

    refused = decoder.decode(pa.array([good_v1, framed(3, ORDER_V1, order(4))], pa.binary()))
    assert refused.stop is not None and (refused.stop.row, refused.stop.reason) == (1, "schema id 3 cannot evolve")
    assert len(refused.columns[0]) == 1


def test_latest_reads_values_without_the_prefix() -> None:
    value_schema = _value_schema(ORDER_V1)
    decoder = AvroValueDecoder(FramedValueSchemas("orders-value", {4: json.dumps(ORDER_V1)}, value_schema,
                                                latest_id=4))
    bare = framed(4, ORDER_V1, order(5))[5:]
    decoded = decoder.decode(pa.array([bare], pa.binary()))
    assert decoded.stop is None and decoded.invalid_reasons.to_pylist() == [None]
    assert pa.Table.from_arrays(decoded.columns, schema=value_schema).to_pylist()[0]["store_id"] == 5
