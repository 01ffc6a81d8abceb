"""Ingest runs in each schema.mode: invalid records to the dead-letter table exactly once, or the run fails.

These run `ingest_mapping` end to end (the ingestion job's tasks write data and dead-letter files, then the commits).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal

import pytest
from pyiceberg.table import Table

import kafscale_lakehouse.engine.ingestion.run as ingest_module
from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestContext, IngestFailedError, ingest_mapping
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.data_files import IcebergSinkError
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY, STAGED_SNAPSHOT_PROPERTY
from kafscale_lakehouse.value_formats.registry import SchemaNotFoundError
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, SEGMENT_RECORDS, records_with_faults, serve_schema

INVALID_OFFSETS = sorted(base + position for base in (0, SEGMENT_RECORDS) for position in FAULTS)
VALID_OFFSETS = sorted(set(range(2 * SEGMENT_RECORDS)) - set(INVALID_OFFSETS))


class StopRun(BaseException):
    """Stands for the process dying at that point: no `except Exception` on the way catches it."""


def write_faulty_topic(world: IngestWorld) -> None:
    """Partition 0: two segments with FAULTS in each; partition 1: one clean segment."""
    for base in (0, SEGMENT_RECORDS):
        world.write_records(0, base, records_with_faults(base))
    world.write_records(1, 0, pizza_orders(0, SEGMENT_RECORDS, partition=1))


def validated_config(world: IngestWorld, base_url: str | None, mode: str, **mapping):
    document = world.config_document()
    if base_url is not None:
        document["schema"] = {"mode": mode, "registry": {"base_url": base_url, "timeout_seconds": 2}}
    document["mappings"][0].update(mapping)
    return world.config(document)


def lenient_faulty_topic(world: IngestWorld, registry):
    """The faulty topic, its schema in the registry, and a lenient config for it."""
    serve_schema(registry, world.topic)
    write_faulty_topic(world)
    return validated_config(world, registry.base_url, "lenient")


def run(world: IngestWorld, config, spark):
    return ingest_mapping(IngestContext.from_config(config, spark), config.mappings[0])


def dead_letter_table(world: IngestWorld, name: str | None = None) -> Table:
    return open_table(load_catalog(catalog_settings(world.config())), name or f"{world.table_name}_dead_letters")


def dead_letter_offsets(table: Table) -> list[int]:
    table.refresh()
    return sorted(table.scan(selected_fields=("offset",)).to_arrow().column("offset").to_pylist())


@pytest.mark.parametrize("world_kind", ["embedded", "production"])
def test_lenient_lands_valid_records_and_dead_letters_the_rest_exactly_once(request, world_kind, registry, spark):
    world: IngestWorld = request.getfixturevalue(f"{world_kind}_world")
    config = lenient_faulty_topic(world, registry)

    result = run(world, config, spark)

    assert not result.failed and result.invalid_count == len(INVALID_OFFSETS)
    assert result.partitions[0].dead_lettered == len(INVALID_OFFSETS) and result.partitions[1].dead_lettered == 0
    world.assert_exactly_once(runs=1, expected={0: VALID_OFFSETS, 1: range(SEGMENT_RECORDS)})
    dead_letters = dead_letter_table(world)
    rows = sorted(dead_letters.scan().to_arrow().to_pylist(), key=lambda row: row["offset"])
    assert [row["offset"] for row in rows] == INVALID_OFFSETS
    for row in rows:
        fault = FAULTS[row["offset"] % SEGMENT_RECORDS]
        assert row["value"] == fault.value and row["schema_path"] == fault.schema_path
        assert fault.schema_reason in row["error"] and row["run_id"] == result.run_id
    assert dead_letters.current_snapshot().snapshot_id == result.dead_letter_snapshot_id
    table_summary = world.table().current_snapshot().summary
    assert table_summary["kafscale.dead-letter.records"] == str(len(INVALID_OFFSETS))

    # Nothing new: no second commit anywhere, no duplicate dead letter.
    again = run(world, config, spark)
    assert again.snapshot_id is None and again.dead_letter_snapshot_id is None
    world.assert_exactly_once(runs=1, expected={0: VALID_OFFSETS, 1: range(SEGMENT_RECORDS)})
    assert dead_letter_offsets(dead_letters) == INVALID_OFFSETS


def test_strict_fails_before_committing_naming_the_record_and_the_schema_path(embedded_world, registry, spark):
    world = embedded_world
    serve_schema(registry, world.topic)
    write_faulty_topic(world)

    with pytest.raises(IngestFailedError) as failure:
        run(world, validated_config(world, registry.base_url, "strict"), spark)

    message = str(failure.value)
    assert f"{world.topic}:0:3" in message and "#/properties/store_id/type" in message
    assert f"{len(INVALID_OFFSETS)} invalid records, nothing committed" in message
    assert world.our_snapshots() == [] and world.store_next_offsets() == {}
    assert not load_catalog(catalog_settings(world.config())).table_exists(f"{world.table_name}_dead_letters")
    assert world.table_data_files() == set(), "the run's data files are deleted"


def test_a_registry_without_the_topic_fails_the_run_as_infrastructure_not_as_invalid_records(embedded_world,
                                                                                            registry, spark):
    world = embedded_world
    write_faulty_topic(world)  # the registry serves nothing: 404

    with pytest.raises(SchemaNotFoundError, match=f"no schema for topic '{world.topic}'"):
        run(world, validated_config(world, registry.base_url, "lenient"), spark)

    assert world.store_next_offsets() == {}
    assert not load_catalog(catalog_settings(world.config())).table_exists(f"{world.table_name}_dead_letters")


def test_mode_off_sends_coercion_failures_to_a_configured_dead_letter_table(embedded_world, spark):
    world = embedded_world
    write_faulty_topic(world)
    dead_letter_name = f"{world.table_name}_rejects"
    config = validated_config(world, None, "off", dead_letter_table=dead_letter_name)

    result = run(world, config, spark)

    # Only the harness' required order_id makes records invalid: positions 5 (missing) and 8 (not JSON).
    coercion_invalid = [o for o in INVALID_OFFSETS if FAULTS[o % SEGMENT_RECORDS].coercion_reason]
    assert not result.failed and result.invalid_count == len(coercion_invalid)
    world.assert_exactly_once(runs=1, expected={0: sorted(set(range(40)) - set(coercion_invalid)),
                                                1: range(SEGMENT_RECORDS)})
    rows = dead_letter_table(world, dead_letter_name).scan().to_arrow().to_pylist()
    assert sorted(row["offset"] for row in rows) == coercion_invalid
    assert all(row["schema_path"] is None and FAULTS[row["offset"] % SEGMENT_RECORDS].coercion_reason in row["error"]
               for row in rows)


def stop_before_publishing(world: IngestWorld, config, spark, monkeypatch) -> None:
    """One run that stops between its table commit and publishing its dead letters."""
    def stop(*args, **kwargs):
        raise StopRun("between the table commit and publishing the dead letters")

    with monkeypatch.context() as patch:
        patch.setattr(ingest_module, "publish_dead_letters", stop)
        with pytest.raises(StopRun):
            run(world, config, spark)


def test_a_run_stopped_after_the_table_commit_has_its_dead_letters_published_by_the_next(embedded_world, registry,
                                                                                         spark, monkeypatch):
    world = embedded_world
    config = lenient_faulty_topic(world, registry)

    stop_before_publishing(world, config, spark, monkeypatch)
    table = world.table()
    assert sorted(offset for _, p, offset in world.table_rows(table) if p == 0) == VALID_OFFSETS
    assert STAGED_SNAPSHOT_PROPERTY in table.current_snapshot().summary.additional_properties
    dead_letters = dead_letter_table(world)
    assert dead_letter_offsets(dead_letters) == [], "staged, not yet published"

    again = run(world, config, spark)

    assert again.snapshot_id is None
    world.assert_exactly_once(runs=1, expected={0: VALID_OFFSETS, 1: range(SEGMENT_RECORDS)})
    assert dead_letter_offsets(dead_letters) == INVALID_OFFSETS
    assert dead_letters.current_snapshot().summary[RUN_ID_PROPERTY] == table.current_snapshot().summary[RUN_ID_PROPERTY]


def lose_the_dead_letters_of_a_stopped_run(world: IngestWorld, config, spark, monkeypatch) -> str:
    """A run stops between its table commit and publishing; then its staged snapshot goes (the dead-letter table is
    dropped) and partition 1 gets a new segment. Returns the stopped run's id."""
    stop_before_publishing(world, config, spark, monkeypatch)
    load_catalog(catalog_settings(config)).drop_table(f"{world.table_name}_dead_letters")
    world.write_records(1, SEGMENT_RECORDS, pizza_orders(SEGMENT_RECORDS, SEGMENT_RECORDS, partition=1))
    return world.table().current_snapshot().summary[RUN_ID_PROPERTY]


