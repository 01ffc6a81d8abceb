"""Values in the Confluent wire format, whatever their schema type: what the executors decode them with, and the
parts every format's decoder shares.

Wire format (Confluent): magic byte 0, the schema id as 4 bytes big-endian, then the value's encoding (Avro binary;
Protobuf's message indexes then the message; JSON text). With `latest` (producers that do not write the prefix)
every value is the bare encoding of one schema id.

`FramedValueSchemas` is built on the driver (value_formats/registered_tables.py) and pickled into the task spec; each
format's decoder (`value_decoder`) turns a batch of values into the table's value columns (`DecodedValues`): a null
value (tombstone) is a row of nulls, a value that does not decode is an invalid record with the reason, a schema id
the run does not know, or one whose schema could not evolve the table, stops the partition at that record.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WIRE_MAGIC = 0
WIRE_HEADER_SIZE = 5  # magic byte + 4-byte schema id

FramedValueFormat = Literal["avro", "protobuf", "json_schema"]
# The registry's schemaType of each format
REGISTRY_SCHEMA_TYPES: Mapping[str, str] = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}


@dataclass(frozen=True)
class FramedValueSchemas:
    """What the executors need to decode a mapping's values; built on the driver, pickled into the task spec.

    `schemas`: schema id → schema text (Avro JSON; Protobuf: the base64 `FileDescriptorProto` the registry serves
    with `format=serialized`; a JSON Schema document), every version of `subject` known when the run started;
    `refused`: schema id → why its records cannot land (its schema could not evolve the table); `value_schema`: the
    table's columns after the base columns, as Arrow (the types the decoded columns are built as); `latest_id`:
    values carry no wire-format prefix and are all of this schema id; `message_name`: Protobuf only, the full name of
    the message the table's columns come from; `imports`: Protobuf only, schema id → (import name, serialized
    FileDescriptorProto) of the schemas it imports through registry references, imports first."""

    subject: str
    schemas: Mapping[int, str]
    value_schema: pa.Schema
    refused: Mapping[int, str] = field(default_factory=dict)
    latest_id: int | None = None
    value_format: FramedValueFormat = "avro"
    message_name: str | None = None
    imports: Mapping[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def unknown_schema(self, schema_id: int) -> str:
        """Why a record of `schema_id`, which is not in `schemas`, stops its partition."""
        known = ", ".join(str(i) for i in sorted(self.schemas)) or "none"
        return (f"schema id {schema_id} is not a version of subject {self.subject} known to this run "
                f"(ids {known}); registered since the run started, or under another subject")


@dataclass(frozen=True)
class DecodeStop:
    """The partition stops at `row`: records from it on are not delivered."""

    row: int
    schema_id: int | None
    reason: str


@dataclass(frozen=True)
class DecodedValues:
    """Value columns (in `value_schema` order) and the invalid reason per row (null for valid rows and tombstones),
    for the rows before `stop` (all rows when `stop` is None)."""

    columns: list[pa.Array]
    invalid_reasons: pa.StringArray
    stop: DecodeStop | None = None


class ValueDecoder(Protocol):
    settings: FramedValueSchemas

    def decode(self, values: pa.Array) -> DecodedValues: ...


class FramedValueDecoder:
    """The per-batch loop every registry format shares (one decoder per executor task): each value's schema id from
    its wire header (or the subject's latest), a refused or unknown id stops the partition at that row, a value that
    does not read is an invalid record with its reason, tombstones stay null; `read` decodes one value."""

    def __init__(self, schemas: FramedValueSchemas) -> None:
        self.settings = schemas

    def decode(self, values: pa.Array) -> DecodedValues:
        # A batch allocates a dict or list per record and nested value, none of them in a cycle: the cyclic garbage
        # collector would walk them all again and again as they pile up (1.5x the decoding time on 65k orders).
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if pa.types.is_large_binary(values.type):
            values = values.cast(pa.binary())
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._decode(values)
        finally:
            if collecting:
                gc.enable()

    def read(self, value: bytes, schema_id: int, bare: bool) -> tuple[dict[str, Any] | None, str | None]:
        """(record, None) or (None, why the value is invalid); `bare`: no wire header (the subject's latest mode)."""
        raise NotImplementedError

    def _decode(self, values: pa.Array) -> DecodedValues:
        framing = frame_values(self.settings, values)
        records: list[dict[str, Any] | None] = [None] * framing.rows
        reasons = framing.reasons
        bare = self.settings.latest_id is not None
        for row, value in enumerate(values.slice(0, framing.rows).to_pylist()):
            schema_id = int(framing.schema_ids[row])
            if schema_id >= 0:
                records[row], reasons[row] = self.read(value, schema_id, bare)
        columns = [arrow_column(f, records, reasons) for f in self.settings.value_schema]
        return DecodedValues(columns, pa.array(reasons, pa.string()), framing.stop)


@dataclass(frozen=True)
class Framing:
    """The rows of a batch of framed values up to its stop: `schema_ids[row]` the schema id to decode the value
    with, -1 for a tombstone or a value not in the wire format (`reasons[row]` says why); `skip` the header bytes."""

    rows: int
    schema_ids: np.ndarray
    reasons: list[str | None]
    stop: DecodeStop | None
    skip: int


def frame_values(settings: FramedValueSchemas, values: pa.Array) -> Framing:
    """Each value's schema id from its wire header (or the subject's latest), vectorized; a refused or unknown id
    stops the partition at that row; tombstones stay null."""
    count = len(values)
    valid = np.ones(count, bool) if values.null_count == 0 else values.is_valid().to_numpy(zero_copy_only=False)
    if settings.latest_id is not None:
        schema_ids = np.where(valid, settings.latest_id, -1).astype(np.int64)
        framed, skip = valid, 0
    else:
        offsets, data = _binary_buffers(values)
        starts = offsets[:-1].astype(np.int64)
        framed = valid & (np.diff(offsets) >= WIRE_HEADER_SIZE)
        header = np.where(framed, starts, 0)[:, None] + np.arange(WIRE_HEADER_SIZE)
        heads = data[np.minimum(header, max(len(data) - 1, 0))] if len(data) else np.zeros((count, 5), np.uint8)
        framed &= heads[:, 0] == WIRE_MAGIC
        ids = heads[:, 1:].astype(np.int64) @ np.array([1 << 24, 1 << 16, 1 << 8, 1], np.int64)
        schema_ids, skip = np.where(framed, ids, -1), WIRE_HEADER_SIZE
    reasons: list[str | None] = [None] * count
    for row in np.flatnonzero(valid & ~framed):
        reasons[row] = wire_header(values[row].as_py())[1]
    stop = None
    present = np.unique(schema_ids[schema_ids >= 0])
    stopping = [i for i in present.tolist() if i in settings.refused or i not in settings.schemas]
    if stopping:
        stop_row = int(np.flatnonzero(np.isin(schema_ids, stopping))[0])
        schema_id = int(schema_ids[stop_row])
        stop = DecodeStop(stop_row, schema_id, settings.refused.get(schema_id) or settings.unknown_schema(schema_id))
        count = stop_row
    return Framing(count, schema_ids[:count], reasons[:count], stop, skip)


def _binary_buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, data bytes) of a binary array, as numpy views."""
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], np.int32, count=len(values) + 1, offset=values.offset * 4) \
        if buffers[1] is not None else np.zeros(1, np.int32)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def wire_header(value: bytes) -> tuple[int | None, str | None]:
    """(schema id, None) of a framed value, or (None, why it is not one)."""
    if len(value) < WIRE_HEADER_SIZE or value[0] != WIRE_MAGIC:
        what = f"magic byte {value[0]}" if value else "an empty value"
        return None, (f"value is not in the Confluent wire format ({what}, {len(value)} bytes; expected magic byte 0 "
                      "and a 4-byte schema id)")
    return int.from_bytes(value[1:WIRE_HEADER_SIZE], "big"), None


def arrow_column(target: pa.Field, records: Sequence[Mapping[str, Any] | None], reasons: list[str | None]) -> pa.Array:
    """Column `target` of the decoded `records` (dicts by field name; None for tombstones and invalid records), in
    one pyarrow call; a record whose value does not fit the column's type is made invalid (`reasons`) and null."""
    name = target.name
    items = [None if r is None else r.get(name) for r in records]
    try:
        if target.type == pa.uuid():
            return uuid_array(pa.array(items, pa.string()))
        return pa.array(items, type=target.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    # Some value does not fit the table's type: find those records, make them invalid, keep the rest.
    converted = []
    for row, item in enumerate(items):
        try:
            if target.type == pa.uuid() and isinstance(item, str):
                item = uuid.UUID(item)
            converted.append(pa.array([item], type=target.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:  # ValueError: uuid.UUID's
            reasons[row] = reasons[row] or f"{name}: {item!r} does not fit the column type {target.type} ({exc})"
            converted.append(pa.nulls(1, target.type))
    return pa.concat_arrays(converted) if converted else pa.array([], type=target.type)


_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX_VALUES[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def uuid_array(strings: pa.StringArray) -> pa.Array:
    """Canonical UUID strings (`8-4-4-4-12` hex digits) as an Arrow uuid array, vectorized; `ArrowInvalid` when
    one is not such a string."""
    count = len(strings)
    hex_digits = pc.replace_substring(strings.fill_null("0" * 32), "-", "")
    if count and not pc.all(pc.equal(pc.binary_length(hex_digits), 32)).as_py():
        raise pa.ArrowInvalid("a value is not a UUID string")
    start = int(np.frombuffer(hex_digits.buffers()[1], np.int32, count=1, offset=hex_digits.offset * 4)[0])
    digits = np.frombuffer(hex_digits.buffers()[2], np.uint8, count=count * 32, offset=start)
    nibbles = _HEX_VALUES[digits]
    if (nibbles == 255).any():
        raise pa.ArrowInvalid("a value is not a UUID string")
    packed = (nibbles[0::2] << 4) | nibbles[1::2]
    validity = None if strings.null_count == 0 else pc.is_valid(strings).buffers()[1]
    storage = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), count, [validity, pa.py_buffer(packed.tobytes())])
    return pa.ExtensionArray.from_storage(pa.uuid(), storage)
