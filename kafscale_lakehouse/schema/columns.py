"""Table columns: base columns (field ids 1-8) + mapped columns (9+) as a pyiceberg Schema and as Arrow.

Types follow KafScale's Go processor (`internal/sink/iceberg.go`): boolean, int (32-bit), long, float, double,
string, binary, timestamp (Iceberg `timestamp`, without zone, values in UTC), date.

`Column` is the layer's own column type (the config's `mappings[].schema.columns[]` validate into it, the registry
derives it from a JSON Schema); a `Column` always has a known `type`. The base columns are defined once, as the
Arrow schema `format.BASE_SCHEMA`; `BASE_COLUMNS` is that schema seen as `Column`s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from kafscale_lakehouse.format.base_columns import BASE_SCHEMA
from kafscale_lakehouse.format.lfs import LFS_METADATA_FIELDS
from kafscale_lakehouse.schema.errors import SchemaMappingError

log = logging.getLogger(__name__)

# Column types (the Go processor's set; the config matches `mappings[].schema.columns[].type` case-insensitively).
ColumnType = Literal["boolean", "int", "long", "float", "double", "string", "binary", "timestamp", "date"]
COLUMN_TYPES: tuple[ColumnType, ...] = get_args(ColumnType)


@dataclass(frozen=True)
class Column:
    """A table column: mapped columns are the top-level JSON key `name` of the record value, coerced to `type`;
    a record whose value is a JSON object without a valid value for a `required` one is invalid (a tombstone, a null
    value, never is: mapped columns are optional in the table)."""

    name: str
    type: ColumnType
    required: bool = False

    def __post_init__(self) -> None:
        if self.type not in COLUMN_TYPES:
            raise ValueError(f"column {self.name!r}: type {self.type!r} is not one of {', '.join(COLUMN_TYPES)}")


ICEBERG_TYPES: dict[str, PrimitiveType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "timestamp": TimestampType(),
    "date": DateType(),
}
# The Arrow types of coerced columns and of the record batches the reader yields. pyiceberg's writer accepts
# string/binary as well as its own large_string/large_binary for the same Iceberg types.
ARROW_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us"),
    "date": pa.date32(),
}

# The columns KafScale's Go processor writes first in every table (docs/kafscale-format.md §8), in this order (field ids
# 1-8): `format.BASE_SCHEMA` as `Column`s, non-nullable fields required.
_COLUMN_TYPE_OF_ARROW: dict[pa.DataType, ColumnType] = {ARROW_TYPES[name]: name for name in COLUMN_TYPES}
BASE_COLUMNS: tuple[Column, ...] = tuple(
    Column(name=field.name, type=_COLUMN_TYPE_OF_ARROW[field.type], required=not field.nullable)
    for field in BASE_SCHEMA
)
BASE_COLUMN_NAMES = tuple(column.name for column in BASE_COLUMNS)
# The six columns `mappings[].lfs.store_metadata` adds after the mapped columns (docs/kafscale-format.md §9); the LFS
# stage fills them (null for records that are no envelope), never the JSON coercion.
LFS_METADATA_COLUMNS: tuple[Column, ...] = tuple(
    Column(name=f.name, type="long" if f.type == pa.int64() else "string") for f in LFS_METADATA_FIELDS)
FIRST_MAPPED_FIELD_ID = len(BASE_COLUMNS) + 1
# Extension `mappings[].kafka_timestamp_column`: the record timestamp as a timestamptz (the base column `timestamp_ms`
# is a long, as Go writes it, which no hour/day partition transform takes). Added after the table's other columns.
KAFKA_TIMESTAMP_COLUMN = "kafka_timestamp"
KAFKA_TIMESTAMP_ARROW_TYPE = pa.timestamp("us", tz="UTC")


def with_kafka_timestamp_column(schema: Schema) -> Schema:
    """`schema` (of a new table) with the optional `kafka_timestamp` timestamptz column last."""
    if KAFKA_TIMESTAMP_COLUMN in schema.column_names:
        return schema
    return Schema(*schema.fields, NestedField(schema.highest_field_id + 1, KAFKA_TIMESTAMP_COLUMN, TimestamptzType(),
                                              required=False))

# JSON Schema property types → column types, as the Go processor maps registry schemas.
_JSON_SCHEMA_TYPES: dict[str, ColumnType] = {
    "integer": "long", "number": "double", "boolean": "boolean", "string": "string",
}


def table_schema(columns: Sequence[Column]) -> Schema:
    """The Iceberg schema of a new table: base columns with ids 1-8, then the mapped columns from id 9 in order.
    Mapped columns are optional in the table even when `required`: a tombstone (null value) lands with nulls there."""
    all_columns = [*BASE_COLUMNS, *columns]
    check_column_names(all_columns)
    fields = [
        NestedField(
            field_id=field_id, name=column.name, field_type=ICEBERG_TYPES[column.type],
            required=column.required and field_id <= len(BASE_COLUMNS),
        )
        for field_id, column in enumerate(all_columns, start=1)
    ]
    return Schema(*fields)


def record_arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    """The Arrow schema of decoded records: base columns then mapped columns; required columns are not nullable."""
    all_columns = [*BASE_COLUMNS, *columns]
    check_column_names(all_columns)
    return pa.schema(
        [pa.field(column.name, ARROW_TYPES[column.type], nullable=not column.required) for column in all_columns]
    )


def check_column_names(columns: Sequence[Column]) -> None:
    """Raise `SchemaMappingError` when a name repeats (a mapped column reusing a base column name included)."""
    seen: set[str] = set()
    for column in columns:
        if column.name in seen:
            which = "a base column" if column.name in BASE_COLUMN_NAMES else "declared twice"
            raise SchemaMappingError(
                f"column {column.name!r} is {which}; mapped column names must be unique and not "
                f"{', '.join(BASE_COLUMN_NAMES)}"
            )
        seen.add(column.name)


def columns_from_json_schema(document: Mapping[str, Any], topic: str) -> list[Column]:
    """Mapped columns from a registry JSON Schema, as the Go processor derives them: each top-level property whose
    type (or first non-null type of a list) is integer → long, number → double, boolean, string; `required` from the
    schema's `required`; sorted by name. Properties of other types (object, array) stay only in `value`."""
    properties = document.get("properties")
    if not isinstance(properties, Mapping):
        raise SchemaMappingError(f"registry schema of topic {topic!r} has no top-level 'properties' object")
    required = {name for name in document.get("required", []) if isinstance(name, str)}
    columns = []
    skipped = []
    for name, definition in properties.items():
        column_type = _JSON_SCHEMA_TYPES.get(_json_schema_type(definition) or "")
        if column_type is None or name in BASE_COLUMN_NAMES:
            skipped.append(name)
            continue
        columns.append(Column(name=name, type=column_type, required=name in required))
    if skipped:
        log.info(
            "registry schema of topic %s: properties %s get no column (not a scalar JSON type, or a base column name)",
            topic,
            ", ".join(sorted(skipped)),
        )
    if not columns:
        raise SchemaMappingError(
            f"registry schema of topic {topic!r} gives no columns (no top-level "
            "integer/number/boolean/string properties)"
        )
    return sorted(columns, key=lambda column: column.name)


def _json_schema_type(definition: Any) -> str | None:
    if not isinstance(definition, Mapping):
        return None
    declared = definition.get("type")
    if isinstance(declared, str):
        return declared.lower()
    if isinstance(declared, list):
        return next((entry.lower() for entry in declared if isinstance(entry, str) and entry != "null"), None)
    return None
