"""Typed errors of the schema layer; each names the table and/or column at fault."""

from __future__ import annotations


class SchemaError(ValueError):
    """Base class of schema-layer errors."""


class SchemaMappingError(SchemaError):
    """Mapped columns or a partition spec that cannot form a table schema (duplicate name, unknown partition source)."""


class SchemaEvolutionError(SchemaError):
    """The table's schema cannot be evolved to the mapping's columns; `problems` has one line per column."""

    def __init__(self, table: str, problems: list[str]) -> None:
        self.table = table
        self.problems = list(problems)
        super().__init__(f"table {table}: " + "; ".join(self.problems))

    def __reduce__(self) -> tuple[object, ...]:  # keep table/problems when pickled across Spark workers
        return (type(self), (self.table, self.problems))
