"""The fuzz inputs of the columnar Avro decoder (fuzz/avro_fuzz.py) and their seed corpus.

An input is one byte of choices, then the values' bytes:
  byte 0, bits 0-3: the writer schema, `SCHEMAS[bits % len(SCHEMAS)]`;
  bit 4: several values: the rest is a run of values, each a length byte then that many bytes (the last one takes
         what is left), so a value that fails sits between values that decode (the decoder rolls its buffers back);
  bit 5: bare values (the subject's latest schema id, no wire header) instead of the Confluent wire format.
`decode_input` decodes an input through `AvroValueDecoder.decode`, the executors' entry point, and checks what it
returns. `python -m kafscale_lakehouse_tests.fuzz.avro_inputs` rewrites the seed corpus (fuzz/corpus/avro) from
random valid values of every schema (fixed seed); with a directory argument, it writes there the seeds cut at every
byte (`truncated_inputs`), which scripts/fuzz-avro.sh generates for each run rather than keeping them in the corpus.
"""

from __future__ import annotations

import io
import json
import logging
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from kafscale_lakehouse.apps.workload import PIZZA_AVRO_SCHEMA
from kafscale_lakehouse.value_formats.avro import AvroValueDecoder, avro_value_fields, parse_avro_schema
from kafscale_lakehouse.value_formats.framed import WIRE_MAGIC, FramedValueSchemas
from kafscale_lakehouse_tests.formats.test_avro_columns import ALL_TYPES_V1, ALL_TYPES_V2, random_value

log = logging.getLogger(__name__)

CORPUS = Path(__file__).parent / "corpus" / "avro"
MULTI, BARE = 0x10, 0x20
SCHEMA_ID = 3



def _record(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


_GEO = _record("Geo", ("lat", "double"), ("lon", "float"))


@dataclass(frozen=True)
class FuzzSchema:
    """A writer schema and the table schema (`table`, default the writer's) its values land in."""

    name: str
    writer: dict[str, Any]
    table: dict[str, Any] | None = None


SCHEMAS: tuple[FuzzSchema, ...] = (
    FuzzSchema("nested", _record(
        "Nested",
        ("id", "long"),
        ("home", _record("Address", ("street", "string"), ("zip", ["null", "int"]), ("geo", ["null", _GEO]))),
        ("work", ["Address", "null"]),
        ("deep", _record("L1", ("l2", ["null", _record("L2", ("l3", _record("L3", ("leaf", ["null", "boolean"]))))]))),
    )),
    FuzzSchema("collections", _record(
        "Collections",
        ("scores", {"type": "array", "items": ["null", "int"]}),
        ("matrix", {"type": "array", "items": {"type": "array", "items": "double"}}),
        ("by_name", {"type": "map", "values": _record("Point", ("x", "int"), ("y", ["null", "long"]))}),
        ("weights", {"type": "map", "values": ["null", "double"]}),
        ("tags", {"type": "map", "values": {"type": "array", "items": "string"}}),
        ("maybe_list", ["null", {"type": "array", "items": "long"}]),
        ("nested_maps", {"type": "array", "items": {"type": "map", "values": "bytes"}}),
    )),
    FuzzSchema("decimals", _record(
        "Decimals",
        ("price", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}),
        ("amount", {"type": "fixed", "name": "Amount", "size": 8, "logicalType": "decimal", "precision": 18,
                    "scale": 4}),
        ("huge", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 0}),
        ("wide", {"type": "fixed", "name": "Wide", "size": 20, "logicalType": "decimal", "precision": 38,
                  "scale": 2}),
        ("digit", ["null", {"type": "bytes", "logicalType": "decimal", "precision": 1, "scale": 0}]),
        ("prices", {"type": "array", "items": {"type": "fixed", "name": "Cents", "size": 3, "logicalType": "decimal",
                                               "precision": 6, "scale": 2}}),
    )),
    FuzzSchema("text", _record(
        "Text",
        ("name", "string"),
        ("blob", "bytes"),
        ("note", ["null", "string"]),
        ("id_text", {"type": "string", "logicalType": "uuid"}),
        ("id_fixed", {"type": "fixed", "name": "Id", "size": 16, "logicalType": "uuid"}),
        ("words", {"type": "array", "items": "string"}),
    )),
    FuzzSchema("enums_fixed", _record(
        "EnumsFixed",
        ("color", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}),
        ("maybe_color", ["null", "Color"]),
        ("code", {"type": "fixed", "name": "Code", "size": 3}),
        ("flag", "boolean"),
        ("flags", {"type": "array", "items": "boolean"}),
        ("colors", {"type": "map", "values": "Color"}),
    )),
    FuzzSchema("times", _record(
        "Times",
        ("day", {"type": "int", "logicalType": "date"}),
        ("clock_ms", {"type": "int", "logicalType": "time-millis"}),
        ("clock_us", {"type": "long", "logicalType": "time-micros"}),
        ("at_ms", {"type": "long", "logicalType": "timestamp-millis"}),
        ("at_us", {"type": "long", "logicalType": "timestamp-micros"}),
        ("local_ms", {"type": "long", "logicalType": "local-timestamp-millis"}),
        ("local_us", ["null", {"type": "long", "logicalType": "local-timestamp-micros"}]),
    )),
    FuzzSchema("numbers", _record(
        "Numbers",
        ("small", "int"), ("big", "long"), ("ratio", "float"), ("exact", "double"),
        ("maybe_long", ["long", "null"]), ("widen_int", "int"), ("widen_float", "float"),
    ), table=_record(
        "Numbers",
        ("small", "int"), ("big", "long"), ("ratio", "float"), ("exact", "double"),
        ("maybe_long", ["long", "null"]), ("widen_int", "long"), ("widen_float", "double"),
        ("added", ["null", "string"]),
    )),
    # Items of no bytes: the bytes left do not bound an array's count, a cap does.
    FuzzSchema("empty_items", _record(
        "EmptyItems",
        ("marks", {"type": "array", "items": {"type": "fixed", "name": "Mark", "size": 0}}),
        ("nothing", {"type": "map", "values": "Mark"}),
        ("lists", {"type": "array", "items": {"type": "array", "items": "Mark"}}),
    )),
    FuzzSchema("everything", ALL_TYPES_V1, table=ALL_TYPES_V2),
    FuzzSchema("pizza", PIZZA_AVRO_SCHEMA),
)


