"""Columnar Avro decoding: a run of values of one writer schema straight into Arrow arrays, through the C extension
`value_formats/_avro_columns.c`.

`AvroProgram` compiles a writer schema (parsed, named types expanded) into the extension's program: one node per
Avro type, in an order where children follow their parent. The extension walks each value's bytes once into
per-node buffers (validity bytes, fixed-width values, int64 offsets, string data), with logical types converted
(time-millis and timestamp-millis to microseconds, decimals to 128-bit integers) and every value that does not decode
reported with its reason as a null record. `AvroProgram.decode` then wraps the buffers as Arrow arrays of the writer's
shape (`pa.Array.from_buffers`, no copy of the data) and `conform` fits them to the table's columns by name: fields
the writer lacks are null, narrower types widen (int → long, float → double, decimal precision), a value that does not
fit its column makes its row invalid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa

from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.value_formats import _avro_columns  # type: ignore[attr-defined]  # the C extension
from kafscale_lakehouse.value_formats.framed import uuid_array

# Node kinds, as `_avro_columns.c` numbers them.
_BOOLEAN, _INT, _LONG, _FLOAT, _DOUBLE, _BYTES, _STRING, _FIXED, _ENUM, _RECORD, _ARRAY, _MAP = range(1, 13)
_DECIMAL_BYTES, _DECIMAL_FIXED, _DATE, _TIME_MILLIS, _TIME_MICROS, _TIMESTAMP_MILLIS, _TIMESTAMP_MICROS = range(13, 20)

_PRIMITIVE_KINDS = {"boolean": _BOOLEAN, "int": _INT, "long": _LONG, "float": _FLOAT, "double": _DOUBLE,
                    "bytes": _BYTES, "string": _STRING}
_LOGICAL_KINDS = {("int", "date"): _DATE, ("int", "time-millis"): _TIME_MILLIS, ("long", "time-micros"): _TIME_MICROS,
                  ("long", "timestamp-millis"): _TIMESTAMP_MILLIS, ("long", "timestamp-micros"): _TIMESTAMP_MICROS,
                  ("long", "local-timestamp-millis"): _TIMESTAMP_MILLIS,
                  ("long", "local-timestamp-micros"): _TIMESTAMP_MICROS}
_FIXED_WIDTH_TYPES: dict[int, pa.DataType] = {
    _INT: pa.int32(), _LONG: pa.int64(), _FLOAT: pa.float32(), _DOUBLE: pa.float64(), _DATE: pa.date32(),
    _TIME_MILLIS: pa.time64("us"), _TIME_MICROS: pa.time64("us"),
}
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError)


@dataclass
class _Node:
    kind: int
    path: str
    size: int = 0  # fixed: bytes; enum: symbol count
    precision: int = 0
    scale: int = 0
    branches: int = 0  # a union's branch count (0: not a union)
    null_branch: int = -1
    children: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # a record's field names
    symbols: pa.Array | None = None  # an enum's
    local: bool = False  # local-timestamp: no time zone
    uuid: bool = False  # fixed(16) with logicalType uuid

    @property
    def nullable(self) -> bool:
        return self.null_branch >= 0


class AvroProgram:
    """A writer schema compiled for `_avro_columns.decode`; `what` names the schema in errors."""

    def __init__(self, schema: Any, *, what: str) -> None:
        self.what = what
        self.nodes: list[_Node] = []
        self._compile(schema, "(value)")
        if self.nodes[0].kind != _RECORD or self.nodes[0].branches:
            raise SchemaMappingError(f"{what}: a value schema must be an Avro record")
        self.program = tuple((n.kind, n.size, n.precision, n.branches, n.null_branch, tuple(n.children), n.path)
                             for n in self.nodes)

    def _compile(self, avro: Any, path: str) -> int:
        index = len(self.nodes)
        if isinstance(avro, list):
            non_null = [b for b in avro if b != "null"]
            if len(non_null) != 1 or isinstance(non_null[0], list):
                raise SchemaMappingError(f"{self.what}: field {path} is a union of {len(non_null)} types other than "
                                         "null; only a union of null and one type has a column type")
            self._compile(non_null[0], path)
            node = self.nodes[index]
            node.branches, node.null_branch = len(avro), avro.index("null") if "null" in avro else -1
            return index
        kind_name = avro if isinstance(avro, str) else avro["type"]
        logical = "" if isinstance(avro, str) else str(avro.get("logicalType", ""))
        node = _Node(0, path)
        self.nodes.append(node)
        if isinstance(kind_name, dict | list):  # {"type": {...}}: a nested type definition
            self.nodes.pop()
            return self._compile(kind_name, path)
        if logical == "decimal" and kind_name in ("bytes", "fixed"):
            node.kind = _DECIMAL_BYTES if kind_name == "bytes" else _DECIMAL_FIXED
            node.precision, node.scale = int(avro["precision"]), int(avro.get("scale", 0))
            node.size = int(avro.get("size", 0))
            if not 1 <= node.precision <= 38:
                raise SchemaMappingError(f"{self.what}: field {path} is a decimal of precision {node.precision}; "
                                         "at most 38 digits have a column type")
        elif (kind_name, logical) in _LOGICAL_KINDS:
            node.kind = _LOGICAL_KINDS[(kind_name, logical)]
            node.local = logical.startswith("local-")
        elif kind_name in _PRIMITIVE_KINDS:
            node.kind = _PRIMITIVE_KINDS[kind_name]
        elif kind_name == "fixed":
            node.kind, node.size = _FIXED, int(avro["size"])
            node.uuid = logical == "uuid" and node.size == 16
        elif kind_name == "enum":
            node.kind, node.size = _ENUM, len(avro["symbols"])
            node.symbols = pa.array(avro["symbols"], pa.large_string())
        elif kind_name == "record":
            node.kind = _RECORD
            for avro_field in avro["fields"]:
                node.names.append(avro_field["name"])
                child_path = avro_field["name"] if path == "(value)" else f"{path}.{avro_field['name']}"
                node.children.append(self._compile(avro_field["type"], child_path))
        elif kind_name == "array":
            node.kind = _ARRAY
            node.children.append(self._compile(avro["items"], f"{path}[]"))
        elif kind_name == "map":
            node.kind = _MAP
            node.children.append(self._compile(avro["values"], f"{path}{{}}"))
        else:
            raise SchemaMappingError(f"{self.what}: field {path} has the Avro type {kind_name!r}, which has no "
                                     "column type")
        return index

    def decode(self, values: pa.BinaryArray, rows: np.ndarray,
               skip: int) -> tuple[pa.StructArray, list[tuple[int, str]]]:
        """The records of `values[rows]` (each read from byte `skip`) as a struct array of the writer's shape, and
        (position in `rows`, reason) of those that did not decode (null there)."""
        offsets, data = values.buffers()[1], values.buffers()[2]
        offsets = offsets.slice(values.offset * 4, (len(values) + 1) * 4) if offsets is not None else b"\0" * 4
        buffers, errors = _avro_columns.decode(self.program, data if data is not None else b"", offsets,
                                               np.ascontiguousarray(rows, np.int64), skip)
        return cast(pa.StructArray, self._array(0, buffers, len(rows), None)), errors

    def _array(self, index: int, buffers: Sequence[tuple[bytes, ...]], count: int,
               parent_flags: np.ndarray | None) -> pa.Array:
        """Node `index`'s array of `count` entries; `parent_flags`: the value record's validity, for its fields
        (a record that did not decode leaves placeholders in them)."""
        node = self.nodes[index]
        valid, values, offsets, key_offsets, chars = buffers[index]
        flags = np.frombuffer(valid, np.uint8, count=count) if (node.nullable or index == 0) else None
        if parent_flags is not None:
            flags = parent_flags if flags is None else flags & parent_flags
        validity = None if flags is None or flags.all() else pa.py_buffer(np.packbits(flags, bitorder="little"))
        kind = node.kind
        if kind in _FIXED_WIDTH_TYPES:
            return pa.Array.from_buffers(_FIXED_WIDTH_TYPES[kind], count, [validity, pa.py_buffer(values)])
        if kind in (_TIMESTAMP_MILLIS, _TIMESTAMP_MICROS):
            return pa.Array.from_buffers(pa.timestamp("us", None if node.local else "UTC"), count,
                                         [validity, pa.py_buffer(values)])
        if kind == _BOOLEAN:
            bits = np.packbits(np.frombuffer(values, np.uint8), bitorder="little")
            return pa.Array.from_buffers(pa.bool_(), count, [validity, pa.py_buffer(bits)])
        if kind in (_STRING, _BYTES):
            return pa.Array.from_buffers(pa.large_string() if kind == _STRING else pa.large_binary(), count,
                                         [validity, pa.py_buffer(offsets), pa.py_buffer(chars)])
        if kind == _FIXED:
            storage = pa.Array.from_buffers(pa.binary(node.size), count, [validity, pa.py_buffer(values)])
            return pa.ExtensionArray.from_storage(pa.uuid(), storage) if node.uuid else storage
        if kind in (_DECIMAL_BYTES, _DECIMAL_FIXED):
            return pa.Array.from_buffers(pa.decimal128(node.precision, node.scale), count,
                                         [validity, pa.py_buffer(values)])
        if kind == _ENUM:
            indices = pa.Array.from_buffers(pa.int32(), count, [validity, pa.py_buffer(values)])
            return cast(pa.Array, node.symbols).take(indices)
        if kind == _RECORD:
            top_flags = flags if index == 0 and validity is not None else None
            children = [self._array(child, buffers, count, top_flags) for child in node.children]
            fields = [pa.field(name, child.type) for name, child in zip(node.names, children, strict=True)]
            return pa.Array.from_buffers(pa.struct(fields), count, [validity], children=children)
        child_node = self.nodes[node.children[0]]
        entry_offsets = np.frombuffer(offsets, np.int64)
        entries = int(entry_offsets[-1])
        item = self._array(node.children[0], buffers, entries, None)
        if kind == _ARRAY:
            list_type = pa.large_list(pa.field("element", item.type, nullable=child_node.nullable))
            return pa.Array.from_buffers(list_type, count, [validity, pa.py_buffer(offsets)], children=[item])
        keys = pa.Array.from_buffers(pa.large_string(), entries, [None, pa.py_buffer(key_offsets), pa.py_buffer(chars)])
        map_type = pa.map_(pa.field("key", pa.large_string(), nullable=False),
                           pa.field("value", item.type, nullable=child_node.nullable))
        if entries > np.iinfo(np.int32).max:
            raise pa.ArrowCapacityError(f"{self.what}: map {node.path} has more than 2^31 entries in one batch")
        entry_struct = pa.StructArray.from_arrays([keys, item], fields=[map_type.key_field, map_type.item_field])
        return pa.Array.from_buffers(map_type, count, [validity, pa.py_buffer(entry_offsets.astype(np.int32))],
                                     children=[entry_struct])


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """`array` (of a writer's shape) as the table type `target`: struct fields by name (missing ones null), lists and
    maps item by item, leaves cast (widening); raises `pa.ArrowInvalid` & co. when a value does not fit."""
    if array.type.equals(target):
        return array if array.type.equals(target, check_metadata=True) else array.cast(target)
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        by_name = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = [conform(array.field(by_name[f.name]), f.type) if f.name in by_name
                    else pa.nulls(len(array), f.type) for f in target]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_null_mask(array))
    if pa.types.is_map(target) and pa.types.is_map(array.type):
        entries = cast(pa.MapArray, array)
        return pa.MapArray.from_arrays(entries.offsets, conform(entries.keys, target.key_type),
                                       conform(entries.items, target.item_type), type=target, mask=_null_mask(array))
    if (pa.types.is_large_list(target) or pa.types.is_list(target)) and (
            pa.types.is_large_list(array.type) or pa.types.is_list(array.type)):
        array_class = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
        offsets = array.offsets.cast(pa.int64() if pa.types.is_large_list(target) else pa.int32())
        values = conform(array.values, target.value_type)
        return array_class.from_arrays(offsets, values, type=target, mask=_null_mask(array))
    if target == pa.uuid():
        if pa.types.is_fixed_size_binary(array.type) and array.type.byte_width == 16:
            return pa.ExtensionArray.from_storage(pa.uuid(), array)
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            return uuid_array(array.cast(pa.string()))
    return array.cast(target)


def _null_mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def conform_column(array: pa.Array, target: pa.Field, reasons: list[str | None], rows: Sequence[int]) -> pa.Array:
    """`conform` of one column; when some value does not fit, row by row: those rows are made invalid
    (`reasons[rows[i]]`, naming the column) and null, the rest keep their values."""
    try:
        return conform(array, target.type)
    except _CONVERSION_ERRORS:
        pass
    pieces = []
    for position in range(len(array)):
        piece = array.slice(position, 1)
        try:
            pieces.append(conform(piece, target.type))
        except _CONVERSION_ERRORS as exc:
            row = rows[position]
            reasons[row] = reasons[row] or (f"{target.name}: {piece.to_pylist()[0]!r} does not fit the column type "
                                            f"{target.type} ({exc})")
            pieces.append(pa.nulls(1, target.type))
    return pa.concat_arrays(pieces) if pieces else pa.array([], type=target.type)


def record_columns(record: pa.StructArray, value_schema: pa.Schema, reasons: list[str | None],
                   rows: Sequence[int]) -> list[pa.Array]:
    """The table's value columns of decoded records, by name (`AvroProgram.decode` made its fields null where the
    record is)."""
    by_name: Mapping[str, int] = {record.type.field(i).name: i for i in range(record.type.num_fields)}
    columns = []
    for target in value_schema:
        if target.name not in by_name:
            columns.append(pa.nulls(len(record), target.type))
            continue
        column = record.field(by_name[target.name])
        columns.append(conform_column(column, target, reasons, rows))
    return columns

