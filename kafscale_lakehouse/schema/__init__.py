"""Schema layer: table columns (Iceberg and Arrow), JSON → Arrow coercion, JSON Schema validation, evolution."""

from kafscale_lakehouse.schema.coercion import CoercionResult, JsonColumnCoercer, coerce_json_values
from kafscale_lakehouse.schema.columns import (
    ARROW_TYPES,
    BASE_COLUMN_NAMES,
    BASE_COLUMNS,
    COLUMN_TYPES,
    ICEBERG_TYPES,
    Column,
    ColumnType,
    columns_from_json_schema,
    record_arrow_schema,
    table_schema,
)
from kafscale_lakehouse.schema.errors import SchemaError, SchemaEvolutionError, SchemaMappingError
from kafscale_lakehouse.schema.evolution import (
    ColumnChange,
    SchemaEvolutionPlan,
    apply_schema_evolution,
    evolve_table_schema,
    plan_schema_evolution,
)
from kafscale_lakehouse.schema.json_values import NumericTimestampUnit

__all__ = [
    "ARROW_TYPES",
    "BASE_COLUMNS",
    "BASE_COLUMN_NAMES",
    "COLUMN_TYPES",
    "ICEBERG_TYPES",
    "CoercionResult",
    "Column",
    "ColumnChange",
    "ColumnType",
    "JsonColumnCoercer",
    "NumericTimestampUnit",
    "SchemaError",
    "SchemaEvolutionError",
    "SchemaEvolutionPlan",
    "SchemaMappingError",
    "apply_schema_evolution",
    "coerce_json_values",
    "columns_from_json_schema",
    "evolve_table_schema",
    "plan_schema_evolution",
    "record_arrow_schema",
    "table_schema",
]