def _value_schema(avro: dict[str, Any]) -> pa.Schema:
    return schema_to_pyarrow(Schema(*avro_value_fields(parse_avro_schema(json.dumps(avro), what="fuzz"), what="fuzz")))


class FuzzDecoders:
    """One `AvroValueDecoder` per schema and framing, built once (as an executor task keeps its decoder)."""

    def __init__(self) -> None:
        self.decoders: dict[tuple[int, bool], AvroValueDecoder] = {}
        for index, schema in enumerate(SCHEMAS):
            value_schema = _value_schema(schema.table or schema.writer)
            for bare in (False, True):
                settings = FramedValueSchemas(f"{schema.name}-value", {SCHEMA_ID: json.dumps(schema.writer)},
                                              value_schema, latest_id=SCHEMA_ID if bare else None)
                self.decoders[(index, bare)] = AvroValueDecoder(settings)


def split_input(data: bytes) -> tuple[int, bool, list[bytes]]:
    """(schema index, bare, the values' bytes) of an input (module docstring)."""
    if not data:
        return 0, False, [b""]
    choice, rest = data[0], data[1:]
    if not choice & MULTI:
        return (choice & 0x0F) % len(SCHEMAS), bool(choice & BARE), [rest]
    values = []
    while rest:
        length, rest = rest[0], rest[1:]
        values.append(rest[:length])
        rest = rest[length:]
    return (choice & 0x0F) % len(SCHEMAS), bool(choice & BARE), values or [b""]


