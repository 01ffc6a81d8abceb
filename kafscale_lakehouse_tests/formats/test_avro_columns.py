"""The columnar Avro decoder (value_formats/avro_columns.py and its C extension) against fastavro, the reference reader.

Every row is compared with what fastavro reads from the same bytes (with the writer schema, all logical types),
put into the table's column types by pyarrow (`arrow_column`, the per-record path). Randomized values print their
seed; set AVRO_COLUMNS_SEED to replay one.
"""

from __future__ import annotations

import ast
import datetime
import decimal
import io
import json
import math
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from kafscale_lakehouse.apps.workload import PIZZA_AVRO_SCHEMA, pizza_order_as_avro, pizza_orders
from kafscale_lakehouse.value_formats.avro import (
    AvroValueDecoder,
    avro_value_fields,
    encode_framed_avro,
    parse_avro_schema,
)
from kafscale_lakehouse.value_formats.framed import WIRE_HEADER_SIZE, FramedValueSchemas, arrow_column
from kafscale_lakehouse_tests.formats.avro_orders import ORDER_V1, ORDER_V2, framed, order

ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"},
    {"name": "zip", "type": ["null", "int"]},
    {"name": "geo", "type": ["null", {"type": "record", "name": "Geo", "fields": [
        {"name": "lat", "type": "double"}, {"name": "lon", "type": "float"}]}]},
]}
# Every Avro type the module docstring lists; V1 writes, the table is V2's (evolution: int -> long, float -> double,
# a field V1 lacks).
ALL_TYPES_V1: dict[str, Any] = {"type": "record", "name": "Everything", "namespace": "t", "fields": [
    {"name": "flag", "type": "boolean"},
    {"name": "small", "type": "int"},
    {"name": "big", "type": "long"},
    {"name": "ratio", "type": "float"},
    {"name": "exact", "type": "double"},
    {"name": "text", "type": "string"},
    {"name": "blob", "type": "bytes"},
    {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
    {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}},
    {"name": "amount", "type": {"type": "fixed", "name": "Amount", "size": 8, "logicalType": "decimal",
                                "precision": 18, "scale": 4}},
    {"name": "huge", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 0}},
    # wider than 128 bits: the leading bytes are sign extension
    {"name": "wide", "type": {"type": "fixed", "name": "Wide", "size": 20, "logicalType": "decimal",
                              "precision": 38, "scale": 2}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "clock_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "clock_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "local_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "id_text", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "id_fixed", "type": {"type": "fixed", "name": "Id", "size": 16, "logicalType": "uuid"}},
    {"name": "maybe_text", "type": ["null", "string"], "default": None},
    {"name": "maybe_long", "type": ["long", "null"], "default": 0},
    {"name": "maybe_day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
    {"name": "home", "type": ADDRESS},
    {"name": "work", "type": ["null", "Address"], "default": None},
    {"name": "addresses", "type": {"type": "array", "items": "Address"}},
    {"name": "scores", "type": {"type": "array", "items": ["null", "int"]}},
    {"name": "matrix", "type": {"type": "array", "items": {"type": "array", "items": "double"}}},
    {"name": "by_name", "type": {"type": "map", "values": "Address"}},
    {"name": "weights", "type": {"type": "map", "values": ["null", "double"]}},
    {"name": "tags", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
    {"name": "maybe_list", "type": ["null", {"type": "array", "items": "long"}], "default": None},
    {"name": "widen_int", "type": "int"},
    {"name": "widen_float", "type": "float"},
]}
ALL_TYPES_V2: dict[str, Any] = {**ALL_TYPES_V1, "fields": [
    *[f for f in ALL_TYPES_V1["fields"] if not f["name"].startswith("widen_")],
    {"name": "widen_int", "type": "long"},
    {"name": "widen_float", "type": "double"},
    {"name": "added", "type": ["null", "string"], "default": None},
]}


def _value_schema(avro: dict[str, Any]) -> pa.Schema:
    return schema_to_pyarrow(Schema(*avro_value_fields(parse_avro_schema(json.dumps(avro), what="t"), what="t")))


def _seed() -> int:
    seed = int(os.environ.get("AVRO_COLUMNS_SEED", time.time_ns() % 2**32))
    print(f"AVRO_COLUMNS_SEED={seed}")
    return seed


# ------------------------------------------------------------------------------------------ random values


def random_value(rng: random.Random, avro: Any, named: dict[str, Any]) -> Any:
    """A random value of the (expanded or named) Avro type `avro`, in the form fastavro's writer takes."""
    if isinstance(avro, list):
        return random_value(rng, rng.choice(avro), named)
    if isinstance(avro, str) and avro in named:
        return random_value(rng, named[avro], named)
    if isinstance(avro, dict) and isinstance(avro["type"], dict | list):
        return random_value(rng, avro["type"], named)
    kind = avro if isinstance(avro, str) else avro["type"]
    logical = None if isinstance(avro, str) else avro.get("logicalType")
    if isinstance(avro, dict) and "name" in avro:
        named[avro["name"]] = avro
        named[f"{avro.get('namespace', 't')}.{avro['name']}"] = avro
    if logical == "decimal":
        digits = rng.choice([1, 3, avro["precision"]])
        unscaled = rng.randint(-(10**digits) + 1, 10**digits - 1)
        return decimal.Decimal(unscaled).scaleb(-avro.get("scale", 0))
    if logical == "date":
        return datetime.date(1, 1, 1) + datetime.timedelta(days=rng.choice([0, 3652058, rng.randint(0, 3652058)]))
    if logical in ("time-millis", "time-micros"):
        micros = rng.randint(0, 86_399_999_999)
        if logical == "time-millis":
            micros -= micros % 1000
        return (datetime.datetime(2000, 1, 1) + datetime.timedelta(microseconds=micros)).time()
    if logical is not None and "timestamp" in logical:
        micros = rng.choice([0, -1000, rng.randint(-62135596800000000, 253402300799999999)])
        if logical.endswith("millis"):
            micros -= micros % 1000
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
        return moment if logical.startswith("local-") else moment.replace(tzinfo=datetime.UTC)
    if logical == "uuid":
        value = uuid.UUID(int=rng.getrandbits(128))
        return value.bytes if kind == "fixed" else str(value)
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 2**31 - 1, -(2**31), rng.randint(-300, 300), rng.randint(-(2**31), 2**31 - 1)])
    if kind == "long":
        return rng.choice([0, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1), rng.randint(-99, 99)])
    if kind in ("float", "double"):
        return rng.choice([0.0, -0.0, 1.5, rng.uniform(-1e9, 1e9), float("inf")])
    if kind == "string":
        return "".join(rng.choice("aZ09 _-é€\U0001f355\u0000") for _ in range(rng.randint(0, 12)))
    if kind == "bytes":
        return rng.randbytes(rng.randint(0, 10))
    if kind == "fixed":
        return rng.randbytes(avro["size"])
    if kind == "enum":
        return rng.choice(avro["symbols"])
    if kind == "record":
        return {f["name"]: random_value(rng, f["type"], named) for f in avro["fields"]}
    if kind == "array":
        return [random_value(rng, avro["items"], named) for _ in range(rng.randint(0, 3))]
    if kind == "map":
        return {f"k{rng.randint(0, 99)}é": random_value(rng, avro["values"], named) for _ in range(rng.randint(0, 3))}
    raise AssertionError(f"no random value of {avro!r}")


