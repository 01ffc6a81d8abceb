"""Schema evolution by name against a real pyiceberg SqlCatalog (sqlite) in tmp_path."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType, NestedField, StringType

from kafscale_lakehouse.schema import (
    SchemaEvolutionError,
    apply_schema_evolution,
    evolve_table_schema,
    plan_schema_evolution,
    table_schema,
)
from kafscale_lakehouse.schema.columns import Column

ORDERS = [
    Column(name="order_id", type="long", required=True),
    Column(name="amount", type="float"),
    Column(name="qty", type="int"),
]


@pytest.fixture
def catalog(tmp_path):
    catalog = SqlCatalog(
        "test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri()
    )
    catalog.create_namespace("prod")
    return catalog


def create(catalog, columns=ORDERS, schema: Schema | None = None):
    return catalog.create_table("prod.orders", schema=schema or table_schema(columns))


def append_rows(table, rows: list[dict]) -> None:
    arrow_schema = table.schema().as_arrow()
    table.append(pa.Table.from_pylist(rows, schema=arrow_schema))


def base_row(offset: int) -> dict:
    return {
        "record_id": f"orders:0:{offset}",
        "topic": "orders",
        "partition": 0,
        "offset": offset,
        "timestamp_ms": 1_700_000_000_000 + offset,
    }


def test_no_change_when_the_table_matches(catalog):
    table = create(catalog)
    plan = evolve_table_schema(table, ORDERS, allow_type_widening=False)
    assert not plan and plan.changes == ()
    assert table.schema().schema_id == 0


def test_new_columns_are_added_optional_keeping_rows_and_field_ids(catalog):
    table = create(catalog)
    append_rows(table, [{**base_row(0), "order_id": 7, "amount": 1.5, "qty": 2}])
    desired = [*ORDERS, Column(name="status", type="string"), Column(name="dotted.name", type="date")]
    plan = evolve_table_schema(table, desired, allow_type_widening=False)
    assert [str(change) for change in plan.changes] == [
        "add optional column 'status' (string)",
        "add optional column 'dotted.name' (date)",
    ]
    fields = {field.name: field for field in catalog.load_table("prod.orders").schema().fields}
    assert (fields["status"].field_id, fields["status"].required) == (12, False)
    assert fields["dotted.name"].field_id == 13
    assert fields["order_id"].field_id == 9  # existing ids never move
    rows = catalog.load_table("prod.orders").scan().to_arrow().to_pylist()
    assert rows[0]["order_id"] == 7 and rows[0]["status"] is None and rows[0]["dotted.name"] is None


@pytest.mark.parametrize(
    ("column", "old_type", "new_type"), [("qty", IntegerType(), LongType()), ("amount", FloatType(), DoubleType())]
)
def test_widening_only_with_allow_type_widening(catalog, column, old_type, new_type):
    table = create(catalog)
    widened = [
        Column(
            name=c.name,
            type={"qty": "long", "amount": "double"}[c.name] if c.name == column else c.type,
            required=c.required,
        )
        for c in ORDERS
    ]
    with pytest.raises(SchemaEvolutionError) as caught:
        evolve_table_schema(table, widened, allow_type_widening=False)
    assert (
        str(caught.value)
        == f"table prod.orders: column {column!r} is {old_type} in the table and {new_type} in the mapping: "
        "set allow_type_widening to widen it"
    )
    plan = evolve_table_schema(table, widened, allow_type_widening=True)
    assert [change.action for change in plan.changes] == ["widen"]
    assert catalog.load_table("prod.orders").schema().find_field(column).field_type == new_type


@pytest.mark.parametrize(
    ("column", "new_type", "message"),
    [
        (
            "order_id",
            "int",
            "column 'order_id' is long in the table and cannot become int (only int→long and float→double widen)",
        ),
        ("amount", "string", "column 'amount' is float in the table and cannot become string"),
        ("qty", "timestamp", "column 'qty' is int in the table and cannot become timestamp"),
    ],
)
def test_other_type_changes_are_errors_naming_the_column(catalog, column, new_type, message):
    table = create(catalog)
    changed = [
        Column(name=c.name, type=new_type if c.name == column else c.type, required=c.required) for c in ORDERS
    ]
    with pytest.raises(SchemaEvolutionError, match=re.escape(message)):
        evolve_table_schema(table, changed, allow_type_widening=True)
    assert catalog.load_table("prod.orders").schema() == table_schema(ORDERS)  # nothing applied


def test_mapped_columns_are_optional_in_the_table_even_when_required(catalog):
    # Tombstones (null values) land with nulls in every mapped column: `required` judges records only.
    table = create(catalog)
    assert not table.schema().find_field("order_id").required and table.schema().find_field("offset").required
    assert not evolve_table_schema(table, ORDERS, allow_type_widening=False)
    new_required = [*ORDERS, Column(name="new", type="string", required=True)]
    plan = evolve_table_schema(table, new_required, allow_type_widening=False)
    assert [str(c) for c in plan.changes] == ["add optional column 'new' (string)"]


def test_a_required_mapped_column_of_an_older_table_is_made_optional(catalog):
    required = NestedField(9, "order_id", LongType(), required=True)
    table = create(catalog, schema=Schema(*table_schema([]).fields, required))
    for declared in (ORDERS[:1], [Column(name="order_id", type="long")]):
        plan = plan_schema_evolution(table.schema(), declared, allow_type_widening=False, table="prod.orders")
        assert [(c.action, c.name) for c in plan.changes] == [("make_optional", "order_id")]
    evolve_table_schema(table, ORDERS[:1], allow_type_widening=False)
    assert not catalog.load_table("prod.orders").schema().find_field("order_id").required


def test_columns_are_matched_by_name_and_never_dropped(catalog):
    # Same columns in another order plus a column the mapping does not know: no change, nothing dropped.
    base = table_schema([]).fields
    schema = Schema(
        *base,
        NestedField(9, "qty", IntegerType(), required=False),
        NestedField(10, "legacy", StringType(), required=False),
        NestedField(11, "amount", FloatType(), required=False),
        NestedField(12, "order_id", LongType(), required=False),
    )
    table = create(catalog, schema=schema)
    assert not evolve_table_schema(table, ORDERS, allow_type_widening=False)
    assert [f.name for f in catalog.load_table("prod.orders").schema().fields][8:] == [
        "qty",
        "legacy",
        "amount",
        "order_id",
    ]


def test_base_columns_and_required_extra_columns_are_checked_all_at_once(catalog):
    base = [f for f in table_schema([]).fields if f.name != "headers"]
    broken = Schema(
        *[
            NestedField(f.field_id, f.name, StringType() if f.name == "offset" else f.field_type, required=f.required)
            for f in base
        ],
        NestedField(9, "legacy", StringType(), required=True),
        NestedField(10, "qty", IntegerType(), required=False),
    )
    with pytest.raises(SchemaEvolutionError) as caught:
        plan_schema_evolution(
            broken, [Column(name="qty", type="long")], allow_type_widening=False, table="prod.orders"
        )
    assert caught.value.table == "prod.orders"
    assert caught.value.problems == [
        "base column 'offset' is string in the table, expected long",
        "base column 'headers' is missing (a KafScale table has record_id, topic, partition, offset, timestamp_ms, "
        "key, value, headers)",
        "column 'qty' is int in the table and long in the mapping: set allow_type_widening to widen it",
        "column 'legacy' is required in the table but the mapping does not produce it",
    ]


def test_concurrent_schema_change_is_replanned(catalog):
    stale = create(catalog)
    other_writer = catalog.load_table("prod.orders")
    evolve_table_schema(
        other_writer, [*ORDERS, Column(name="by_other", type="string")], allow_type_widening=False
    )

    desired = [*ORDERS, Column(name="mine", type="string")]
    plan = plan_schema_evolution(stale.schema(), desired, allow_type_widening=False, table="prod.orders")
    with pytest.raises(CommitFailedException):
        apply_schema_evolution(stale, plan)  # the catalog rejects a change based on an old schema

    evolve_table_schema(stale, desired, allow_type_widening=False)  # refreshes and plans again
    names = [f.name for f in catalog.load_table("prod.orders").schema().fields]
    assert names[-2:] == ["by_other", "mine"]  # the other writer's column is kept
