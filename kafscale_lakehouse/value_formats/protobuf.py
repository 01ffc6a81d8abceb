"""Protobuf values in the Confluent wire format: their Iceberg columns, and decoding them into Arrow columns.

Wire format (Confluent, value_formats/framed.py): magic byte 0, the 4-byte schema id, then the *message indexes* (which
message of the schema's file the value is: a count and the indexes along the nested path, as zigzag varints, with
the first message `[0]` written as a single byte 0), then the message's binary encoding. With `latest` the value is
the bare message, of the table's message.

Schemas: the registry serves a Protobuf schema as .proto text, and as the base64 of its `FileDescriptorProto` with
`format=serialized` (what Confluent's own deserializers fetch); the run fetches that form, so no .proto parser is
needed on the driver or the executors. Imports of Google's well-known types (`google/protobuf/*.proto`) resolve
from the protobuf library, as Confluent's clients do; other imports are the schema's registry references, fetched
the same way on the driver (`ConfluentRegistryClient.serialized_imports`) and shipped with it (`imports`).

Columns: the fields of the mapping's message (`schema_registry.record_name`, a full name such as `shop.Order`;
default: the file's first message) are columns after the base columns, matched by name; types map as
  message → struct, repeated → list (required elements), map<K, V> → map (required values), enum → string
  (its symbol; a number the schema does not name stays its number), oneof → its fields, each optional,
  google.protobuf.Timestamp → timestamptz, the wrappers (StringValue, Int64Value, ...) → their optional primitive,
  Struct/Value/ListValue → string (their JSON), int32/sint32/sfixed32 → int, uint32/fixed32 and every 64-bit
  integer → long (a uint64 above 2^63-1 does not fit: an invalid record), float, double, bool, string, bytes.
Every struct field is optional in the table (a tombstone lands with nulls, and a later schema's field must be addable);
a field without presence (a proto3 scalar not marked `optional`) reads as its default when the value leaves it
out, as every Protobuf reader does, and one with presence (messages, `optional`, oneof members) reads as null.
A recursive message has no Iceberg type: `SchemaMappingError` naming the field. Field numbers are not field ids:
evolution is by name, as for Avro (value_formats/registered_tables.py).

Decoding (`ProtobufValueDecoder`, on the executors): protobuf's C (upb) parser decodes each value with a message
class built from the descriptor (descriptor_pool + message_factory, no generated code); a converter compiled once per
message type turns it into the nested dicts and lists pyarrow builds each column from in one call (framed.py).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    json_format,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from pyiceberg.types import (
    BinaryType,
    BooleanType,
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
    TimestamptzType,
)

from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.value_formats.framed import (
    WIRE_HEADER_SIZE,
    WIRE_MAGIC,
    FramedValueDecoder,
    FramedValueSchemas,
)

_WELL_KNOWN_FILES = (any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)
_SCALARS: dict[int, IcebergType] = {
    FieldDescriptor.TYPE_DOUBLE: DoubleType(), FieldDescriptor.TYPE_FLOAT: FloatType(),
    FieldDescriptor.TYPE_INT32: IntegerType(), FieldDescriptor.TYPE_SINT32: IntegerType(),
    FieldDescriptor.TYPE_SFIXED32: IntegerType(), FieldDescriptor.TYPE_UINT32: LongType(),
    FieldDescriptor.TYPE_FIXED32: LongType(), FieldDescriptor.TYPE_INT64: LongType(),
    FieldDescriptor.TYPE_SINT64: LongType(), FieldDescriptor.TYPE_SFIXED64: LongType(),
    FieldDescriptor.TYPE_UINT64: LongType(), FieldDescriptor.TYPE_FIXED64: LongType(),
    FieldDescriptor.TYPE_BOOL: BooleanType(), FieldDescriptor.TYPE_STRING: StringType(),
    FieldDescriptor.TYPE_BYTES: BinaryType(), FieldDescriptor.TYPE_ENUM: StringType(),
}
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS: dict[str, IcebergType] = {
    "google.protobuf.DoubleValue": DoubleType(), "google.protobuf.FloatValue": FloatType(),
    "google.protobuf.Int64Value": LongType(), "google.protobuf.UInt64Value": LongType(),
    "google.protobuf.Int32Value": IntegerType(), "google.protobuf.UInt32Value": LongType(),
    "google.protobuf.BoolValue": BooleanType(), "google.protobuf.StringValue": StringType(),
    "google.protobuf.BytesValue": BinaryType(),
}
_AS_JSON = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})


# ------------------------------------------------------------------------------------------- schemas and columns


def protobuf_file(serialized: str, *, what: str) -> descriptor_pb2.FileDescriptorProto:
    """The `FileDescriptorProto` of a schema as the registry serves it with `format=serialized` (base64)."""
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized, validate=True))
    except (binascii.Error, ValueError, DecodeError) as exc:
        raise SchemaMappingError(f"{what} is not a serialized Protobuf schema (base64 FileDescriptorProto, as the "
                                 f"registry serves it with format=serialized): {exc}") from None


def file_message_names(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """The full names of the file's top-level messages, in order."""
    prefix = f"{file.package}." if file.package else ""
    return [prefix + m.name for m in file.message_type]


