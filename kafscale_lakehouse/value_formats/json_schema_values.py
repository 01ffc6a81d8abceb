"""JSON values in the Confluent wire format (`value_format: json_schema`): their Iceberg columns from the registered
JSON Schema, validation against it, and decoding into Arrow columns.

Wire format (Confluent, value_formats/framed.py): magic byte 0, the 4-byte schema id, then the value as UTF-8 JSON text
(Confluent's JSONSchemaSerializer); with `latest` the bare JSON of the subject's newest version.

Columns: the properties of the schema's root object are columns after the base columns, matched by name; types map
as
  object with `properties` → struct, object with only `additionalProperties: {schema}` → map<string, V>,
  array with `items: {schema}` → list (optional elements: JSON arrays may hold null),
  string with `format: date-time` → timestamptz, `format: date` → date, other strings → string,
  integer → long, number → double, boolean → boolean,
  `type: [T, "null"]` and `oneOf`/`anyOf` of null and one schema → T (optional),
  and anything else (no `type`, several non-null types, an object without properties) → string, the value's JSON
  text. `$ref`s within the document (`#/$defs/...`, `#/definitions/...`) are followed; a recursive one has no
  Iceberg type: `SchemaMappingError` naming the field.
Every struct field is optional in the table. Evolution by name, as for Avro and Protobuf
(value_formats/registered_tables.py).

Decoding (`JsonSchemaValueDecoder`, on the executors): each value is parsed (`json.loads`) and validated against
its schema id's document (jsonschema, compiled once per id, as Confluent's deserializer validates): a value that is
not JSON or violates its schema is an invalid record naming the violated path. Valid values are converted to the
table's types (ISO date-times and dates parsed; values of JSON-text columns serialized) by converters compiled once
from the table's Arrow schema, then each column is built by pyarrow in one call (framed.py).
"""

from __future__ import annotations

import datetime
import itertools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from jsonschema.exceptions import best_match
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    IcebergType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.schema.validation import CompiledJsonSchema, InvalidSchemaDocumentError, compile_json_schema
from kafscale_lakehouse.value_formats.framed import (
    WIRE_HEADER_SIZE,
    FramedValueDecoder,
    FramedValueSchemas,
)

