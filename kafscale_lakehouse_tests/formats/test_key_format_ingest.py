"""Decoded record keys (`mappings[].key_format`) land as `key_<field>` columns beside the raw `key` bytes: Avro keys
from the registry's `<topic>-key` subject (with JSON values), and JSON keys with declared `key_columns`. A record
without a key has null key columns; a key that does not decode is an invalid record (dead-letter table). Real
SeaweedFS (S3 + Iceberg REST), etcd and Spark."""

from __future__ import annotations

import json

import fastavro

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.value_formats.avro import encode_framed_avro
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.formats.test_avro_ingest import _rows

ORDER_KEY = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [
    {"name": "store_id", "type": "int"}, {"name": "order_id", "type": "string"}]}
NO_KEY_AT, BAD_KEY_AT, END = 3, 6, 20


def _config_document(world: IngestWorld, **mapping: object) -> dict:
    document = world.config_document()
    document["schema"] = {"mode": "off"}
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "dead_letter_table": f"{world.table_name}_dead",
                             "schema": {"columns": [{"name": "total", "type": "double"}]}, **mapping}]
    return document


def _dead_letters(world: IngestWorld, config: LakehouseConfig) -> dict[int, str]:
    table = open_table(load_catalog(catalog_settings(config)), f"{world.table_name}_dead")
    return {r["offset"]: r["error"] for r in table.scan().to_arrow().to_pylist()}


def test_avro_keys_land_as_key_columns_beside_json_values(production_world, confluent_registry, spark):
    world = production_world
    key_id = confluent_registry.register(f"{world.topic}-key", ORDER_KEY)
    parsed = fastavro.parse_schema(ORDER_KEY)
    records = []
    for offset in range(END):
        key: bytes | None = encode_framed_avro(key_id, parsed, {"store_id": offset % 4, "order_id": f"o-{offset}"})
        if offset == NO_KEY_AT:
            key = None
        elif offset == BAD_KEY_AT:
            key = b"plain-key"
        records.append(Record(key=key, value=json.dumps({"total": offset + 0.5}).encode()))
    world.write_records(0, 0, records)
    config = world.config(_config_document(world, key_format="avro",
                                           schema_registry={"url": confluent_registry.url}))

    [result] = ingest(config, spark)

    assert result.partitions[0].dead_lettered == 1
    table = world.assert_exactly_once(runs=1, expected={0: [o for o in range(END) if o != BAD_KEY_AT]})
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert (types["key"], types["key_store_id"], types["key_order_id"], types["total"]) == (
        "binary", "int", "string", "double")
    rows = _rows(table)
    assert (rows[5]["key_store_id"], rows[5]["key_order_id"], rows[5]["total"]) == (1, "o-5", 5.5)
    assert rows[5]["key"] == records[5].key  # the raw bytes stay, as Go writes them
    assert (rows[NO_KEY_AT]["key"], rows[NO_KEY_AT]["key_store_id"], rows[NO_KEY_AT]["total"]) == (None, None, 3.5)
    dead = _dead_letters(world, config)
    assert list(dead) == [BAD_KEY_AT] and dead[BAD_KEY_AT].startswith("record key: value is not in the Confluent")


def test_json_keys_land_as_their_declared_key_columns(production_world, spark):
    world = production_world
    records = [Record(key=json.dumps({"store_id": offset % 4, "region": "eu"}).encode() if offset != NO_KEY_AT
                      else None, value=json.dumps({"total": offset + 0.5}).encode()) for offset in range(END)]
    records[BAD_KEY_AT] = Record(key=b'{"store_id": "four"}', value=b'{"total": 1}')
    world.write_records(0, 0, records)
    config = world.config(_config_document(world, key_format="json", key_columns=[
        {"name": "store_id", "type": "long", "required": True}, {"name": "region", "type": "string"}]))

    ingest(config, spark)

    table = world.assert_exactly_once(runs=1, expected={0: [o for o in range(END) if o != BAD_KEY_AT]})
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert (types["key_store_id"], types["key_region"]) == ("long", "string")
    rows = _rows(table)
    assert (rows[5]["key_store_id"], rows[5]["key_region"], rows[5]["total"]) == (1, "eu", 5.5)
    assert (rows[NO_KEY_AT]["key_store_id"], rows[NO_KEY_AT]["key_region"]) == (None, None)
    dead = _dead_letters(world, config)
    assert list(dead) == [BAD_KEY_AT] and dead[BAD_KEY_AT].startswith("record key: ")
