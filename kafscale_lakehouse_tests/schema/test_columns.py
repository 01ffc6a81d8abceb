"""Table columns: base ids 1-8, mapped 9+, Arrow schema, registry JSON Schema columns."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.types import BinaryType, DateType, IntegerType, LongType, StringType, TimestampType

from kafscale_lakehouse.schema import SchemaMappingError, columns_from_json_schema, record_arrow_schema, table_schema
from kafscale_lakehouse.schema.columns import Column

PIZZA_COLUMNS = [
    Column(name="order_id", type="string", required=True),
    Column(name="store_id", type="int"),
    Column(name="date_ordered", type="timestamp"),
    Column(name="day", type="date"),
]


def test_table_schema_has_base_columns_then_mapped_columns():
    schema = table_schema(PIZZA_COLUMNS)
    assert [(f.field_id, f.name, f.field_type, f.required) for f in schema.fields] == [
        (1, "record_id", StringType(), True),
        (2, "topic", StringType(), True),
        (3, "partition", IntegerType(), True),
        (4, "offset", LongType(), True),
        (5, "timestamp_ms", LongType(), True),
        (6, "key", BinaryType(), False),
        (7, "value", BinaryType(), False),
        (8, "headers", StringType(), False),
        (9, "order_id", StringType(), False),  # required, yet optional: tombstones land with nulls
        (10, "store_id", IntegerType(), False),
        (11, "date_ordered", TimestampType(), False),  # without zone, as the Go processor creates it
        (12, "day", DateType(), False),
    ]


def test_record_arrow_schema_matches_the_table_schema():
    schema = record_arrow_schema(PIZZA_COLUMNS)
    assert schema.names == [f.name for f in table_schema(PIZZA_COLUMNS).fields]
    assert schema.field("partition").type == pa.int32() and not schema.field("partition").nullable
    assert schema.field("key").type == pa.binary() and schema.field("key").nullable
    assert schema.field("order_id").type == pa.string() and not schema.field("order_id").nullable
    assert schema.field("date_ordered").type == pa.timestamp("us")
    assert schema.field("day").type == pa.date32()


@pytest.mark.parametrize("name", ["offset", "order_id"])
def test_duplicate_or_base_column_names_are_rejected(name):
    with pytest.raises(SchemaMappingError, match=repr(name)):
        table_schema([*PIZZA_COLUMNS, Column(name=name, type="long")])


def test_columns_from_a_registry_json_schema_follow_the_go_processor():
    document = {
        "type": "object",
        "required": ["id", "amount"],
        "properties": {
            "status": {"type": "string"},
            "id": {"type": "integer"},
            "amount": {"type": ["null", "number"]},
            "paid": {"type": "boolean"},
            "lines": {"type": "array", "items": {"type": "object"}},
            "offset": {"type": "integer"},  # a base column name: only in `value`
        },
    }
    assert columns_from_json_schema(document, "payments") == [
        Column(name="amount", type="double", required=True),
        Column(name="id", type="long", required=True),
        Column(name="paid", type="boolean"),
        Column(name="status", type="string"),
    ]
    with pytest.raises(SchemaMappingError, match="registry schema of topic 'payments' gives no columns"):
        columns_from_json_schema({"properties": {"lines": {"type": "array"}}}, "payments")
    with pytest.raises(SchemaMappingError, match="has no top-level 'properties'"):
        columns_from_json_schema({"type": "string"}, "payments")