_FORMATS: dict[str, IcebergType] = {"date-time": TimestamptzType(), "date": DateType()}
_PRIMITIVES: dict[str, IcebergType] = {"integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}


def parse_json_schema(text: str, *, what: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise SchemaMappingError(f"{what} is not a JSON Schema document: {exc}") from None
    if not isinstance(document, dict):
        raise SchemaMappingError(f"{what}: a value schema must be a JSON object schema to give columns")
    return document


def json_schema_value_fields(text: str, *, what: str, first_id: int = 1) -> list[NestedField]:
    """The table columns of a JSON Schema value schema: its root object's properties, all optional, ids from
    `first_id` in order."""
    document = parse_json_schema(text, what=what)
    try:
        compile_json_schema(document, what)
    except InvalidSchemaDocumentError as exc:
        raise SchemaMappingError(str(exc)) from None
    root, _ = _non_null(document, document, what, path=(), refs=())
    if not isinstance(root.get("properties"), Mapping):
        raise SchemaMappingError(f"{what}: a value schema must be an object with properties to give columns")
    return _struct_fields(root, document, itertools.count(first_id), what, path=(), refs=())


def _struct_fields(schema: Mapping[str, Any], document: Mapping[str, Any], ids: Iterator[int], what: str,
                   path: tuple[str, ...], refs: tuple[str, ...]) -> list[NestedField]:
    fields = []
    for name, property_schema in schema["properties"].items():
        field_id = next(ids)
        field_type = _iceberg_type(property_schema, document, ids, what, (*path, name), refs)
        fields.append(NestedField(field_id, name, field_type, required=False,
                                  doc=property_schema.get("description") if isinstance(property_schema, Mapping)
                                  else None))
    return fields


def _iceberg_type(schema: Any, document: Mapping[str, Any], ids: Iterator[int], what: str, path: tuple[str, ...],
                  refs: tuple[str, ...]) -> IcebergType:
    schema, refs = _non_null(schema, document, what, path, refs)
    kind = schema.get("type")
    if kind == "object" and isinstance(schema.get("properties"), Mapping):
        return StructType(*_struct_fields(schema, document, ids, what, path, refs))
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        key_id, value_id = next(ids), next(ids)
        value = _iceberg_type(schema["additionalProperties"], document, ids, what, (*path, "value"), refs)
        return MapType(key_id, StringType(), value_id, value, value_required=False)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        element_id = next(ids)
        element = _iceberg_type(schema["items"], document, ids, what, (*path, "element"), refs)
        return ListType(element_id, element, element_required=False)
    if kind == "string":
        return _FORMATS.get(schema.get("format", ""), StringType())
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    return StringType()  # no single type: the value's JSON text


def _non_null(schema: Any, document: Mapping[str, Any], what: str, path: tuple[str, ...],
              refs: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`schema` with its `$ref`s followed and a null alternative dropped (`type: [T, null]`, `oneOf`/`anyOf` of null
    and one schema)."""
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        if ref in refs:
            raise SchemaMappingError(f"{what}: field {'.'.join(path) or '(value)'} is the recursive {ref}, which has "
                                     "no Iceberg type")
        refs = (*refs, ref)
        schema = _resolve_ref(document, ref, what)
    if not isinstance(schema, Mapping):
        return {}, refs  # true/false schemas: any value, its JSON text
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return ({**schema, "type": kinds[0]} if len(kinds) == 1 else {}), refs
    for combinator in ("oneOf", "anyOf"):
        branches = schema.get(combinator)
        if isinstance(branches, list):
            others = [b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")]
            if len(others) == 1:
                return _non_null(others[0], document, what, path, refs)
            return {}, refs
    return dict(schema), refs


def _resolve_ref(document: Mapping[str, Any], ref: str, what: str) -> Any:
    if not ref.startswith("#"):
        raise SchemaMappingError(f"{what}: $ref {ref!r} points outside the document (schema references are not "
                                 "supported)")
    node: Any = document
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            raise SchemaMappingError(f"{what}: $ref {ref!r} does not resolve within the document")
        node = node[part]
    return node


# ---------------------------------------------------------------------------------------------------- decoding

_Converter = Callable[[Any], Any]


def _converter(arrow_type: pa.DataType) -> _Converter | None:
    """How a valid JSON value becomes the Python value pyarrow builds a column of `arrow_type` from; None: as is."""
    if pa.types.is_timestamp(arrow_type):
        return _timestamp
    if pa.types.is_date(arrow_type):
        return lambda v: datetime.date.fromisoformat(v) if isinstance(v, str) else v
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return lambda v: v if isinstance(v, str) or v is None else json.dumps(v, separators=(",", ":"))
    if pa.types.is_struct(arrow_type):
        fields = [(f.name, _converter(f.type)) for f in arrow_type]

        def struct(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            return {name: (value.get(name) if convert is None or value.get(name) is None
                           else convert(value[name])) for name, convert in fields}

        return struct
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        element = _converter(arrow_type.value_type)
        if element is None:
            return None
        return lambda v: [None if i is None else element(i) for i in v] if isinstance(v, list) else v
    if pa.types.is_map(arrow_type):
        item = _converter(arrow_type.item_type)
        return lambda v: ([(k, None if i is None or item is None else item(i)) for k, i in v.items()]
                          if isinstance(v, dict) else v)
    return None


def _timestamp(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    parsed = datetime.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


class JsonSchemaValueDecoder(FramedValueDecoder):
    """Decodes Confluent-framed JSON values, validated by their registered JSON Schema, into the table's value
    columns (one per executor task)."""

    def __init__(self, schemas: FramedValueSchemas) -> None:
        super().__init__(schemas)
        self._validators: dict[int, CompiledJsonSchema] = {}
        self._converters = [(f.name, _converter(f.type)) for f in schemas.value_schema]

    def read(self, value: bytes, schema_id: int, bare: bool) -> tuple[dict[str, Any] | None, str | None]:
        return self._read(value[0 if bare else WIRE_HEADER_SIZE:], schema_id)


    def _read(self, payload: bytes, schema_id: int) -> tuple[dict[str, Any] | None, str | None]:
        try:
            instance = json.loads(payload)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return None, f"value of JSON schema id {schema_id} is not JSON: {exc}"
        error = best_match(self._validator(schema_id).validator.iter_errors(instance))
        if error is not None:
            return None, (f"value violates JSON schema id {schema_id} at {error.json_path}: {error.message[:300]} "
                          f"(schema #/{'/'.join(str(p) for p in error.schema_path)})")
        if not isinstance(instance, dict):
            return None, f"value of JSON schema id {schema_id} is no object"
        record: dict[str, Any] = {}
        for name, convert in self._converters:
            item = instance.get(name)
            try:
                record[name] = item if convert is None or item is None else convert(item)
            except (ValueError, TypeError) as exc:
                return None, f"{name}: {item!r} does not fit the column ({exc})"
        return record, None

    def _validator(self, schema_id: int) -> CompiledJsonSchema:
        compiled = self._validators.get(schema_id)
        if compiled is None:
            what = f"JSON schema id {schema_id} (subject {self.settings.subject})"
            try:
                compiled = compile_json_schema(json.loads(self.settings.schemas[schema_id]), what)
            except (ValueError, InvalidSchemaDocumentError) as exc:
                raise SchemaMappingError(f"{what} is not a valid JSON Schema: {exc}") from None
            compiled = self._validators[schema_id] = compiled
        return compiled
