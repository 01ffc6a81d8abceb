"""`mappings[].kafka_timestamp_column`: the record timestamp as a timestamptz column that partition_spec can take
hour/day of, added to an existing table; a changed partition_spec evolves the table's spec (update_spec) instead of
being ignored after creation."""

from __future__ import annotations

import datetime

from kafscale_lakehouse.engine.ingestion.run import ingest


def test_kafka_timestamp_column_and_partition_spec_evolution(embedded_world, spark):
    world = embedded_world
    document = world.config_document()
    world.write_segments(0, 40, records_per_segment=40)
    ingest(world.config(document), spark)  # run 1: neither the column nor a partition spec
    assert "kafka_timestamp" not in world.table().schema().column_names

    mapping = document["mappings"][0]
    mapping["kafka_timestamp_column"] = True
    mapping["partition_spec"] = [{"source": "kafka_timestamp", "transform": "hour"}]
    world.write_segments(0, 40, base_offset=40, records_per_segment=40)
    ingest(world.config(document), spark)  # run 2: the column is added and the spec evolved to hour
    mapping["partition_spec"] = [{"source": "kafka_timestamp", "transform": "day"}]
    world.write_segments(0, 40, base_offset=80, records_per_segment=40)
    ingest(world.config(document), spark)  # run 3: the spec evolves to day

    table = world.assert_exactly_once(runs=3)
    assert str(table.schema().find_field("kafka_timestamp").field_type) == "timestamptz"
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("kafka_timestamp_day", "day")]
    specs = {spec_id: [str(f.transform) for f in spec.fields] for spec_id, spec in table.specs().items()}
    files = {task.file.file_path: specs[task.file.spec_id] for task in table.scan().plan_files()}
    assert sorted(map(tuple, files.values())) == sorted([(), ("hour",), ("day",)])

    rows = table.scan(selected_fields=("offset", "timestamp_ms", "kafka_timestamp")).to_arrow().to_pylist()
    for row in rows:
        if row["offset"] < 40:
            assert row["kafka_timestamp"] is None  # landed before the column existed
        else:
            assert row["kafka_timestamp"] == datetime.datetime.fromtimestamp(row["timestamp_ms"] / 1000,
                                                                            tz=datetime.UTC)