# ------------------------------------------------------------------------------------------ the reference


def reference_row(value: bytes, parsed: Any, value_schema: pa.Schema) -> tuple[dict[str, Any] | None, str | None]:
    """(row, None) as fastavro reads `value` (framed) and pyarrow puts it in the table's types, or (None, why not)."""
    stream = io.BytesIO(value)
    stream.seek(WIRE_HEADER_SIZE)
    try:
        record = fastavro.schemaless_reader(stream, parsed, None)
    except Exception as exc:
        return None, f"fastavro: {type(exc).__name__}: {exc}"
    if stream.tell() != len(value):
        return None, f"fastavro left {len(value) - stream.tell()} bytes"
    reasons: list[str | None] = [None]
    row = {f.name: arrow_column(f, [record], reasons).to_pylist()[0] for f in value_schema}
    return (None, reasons[0]) if reasons[0] else (row, None)


def normal(value: Any, arrow_type: pa.DataType) -> Any:
    """A value as compared: maps as dicts (fastavro keeps the last of duplicate keys), NaN as a string, uuids as
    strings."""
    if value is None:
        return None
    if arrow_type == pa.uuid():
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=value))
    if pa.types.is_struct(arrow_type):
        return {f.name: normal(value[f.name], f.type) for f in arrow_type}
    if pa.types.is_map(arrow_type):
        return {k: normal(v, arrow_type.item_type) for k, v in value}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [normal(v, arrow_type.value_type) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def decoded_rows(decoder: AvroValueDecoder, values: list[bytes | None]) -> tuple[list[dict[str, Any]], list[Any]]:
    decoded = decoder.decode(pa.array(values, pa.binary()))
    assert decoded.stop is None
    table = pa.Table.from_arrays(decoded.columns, schema=decoder.settings.value_schema)
    return table.to_pylist(), decoded.invalid_reasons.to_pylist()


def assert_rows_match(decoder: AvroValueDecoder, values: list[bytes], parsed: dict[int, Any],
                      strict_ok: tuple[str, ...] = ()) -> int:
    """Decodes `values` in one batch and checks each row against the reference; the count of rows the reference
    reads. `strict_ok`: reasons for which we may refuse a value the reference reads (encodings the Avro spec rules
    out but fastavro takes)."""
    schema = decoder.settings.value_schema
    struct = pa.struct(list(schema))
    rows, reasons = decoded_rows(decoder, list(values))
    readable = 0
    for row, (ours, reason, value) in enumerate(zip(rows, reasons, values, strict=True)):
        expected, why = reference_row(value, parsed[int.from_bytes(value[1:5], "big")], schema)
        if expected is None:
            assert reason is not None, f"row {row}: {value!r} decoded though the reference refuses it ({why})"
            if reason.startswith("value does not decode as Avro schema id"):
                assert all(v is None for v in ours.values()), f"row {row}: a value that did not decode keeps values"
            else:  # decoded, but a value does not fit its column (as the per-record path): that column is null
                column = reason.split(":")[0]
                assert "does not fit the column type" in reason and ours[column] is None, f"row {row}: {reason}"
            continue
        readable += 1
        if reason is not None and any(s in reason for s in strict_ok):
            continue
        assert reason is None, f"row {row}: {value!r} refused ({reason}), the reference reads {expected}"
        assert normal(ours, struct) == normal(expected, struct), f"row {row}: {value!r}"
    return readable


# ------------------------------------------------------------------------------------------ the tests


def test_every_avro_type_decodes_as_fastavro_reads_it() -> None:
    rng = random.Random(_seed())
    value_schema = _value_schema(ALL_TYPES_V2)
    schemas = {1: ALL_TYPES_V1, 2: ALL_TYPES_V2}
    decoder = AvroValueDecoder(FramedValueSchemas("t-value", {i: json.dumps(s) for i, s in schemas.items()},
                                                  value_schema))
    parsed = {i: fastavro.parse_schema(s) for i, s in schemas.items()}
    values = []
    for _ in range(300):
        schema_id = rng.choice([1, 2])
        record = random_value(rng, schemas[schema_id], {})
        values.append(encode_framed_avro(schema_id, parsed[schema_id], record))
    assert assert_rows_match(decoder, values, parsed) == len(values)  # every random value is valid
    rows, _ = decoded_rows(decoder, values)
    v1_rows = [r for r, v in zip(rows, values, strict=True) if v[4] == 1]
    assert v1_rows and all(r["added"] is None for r in v1_rows)  # a field the writer lacks is null
    assert value_schema.field("widen_int").type == pa.int64()


def test_values_of_a_schema_rows_of_another_and_tombstones_keep_their_rows() -> None:
    rng = random.Random(_seed())
    decoder = AvroValueDecoder(FramedValueSchemas("orders-value", {1: json.dumps(ORDER_V1), 2: json.dumps(ORDER_V2)},
                                                  _value_schema(ORDER_V2)))
    values: list[bytes | None] = []
    for n in range(200):
        kind = rng.choice(["v1", "v2", "tombstone", "junk"])
        if kind == "v1":
            values.append(framed(1, ORDER_V1, order(n)))
        elif kind == "v2":
            values.append(framed(2, ORDER_V2, order(n, version=2)))
        else:
            values.append(None if kind == "tombstone" else b"\x01junk")
    rows, reasons = decoded_rows(decoder, values)
    for n, (row, reason, value) in enumerate(zip(rows, reasons, values, strict=True)):
        if value is None:
            assert reason is None and all(v is None for v in row.values())
        elif value == b"\x01junk":
            assert reason is not None and "not in the Confluent wire format" in reason
        else:
            assert reason is None
            single, _ = decoded_rows(decoder, [value])
            assert row == single[0] and row["store_id"] == n % 10


def test_the_value_record_fails_and_its_neighbours_do_not() -> None:
    """Truncated, padded and bit-flipped values: never a crash; what fastavro reads completely decodes alike, what
    it refuses (or leaves bytes of) is an invalid row with the reason; the valid values around them are unaffected."""
    seed = _seed()
    rng = random.Random(seed)
    pizza = fastavro.parse_schema(PIZZA_AVRO_SCHEMA)
    parsed = {1: fastavro.parse_schema(ALL_TYPES_V2), 7: pizza}
    schemas = {1: json.dumps(ALL_TYPES_V2), 7: json.dumps(PIZZA_AVRO_SCHEMA)}
    everything = AvroValueDecoder(FramedValueSchemas("t-value", {1: schemas[1]}, _value_schema(ALL_TYPES_V2)))
    pizzas = AvroValueDecoder(FramedValueSchemas("p-value", {7: schemas[7]}, _value_schema(PIZZA_AVRO_SCHEMA)))
    orders = [pizza_order_as_avro(r, 7, pizza).value for r in pizza_orders(0, 40, workload="realistic")]
    cases = readable = 0
    # fastavro reads any nonzero boolean byte as true, wraps a varint beyond 64 bits and takes a negative enum index
    # or union branch as Python's list index from the end; the spec rules all four out, we refuse them. Python's
    # uuid.UUID takes a uuid string with spaces around its hex digits; a uuid column takes the canonical form only.
    strict_ok = ("boolean byte", "varint overflows", "enum index -", "union branch -", "is not a UUID string")
    for _ in range(60):
        for decoder, schema_id in ((everything, 1), (pizzas, 7)):
            batch = []
            for _ in range(25):
                good = (encode_framed_avro(1, parsed[1], random_value(rng, ALL_TYPES_V2, {})) if schema_id == 1
                        else rng.choice(orders))
                batch += [good, mutate(rng, good)]
            cases += 25
            readable += assert_rows_match(decoder, batch, parsed, strict_ok) - 25
    print(f"{cases} mutated values, {readable} of them still read by fastavro (seed {seed})")
    assert cases == 3000 and 0 < readable < cases


def mutate(rng: random.Random, value: bytes) -> bytes:
    """`value` truncated, padded or with bits flipped, after its wire header."""
    how = rng.choice(["truncate", "pad", "flip", "flip"])
    if how == "truncate":
        return value[:rng.randint(WIRE_HEADER_SIZE, len(value) - 1)]
    if how == "pad":
        return value + rng.randbytes(rng.randint(1, 4))
    flipped = bytearray(value)
    for _ in range(rng.randint(1, 3)):
        bit = rng.randrange(WIRE_HEADER_SIZE * 8, len(value) * 8)
        flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


@pytest.mark.parametrize(("payload", "reason"), [
    (b"\x02\x02\x00\x00", "boolean byte 2 is neither 0 nor 1 at flag"),
    (b"\x01" + b"\xff" * 9 + b"\x7f\x00\x00", "varint overflows 64 bits at small"),
    (b"\x01\x80\x80\x80\x80\x10\x00\x00", "int 2147483648 out of range at small"),
    (b"\x01\x02\x01\x00", "enum index -1 out of range (2 symbols) at kind"),
    (b"\x01\x02\x00\x03", "union branch -2 out of range (2 branches) at note"),
    (b"\x01\x02\x00\x02\x06\xed\xa0\x80", "string is not valid UTF-8 (byte 0) at note"),  # a surrogate
    (b"\x01\x02\x00\x00\x00", "1 bytes left after the record"),
])
def test_encodings_the_spec_rules_out_are_invalid_rows(payload: bytes, reason: str) -> None:
    """Each payload is complete (flag, small, kind, note) but for the one thing at fault."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "flag", "type": "boolean"}, {"name": "small", "type": "int"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "note", "type": ["null", "string"]}]}
    decoder = AvroValueDecoder(FramedValueSchemas("r-value", {3: json.dumps(schema)}, _value_schema(schema)))
    good = framed(3, schema, {"flag": True, "small": 5, "kind": "B", "note": "é"})
    rows, reasons = decoded_rows(decoder, [good, b"\x00\x00\x00\x00\x03" + payload, good])
    assert reasons == [None, f"value does not decode as Avro schema id 3: {reason}", None]
    assert rows[0] == rows[2] == {"flag": True, "small": 5, "kind": "B", "note": "é"}
    assert rows[1] == {"flag": None, "small": None, "kind": None, "note": None}


def test_an_array_of_items_of_no_bytes_cannot_claim_billions_of_items() -> None:
    """Such items (a fixed of size 0; records without fields have no Iceberg type) take no bytes, so the bytes left
    do not bound their count: a cap does (a value of a few bytes would keep the decoder busy for hours otherwise)."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "marks", "type": {"type": "array", "items": {"type": "fixed", "name": "Mark", "size": 0}}}]}
    decoder = AvroValueDecoder(FramedValueSchemas("r-value", {3: json.dumps(schema)}, _value_schema(schema)))
    good = framed(3, schema, {"marks": [b"", b""]})
    block = b"\x80\x80\x80\x80\x01"  # 2^27 items
    billions = b"\x00\x00\x00\x00\x03" + block * 40 + b"\x00"  # 40 blocks of them, then the end
    started = time.perf_counter()
    rows, reasons = decoded_rows(decoder, [good, billions, good])
    assert time.perf_counter() - started < 5
    assert reasons[0] is None and reasons[2] is None and rows[0] == rows[2] == {"marks": [b"", b""]}
    assert reasons[1] is not None and "block of 134217728 items" in reasons[1] and reasons[1].endswith("at marks")


EMPTY_ITEMS_SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "marks", "type": {"type": "array", "items": {"type": "fixed", "name": "Mark", "size": 0}}}]}


