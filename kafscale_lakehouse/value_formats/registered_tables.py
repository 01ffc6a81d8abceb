"""A table landed from values in the Confluent wire format (Avro, Protobuf, JSON Schema): created from the value
subject's first schema, evolved by name through its versions.

Every version of the value subject known when the run starts is applied in version order with pyiceberg's
`union_by_name`, which adds new fields (nested ones too) and widens types (int → long, float → double), keeping the
field ids of the columns the table has. A version that cannot evolve the table (a type changed, a struct turned into
a primitive, ...) is *refused*: the run still lands the records of the other versions, and a partition stops at the
first record of a refused id, naming the field (pyiceberg's message), that id and the id the table was evolved to
before it. A version of another schema type than the mapping's `value_format` is refused too. A field named like a
base column is `SchemaMappingError`: the producer's schema and the table cannot agree whatever the run does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException, ValidationError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import NestedField

from kafscale_lakehouse.schema.columns import (
    BASE_COLUMN_NAMES,
    FIRST_MAPPED_FIELD_ID,
    ICEBERG_TYPES,
    Column,
    table_schema,
)
from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.value_formats.confluent_registry import RegisteredSchema
from kafscale_lakehouse.value_formats.framed import REGISTRY_SCHEMA_TYPES, FramedValueFormat, FramedValueSchemas
from kafscale_lakehouse.value_formats.keys import KeyDecoding, key_column_name

log = logging.getLogger(__name__)

MAX_EVOLUTION_ATTEMPTS = 5


@dataclass(frozen=True)
class RegisteredValueSchemas:
    """The versions of a mapping's value subject as the registry listed them when the run started (oldest first; a
    Protobuf schema as its base64 FileDescriptorProto); `latest`: the values carry no wire-format prefix and are all
    of the newest version; `message_name`: Protobuf only, the message the columns come from (default: the first)."""

    subject: str
    versions: tuple[RegisteredSchema, ...]
    latest: bool = False
    value_format: FramedValueFormat = "avro"
    message_name: str | None = None
    # Protobuf: schema id → the serialized schemas it imports (ConfluentRegistryClient.serialized_imports)
    imports: Mapping[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def first_table_schema(self) -> Schema:
        """The schema a new table is created with: base columns, then the oldest version's value fields."""
        if not self.versions:
            raise SchemaMappingError(f"subject {self.subject} has no schema versions: no table can be created")
        base = table_schema(())
        fields = _value_fields(self.versions[0], self, FIRST_MAPPED_FIELD_ID)
        return Schema(*base.fields, *fields)


def evolve_table_to_registered_versions(table: Table, table_name: str, registered: RegisteredValueSchemas, *,
                                        prefix: str = "") -> FramedValueSchemas:
    """Evolve `table` through the subject's versions (oldest first) and return what the executors decode with.
    `prefix`: the subject's fields are the table's columns of that name prefix (record keys: value_formats/keys.py); the
    decoded fields (`value_schema`) are unprefixed."""
    subject, versions = registered.subject, registered.versions
    schema_type = REGISTRY_SCHEMA_TYPES[registered.value_format]
    if not versions:
        raise SchemaMappingError(f"subject {subject} has no schema versions: nothing to decode the values of "
                                 f"table {table_name} with")
    refused: dict[int, str] = {}
    evolved_to: int | None = None
    columns: set[str] = set()  # the table's columns the accepted versions' fields are
    for version in versions:
        if version.schema_type != schema_type:
            refused[version.schema_id] = (f"schema id {version.schema_id} (subject {subject} version "
                                          f"{version.version}) is {version.schema_type}, not {schema_type}")
            continue
        fields = [NestedField(f.field_id, prefix + f.name, f.field_type, required=f.required, doc=f.doc)
                  for f in _value_fields(version, registered, 1)]
        problem = _union_by_name(table, Schema(*fields))
        if problem is not None:
            refused[version.schema_id] = (f"schema id {version.schema_id} (subject {subject} version "
                                          f"{version.version}) cannot evolve table {table_name}, last evolved to "
                                          f"schema id {evolved_to}: {problem}")
            log.error("%s", refused[version.schema_id])
            continue
        evolved_to = version.schema_id
        columns.update(f.name for f in fields)
    arrow = schema_to_pyarrow(table.schema())
    # not the base columns, kafka_timestamp (the record's), nor the other of value and key columns
    value_schema = pa.schema([f.with_name(f.name[len(prefix):]) for f in arrow if f.name in columns])
    schemas = {v.schema_id: v.text for v in versions if v.schema_type == schema_type}
    return FramedValueSchemas(subject=subject, schemas=schemas, value_schema=value_schema, refused=refused,
                              latest_id=versions[-1].schema_id if registered.latest else None,
                              value_format=registered.value_format, message_name=registered.message_name,
                              imports=registered.imports)


def evolve_table_to_key_columns(table: Table, table_name: str, columns: Sequence[Column]) -> KeyDecoding:
    """Add the JSON key's declared `columns` to `table` as `key_<name>` (optional), and return how they decode."""
    fields = [NestedField(number, key_column_name(c.name), ICEBERG_TYPES[c.type], required=False)
              for number, c in enumerate(columns, start=1)]
    problem = _union_by_name(table, Schema(*fields))
    if problem is not None:
        raise SchemaMappingError(f"table {table_name}: key_columns cannot evolve the table: {problem}")
    return KeyDecoding(json_columns=tuple(columns))


def _value_fields(version: RegisteredSchema, registered: RegisteredValueSchemas, first_id: int) -> list:
    what = f"schema id {version.schema_id} (subject {registered.subject} version {version.version})"
    # Each format's module (fastavro, protobuf, jsonschema) is imported when a table of that format is opened, not
    # by every run that imports this module (the fixed cost of a run).
    if registered.value_format == "protobuf":
        from kafscale_lakehouse.value_formats.protobuf import protobuf_value_fields

        fields = protobuf_value_fields(version.text, registered.message_name, what=what, first_id=first_id,
                                       imports=registered.imports.get(version.schema_id, ()))
    elif registered.value_format == "json_schema":
        from kafscale_lakehouse.value_formats.json_schema_values import json_schema_value_fields

        fields = json_schema_value_fields(version.text, what=what, first_id=first_id)
    else:
        from kafscale_lakehouse.value_formats.avro import avro_value_fields, parse_avro_schema

        fields = avro_value_fields(parse_avro_schema(version.text, what=what), what=what, first_id=first_id)
    clashes = [f.name for f in fields if f.name in BASE_COLUMN_NAMES]
    if clashes:
        raise SchemaMappingError(f"{what}: fields {clashes} have the names of base columns KafScale always writes "
                                 f"({', '.join(BASE_COLUMN_NAMES)})")
    return fields


def _union_by_name(table: Table, schema: Schema) -> str | None:
    """Commit the union of the table's schema and `schema` (nothing when it adds nothing); the reason when it
    cannot be applied."""
    for attempt in range(1, MAX_EVOLUTION_ATTEMPTS + 1):
        try:
            with table.update_schema() as update:
                update.union_by_name(schema)
            return None
        except (ValidationError, ValueError) as exc:
            return str(exc)
        except CommitFailedException:
            if attempt == MAX_EVOLUTION_ATTEMPTS:
                raise
            log.warning("table schema update conflicted with another writer; refreshing (attempt %d)", attempt)
            table.refresh()
    return None
