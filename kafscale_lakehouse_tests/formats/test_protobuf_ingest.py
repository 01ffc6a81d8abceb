"""A Protobuf topic (Confluent wire format with message indexes, schemas as .proto text in a Confluent-compatible
registry, read back with format=serialized) lands exactly once in a typed, nested table: a schema change mid-topic
evolves the table, tombstones land as rows of nulls, values that do not decode (or are another message of the file)
go to the dead-letter table, and a schema that cannot evolve the table stops the partition at its first record.
Real SeaweedFS (S3 + Iceberg REST), etcd and Spark; DuckDB reads the data files."""

from __future__ import annotations

import datetime

import duckdb
import pytest

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.value_formats.protobuf import encode_framed_protobuf
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.formats.protobuf_orders import (
    ORDER_V1,
    ORDER_V2,
    ORDER_V3,
    framed,
    message_class,
    order,
)
from kafscale_lakehouse_tests.formats.test_avro_ingest import _data_files_for_duckdb, _rows
from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry

TOMBSTONE_AT = 5
GARBAGE_AT = 7  # framed, message index 0, but the payload is no shop.Order
REFUND_AT = 9  # a shop.Refund (message indexes [1]) of the same schema
SCHEMA_CHANGE_AT = 30
END = 60


def _config_document(world: IngestWorld, registry_url: str, schema_mode: str) -> dict:
    document = world.config_document()
    document["schema"] = {"mode": schema_mode}
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "value_format": "protobuf", "schema_registry": {"url": registry_url},
                             "partition_spec": [{"source": "placed_at", "transform": "day"}]}]
    return document


def _write_protobuf_topic(world: IngestWorld, registry: ConfluentCompatibleRegistry, ids: dict[int, int]) -> None:
    for base, version in ((0, 1), (SCHEMA_CHANGE_AT, 2)):
        records = []
        for offset in range(base, base + 30):
            value: bytes | None = framed(registry, ids[version], order(offset, version=version))
            if offset == TOMBSTONE_AT:
                value = None
            elif offset == GARBAGE_AT:
                value = bytes([0]) + ids[1].to_bytes(4, "big") + b"\x00" + b"\xff\xff\xff"
            elif offset == REFUND_AT:
                refund = message_class(registry, ids[1], "shop.Refund")(order_id=f"order-{offset}")
                value = encode_framed_protobuf(ids[1], refund, [1])
            records.append(Record(key=f"k{offset}".encode(), value=value, timestamp_ms=1_700_000_000_000 + offset))
        world.write_records(0, base, records)