def empty_items_rows(values: list[bytes]) -> tuple[list[dict[str, Any]], list[Any]]:
    """`decoded_rows` of values of `EMPTY_ITEMS_SCHEMA` (schema id 3)."""
    decoder = AvroValueDecoder(FramedValueSchemas("r-value", {3: json.dumps(EMPTY_ITEMS_SCHEMA)},
                                                  _value_schema(EMPTY_ITEMS_SCHEMA)))
    return decoded_rows(decoder, list(values))


def test_a_block_of_2_63_items_of_no_bytes_after_another_block_is_refused() -> None:
    """The cap on items of no bytes counts the items of earlier blocks: a first block of one item, then one that
    claims 2^63-1 more (the sum overflows 64 bits) is refused like any count over the cap; its neighbours decode.
    Decoded in a child process: a decoder that loops over the items holds the GIL, which no timeout in this process
    could interrupt."""
    good = framed(3, EMPTY_ITEMS_SCHEMA, {"marks": [b"", b""]})
    long_max = b"\xfe" + b"\xff" * 8 + b"\x01"  # zigzag varint of 2^63-1
    claimed = b"\x00\x00\x00\x00\x03" + b"\x02" + long_max + b"\x00"  # a block of 1, then 2^63-1, then the end
    code = ("from kafscale_lakehouse_tests.formats.test_avro_columns import empty_items_rows; "
            f"print(repr(empty_items_rows({[good, claimed, good]!r})))")
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                               check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("decoding 3 values of a few bytes did not end in 60 s (the items of no bytes were counted "
                    "past the cap)")
    assert child.returncode == 0, child.stderr
    rows, reasons = ast.literal_eval(child.stdout.strip().splitlines()[-1])
    assert reasons[0] is None and reasons[2] is None and rows[0] == rows[2] == {"marks": [b"", b""]}
    assert reasons[1] == ("value does not decode as Avro schema id 3: block of 9223372036854775807 items of no bytes, "
                          "more than the 1048575 left of 1048576 in one value, at marks")
    assert rows[1] == {"marks": None}


def test_items_of_no_bytes_are_capped_per_value_across_its_arrays() -> None:
    """A cap per array would let a value of arrays of such arrays claim a million items in every 5 bytes (an hour of
    decoding per megabyte): the cap counts every array of the value. A value at the cap decodes."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "lists", "type": {"type": "array", "items": {"type": "array", "items": {
            "type": "fixed", "name": "Mark", "size": 0}}}}]}
    decoder = AvroValueDecoder(FramedValueSchemas("r-value", {3: json.dumps(schema)}, _value_schema(schema)))
    half = 1 << 19
    at_cap = framed(3, schema, {"lists": [[b""] * half, [b""] * half]})
    over_cap = framed(3, schema, {"lists": [[b""] * half, [b""] * (half + 1)]})
    rows, reasons = decoded_rows(decoder, [at_cap, over_cap, at_cap])
    assert reasons[0] is None and reasons[2] is None and [len(items) for items in rows[0]["lists"]] == [half, half]
    assert reasons[1] == ("value does not decode as Avro schema id 3: block of 524289 items of no bytes, more than the "
                          "524288 left of 1048576 in one value, at lists[]")
    assert rows[1] == {"lists": None}
