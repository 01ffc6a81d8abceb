"""Row filters of the lakehouse's table partitions, shared by writes (the rows a partition-scoped overwrite replaces)
and reads (the rows a partitioned downstream asset loads). Pure logic over pyiceberg expressions, no Dagster.

A time window `[start, end)` maps to `start <= column < end` in the column's own type (a `date` column compares
with dates, `timestamptz` with UTC instants); static keys map to `column = key` / `column IN (keys)`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import reduce

from pyiceberg.expressions import (
    AlwaysFalse,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThan,
    Or,
)
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.catalogs import PartitionFieldSpec

_SPEC_FIELD = re.compile(r"^\s*(?:(?P<transform>[a-z]+(?:\[[1-9][0-9]*\])?)\s*\(\s*(?P<column>[^()\s]+)\s*\)"
                         r"|(?P<bare>[^()\s]+))\s*$")


class PartitionFilterError(EngineError, ValueError):
    """A partition cannot be expressed as a row filter on the named column."""


def parse_partition_spec(text: str | Sequence[str]) -> list[PartitionFieldSpec]:
    """`"day(order_date)"`, `"store_id"` (identity), `"bucket[16](order_id)"`, or a list of them."""
    entries = [text] if isinstance(text, str) else list(text)
    fields = []
    for entry in entries:
        match = _SPEC_FIELD.match(entry) if isinstance(entry, str) else None
        if match is None:
            raise PartitionFilterError(f"partition spec field {entry!r} is not `column` or `transform(column)` "
                                       "(e.g. day(order_date), bucket[16](order_id))")
        if match.group("bare"):
            fields.append(PartitionFieldSpec(match.group("bare"), "identity"))
        else:
            fields.append(PartitionFieldSpec(match.group("column"), match.group("transform")))
    return fields


def column_type(schema: Schema, column: str, what: str) -> IcebergType:
    try:
        return schema.find_field(column).field_type
    except ValueError:
        raise PartitionFilterError(f"{what}: column {column!r} is not in the table "
                                   f"({', '.join(schema.column_names)})") from None


def time_window_filter(schema: Schema, column: str, start: datetime, end: datetime, *,
                       what: str = "partition_expr") -> BooleanExpression:
    """`start <= column < end` for a date or timestamp column (`start`/`end` are aware datetimes)."""
    field_type = column_type(schema, column, what)
    start_utc, end_utc = start.astimezone(UTC), end.astimezone(UTC)
    if isinstance(field_type, DateType):
        low, high = start_utc.date().isoformat(), end_utc.date().isoformat()
        if end_utc.time() != datetime.min.time():  # an hourly window on a date column: the day it falls in
            high = end_utc.date().fromordinal(end_utc.date().toordinal() + 1).isoformat()
    elif isinstance(field_type, TimestamptzType):
        low, high = start_utc.isoformat(), end_utc.isoformat()
    elif isinstance(field_type, TimestampType):
        low, high = start_utc.replace(tzinfo=None).isoformat(), end_utc.replace(tzinfo=None).isoformat()
    else:
        raise PartitionFilterError(f"{what}: column {column!r} is {field_type}, a time window needs a date or "
                                   "timestamp column")
    return And(GreaterThanOrEqual(column, low), LessThan(column, high))


def values_filter(schema: Schema, column: str, values: Sequence[str], *,
                  what: str = "partition_expr") -> BooleanExpression:
    """`column IN (values)` for static partition keys, converted to the column's type."""
    field_type = column_type(schema, column, what)
    if not values:
        return AlwaysFalse()
    if isinstance(field_type, (IntegerType, LongType)):
        try:
            literals: list[object] = [int(v) for v in values]
        except ValueError:
            raise PartitionFilterError(f"{what}: partition keys {list(values)} are not integers for column "
                                       f"{column!r} ({field_type})") from None
    elif isinstance(field_type, (StringType, DateType, TimestampType, TimestamptzType)):
        literals = list(values)
    else:
        raise PartitionFilterError(f"{what}: column {column!r} is {field_type}; partition keys map to string, "
                                   "integer, date or timestamp columns")
    return EqualTo(column, literals[0]) if len(literals) == 1 else In(column, literals)


def all_of(clauses: Sequence[BooleanExpression]) -> BooleanExpression:
    return reduce(And, clauses)


def any_of(clauses: Sequence[BooleanExpression]) -> BooleanExpression:
    return reduce(Or, clauses) if clauses else AlwaysFalse()
