"""`offsets skip` and `offsets replay` open an Avro mapping's table with its registered value schemas, as a run
does: a table they create has the typed value columns, and a replay lands the typed rows again."""

from __future__ import annotations

from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.formats.avro_orders import ORDER_V1, framed, order
from kafscale_lakehouse_tests.formats.test_avro_ingest import _rows


def test_offsets_skip_and_replay_open_an_avro_table_with_its_registered_schemas(production_world, confluent_registry,
                                                                                spark, cli_main):
    world = production_world
    schema_id = confluent_registry.register(f"{world.topic}-value", ORDER_V1)
    world.write_records(0, 0, [Record(key=None, value=framed(schema_id, ORDER_V1, order(n))) for n in range(30)])
    document = world.config_document()
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "create_table_if_missing": True,
                             "value_format": "avro", "schema_registry": {"url": confluent_registry.url},
                             "partition_spec": [{"source": "placed_at", "transform": "day"}]}]
    config_path = world.write_config_file(document)
    offsets = ("--config", str(config_path), "--topic", world.topic, "--partition", "0")

    # The table does not exist yet: skip creates it as a run would, with the value schema's columns (its partition
    # spec needs placed_at), then finds nothing committed to skip from.
    assert cli_main("offsets", "skip", *offsets, "--to", "10", "--yes") == 2
    table = world.table()
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert (types.get("order_id"), types.get("placed_at"), types.get("status")) == ("uuid", "timestamptz", "string")
    assert [f.name for f in table.spec().fields] == ["placed_at_day"]

    ingest(world.config(document), spark)
    world.write_records(0, 30, [Record(key=None, value=framed(schema_id, ORDER_V1, order(n))) for n in range(30, 40)])
    assert cli_main("offsets", "skip", *offsets, "--to", "35", "--yes") == 0
    ingest(world.config(document), spark)
    before = _rows(world.table())
    assert sorted(before) == [*range(30), *range(35, 40)] and before[12]["store_id"] == 2

    assert cli_main("offsets", "replay", *offsets, "--from", "15", "--to", "20", "--yes") == 0
    after = _rows(world.table())
    assert sorted(after) == sorted(before)
    assert [after[o]["lines"] for o in range(15, 20)] == [before[o]["lines"] for o in range(15, 20)]
    assert str(after[17]["order_id"]) == order(17)["order_id"]
