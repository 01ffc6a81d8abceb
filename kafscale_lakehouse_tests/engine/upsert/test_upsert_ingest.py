"""`mode: upsert` end to end on the real servers: a topic of changes (updates, tombstones) over several runs ends
with exactly the state a reference computes from the log, every key and every column; a run SIGKILLed around its
commit, then a rerun, ends the same way."""

from __future__ import annotations

import json
import logging
import random
import sys
from typing import Any

import pytest

from kafscale_lakehouse.engine.ingestion.replay import move_position
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY, read_topic_offsets
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.orchestration.checks import evaluate_id_unique
from kafscale_lakehouse.orchestration.metadata import run_metadata
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld

STORE_COLUMNS = [
    {"name": "store_id", "type": "long", "required": True},
    {"name": "status", "type": "string"},
    {"name": "seats", "type": "int"},
    {"name": "opened", "type": "timestamp"},
]
STATUSES = ("open", "closed", "renovating", "busy")
KEYS = 40


def upsert_document(world: IngestWorld, *, bucketed: bool = False) -> dict[str, Any]:
    document = world.config_document()
    mapping = document["mappings"][0]
    mapping.update(mode="upsert", id_columns=["store_id"], schema={"columns": STORE_COLUMNS})
    if bucketed:
        mapping["partition_spec"] = [{"source": "store_id", "transform": "bucket[4]"}]
    return document


class ChangeLog:
    """Changes of stores (a key lives in partition key % 2), written as segments, and the state they lead to."""

    def __init__(self, world: IngestWorld, seed: int) -> None:
        self.world, self.random = world, random.Random(seed)
        self.next_offset = {0: 0, 1: 0}
        self.log: dict[int, list[tuple[int, Record]]] = {0: [], 1: []}

    def write(self, changes: int) -> None:
        """One segment per partition with `changes` records in all: updates, and tombstones (about 1 in 6)."""
        by_partition: dict[int, list[Record]] = {0: [], 1: []}
        for _ in range(changes):
            store = self.random.randrange(KEYS)
            key = json.dumps({"store_id": store}).encode()
            if self.random.random() < 1 / 6:
                record = Record(key=key, value=None, timestamp_ms=1_700_000_000_000)
            else:
                value = {"store_id": store, "status": self.random.choice(STATUSES),
                         "seats": self.random.randrange(200), "opened": f"2024-0{self.random.randrange(1, 10)}-01"}
                if self.random.random() < 0.3:
                    del value["seats"]
                record = Record(key=key, value=json.dumps(value).encode(), timestamp_ms=1_700_000_000_000)
            by_partition[store % 2].append(record)
        for partition, records in by_partition.items():
            if records:
                base = self.next_offset[partition]
                self.world.write_records(partition, base, records)
                self.log[partition].extend(enumerate(records, start=base))
                self.next_offset[partition] += len(records)

    def expected_state(self) -> dict[int, dict[str, Any]]:
        """store_id → the row its last record makes (mapped columns, offset, partition); deleted stores absent."""
        state: dict[int, dict[str, Any]] = {}
        for partition, records in self.log.items():
            for offset, record in records:
                store = json.loads(record.key)["store_id"]
                if record.value is None:
                    state.pop(store, None)
                    continue
                value = json.loads(record.value)
                state[store] = {"store_id": store, "status": value["status"], "seats": value.get("seats"),
                                "opened": f"{value['opened']}T00:00:00", "partition": partition, "offset": offset,
                                "record_id": f"{self.world.topic}:{partition}:{offset}", "value": record.value,
                                "key": record.key}
        return state


def assert_state(world: IngestWorld, log: ChangeLog) -> None:
    table = world.table()
    rows = table.scan().to_arrow().to_pylist()
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        assert row["store_id"] not in found, f"store {row['store_id']} has two rows"
        row["opened"] = row["opened"].isoformat()
        found[row["store_id"]] = {name: row[name] for name in
                                  ("store_id", "status", "seats", "opened", "partition", "offset", "record_id",
                                   "value", "key")}
    expected = log.expected_state()
    assert sorted(found) == sorted(expected), "the table's stores are not those the log leaves"
    for store, row in expected.items():
        assert found[store] == row, f"store {store}"
    assert read_topic_offsets(table, world.topic) == {p: n for p, n in log.next_offset.items() if n}
    assert world.store_next_offsets() == read_topic_offsets(table, world.topic)
    assert world.table_data_files() >= world.referenced_data_files(table)


@pytest.mark.parametrize("bucketed", [False, True], ids=["unpartitioned", "bucketed"])
def test_updates_and_tombstones_over_runs_end_in_the_logs_state(production_world, spark, bucketed, caplog):
    world = production_world
    caplog.set_level(logging.WARNING, logger="kafscale_lakehouse.engine.tables.upserts")
    log = ChangeLog(world, seed=21)
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


@pytest.mark.parametrize("kill_point", ["before-upsert-commit", "after-upsert-commit"])
def test_killed_around_the_upsert_commit_then_rerun(production_world, spark, kill_point):
    world = production_world
    log = ChangeLog(world, seed=7)
    document = upsert_document(world)
    log.write(100)
    ingest(world.config(document), spark)
    log.write(100)
    config_path = world.write_config_file(document)
    done = world.run_process(sys.executable, "-m", "kafscale_lakehouse_tests.engine.upsert.crash_upsert",
                             kill_point, "--config", str(config_path))
    assert done.returncode == -9 and f"KILL POINT {kill_point}" in done.stderr, done.stderr[-4000:]
    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
    [result] = ingest(world.config(document), spark)
    assert (result.snapshot_id is None) == (kill_point == "after-upsert-commit")
    assert_state(world, log)
    assert world.recorded_runs() == []
    # Files an upsert replaced stay until snapshot expiry and orphan removal; a killed run's files must be gone.
    committed_runs = {s.summary[RUN_ID_PROPERTY] for s in world.our_snapshots()}
    left = {path for path in world.table_data_files() if path.split("/data/kafscale-")[1].split("/")[0]
            not in committed_runs}
    assert not left, f"a killed run's files were left behind: {sorted(left)[:3]}"


def test_id_unique_passes_on_the_upserted_state_and_fails_on_a_second_row_of_a_key(production_world, spark):
    world = production_world
    log = ChangeLog(world, seed=3)
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
    log = ChangeLog(world, seed=99)
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
