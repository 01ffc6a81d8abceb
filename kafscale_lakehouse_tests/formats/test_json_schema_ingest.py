"""A JSON Schema topic (Confluent-framed JSON, schemas in a Confluent-compatible registry) lands exactly once in a
typed, nested table: objects become structs, arrays lists, date-time/date strings timestamptz/date; a schema change
mid-topic evolves the table, a tombstone lands as a row of nulls, and a value that is not JSON or violates its schema
goes to the dead-letter table naming why. Real SeaweedFS (S3 + Iceberg REST), etcd and Spark; DuckDB reads the
data files."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import duckdb

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.formats.test_avro_ingest import _data_files_for_duckdb, _rows

ORDER_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order", "type": "object", "required": ["order_id", "placed_at"],
    "definitions": {"line": {"type": "object", "properties": {
        "sku": {"type": "string"}, "quantity": {"type": "integer"}, "unit_price": {"type": "number"}}}},
    "properties": {
        "order_id": {"type": "string"},
        "store_id": {"type": "integer"},
        "placed_at": {"type": "string", "format": "date-time"},
        "delivery_date": {"type": ["string", "null"], "format": "date"},
        "paid": {"type": "boolean"},
        "lines": {"type": "array", "items": {"$ref": "#/definitions/line"}},
        "customer": {"type": "object", "properties": {"name": {"type": "string"},
                                                      "tags": {"type": "array", "items": {"type": "string"}}}},
        "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
        "extra": {},  # any JSON: its text
    },
}
# Version 2: a nested field and a top-level field added.
ORDER_V2 = copy.deepcopy(ORDER_V1)
ORDER_V2["definitions"]["line"]["properties"]["discount"] = {"oneOf": [{"type": "null"}, {"type": "number"}]}
ORDER_V2["properties"]["coupon"] = {"type": "string"}

TOMBSTONE_AT, NOT_JSON_AT, VIOLATION_AT = 5, 7, 9
SCHEMA_CHANGE_AT, END = 20, 40
PLACED_AT = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)


def order(n: int, *, version: int = 1) -> dict[str, Any]:
    line: dict[str, Any] = {"sku": f"sku-{n % 7}", "quantity": n % 5 + 1, "unit_price": n % 50 + 0.25}
    if version >= 2:
        line["discount"] = 0.5 if n % 2 else None
    record: dict[str, Any] = {
        "order_id": f"order-{n}", "store_id": n % 10,
        "placed_at": (PLACED_AT + datetime.timedelta(seconds=n)).isoformat().replace("+00:00", "Z"),
        "delivery_date": "2026-12-01" if n % 3 else None, "paid": n % 2 == 0,
        "lines": [line] * (n % 3 + 1), "customer": {"name": f"customer {n}", "tags": ["vip"] if n % 2 else []},
        "attributes": {"channel": "web"} if n % 2 else {}, "extra": {"n": n} if n % 4 == 0 else None,
    }
    if version >= 2 and n % 4 == 0:
        record["coupon"] = f"C{n}"
    return record


def _framed(schema_id: int, record: Any) -> bytes:
    return bytes([0]) + schema_id.to_bytes(4, "big") + json.dumps(record).encode()


def test_json_schema_topic_lands_typed_and_nested_exactly_once(production_world, confluent_registry, spark, tmp_path):
    world = production_world
    subject = f"{world.topic}-value"
    ids = {1: confluent_registry.register(subject, json.dumps(ORDER_V1), "JSON"),
           2: confluent_registry.register(subject, json.dumps(ORDER_V2), "JSON")}
    records = []
    for offset in range(END):
        version = 1 if offset < SCHEMA_CHANGE_AT else 2
        value: bytes | None = _framed(ids[version], order(offset, version=version))
        if offset == TOMBSTONE_AT:
            value = None
        elif offset == NOT_JSON_AT:
            value = _framed(ids[1], "x")[:5] + b"{not json"
        elif offset == VIOLATION_AT:
            value = _framed(ids[1], {**order(offset), "store_id": "nine"})
        records.append(Record(key=f"k{offset}".encode(), value=value, timestamp_ms=1_700_000_000_000 + offset))
    world.write_records(0, 0, records)
    document = world.config_document()
    document["schema"] = {"mode": "lenient"}
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "value_format": "json_schema", "schema_registry": {"url": confluent_registry.url}}]
    config = world.config(document)

    [result] = ingest(config, spark)

    assert result.partitions[0].dead_lettered == 2
    table = world.assert_exactly_once(runs=1, expected={0: [o for o in range(END) if o not in (NOT_JSON_AT,
                                                                                               VIOLATION_AT)]})
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert {name: types[name] for name in ("order_id", "store_id", "placed_at", "delivery_date", "paid",
                                           "attributes", "extra", "coupon")} == {
        "order_id": "string", "store_id": "long", "placed_at": "timestamptz", "delivery_date": "date",
        "paid": "boolean", "attributes": "map<string, string>", "extra": "string", "coupon": "string"}
    line = table.schema().find_field("lines").field_type.element_field.field_type
    assert [(f.name, str(f.field_type)) for f in line.fields] == [
        ("sku", "string"), ("quantity", "long"), ("unit_price", "double"), ("discount", "double")]
    customer = table.schema().find_field("customer").field_type
    assert [(f.name, str(f.field_type)) for f in customer.fields] == [("name", "string"), ("tags", "list<string>")]

    rows = _rows(table)
    v1, v2 = rows[3], rows[24]
    assert v1["placed_at"] == PLACED_AT + datetime.timedelta(seconds=3) and v1["delivery_date"] is None
    assert rows[4]["delivery_date"] == datetime.date(2026, 12, 1) and rows[4]["extra"] == '{"n":4}'
    assert v1["lines"] == [{**line, "discount": None} for line in order(3)["lines"]] and v1["coupon"] is None
    assert v1["customer"] == {"name": "customer 3", "tags": ["vip"]} and v1["attributes"] == [("channel", "web")]
    assert v2["coupon"] == "C24" and rows[25]["lines"][0]["discount"] == 0.5 and v2["extra"] == '{"n":24}'
    tombstone = rows[TOMBSTONE_AT]
    assert tombstone["value"] is None and tombstone["order_id"] is None and tombstone["lines"] is None

    catalog = load_catalog(catalog_settings(config))
    dead = {r["offset"]: r["error"] for r in
            open_table(catalog, f"{world.table_name}_dead_letters").scan().to_arrow().to_pylist()}
    assert sorted(dead) == [NOT_JSON_AT, VIOLATION_AT]
    assert f"value of JSON schema id {ids[1]} is not JSON" in dead[NOT_JSON_AT]
    assert f"violates JSON schema id {ids[1]} at $.store_id" in dead[VIOLATION_AT]

    with duckdb.connect() as connection:
        files = _data_files_for_duckdb(table, tmp_path)
        described = connection.execute("DESCRIBE SELECT * FROM read_parquet(?)", [files]).fetchall()
        duck = {name: column_type for name, column_type, *_ in described}
        assert duck["lines"] == "STRUCT(sku VARCHAR, quantity BIGINT, unit_price DOUBLE, discount DOUBLE)[]"
        assert duck["customer"] == 'STRUCT("name" VARCHAR, tags VARCHAR[])'
        assert duck["placed_at"] == "TIMESTAMP WITH TIME ZONE" and duck["delivery_date"] == "DATE"
        assert connection.execute("SELECT count(*), count(lines) FROM read_parquet(?)", [files]).fetchone() == (
            END - 2, END - 3)


def test_plain_json_values_take_nested_columns_from_the_subjects_latest_json_schema(production_world,
                                                                                   confluent_registry, spark):
    """`latest: true`: values without the wire-format prefix (the Go processor's plain JSON) are typed by the
    subject's newest JSON Schema, nested columns included."""
    world = production_world
    confluent_registry.register(f"{world.topic}-value", json.dumps(ORDER_V1), "JSON")
    confluent_registry.register(f"{world.topic}-value", json.dumps(ORDER_V2), "JSON")
    world.write_records(0, 0, [Record(key=None, value=json.dumps(order(n, version=2)).encode()) for n in range(10)])
    document = world.config_document()
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "value_format": "json_schema",
                             "schema_registry": {"url": confluent_registry.url, "latest": True}}]

    ingest(world.config(document), spark)

    rows = _rows(world.assert_exactly_once(runs=1, expected={0: range(10)}))
    assert rows[4]["coupon"] == "C4" and rows[5]["lines"][0]["discount"] == 0.5
    assert rows[5]["customer"] == {"name": "customer 5", "tags": ["vip"]}
    assert rows[2]["placed_at"] == PLACED_AT + datetime.timedelta(seconds=2)


