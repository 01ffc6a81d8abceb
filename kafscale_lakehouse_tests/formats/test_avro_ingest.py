"""An Avro topic (Confluent wire format, schemas in a Confluent-compatible registry) lands exactly once in a typed,
nested table: a schema change mid-topic evolves the table, tombstones land as rows of nulls, a value that does not
decode goes to the dead-letter table, and a schema that cannot evolve the table stops the partition at its first
record, naming the field and both schema ids. Real SeaweedFS (S3 + Iceberg REST), etcd and Spark."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from pyiceberg.table import Table

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.replay import replay_range
from kafscale_lakehouse.engine.ingestion.run import IngestContext, IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.value_formats.registry import SchemaNotFoundError, SchemaRegistryUnavailableError
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.formats.avro_orders import ORDER_V1, ORDER_V2, ORDER_V3, framed, order
from kafscale_lakehouse_tests.support.servers import free_ports

TOMBSTONE_AT = 5
GARBAGE_AT = 7
SCHEMA_CHANGE_AT = 30  # offsets from here on are written with ORDER_V2
END = 60


def _config_document(world: IngestWorld, registry_url: str, schema_mode: str) -> dict:
    document = world.config_document()
    document["schema"] = {"mode": schema_mode}
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "value_format": "avro", "schema_registry": {"url": registry_url},
                             "partition_spec": [{"source": "placed_at", "transform": "day"}]}]
    return document


def _write_avro_topic(world: IngestWorld, ids: dict[int, int]) -> None:
    """Partition 0: offsets 0-29 of ORDER_V1 (a tombstone, one value not in the wire format), 30-59 of ORDER_V2."""
    for base, version in ((0, 1), (SCHEMA_CHANGE_AT, 2)):
        records = []
        for offset in range(base, base + 30):
            schema = ORDER_V1 if version == 1 else ORDER_V2
            value: bytes | None = framed(ids[version], schema, order(offset, version=version))
            if offset == TOMBSTONE_AT:
                value = None
            elif offset == GARBAGE_AT:
                value = b'{"order_id": "json, not avro"}'
            records.append(Record(key=f"k{offset}".encode(), value=value, timestamp_ms=1_700_000_000_000 + offset,
                                  headers=(("source", b"test"),)))
        world.write_records(0, base, records)


def _rows(table: Table) -> dict[int, dict]:
    return {row["offset"]: row for row in table.scan().to_arrow().to_pylist()}


def _data_files_for_duckdb(table: Table, tmp_path: Path) -> list[str]:
    """The table's Parquet data files, copied to local paths (DuckDB's S3 and Iceberg extensions download from
    extensions.duckdb.org, which these machines do not reach)."""
    paths = []
    for number, task in enumerate(table.scan().plan_files()):
        local = tmp_path / f"data-{number}.parquet"
        with table.io.new_input(task.file.file_path).open() as stream:
            local.write_bytes(stream.read())
        paths.append(str(local))
    return paths


def test_avro_topic_lands_typed_and_nested_exactly_once(production_world, confluent_registry, spark, tmp_path):
    world = production_world
    subject = f"{world.topic}-value"
    ids = {1: confluent_registry.register(subject, ORDER_V1), 2: confluent_registry.register(subject, ORDER_V2)}
    _write_avro_topic(world, ids)
    config = world.config(_config_document(world, confluent_registry.url, "lenient"))

    [result] = ingest(config, spark)

    assert result.partitions[0].dead_lettered == 1
    expected = {0: [o for o in range(END) if o != GARBAGE_AT]}
    table = world.assert_exactly_once(runs=1, expected=expected)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert {name: types[name] for name in ("order_id", "store_id", "placed_at", "delivery_date", "status",
                                           "attributes", "signature", "coupon")} == {
        "order_id": "uuid", "store_id": "long", "placed_at": "timestamptz", "delivery_date": "date",
        "status": "string", "attributes": "map<string, string>", "signature": "binary", "coupon": "string"}
    lines = table.schema().find_field("lines").field_type
    assert [(f.name, str(f.field_type)) for f in lines.element_field.field_type.fields] == [
        ("sku", "string"), ("quantity", "int"), ("unit_price", "decimal(9, 2)"), ("discount", "double")]
    assert [f.name for f in table.spec().fields] == ["placed_at_day"]

    rows = _rows(table)
    v1, v2 = rows[3], rows[SCHEMA_CHANGE_AT + 1]
    assert str(v1["order_id"]) == order(3)["order_id"] and v1["store_id"] == 3 and v1["coupon"] is None
    assert v1["lines"] == [{**line, "discount": None} for line in order(3)["lines"]]
    assert v1["placed_at"] == order(3)["placed_at"] and v1["status"] == "NEW"
    assert v2["lines"][0]["discount"] == 0.5 and v2["coupon"] is None and rows[32]["coupon"] == "C32"
    assert v2["attributes"] == [("channel", "web")] and v2["signature"] == (31).to_bytes(4, "big")
    assert v2["value"] == framed(ids[2], ORDER_V2, order(31, version=2))  # the raw value stays, as Go writes it
    tombstone = rows[TOMBSTONE_AT]
    assert tombstone["value"] is None and tombstone["order_id"] is None and tombstone["attributes"] is None
    assert tombstone["lines"] is None  # not [] (engine/tables/commits.py: pyiceberg's projection)

    catalog = load_catalog(catalog_settings(config))
    [dead] = open_table(catalog, f"{world.table_name}_dead_letters").scan().to_arrow().to_pylist()
    assert dead["offset"] == GARBAGE_AT and "not in the Confluent wire format" in dead["error"]

    # DuckDB reads the same data files with the same nested types; the tombstone's list is null in the file.
    with duckdb.connect() as connection:
        files = _data_files_for_duckdb(table, tmp_path)
        described = connection.execute("DESCRIBE SELECT * FROM read_parquet(?)", [files]).fetchall()
        duck = {name: column_type for name, column_type, *_ in described}
        assert duck["lines"] == ("STRUCT(sku VARCHAR, quantity INTEGER, unit_price DECIMAL(9,2), "
                                 "discount DOUBLE)[]")
        assert duck["attributes"] == "MAP(VARCHAR, VARCHAR)" and duck["placed_at"] == "TIMESTAMP WITH TIME ZONE"
        assert connection.execute('SELECT count(*), count(lines), sum(len(lines)) FROM read_parquet(?)',
                                  [files]).fetchone() == (END - 1, END - 2, sum(len(order(o, version=2)["lines"])
                                                                             for o in range(END)
                                                                             if o not in (TOMBSTONE_AT, GARBAGE_AT)))
        [(tombstone_lines,)] = connection.execute('SELECT lines FROM read_parquet(?) WHERE "offset" = ?',
                                                  [files, TOMBSTONE_AT]).fetchall()
        assert tombstone_lines is None


def test_a_schema_that_cannot_evolve_the_table_stops_the_partition_at_its_first_record(
        production_world, confluent_registry, spark):
    world = production_world
    subject = f"{world.topic}-value"
    ids = {1: confluent_registry.register(subject, ORDER_V1), 2: confluent_registry.register(subject, ORDER_V2)}
    _write_avro_topic(world, ids)
    config_document = _config_document(world, confluent_registry.url, "off")
    # Without a dead-letter table (schema.mode off) the value that does not decode stops the partition too.
    with pytest.raises(IngestFailedError, match=f"record {world.topic}:0:{GARBAGE_AT}.*not in the Confluent wire"):
        ingest(world.config(config_document), spark)
    world.assert_exactly_once(runs=1, expected={0: range(GARBAGE_AT)})

    confluent_registry.set_compatibility("NONE", subject)
    ids[3] = confluent_registry.register(subject, ORDER_V3)  # store_id: long → string
    world.write_records(0, END, [Record(key=None, value=framed(ids[3], ORDER_V3, order(n, version=3)))
                                 for n in range(END, END + 5)])
    config_document["mappings"][0]["dead_letter_table"] = f"{world.table_name}_dead"
    with pytest.raises(IngestFailedError) as failure:
        ingest(world.config(config_document), spark)
    message = str(failure.value)
    assert f"record {world.topic}:0:{END}" in message
    assert f"schema id {ids[3]}" in message and f"last evolved to schema id {ids[2]}" in message
    assert "store_id: long -> string" in message
    # Everything before the new schema's first record landed once; the partition waits there.
    world.assert_exactly_once(runs=2, expected={0: [o for o in range(END) if o != GARBAGE_AT]})
    assert world.store_next_offsets() == {0: END}


def test_a_replay_of_an_avro_range_decodes_it_again_into_the_typed_columns(production_world, confluent_registry,
                                                                            spark):
    world = production_world
    subject = f"{world.topic}-value"
    ids = {1: confluent_registry.register(subject, ORDER_V1), 2: confluent_registry.register(subject, ORDER_V2)}
    _write_avro_topic(world, ids)
    config = world.config(_config_document(world, confluent_registry.url, "lenient"))
    ingest(config, spark)
    before = _rows(world.table())

    with IngestContext.from_config(config, spark) as context:
        replay_range(context, config.mappings[0], OffsetRange(0, SCHEMA_CHANGE_AT - 10, END))

    after = _rows(world.table())
    assert sorted(after) == sorted(before)
    for offset in range(SCHEMA_CHANGE_AT - 10, END):
        for column in ("order_id", "store_id", "lines", "coupon", "placed_at", "attributes"):
            assert after[offset][column] == before[offset][column], (offset, column)
    assert after[SCHEMA_CHANGE_AT + 2]["lines"][0]["sku"] == "sku-4"


def test_a_registry_that_is_down_or_lacks_the_subject_fails_the_run_before_anything_is_read(
        production_world, confluent_registry, spark):
    world = production_world
    _write_avro_topic(world, {1: 1, 2: 2})
    [port] = free_ports(1)
    with pytest.raises(SchemaRegistryUnavailableError, match=f"subject {world.topic}-value"):
        ingest(world.config(_config_document(world, f"http://127.0.0.1:{port}", "lenient")), spark)
    with pytest.raises(SchemaNotFoundError, match=f"subject {world.topic}-value.*40401"):
        ingest(world.config(_config_document(world, confluent_registry.url, "lenient")), spark)
    assert world.store_next_offsets() == {}
