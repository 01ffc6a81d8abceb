"""Pure logic of the lakehouse write path: partition specs from metadata, partition row filters, schema changes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, In, LessThan
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from kafscale_lakehouse.engine.tables.catalogs import PartitionFieldSpec
from kafscale_lakehouse.engine.tables.filters import (
    PartitionFilterError,
    parse_partition_spec,
    time_window_filter,
    values_filter,
)
from kafscale_lakehouse.engine.tables.writes import TableWriteSchemaError, schema_changes

SCHEMA = Schema(NestedField(1, "order_id", StringType(), required=True), NestedField(2, "store_id", IntegerType()),
                NestedField(3, "order_date", DateType()), NestedField(4, "ordered_at", TimestamptzType()),
                NestedField(5, "price", FloatType()))
DAY = (datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC))


def test_partition_spec_metadata_parses_transforms_and_identity():
    assert parse_partition_spec("day(order_date)") == [PartitionFieldSpec("order_date", "day")]
    assert parse_partition_spec(["store_id", "bucket[16](order_id)"]) == [
        PartitionFieldSpec("store_id", "identity"), PartitionFieldSpec("order_id", "bucket[16]")]
    with pytest.raises(PartitionFilterError, match="day order_date"):
        parse_partition_spec("day order_date")


def test_a_time_window_filters_in_the_column_type():
    assert time_window_filter(SCHEMA, "order_date", *DAY) == And(GreaterThanOrEqual("order_date", "2026-11-02"),
                                                                   LessThan("order_date", "2026-11-03"))
    assert time_window_filter(SCHEMA, "ordered_at", *DAY) == And(
        GreaterThanOrEqual("ordered_at", "2026-11-02T00:00:00+00:00"),
        LessThan("ordered_at", "2026-11-03T00:00:00+00:00"),
    )
    with pytest.raises(PartitionFilterError, match="column 'store_id' is int"):
        time_window_filter(SCHEMA, "store_id", *DAY)
    with pytest.raises(PartitionFilterError, match="column 'day' is not in the table"):
        time_window_filter(SCHEMA, "day", *DAY)


def test_static_keys_filter_by_value():
    assert values_filter(SCHEMA, "store_id", ["7"]) == EqualTo("store_id", 7)
    assert values_filter(SCHEMA, "order_id", ["a", "b"]) == In("order_id", ["a", "b"])
    with pytest.raises(PartitionFilterError, match="not integers"):
        values_filter(SCHEMA, "store_id", ["north"])


def test_schema_changes_add_by_name_widen_and_name_an_incompatible_column():
    incoming = Schema(
        NestedField(1, "crust", StringType()),
        NestedField(2, "order_id", StringType()),
        NestedField(3, "store_id", LongType()),
        NestedField(4, "price", FloatType()),
    )
    additions, widenings = schema_changes("rpc.t", SCHEMA, incoming)
    assert additions == [("crust", StringType())]
    assert widenings == [("store_id", LongType())]

    narrower = Schema(NestedField(1, "order_id", StringType()), NestedField(2, "price", FloatType()))
    assert schema_changes("rpc.t", Schema(*SCHEMA.fields[:1], NestedField(5, "price", DoubleType())), narrower) == (
        [],
        [],
    )

    with pytest.raises(TableWriteSchemaError, match="column 'store_id' is int in the table but string in the data"):
        schema_changes(
            "rpc.t", SCHEMA, Schema(NestedField(1, "order_id", StringType()), NestedField(2, "store_id", StringType()))
        )
    with pytest.raises(TableWriteSchemaError, match=r"required columns \['order_id'\] are missing"):
        schema_changes("rpc.t", SCHEMA, Schema(NestedField(1, "store_id", IntegerType())))