def test_a_run_that_finds_dead_letters_lost_fails_naming_them_once_and_keeps_its_commit(embedded_world, registry,
                                                                                       spark, monkeypatch):
    """A run stops between its table commit and publishing, then its staged snapshot goes
    (the dead-letter table dropped). The next run commits what it read, then fails naming the stopped run, the
    record count and the offsets to replay; the run after it is not wedged."""
    world = embedded_world
    config = lenient_faulty_topic(world, registry)
    stopped_run = lose_the_dead_letters_of_a_stopped_run(world, config, spark, monkeypatch)

    with pytest.raises(IngestFailedError) as failure:
        run(world, config, spark)

    message = str(failure.value)
    assert f"(run {failure.value.result.run_id})" in message and f"Run {stopped_run}" in message
    assert f"{len(INVALID_OFFSETS)} invalid records" in message
    assert f"{{0: [0, {2 * SEGMENT_RECORDS}], 1: [0, {SEGMENT_RECORDS}]}}" in message, "the offsets to replay"
    assert failure.value.result.snapshot_id is not None, "what the run read is committed"
    world.assert_exactly_once(runs=2, expected={0: VALID_OFFSETS, 1: range(2 * SEGMENT_RECORDS)})
    again = run(world, config, spark)
    assert not again.failed and again.dead_letters_lost == [], "reported once"


