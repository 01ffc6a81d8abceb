"""`cdc` change events landing in an upsert table on the real servers: a Debezium-shaped topic with creates, updates,
snapshot reads, deletes (whose `before` holds the key alone) and tombstones, some in the JSON converter's
`{schema, payload}` wrapper (changes.StoreChanges), over several runs, SIGKILLed at random points of the commit
protocol (the fault matrix's `upsert` actor; seeded, the seed printed and in every assertion message, and
`KAFSCALE_UPSERT_KILL_SEED` replays one), ends with exactly the state a reference computes from the log; pyiceberg
and DuckDB read it."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest

from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.engine.faults.actor import OTHER_POINTS
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld
from kafscale_lakehouse_tests.engine.upsert.changes import STORE_COLUMNS, StoreChanges, assert_state

KILLS = 4  # killed runs per test, each at a point drawn from the upsert actor's
KILL_SEED_VARIABLE = "KAFSCALE_UPSERT_KILL_SEED"


def cdc_document(world: IngestWorld, cdc: dict[str, Any]) -> dict[str, Any]:
    document = world.config_document()
    document["mappings"][0].update(mode="upsert", id_columns=["store_id"], schema={"columns": STORE_COLUMNS},
                                   cdc=cdc, partition_spec=[{"source": "store_id", "transform": "bucket[3]"}])
    return document


def test_debezium_topic_with_random_sigkills_ends_in_the_logs_state(production_world, spark, tmp_path):
    seed = int(os.environ.get(KILL_SEED_VARIABLE) or random.randrange(1_000_000))
    print(f"random SIGKILLs: seed {seed} (replay with {KILL_SEED_VARIABLE}={seed})")
    rng = random.Random(seed)
    world = production_world
    changes = StoreChanges(world, seed=seed, debezium=True, keys=30)
    document = cdc_document(world, {"format": "debezium"})
    config, config_path = world.config(document), world.write_config_file(document)
    changes.write(90)
    ingest(config, spark)
    assert_state(world, changes, tmp_path / "first")
    points = sorted(OTHER_POINTS["upsert"])
    for kill in range(KILLS):
        changes.write(rng.randrange(30, 120))
        point = rng.choice(points)
        print(f"seed {seed}: kill {kill} at {point}")
        try:
            world.run_killed(config_path, point, actor="upsert")
            world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
            if rng.random() < 0.5:  # more changes land before the next run finds what the killed one left
                changes.write(rng.randrange(10, 60))
            ingest(config, spark)
            assert_state(world, changes, tmp_path / f"after-{kill}")
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, kill {kill} at {point}: {exc}") from exc
    assert world.recorded_runs() == [], f"seed {seed}"


def test_op_field_events_and_a_record_that_is_no_event(embedded_world, spark):
    world = embedded_world
    document = cdc_document(world, {"format": "op_field", "op_field": "action", "delete_ops": ["delete"]})
    config = world.config(document)
    key = json.dumps({"store_id": 1}).encode()
    world.write_records(0, 0, [
        Record(key=key, value=json.dumps({"action": "upsert", "store_id": 1, "status": "open"}).encode()),
        Record(key=key, value=json.dumps({"action": "upsert", "store_id": 3, "status": "busy"}).encode()),
        Record(key=key, value=json.dumps({"action": "delete", "store_id": 1}).encode()),
        Record(key=key, value=json.dumps({"action": "upsert", "store_id": 5, "status": "closed"}).encode()),
    ])
    ingest(config, spark)
    rows = world.table().scan(selected_fields=("store_id", "status", "offset")).to_arrow().to_pylist()
    assert sorted((r["store_id"], r["status"], r["offset"]) for r in rows) == [(3, "busy", 1), (5, "closed", 3)]
    # Without a dead-letter table, a value that is no JSON object stops its partition there, naming the record;
    # the events before it commit.
    world.write_records(0, 4, [Record(key=key, value=json.dumps({"action": "upsert", "store_id": 7}).encode()),
                               Record(key=key, value=b"[1, 2]")])
    with pytest.raises(IngestFailedError, match=rf"offset 5 \({world.topic}:0:5\) is no change event: the value is "
                                                "not a JSON object"):
        ingest(config, spark)
    assert read_topic_offsets(world.table(), world.topic) == {0: 5}
    assert 7 in world.table().scan(selected_fields=("store_id",)).to_arrow()["store_id"].to_pylist()
