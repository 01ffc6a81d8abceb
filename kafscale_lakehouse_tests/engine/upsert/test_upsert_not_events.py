"""Records of a `cdc` topic that are no change event (no `op`, an unknown op, an update without its `after`, a value
that is no JSON object) on the real servers (SeaweedFS S3 + Iceberg REST, etcd): with a dead-letter table (lenient)
they land there with the reason, once, and the change events around them land; in strict mode their partition stops
before the first, naming its offset and the reason, and commits what lies before it. Never silently."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.engine.upsert.test_upsert_cdc import cdc_document
from kafscale_lakehouse_tests.schema_registry.conftest import REGISTRY_PATH, RegistryServer

SOURCE = {"connector": "postgresql", "db": "shop", "table": "stores"}


def event(op: str | None, after: dict[str, Any] | None = None) -> bytes:
    document: dict[str, Any] = {"before": None, "after": after, "source": SOURCE, "ts_ms": 1}
    if op is not None:
        document["op"] = op
    return json.dumps(document).encode()


def key(store: int) -> bytes:
    return json.dumps({"store_id": store}).encode()


# Partition 0: offsets 1, 2, 3 and 5 are no change event; partition 1 is clean.
PARTITION_0 = [
    Record(key=key(1), value=event("c", {"store_id": 1, "status": "open"})),
    Record(key=key(2), value=event(None, {"store_id": 2, "status": "busy"})),
    Record(key=key(2), value=event("t")),
    Record(key=key(1), value=event("u")),
    Record(key=key(1), value=event("u", {"store_id": 1, "status": "closed"})),
    Record(key=key(3), value=b"[1, 2]"),
    Record(key=key(3), value=event("c", {"store_id": 3, "status": "renovating"})),
]
PARTITION_1 = [
    Record(key=key(4), value=event("r", {"store_id": 4, "status": "open"})),
    Record(key=key(4), value=event("u", {"store_id": 4, "status": "busy"})),
]
NOT_EVENTS = {1: "no Debezium op", 2: "Debezium op 't' is not one of c, u, r, d",
              3: "Debezium op 'u' without an `after` object", 5: "the value is not a JSON object"}


@pytest.fixture
def registry() -> Iterator[RegistryServer]:
    server = RegistryServer().start()
    yield server
    server.stop()


def validated_config(world: IngestWorld, registry: RegistryServer, mode: str):
    registry.serve_json(f"{REGISTRY_PATH}/{world.topic}.json", {})  # the contract holds any JSON
    document = cdc_document(world, {"format": "debezium"})
    document["schema"] = {"mode": mode, "registry": {"base_url": registry.base_url, "timeout_seconds": 2}}
    world.write_records(0, 0, PARTITION_0)
    world.write_records(1, 0, PARTITION_1)
    return world.config(document)


def states(world: IngestWorld) -> dict[int, tuple[str, int, int]]:
    rows = world.table().scan(selected_fields=("store_id", "status", "partition", "offset")).to_arrow().to_pylist()
    return {r["store_id"]: (r["status"], r["partition"], r["offset"]) for r in rows}


def test_lenient_sends_records_that_are_no_change_event_to_the_dead_letter_table_once(production_world, registry,
                                                                                      spark):
    world = production_world
    config = validated_config(world, registry, "lenient")
    [result] = ingest(config, spark)
    assert not result.failed and result.invalid_count == len(NOT_EVENTS)
    assert result.partitions[0].dead_lettered == len(NOT_EVENTS)
    assert states(world) == {1: ("closed", 0, 4), 3: ("renovating", 0, 6), 4: ("busy", 1, 1)}
    assert read_topic_offsets(world.table(), world.topic) == {0: 7, 1: 2}

    dead_letters = open_table(load_catalog(catalog_settings(config)), f"{world.table_name}_dead_letters")
    rows = dead_letters.scan().to_arrow().to_pylist()
    assert {r["offset"]: r["error"] for r in rows} == NOT_EVENTS
    assert all(r["record_id"] == f"{world.topic}:0:{r['offset']}" and r["value"] == PARTITION_0[r["offset"]].value
               and r["run_id"] == result.run_id for r in rows)

    [again] = ingest(config, spark)  # nothing new: nothing read, nothing dead-lettered twice
    assert again.records == 0 and again.snapshot_id is None
    dead_letters.refresh()
    assert len(dead_letters.scan().to_arrow()) == len(NOT_EVENTS)


def test_strict_stops_the_partition_before_the_first_record_that_is_no_change_event(production_world, registry,
                                                                                     spark):
    world = production_world
    config = validated_config(world, registry, "strict")
    for _ in range(2):  # a rerun stops at the same record: nothing skipped, nothing committed twice
        with pytest.raises(IngestFailedError) as failed:
            ingest(config, spark)
        result = failed.value.result
        assert result.partitions[0].error.startswith(f"offset 1 ({world.topic}:0:1) is no change event: "
                                                     "no Debezium op;")
        assert "offset 1" in str(failed.value) and result.partitions[1].error is None
        assert states(world) == {1: ("open", 0, 0), 4: ("busy", 1, 1)}
        assert read_topic_offsets(world.table(), world.topic) == {0: 1, 1: 2}
        assert world.store_next_offsets() == {0: 1, 1: 2}