def test_plain_json_values_take_nested_columns_from_a_json_schema_file_without_a_registry(production_world, spark):
    """`value_schema_file`: the mapping's own JSON Schema document types the plain JSON values, nested columns
    included; no registry involved."""
    world = production_world
    schema_file = world.root / "order.schema.json"
    schema_file.write_text(json.dumps(ORDER_V2))
    records = [Record(key=None, value=json.dumps(order(n, version=2)).encode()) for n in range(10)]
    records[6] = Record(key=None, value=json.dumps({**order(6), "lines": "none"}).encode())
    world.write_records(0, 0, records)
    document = world.config_document()
    document["schema"] = {"mode": "lenient"}
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "value_format": "json_schema", "value_schema_file": str(schema_file)}]

    [result] = ingest(world.config(document), spark)

    assert result.partitions[0].dead_lettered == 1
    table = world.assert_exactly_once(runs=1, expected={0: [o for o in range(10) if o != 6]})
    assert str(table.schema().find_field("customer").field_type.fields[1].field_type) == "list<string>"
    rows = _rows(table)
    assert rows[4]["coupon"] == "C4" and rows[5]["lines"][0]["discount"] == 0.5
    assert rows[3]["attributes"] == [("channel", "web")] and rows[4]["delivery_date"] == datetime.date(2026, 12, 1)