def message_descriptor(serialized: str, message_name: str | None, *, what: str,
                       imports: Sequence[tuple[str, str]] = ()) -> Descriptor:
    """The descriptor of `message_name` (default: the file's first message) in the serialized schema, in a pool of
    its own holding the well-known types and the serialized `imports` ((import name, base64), imports first)."""
    pool, file = _pool(serialized, what, imports)
    names = file_message_names(file)
    name = message_name or (names[0] if names else None)
    if name is None:
        raise SchemaMappingError(f"{what} defines no message")
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError:
        raise SchemaMappingError(f"{what} has no message {name} (its top-level messages: "
                                 f"{', '.join(names)})") from None


def _pool(serialized: str, what: str, imports: Sequence[tuple[str, str]] = (),
          ) -> tuple[descriptor_pool.DescriptorPool, descriptor_pb2.FileDescriptorProto]:
    file = protobuf_file(serialized, what=what)
    pool = descriptor_pool.DescriptorPool()
    for module in _WELL_KNOWN_FILES:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    imported = {name for name, _ in imports}
    missing = [d for d in file.dependency if not d.startswith("google/protobuf/") and d not in imported]
    if missing:
        raise SchemaMappingError(f"{what} imports {', '.join(missing)}, which are not among its registry "
                                 "references")
    try:
        for name, imported_serialized in imports:
            imported_file = protobuf_file(imported_serialized, what=f"{what}'s import {name}")
            imported_file.name = name  # as Confluent's clients do: the import name, not the registered file's
            pool.Add(imported_file)
        pool.Add(file)
    except (TypeError, KeyError, ValueError) as exc:
        raise SchemaMappingError(f"{what} is not a valid Protobuf schema: {exc}") from None
    return pool, file


def protobuf_value_fields(serialized: str, message_name: str | None, *, what: str, first_id: int = 1,
                          imports: Sequence[tuple[str, str]] = ()) -> list[NestedField]:
    """The table columns of a Protobuf value schema: the message's fields, all optional, ids from `first_id`."""
    message = message_descriptor(serialized, message_name, what=what, imports=imports)
    return _struct_fields(message, itertools.count(first_id), what, path=(), seen=())


def _struct_fields(message: Descriptor, ids: Iterator[int], what: str, path: tuple[str, ...],
                   seen: tuple[str, ...]) -> list[NestedField]:
    if message.full_name in seen:
        raise SchemaMappingError(f"{what}: field {'.'.join(path) or '(value)'} is the recursive message "
                                 f"{message.full_name}, which has no Iceberg type")
    fields = []
    for proto_field in message.fields:
        field_path = (*path, proto_field.name)
        field_id = next(ids)
        field_type = _field_type(proto_field, ids, what, field_path, (*seen, message.full_name))
        fields.append(NestedField(field_id, proto_field.name, field_type, required=False))
    return fields