def test_ingest_once_exits_1_on_dead_letters_found_lost_then_0(embedded_world, registry, spark, monkeypatch,
                                                                 caplog):
    """Through `kafscale-lakehouse ingest --once`: exit 1 naming the lost dead letters, once."""
    world = embedded_world
    serve_schema(registry, world.topic)
    write_faulty_topic(world)
    document = world.config_document()
    document["schema"] = {"mode": "lenient", "registry": {"base_url": registry.base_url, "timeout_seconds": 2}}
    config_path = world.write_config_file(document)
    stopped_run = lose_the_dead_letters_of_a_stopped_run(world, world.config(document), spark, monkeypatch)
    sigterm = signal.getsignal(signal.SIGTERM)  # the CLI installs its own handler
    try:
        with caplog.at_level(logging.ERROR, logger="kafscale_lakehouse.apps.cli"):
            assert cli.main(["ingest", "--config", str(config_path), "--once"]) == 1
        [error] = [r.getMessage() for r in caplog.records if r.name == "kafscale_lakehouse.apps.cli"]
        assert f"Run {stopped_run}" in error and f"{len(INVALID_OFFSETS)} invalid records" in error
        assert cli.main(["ingest", "--config", str(config_path), "--once"]) == 0
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    world.assert_exactly_once(runs=2, expected={0: VALID_OFFSETS, 1: range(2 * SEGMENT_RECORDS)})


def test_a_run_stopped_before_the_table_commit_leaves_no_dead_letter_behind(embedded_world, registry, spark,
                                                                            monkeypatch):
    world = embedded_world
    config = lenient_faulty_topic(world, registry)

    def stop(*args, **kwargs):
        raise StopRun("after staging the dead letters, before the table commit")

    with monkeypatch.context() as patch:
        patch.setattr(ingest_module, "commit_append", stop)
        with pytest.raises(StopRun):
            run(world, config, spark)
    assert world.our_snapshots() == []

    result = run(world, config, spark)

    world.assert_exactly_once(runs=1, expected={0: VALID_OFFSETS, 1: range(SEGMENT_RECORDS)})
    assert dead_letter_offsets(dead_letter_table(world)) == INVALID_OFFSETS  # the second run's, once
    assert result.dead_letter_snapshot_id is not None


