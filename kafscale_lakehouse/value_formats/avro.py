"""Avro values in the Confluent wire format: their Iceberg columns, and decoding them into Arrow columns.

Wire format (Confluent, value_formats/framed.py): magic byte 0, the schema id as 4 bytes big-endian, then the Avro
binary encoding of the value without a container. With `latest` (producers that do not write the prefix) every value is
the bare Avro encoding of one schema id.

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

Decoding (`AvroValueDecoder`, on the executors): each run of values of one schema id goes through the columnar decoder
(value_formats/avro_columns.py and its C extension), which reads the Avro binary straight into Arrow buffers and fits
the writer's columns to the table's by name (a narrower writer type, e.g. int into a long column, widens there);
fastavro parses the schemas and writes values (the producer side), it does not read them. A null value (tombstone) is a
row of nulls; a value that is not in the wire format or does not decode (out of bytes, bytes left after the record, a
bad varint, union branch or enum index, invalid UTF-8, a value out of its type's range, a boolean byte other than 0 or
1) is an invalid record with the reason; a schema id the run does not know, or one whose schema could not evolve the
table, stops the partition at that record (`DecodedValues.stop`).
"""

from __future__ import annotations

import io
import itertools
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
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
from kafscale_lakehouse.value_formats.avro_columns import AvroProgram, record_columns
from kafscale_lakehouse.value_formats.framed import (
    WIRE_MAGIC,
    DecodedValues,
    FramedValueDecoder,
    FramedValueSchemas,
    frame_values,
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
    inline (to map them to columns and compile them, value_formats/avro_columns.py), or, `for_reading`, the form
    fastavro's readers and writers take without parsing it again on every call (they re-parse a schema that lacks
    fastavro's parsed marker: several times slower per value)."""
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
        if not avro["fields"]:  # Iceberg has no struct of nothing (pyiceberg cannot even nest one in a list)
            raise SchemaMappingError(f"{what}: field {'.'.join(path)} is the record {avro.get('name', '')} without "
                                     "fields, which has no Iceberg type")
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
    """Decodes Confluent-framed Avro values into the table's value columns (one per executor task): each run of one
    schema id through the columnar decoder (value_formats/avro_columns.py), in row order."""

    def __init__(self, schemas: FramedValueSchemas) -> None:
        super().__init__(schemas)
        self._programs: dict[int, AvroProgram] = {}

    def _decode(self, values: pa.Array) -> DecodedValues:
        framing = frame_values(self.settings, values)
        value_schema, reasons, schema_ids = self.settings.value_schema, framing.reasons, framing.schema_ids
        runs: list[tuple[np.ndarray, list[pa.Array]]] = []
        for schema_id in np.unique(schema_ids[schema_ids >= 0]).tolist():
            rows = np.flatnonzero(schema_ids == schema_id)
            record, errors = self._program(schema_id).decode(values, rows, framing.skip)
            for position, reason in errors:
                reasons[rows[position]] = f"value does not decode as Avro schema id {schema_id}: {reason}"
            runs.append((rows, record_columns(record, value_schema, reasons, rows.tolist())))
        if len(runs) == 1 and len(runs[0][0]) == framing.rows:
            columns = runs[0][1]
        else:  # several schema ids, tombstones or values not in the wire format: back into row order
            decoded = sum(len(rows) for rows, _ in runs)
            order = np.full(framing.rows, decoded, np.int64)  # rows of no run take the null after the runs
            start = 0
            for rows, _ in runs:
                order[rows] = np.arange(start, start + len(rows))
                start += len(rows)
            columns = [pa.concat_arrays([run[i] for _, run in runs] + [pa.nulls(1, f.type)]).take(order)
                       for i, f in enumerate(value_schema)]
        return DecodedValues(columns, pa.array(reasons, pa.string()), framing.stop)

    def _program(self, schema_id: int) -> AvroProgram:
        program = self._programs.get(schema_id)
        if program is None:
            what = f"schema id {schema_id}"
            text = self.settings.schemas[schema_id]  # the framing stopped at ids the run does not know
            program = self._programs[schema_id] = AvroProgram(parse_avro_schema(text, what=what), what=what)
        return program