def _field_type(proto_field: FieldDescriptor, ids: Iterator[int], what: str, path: tuple[str, ...],
                seen: tuple[str, ...]) -> IcebergType:
    if _is_map(proto_field):
        entry = proto_field.message_type
        key_id, value_id = next(ids), next(ids)
        key = _single_type(entry.fields_by_name["key"], ids, what, (*path, "key"), seen)
        value = _single_type(entry.fields_by_name["value"], ids, what, (*path, "value"), seen)
        return MapType(key_id, key, value_id, value, value_required=True)
    if _is_repeated(proto_field):
        element_id = next(ids)
        element = _single_type(proto_field, ids, what, (*path, "element"), seen)
        return ListType(element_id, element, element_required=True)
    return _single_type(proto_field, ids, what, path, seen)


def _single_type(proto_field: FieldDescriptor, ids: Iterator[int], what: str, path: tuple[str, ...],
                 seen: tuple[str, ...]) -> IcebergType:
    if proto_field.type == FieldDescriptor.TYPE_GROUP:
        raise SchemaMappingError(f"{what}: field {'.'.join(path)} is a proto2 group, which has no Iceberg type")
    if proto_field.type != FieldDescriptor.TYPE_MESSAGE:
        return _SCALARS[proto_field.type]
    name = proto_field.message_type.full_name
    if name == _TIMESTAMP:
        return TimestamptzType()
    if name in _WRAPPERS:
        return _WRAPPERS[name]
    if name in _AS_JSON:
        return StringType()
    return StructType(*_struct_fields(proto_field.message_type, ids, what, path, seen))


def _is_repeated(proto_field: FieldDescriptor) -> bool:
    return bool(proto_field.is_repeated)


def _is_map(proto_field: FieldDescriptor) -> bool:
    return (_is_repeated(proto_field) and proto_field.type == FieldDescriptor.TYPE_MESSAGE
            and proto_field.message_type.GetOptions().map_entry)


# ------------------------------------------------------------------------------------------------ the wire format


def encode_message_indexes(indexes: Sequence[int]) -> bytes:
    """Confluent's message indexes: `[0]` as the single byte 0, else the count and each index, zigzag varints."""
    if list(indexes) == [0]:
        return b"\x00"
    return b"".join(_zigzag_varint(n) for n in (len(indexes), *indexes))