def binary_array(values: list[bytes]) -> pa.BinaryArray:
    """`values` as a binary array whose data and offsets buffers are malloc'd copies of exactly their size (numpy's),
    so AddressSanitizer sees a read past the last value's end; sliced by one leading value (a non-zero array
    offset)."""
    data = np.frombuffer(b"".join([b"\xaa", *values]), np.uint8).copy()
    offsets = np.cumsum([0, 1, *(len(v) for v in values)], dtype=np.int32)
    array = pa.Array.from_buffers(pa.binary(), len(values) + 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return array.slice(1)


def decode_input(decoders: FuzzDecoders, data: bytes) -> list[str | None]:
    """Decodes one input and checks the result: every row is there, the columns are valid Arrow arrays of the table's
    types, a value that did not decode is a row of nulls with the reason; its rows' reasons. Raises AssertionError on
    a result that breaks these, and whatever the decoder raises."""
    index, bare, payloads = split_input(data)
    decoder = decoders.decoders[(index, bare)]
    header = b"" if bare else bytes([WIRE_MAGIC]) + SCHEMA_ID.to_bytes(4, "big")
    values = binary_array([header + payload for payload in payloads])
    decoded = decoder.decode(values)
    assert decoded.stop is None, f"stopped at {decoded.stop}"
    reasons = decoded.invalid_reasons.to_pylist()
    assert len(reasons) == len(payloads), f"{len(reasons)} reasons for {len(payloads)} values"
    value_schema = decoder.settings.value_schema
    assert len(decoded.columns) == len(value_schema), "a column short"
    for column, target in zip(decoded.columns, value_schema, strict=True):
        assert column.type.equals(target.type), f"{target.name}: {column.type}, not {target.type}"
        assert len(column) == len(payloads), f"{target.name}: {len(column)} rows for {len(payloads)} values"
        column.validate(full=True)
    for row, reason in enumerate(reasons):
        if reason is not None and reason.startswith("value does not decode"):
            nulls = [target.name for column, target in zip(decoded.columns, value_schema, strict=True)
                     if column[row].is_valid]
            assert not nulls, f"row {row} did not decode ({reason}) but keeps {nulls}"
    return reasons


def seed_inputs(per_schema: int = 6, seed: int = 0) -> dict[str, bytes]:
    """Valid inputs of every schema (file name → input): single values, framed and bare, and runs of several."""
    rng = random.Random(seed)
    seeds: dict[str, bytes] = {}
    for index, schema in enumerate(SCHEMAS):
        parsed = fastavro.parse_schema(schema.writer)
        expanded = parse_avro_schema(json.dumps(schema.writer), what=schema.name)  # named types inline
        values = []
        for _ in range(per_schema):
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed, random_value(rng, expanded, {}))
            values.append(out.getvalue())
        for n, value in enumerate(values):
            seeds[f"{schema.name}-{n}"] = bytes([index | (BARE if n % 2 else 0)]) + value
        short = [v for v in values if len(v) < 256][:3]
        if len(short) >= 2:
            seeds[f"{schema.name}-run"] = bytes([index | MULTI]) + b"".join(bytes([len(v)]) + v for v in short)
    return seeds


def truncated_inputs(seeds: dict[str, bytes]) -> dict[str, bytes]:
    """The shortest single-value seed of each schema cut at every byte: values out of bytes at each field, so the
    fuzz run starts from every end of input the decoder must notice (the cut is the end of the data buffer, where
    AddressSanitizer sees a read past it)."""
    shortest: dict[int, tuple[str, bytes]] = {}
    for name, data in seeds.items():
        if not data[0] & MULTI:
            index = data[0] & 0x0F
            if index not in shortest or len(data) < len(shortest[index][1]):
                shortest[index] = (name, data)
    return {f"{name}-cut{n}": data[:n] for name, data in shortest.values() for n in range(2, len(data))}


def write_seeds(directory: Path = CORPUS, *, truncated: bool = False) -> None:
    """Replaces the generated seeds in `directory` (inputs that exposed a bug, named `finding-*`, stay); `truncated`:
    the cuts of `truncated_inputs` instead."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        if not old.name.startswith("finding-"):
            old.unlink()
    seeds = truncated_inputs(seed_inputs()) if truncated else seed_inputs()
    for name, data in seeds.items():
        (directory / name).write_bytes(data)
    log.info("wrote %d seeds to %s", len(seeds), directory)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if len(sys.argv) > 1:
        write_seeds(Path(sys.argv[1]), truncated=True)
    else:
        write_seeds()
