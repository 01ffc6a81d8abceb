"""Avro values in the Confluent wire format: their Iceberg columns, and decoding them into Arrow columns.

Wire format (Confluent, schema/framed.py): magic byte 0, the schema id as 4 bytes big-endian, then the Avro binary
encoding of the value without a container. With `latest` (producers that do not write the prefix) every value is the
bare Avro encoding of one schema id.

Columns: the top-level fields of the value's record are columns after the base columns, matched by name; nested
types map as
  record → struct, array → list, map → map (string keys), enum → string, [null, T] → T (optional),
  decimal (bytes or fixed) → decimal(p, s), date → date, time-millis/-micros → time,
  timestamp-millis/-micros → timestamptz, local-timestamp-millis/-micros → timestamp, uuid → uuid,
  bytes and fixed → binary, and the primitives to their Iceberg types.
Every struct field is optional in the table (a tombstone lands with nulls, and a field a later schema adds must be
addable to a table that already has rows); list elements and map values are required when the Avro type is not
nullable. A union of two or more non-null types, and a recursive record, have no Iceberg type: `SchemaMappingError`
naming the field.

Decoding (`AvroValueDecoder`, on the executors): fastavro's C reader decodes each value with the writer schema its id
names; pyarrow then builds each column from the decoded records in one call, typed as the table's column (a narrower
writer type, e.g. int into a long column, converts there). A null value (tombstone) is a row of nulls; a value that is
not in the wire format or does not decode is an invalid record with the reason; a schema id the run does not know, or
one whose schema could not evolve the table, stops the partition at that record (`DecodedValues.stop`).
"""

from __future__ import annotations

import io
import itertools
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import fastavro
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.schema.framed import (
    WIRE_HEADER_SIZE,
    WIRE_MAGIC,
    FramedValueDecoder,
    FramedValueSchemas,
)

log = logging.getLogger(__name__)

_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
    "double": DoubleType(), "string": StringType(), "bytes": BinaryType(),
}
_LOGICAL: dict[tuple[str, str], IcebergType] = {
    ("int", "date"): DateType(), ("int", "time-millis"): TimeType(), ("long", "time-micros"): TimeType(),
    ("long", "timestamp-millis"): TimestamptzType(), ("long", "timestamp-micros"): TimestamptzType(),
    ("long", "local-timestamp-millis"): TimestampType(), ("long", "local-timestamp-micros"): TimestampType(),
    ("string", "uuid"): UUIDType(), ("fixed", "uuid"): UUIDType(),
}


def parse_avro_schema(text: str, *, what: str, for_reading: bool = False) -> Any:
    """The parsed (fastavro) form of a schema's JSON text; `what` names it in errors. Named types are expanded
    inline (to map them to columns), or, `for_reading`, the form fastavro's readers take without parsing it again on
    every call (they re-parse a schema that lacks fastavro's parsed marker: several times slower per value)."""
    try:
        if for_reading:
            return fastavro.parse_schema(json.loads(text))
        return fastavro.parse_schema(json.loads(text), expand=True, _write_hint=False)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise SchemaMappingError(f"{what} is not a valid Avro schema: {exc}") from None


def avro_value_fields(avro_schema: Any, *, what: str, first_id: int = 1) -> list[NestedField]:
    """The table columns of an Avro value schema (parsed): its record's fields, all optional, ids from `first_id`
    in order (a new table takes them; evolution matches by name). `what` names the schema in errors."""
    if not isinstance(avro_schema, Mapping) or avro_schema.get("type") != "record":
        raise SchemaMappingError(f"{what}: a value schema must be an Avro record to give columns, not "
                                 f"{_describe(avro_schema)}")
    ids = itertools.count(first_id)
    return _struct_fields(avro_schema, ids, what, path=(), seen=())


def _struct_fields(record: Mapping[str, Any], ids: Iterator[int], what: str, path: tuple[str, ...],
                   seen: tuple[str, ...]) -> list[NestedField]:
    name = record.get("name", "")
    if name in seen:
        raise SchemaMappingError(f"{what}: field {'.'.join(path) or '(value)'} is the recursive record {name}, which "
                                 "has no Iceberg type")
    fields = []
    for avro_field in record["fields"]:
        field_path = (*path, avro_field["name"])
        field_id = next(ids)
        field_type, _ = _iceberg_type(avro_field["type"], ids, what, field_path, (*seen, name))
        fields.append(NestedField(field_id, avro_field["name"], field_type, required=False, doc=avro_field.get("doc")))
    return fields