def test_protobuf_topic_lands_typed_and_nested_exactly_once(production_world, confluent_registry, spark, tmp_path):
    world = production_world
    subject = f"{world.topic}-value"
    ids = {1: confluent_registry.register(subject, ORDER_V1, "PROTOBUF"),
           2: confluent_registry.register(subject, ORDER_V2, "PROTOBUF")}
    _write_protobuf_topic(world, confluent_registry, ids)
    config = world.config(_config_document(world, confluent_registry.url, "lenient"))

    [result] = ingest(config, spark)

    assert result.partitions[0].dead_lettered == 2
    table = world.assert_exactly_once(runs=1, expected={0: [o for o in range(END) if o not in (GARBAGE_AT, REFUND_AT)]})
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert {name: types[name] for name in ("order_id", "store_id", "placed_at", "status", "attributes", "note",
                                           "card", "cash_cents", "signature", "coupon")} == {
        "order_id": "string", "store_id": "long", "placed_at": "timestamptz", "status": "string",
        "attributes": "map<string, string>", "note": "string", "card": "string", "cash_cents": "long",
        "signature": "binary", "coupon": "string"}
    lines = table.schema().find_field("lines").field_type
    assert lines.element_required
    assert [(f.name, str(f.field_type)) for f in lines.element_field.field_type.fields] == [
        ("sku", "string"), ("quantity", "int"), ("unit_price", "double"), ("discount", "double")]
    customer = table.schema().find_field("customer").field_type
    assert [(f.name, str(f.field_type)) for f in customer.fields] == [("name", "string"), ("email", "string")]
    assert [f.name for f in table.spec().fields] == ["placed_at_day"]

    rows = _rows(table)
    v1, v2 = rows[3], rows[SCHEMA_CHANGE_AT + 1]
    assert v1["order_id"] == "order-3" and v1["store_id"] == 3 and v1["coupon"] is None
    assert v1["placed_at"] == order(3)["placed_at"] and v1["status"] == "NEW"
    assert v1["lines"] == [{**line, "discount": None} for line in order(3)["lines"]]
    assert v1["customer"] == {"name": "customer 3", "email": "c3@example.com"}
    assert v1["card"] is None and v1["cash_cents"] == 300 and v1["note"] is None  # oneof; unset wrapper: null
    assert rows[1]["note"] == "note 1" and rows[4]["card"] == "card-4" and rows[4]["customer"]["email"] is None
    assert v2["lines"][0]["discount"] == 0.5 and v2["coupon"] == "" and rows[32]["coupon"] == "C32"
    assert v2["attributes"] == [("channel", "web")] and v2["signature"] == (31).to_bytes(4, "big")
    assert v2["placed_at"] == datetime.datetime(2026, 11, 24, 0, 0, 31, 31, tzinfo=datetime.UTC)
    tombstone = rows[TOMBSTONE_AT]
    assert tombstone["value"] is None and tombstone["order_id"] is None and tombstone["lines"] is None
    assert tombstone["customer"] is None

    catalog = load_catalog(catalog_settings(config))
    dead = {r["offset"]: r["error"] for r in
            open_table(catalog, f"{world.table_name}_dead_letters").scan().to_arrow().to_pylist()}
    assert sorted(dead) == [GARBAGE_AT, REFUND_AT]
    assert f"does not decode as Protobuf schema id {ids[1]}" in dead[GARBAGE_AT]
    assert "is a shop.Refund" in dead[REFUND_AT] and "not the mapping's message shop.Order" in dead[REFUND_AT]

    with duckdb.connect() as connection:
        files = _data_files_for_duckdb(table, tmp_path)
        described = connection.execute("DESCRIBE SELECT * FROM read_parquet(?)", [files]).fetchall()
        duck = {name: column_type for name, column_type, *_ in described}
        assert duck["lines"] == "STRUCT(sku VARCHAR, quantity INTEGER, unit_price DOUBLE, discount DOUBLE)[]"
        assert duck["customer"] == "STRUCT(\"name\" VARCHAR, email VARCHAR)"
        assert duck["attributes"] == "MAP(VARCHAR, VARCHAR)" and duck["placed_at"] == "TIMESTAMP WITH TIME ZONE"
        assert connection.execute("SELECT count(*), count(lines), sum(len(lines)) FROM read_parquet(?)",
                                  [files]).fetchone() == (
            END - 2, END - 3, sum(len(order(o)["lines"]) for o in range(END)
                                  if o not in (TOMBSTONE_AT, GARBAGE_AT, REFUND_AT)))


def test_a_protobuf_schema_that_cannot_evolve_the_table_stops_the_partition(production_world, confluent_registry,
                                                                           spark):
    world = production_world
    subject = f"{world.topic}-value"
    ids = {1: confluent_registry.register(subject, ORDER_V1, "PROTOBUF"),
           2: confluent_registry.register(subject, ORDER_V2, "PROTOBUF")}
    _write_protobuf_topic(world, confluent_registry, ids)
    config_document = _config_document(world, confluent_registry.url, "off")
    # Without a dead-letter table the value that does not decode stops the partition.
    with pytest.raises(IngestFailedError, match=f"record {world.topic}:0:{GARBAGE_AT}.*does not decode as Protobuf"):
        ingest(world.config(config_document), spark)
    world.assert_exactly_once(runs=1, expected={0: range(GARBAGE_AT)})

    ids[3] = confluent_registry.register(subject, ORDER_V3, "PROTOBUF")  # store_id: int64 → string
    world.write_records(0, END, [Record(key=None, value=framed(confluent_registry, ids[3], order(n, version=3)))
                                 for n in range(END, END + 5)])
    config_document["mappings"][0]["dead_letter_table"] = f"{world.table_name}_dead"
    with pytest.raises(IngestFailedError) as failure:
        ingest(world.config(config_document), spark)
    message = str(failure.value)
    assert f"record {world.topic}:0:{END}" in message
    assert f"schema id {ids[3]}" in message and f"last evolved to schema id {ids[2]}" in message
    assert "store_id: long -> string" in message
    world.assert_exactly_once(runs=2, expected={0: [o for o in range(END) if o not in (GARBAGE_AT, REFUND_AT)]})
    assert world.store_next_offsets() == {0: END}