def _zigzag_varint(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_message_indexes(value: bytes, start: int) -> tuple[tuple[int, ...], int]:
    """(message indexes, offset of the message) of a framed value whose indexes start at `start`; `ValueError` when
    they are cut short."""
    count, position = _read_zigzag(value, start)
    if count == 0:
        return (0,), position
    if count < 0 or count > len(value):
        raise ValueError(f"message index count {count} is not possible in a value of {len(value)} bytes")
    indexes = []
    for _ in range(count):
        index, position = _read_zigzag(value, position)
        indexes.append(index)
    return tuple(indexes), position


def _read_zigzag(value: bytes, position: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if position >= len(value):
            raise ValueError("the message indexes are cut short")
        byte = value[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 63:
            raise ValueError("a message index varint is longer than 10 bytes")


def encode_framed_protobuf(schema_id: int, message: Message, indexes: Sequence[int] = (0,)) -> bytes:
    """`message` in the Confluent wire format (the producer side: the tests)."""
    return (bytes([WIRE_MAGIC]) + schema_id.to_bytes(4, "big") + encode_message_indexes(indexes)
            + message.SerializeToString())


# ---------------------------------------------------------------------------------------------------- decoding

_Converter = Callable[[Any], Any]


def _message_converter(message: Descriptor) -> Callable[[Message], dict[str, Any]]:
    """message → dict of its fields (the nested Python values pyarrow builds the table's struct from)."""
    steps: list[tuple[str, bool, str, _Converter | None]] = []
    for proto_field in message.fields:
        if _is_map(proto_field):
            value_field = proto_field.message_type.fields_by_name["value"]
            steps.append((proto_field.name, False, "map", _value_converter(value_field)))
        elif _is_repeated(proto_field):
            steps.append((proto_field.name, False, "list", _value_converter(proto_field)))
        else:
            steps.append((proto_field.name, proto_field.has_presence, "one", _value_converter(proto_field)))

    def convert(value: Message) -> dict[str, Any]:
        record: dict[str, Any] = {}
        for name, has_presence, kind, convert_value in steps:
            if has_presence and not value.HasField(name):
                record[name] = None
                continue
            item = getattr(value, name)
            if kind == "one":
                record[name] = item if convert_value is None else convert_value(item)
            elif kind == "list":
                record[name] = list(item) if convert_value is None else [convert_value(i) for i in item]
            else:
                record[name] = (list(item.items()) if convert_value is None
                                else [(k, convert_value(v)) for k, v in item.items()])
        return record

    return convert


def _value_converter(proto_field: FieldDescriptor) -> _Converter | None:
    """How one value of the field becomes its column's Python value; None: as protobuf gives it."""
    if proto_field.type == FieldDescriptor.TYPE_ENUM:
        symbols = {v.number: v.name for v in proto_field.enum_type.values}
        return lambda number: symbols.get(number, str(number))
    if proto_field.type != FieldDescriptor.TYPE_MESSAGE:
        return None
    name = proto_field.message_type.full_name
    if name == _TIMESTAMP:
        return lambda t: t.seconds * 1_000_000 + t.nanos // 1000  # microseconds: the column's unit
    if name in _WRAPPERS:
        return lambda w: w.value
    if name in _AS_JSON:
        return lambda m: json.dumps(json_format.MessageToDict(m), separators=(",", ":"))
    return _message_converter(proto_field.message_type)


# A message of one schema id: its class and its converter, or why values of it cannot land.
_MessageType = tuple[type[Message], _Converter] | str


class ProtobufValueDecoder(FramedValueDecoder):
    """Decodes Confluent-framed Protobuf values into the table's value columns (one per executor task)."""

    def __init__(self, schemas: FramedValueSchemas) -> None:
        super().__init__(schemas)
        self._types: dict[tuple[int, tuple[int, ...]], _MessageType] = {}


    def read(self, value: bytes, schema_id: int, bare: bool) -> tuple[dict[str, Any] | None, str | None]:
        try:
            indexes, start = ((), 0) if bare else read_message_indexes(value, WIRE_HEADER_SIZE)
        except ValueError as exc:
            return None, f"value of Protobuf schema id {schema_id} has no valid message indexes: {exc}"
        message_type = self._message_type(schema_id, indexes)
        if isinstance(message_type, str):
            return None, message_type
        message_class, convert = message_type
        try:
            message = message_class.FromString(value[start:])
        except DecodeError as exc:
            return None, f"value does not decode as Protobuf schema id {schema_id}: {exc}"
        return convert(message), None

    def _message_type(self, schema_id: int, indexes: tuple[int, ...]) -> _MessageType:
        key = (schema_id, indexes)
        found = self._types.get(key)
        if found is None:
            found = self._types[key] = self._resolve(schema_id, indexes)
        return found

    def _resolve(self, schema_id: int, indexes: tuple[int, ...]) -> _MessageType:
        what = f"Protobuf schema id {schema_id}"
        wanted = self.settings.message_name
        descriptor = message_descriptor(self.settings.schemas[schema_id], wanted, what=what,
                                        imports=self.settings.imports.get(schema_id, ()))
        if indexes:  # the value names its message; it must be the table's
            name = _message_at(protobuf_file(self.settings.schemas[schema_id], what=what), indexes)
            if name is None:
                return f"value names message indexes {list(indexes)}, which {what} does not have"
            if name != descriptor.full_name:
                return f"value is a {name} of {what}, not the mapping's message {descriptor.full_name}"
        return message_factory.GetMessageClass(descriptor), _message_converter(descriptor)


def _message_at(file: descriptor_pb2.FileDescriptorProto, indexes: tuple[int, ...]) -> str | None:
    """The full name of the message at `indexes` (top-level index, then nested ones) of `file`."""
    messages: Sequence[descriptor_pb2.DescriptorProto] = file.message_type
    names = [file.package] if file.package else []
    for index in indexes:
        if not 0 <= index < len(messages):
            return None
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join(names)
