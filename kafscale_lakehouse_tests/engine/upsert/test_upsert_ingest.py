"""`mode: upsert` end to end on the real servers: a topic of changes (updates, tombstones) over several runs ends
with exactly the state a reference computes from the log, every key and every column; a run SIGKILLed around its
commit, then a rerun, ends the same way."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from kafscale_lakehouse.engine.ingestion.replay import move_position
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest
from kafscale_lakehouse.engine.tables.data_files import data_file_prefix
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.orchestration.checks import evaluate_id_unique
from kafscale_lakehouse.orchestration.metadata import run_metadata
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld
from kafscale_lakehouse_tests.engine.upsert.changes import STORE_COLUMNS, StoreChanges, assert_state


def upsert_document(world: IngestWorld, *, bucketed: bool = False) -> dict[str, Any]:
    document = world.config_document()
    mapping = document["mappings"][0]
    mapping.update(mode="upsert", id_columns=["store_id"], schema={"columns": STORE_COLUMNS})
    if bucketed:
        mapping["partition_spec"] = [{"source": "store_id", "transform": "bucket[4]"}]
    return document


@pytest.mark.parametrize("bucketed", [False, True], ids=["unpartitioned", "bucketed"])
def test_updates_and_tombstones_over_runs_end_in_the_logs_state(production_world, spark, bucketed, caplog):
    world = production_world
    caplog.set_level(logging.WARNING, logger="kafscale_lakehouse.engine.tables.upserts")
    log = StoreChanges(world, seed=21)
    config = world.config(upsert_document(world, bucketed=bucketed))
    for _ in range(3):
        log.write(120)
        [result] = ingest(config, spark)
        assert result.snapshot_id is not None
        assert_state(world, log)
    # A table not bucketed on its id is told, once, how to keep runs to their keys' buckets.
    assert caplog.text.count("transform: bucket[16]") == (0 if bucketed else 1)
    snapshots = world.our_snapshots()
    assert len(snapshots) == 3 and len({s.summary[RUN_ID_PROPERTY] for s in snapshots}) == 3
    # A run with nothing new commits nothing and changes nothing.
    [result] = ingest(config, spark)
    assert result.snapshot_id is None
    assert_state(world, log)


@pytest.mark.parametrize("kill_point", ["before-commit", "after-commit"])
def test_killed_around_the_upsert_commit_then_rerun(production_world, spark, kill_point):
    world = production_world
    log = StoreChanges(world, seed=7)
    document = upsert_document(world)
    log.write(100)
    ingest(world.config(document), spark)
    log.write(100)
    world.run_killed(world.write_config_file(document), kill_point, actor="upsert")
    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
    [result] = ingest(world.config(document), spark)
    assert (result.snapshot_id is None) == (kill_point == "after-commit")
    assert_state(world, log)
    assert world.recorded_runs() == []
    # Files an upsert replaced stay until snapshot expiry and orphan removal; a killed run's files must be gone.
    committed_runs = {s.summary[RUN_ID_PROPERTY] for s in world.our_snapshots()}
    left = {path for path in world.table_data_files()
            if not any(path.rsplit("/", 1)[1].startswith(data_file_prefix(run)) for run in committed_runs)}
    assert not left, f"a killed run's files were left behind: {sorted(left)[:3]}"


def test_id_unique_passes_on_the_upserted_state_and_fails_on_a_second_row_of_a_key(production_world, spark):
    world = production_world
    log = StoreChanges(world, seed=3)
    config = world.config(upsert_document(world, bucketed=True))
    log.write(80)
    ingest(config, spark)
    log.write(80)
    [result] = ingest(config, spark)
    metadata = run_metadata(result)
    table = world.table()
    check = evaluate_id_unique(table, world.topic, ["store_id"], metadata)
    assert check.passed, check.description
    assert check.metadata["rows_scanned"].value > 0
    # Another writer appends a second row of a key the last run landed.
    landed = table.scan(row_filter=f"offset >= {result.committed_ranges()[0].start} and partition = 0").to_arrow()
    table.append(landed.slice(0, 1).cast(table.schema().as_arrow()))
    check = evaluate_id_unique(world.table(), world.topic, ["store_id"], metadata)
    assert not check.passed and check.metadata["duplicate_ids"].value == 1
    assert str(landed.column("store_id")[0].as_py()) in check.description


def test_moving_a_partition_back_then_running_again_gives_the_same_state(embedded_world, spark):
    world = embedded_world
    log = StoreChanges(world, seed=99)
    config = world.config(upsert_document(world))
    for _ in range(2):
        log.write(100)
        ingest(config, spark)
    assert_state(world, log)
    with IngestContext.from_config(config, spark) as context:
        move_position(context, config.mappings[0], 0, log.next_offset[0] // 3)
    [result] = ingest(config, spark)
    assert result.partitions[0].start_offset == log.next_offset[0] // 3
    assert_state(world, log)


def test_a_later_run_with_an_older_change_of_a_key_keeps_the_newer_row(embedded_world, spark):
    """`order_column`: run 1 lands the newer change of store 7 (partition 1, updated_ms 200); run 2 lands an older
    change of it from partition 0 (updated_ms 100), which Kafka delivered late: the table keeps the newer row, as one
    run over both changes would."""
    world = embedded_world
    document = world.config_document()
    document["mappings"][0].update(mode="upsert", id_columns=["store_id"], order_column="updated_ms", schema={
        "columns": [{"name": "store_id", "type": "long", "required": True}, {"name": "status", "type": "string"},
                    {"name": "updated_ms", "type": "long"}]})
    config = world.config(document)

    def change(status: str, updated_ms: int) -> Record:
        return Record(key=b'{"store_id": 7}',
                      value=json.dumps({"store_id": 7, "status": status, "updated_ms": updated_ms}).encode())

    world.write_records(1, 0, [change("newer", 200)])
    ingest(config, spark)
    world.write_records(0, 0, [change("older", 100)])
    [result] = ingest(config, spark)
    assert result.snapshot_id is not None
    rows = world.table().scan(selected_fields=("store_id", "status", "partition")).to_arrow().to_pylist()
    assert rows == [{"store_id": 7, "status": "newer", "partition": 1}]