def _iceberg_type(avro: Any, ids: Iterator[int], what: str, path: tuple[str, ...],
                  seen: tuple[str, ...]) -> tuple[IcebergType, bool]:
    """(Iceberg type, nullable) of an Avro type at `path`."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise SchemaMappingError(f"{what}: field {'.'.join(path)} is the union {_describe(avro)}; only a union of "
                                     "null and one type has an Iceberg type")
        return _iceberg_type(branches[0], ids, what, path, seen)[0], len(branches) < len(avro)
    if isinstance(avro, str):
        if avro not in _PRIMITIVES:
            raise SchemaMappingError(f"{what}: field {'.'.join(path)} has the Avro type {avro!r}, which has no "
                                     "Iceberg type")
        return _PRIMITIVES[avro], False
    kind, logical = avro["type"], avro.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return DecimalType(int(avro["precision"]), int(avro.get("scale", 0))), False
    if logical is not None and (kind, logical) in _LOGICAL:
        return _LOGICAL[(kind, logical)], False
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind], False
    if kind == "fixed":
        return BinaryType(), False
    if kind == "enum":
        return StringType(), False
    if kind == "record":
        return StructType(*_struct_fields(avro, ids, what, path, seen)), False
    if kind == "array":
        element_id = next(ids)
        element, nullable = _iceberg_type(avro["items"], ids, what, (*path, "element"), seen)
        return ListType(element_id, element, element_required=not nullable), False
    if kind == "map":
        key_id, value_id = next(ids), next(ids)
        value, nullable = _iceberg_type(avro["values"], ids, what, (*path, "value"), seen)
        return MapType(key_id, StringType(), value_id, value, value_required=not nullable), False
    if kind == "null":
        raise SchemaMappingError(f"{what}: field {'.'.join(path)} is always null, which has no Iceberg type")
    return _iceberg_type(kind, ids, what, path, seen)


def encode_framed_avro(schema_id: int, parsed_schema: Any, record: Mapping[str, Any]) -> bytes:
    """`record` in the Confluent wire format (the producer side: the demo producer and the tests)."""
    out = io.BytesIO()
    out.write(bytes([WIRE_MAGIC]) + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, parsed_schema, record)
    return out.getvalue()


def _describe(avro: Any) -> str:
    text = json.dumps(avro, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


# ---------------------------------------------------------------------------------------------------- decoding


class AvroValueDecoder(FramedValueDecoder):
    """Decodes Confluent-framed Avro values into the table's value columns (one per executor task)."""

    def __init__(self, schemas: FramedValueSchemas) -> None:
        super().__init__(schemas)
        self._parsed: dict[int, Any] = {}

    def read(self, value: bytes, schema_id: int, bare: bool) -> tuple[dict[str, Any] | None, str | None]:
        return _read_record(value, 0 if bare else WIRE_HEADER_SIZE, self._schema(schema_id), schema_id)

    def _schema(self, schema_id: int) -> Any:
        parsed = self._parsed.get(schema_id)
        if parsed is None:
            text = self.settings.schemas[schema_id]  # the loop stopped at ids the run does not know
            parsed = self._parsed[schema_id] = parse_avro_schema(_without_costly_logical_types(text),
                                                                 what=f"schema id {schema_id}", for_reading=True)
        return parsed


# Logical types of top-level fields read as their plain Avro values, which pyarrow takes as they are (ints as
# microseconds or days) or converts in bulk (uuid strings, `framed.uuid_array`): fastavro builds a Python datetime,
# date or UUID per value otherwise, the larger part of the decoding time. Millisecond timestamps keep theirs (a column
# may mix millis and micros versions); nested fields keep theirs.
_READ_PLAIN = {("long", "timestamp-micros"), ("long", "local-timestamp-micros"), ("int", "date"), ("string", "uuid")}


def _without_costly_logical_types(text: str) -> str:
    schema = json.loads(text)
    if isinstance(schema, dict) and schema.get("type") == "record":
        for avro_field in schema.get("fields", []):
            avro_field["type"] = _plain_if_costly(avro_field["type"])
    return json.dumps(schema)


def _plain_if_costly(avro: Any) -> Any:
    if isinstance(avro, list):
        return [_plain_if_costly(branch) for branch in avro]
    if isinstance(avro, dict) and (avro.get("type"), avro.get("logicalType")) in _READ_PLAIN:
        return avro["type"]
    return avro


def _read_record(value: bytes, start: int, parsed: Any, schema_id: int) -> tuple[dict[str, Any] | None, str | None]:
    stream = io.BytesIO(value)
    stream.seek(start)
    try:
        record = fastavro.schemaless_reader(stream, parsed, None)
    except Exception as exc:  # noqa: BLE001 - fastavro raises whatever the bytes provoke (EOFError, ValueError, ...)
        return None, f"value does not decode as Avro schema id {schema_id}: {type(exc).__name__}: {exc}"
    left = len(value) - stream.tell()
    if left:
        return None, f"value does not decode as Avro schema id {schema_id}: {left} bytes left after the record"
    if not isinstance(record, dict):
        return None, f"value of Avro schema id {schema_id} is no record"
    return record, None
