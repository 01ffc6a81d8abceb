"""Schema evolution by column name: bring an existing table's schema to a mapping's columns.

Rules (docs/architecture.md "Schema and coercion"), compared by name, never by position:
- base columns (ids 1-8 in tables we create) must be present with their types; anything else is an error;
- mapped columns are optional in the table, `required` or not: a tombstone (null value) lands with nulls in them
  (`required` only makes a record whose JSON object lacks the value invalid). A mapped column missing from the
  table is added, as optional;
- a column whose type differs is widened int→long or float→double only with `allow_type_widening`; any
  other difference, including long→int, is an error naming the column;
- a required mapped column of the table (tables created before tombstones landed) is made optional;
- table columns the mapping does not declare are kept (never dropped); if such a column is required we could
  not write rows, so that is an error;
- all problems are reported together in one `SchemaEvolutionError` naming the table and columns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, FloatType, IcebergType, IntegerType, LongType

from kafscale_lakehouse.schema.columns import BASE_COLUMNS, ICEBERG_TYPES, Column, check_column_names
from kafscale_lakehouse.schema.errors import SchemaEvolutionError

log = logging.getLogger(__name__)

_WIDENINGS = {(IntegerType(), LongType()), (FloatType(), DoubleType())}


@dataclass(frozen=True)
class ColumnChange:
    """One change to a table column: add it (optional), widen its type, or make it optional."""

    action: Literal["add", "widen", "make_optional"]
    name: str
    field_type: IcebergType

    def __str__(self) -> str:
        verb = {"add": "add optional column", "widen": "widen column", "make_optional": "make optional column"}[
            self.action
        ]
        return f"{verb} {self.name!r} ({self.field_type})"


@dataclass(frozen=True)
class SchemaEvolutionPlan:
    """The changes that bring a table schema (id `schema_id`) to the mapping's columns; empty when none are needed."""

    table: str
    schema_id: int
    changes: tuple[ColumnChange, ...]

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __str__(self) -> str:
        return f"table {self.table}: " + (
            "; ".join(map(str, self.changes)) if self.changes else "schema already matches"
        )


def plan_schema_evolution(
    current: Schema,
    columns: Sequence[Column],
    *,
    allow_type_widening: bool,
    table: str,
) -> SchemaEvolutionPlan:
    """Compare `current` with base + mapped `columns`; raise `SchemaEvolutionError` listing every problem."""
    check_column_names([*BASE_COLUMNS, *columns])
    fields_by_name = {field.name: field for field in current.fields}
    problems: list[str] = []
    changes: list[ColumnChange] = []

    for column in BASE_COLUMNS:
        field = fields_by_name.get(column.name)
        if field is None:
            problems.append(
                f"base column {column.name!r} is missing (a KafScale table has "
                f"{', '.join(c.name for c in BASE_COLUMNS)})"
            )
        elif field.field_type != ICEBERG_TYPES[column.type]:
            problems.append(
                f"base column {column.name!r} is {field.field_type} in the table, expected {ICEBERG_TYPES[column.type]}"
            )

    for column in columns:
        desired = ICEBERG_TYPES[column.type]
        field = fields_by_name.get(column.name)
        if field is None:
            changes.append(ColumnChange("add", column.name, desired))
            continue
        if field.field_type != desired:
            if (field.field_type, desired) in _WIDENINGS and allow_type_widening:
                changes.append(ColumnChange("widen", column.name, desired))
            elif (field.field_type, desired) in _WIDENINGS:
                problems.append(
                    f"column {column.name!r} is {field.field_type} in the table and {desired} in the "
                    "mapping: set allow_type_widening to widen it"
                )
            else:
                problems.append(
                    f"column {column.name!r} is {field.field_type} in the table and cannot become "
                    f"{desired} (only int→long and float→double widen)"
                )
        if field.required:
            changes.append(ColumnChange("make_optional", column.name, desired))

    declared = {column.name for column in (*BASE_COLUMNS, *columns)}
    problems.extend(
        f"column {field.name!r} is required in the table but the mapping does not produce it"
        for field in current.fields
        if field.name not in declared and field.required
    )

    if problems:
        raise SchemaEvolutionError(table, problems)
    return SchemaEvolutionPlan(table=table, schema_id=current.schema_id, changes=tuple(changes))


def apply_schema_evolution(table: Table, plan: SchemaEvolutionPlan) -> Schema:
    """Commit `plan` with one pyiceberg schema update; returns the table's new schema.

    Raises `CommitFailedException` when the table's schema changed since the plan (plan again and retry)."""
    if not plan:
        return table.schema()
    if table.schema().schema_id != plan.schema_id:
        raise CommitFailedException(
            f"table {plan.table}: schema {table.schema().schema_id} is current, the plan was made for {plan.schema_id}"
        )
    with table.update_schema() as update:
        for change in plan.changes:
            path = (change.name,)  # a tuple: column names may contain "."
            if change.action == "add":
                update.add_column(path, change.field_type, required=False)
            elif change.action == "widen":
                update.update_column(path, field_type=change.field_type)
            else:
                update.make_column_optional(path)
    log.info("evolved schema: %s", plan)
    return table.schema()


def evolve_table_schema(
    table: Table,
    columns: Sequence[Column],
    *,
    allow_type_widening: bool,
    max_attempts: int = 3,
) -> SchemaEvolutionPlan:
    """Plan and apply the evolution of `table` to `columns`; when another writer changes the table meanwhile,
    refresh and plan again (at most `max_attempts` commits). Returns the plan that was applied."""
    name = ".".join(table.name())
    attempt = 1
    while True:
        plan = plan_schema_evolution(table.schema(), columns, allow_type_widening=allow_type_widening, table=name)
        try:
            apply_schema_evolution(table, plan)
            return plan
        except CommitFailedException as exc:
            if attempt >= max_attempts:
                raise
            attempt += 1
            log.warning(
                "table %s: schema update conflicted with another writer (%s); refreshing, attempt %d of %d",
                name,
                exc,
                attempt,
                max_attempts,
            )
            table.refresh()