def test_a_task_that_fails_fails_the_run_and_no_data_file_of_any_task_is_left(embedded_world, registry, spark,
                                                                              monkeypatch):
    """Partition 0's task fails writing its dead letters (their S3 endpoint refuses connections; the S3 client's
    retries take ~1.5 s) after partition 1's task wrote its data files: the job fails naming the table, and the files
    of both tasks are gone."""
    world = embedded_world
    config = lenient_faulty_topic(world, registry)
    real_target = ingest_module.dead_letter_target

    def unreachable_target(*args, **kwargs):
        target = real_target(*args, **kwargs)
        metadata = json.loads(target.sink.table_metadata_json)
        metadata["location"] = "s3://unreachable/dead_letters"
        sink = dataclasses.replace(
            target.sink,
            table_metadata_json=json.dumps(metadata),
            data_dir=f"s3://unreachable/dead_letters/data/{target.sink.data_dir.rsplit('/', 1)[1]}",
            file_io_properties={
                "s3.endpoint": "http://127.0.0.1:9",
                "s3.region": "us-east-1",
                "s3.access-key-id": "k",
                "s3.secret-access-key": "s",
                "s3.connect-timeout": "1",
            },
        )
        return dataclasses.replace(target, sink=sink)

    with monkeypatch.context() as patch:
        patch.setattr(ingest_module, "dead_letter_target", unreachable_target)
        with pytest.raises(IcebergSinkError, match=rf"table {world.table_name} \(run [0-9a-f]+\) failed"):
            run(world, config, spark)

    assert world.our_snapshots() == []
    assert world.table_data_files() == set()
    result = run(world, config, spark)  # leases were released; the next run lands everything
    world.assert_exactly_once(runs=1, expected={0: VALID_OFFSETS, 1: range(SEGMENT_RECORDS)})
    assert result.invalid_count == len(INVALID_OFFSETS)


def test_registry_columns_shape_the_table(embedded_world, registry, spark):
    world = embedded_world
    serve_schema(registry, world.topic)
    world.write_records(0, 0, pizza_orders(0, SEGMENT_RECORDS))
    document = world.config_document()
    document["schema"] = {"registry": {"base_url": registry.base_url}}  # mode off; columns from the registry
    del document["mappings"][0]["schema"]
    config = world.config(document)

    run(world, config, spark)

    table = world.assert_exactly_once(runs=1, expected={0: range(SEGMENT_RECORDS)})
    assert table.schema().column_names[8:] == ["date_ordered", "order_id", "sauce", "store_id"]
    assert not table.schema().find_field("store_id").required  # mapped columns hold tombstones' nulls
    rows = table.scan(selected_fields=("order_id", "store_id", "sauce")).to_arrow().to_pylist()
    assert all(row["order_id"] and 1 <= row["store_id"] <= 100 and row["sauce"] for row in rows)


@pytest.mark.parametrize("mode", ["off", "lenient", "strict"])
def test_tombstones_land_with_null_columns_and_count_as_written_in_every_mode(embedded_world, registry, spark, mode):
    # KafScale has no compaction: null values stay in the log and are records. order_id is required
    # and the schema requires an object, yet a tombstone is neither invalid nor judged.
    world = embedded_world
    serve_schema(registry, world.topic)
    orders = pizza_orders(0, SEGMENT_RECORDS, partition=0)
    tombstones = {2, 9}
    world.write_records(0, 0, [dataclasses.replace(r, value=None) if i in tombstones else r
                               for i, r in enumerate(orders)])

    result = run(world, validated_config(world, registry.base_url, mode), spark)

    assert not result.failed and result.invalid_count == 0 and result.records == SEGMENT_RECORDS
    table = world.assert_exactly_once(runs=1)
    rows = {r["offset"]: r for r in table.scan(selected_fields=("offset", "value", "order_id", "store_id"))
            .to_arrow().to_pylist()}
    assert [o for o, r in sorted(rows.items()) if r["value"] is None] == sorted(tombstones)
    assert all(rows[o]["order_id"] is None and rows[o]["store_id"] is None for o in tombstones)
    assert rows[0]["order_id"] is not None
