"""`make demo`'s CDC topic: `demo-producer --cdc` writes Debezium change events of stores (creates, snapshot reads
after a restart, updates, deletes with their tombstones, store ids reused) to the lakehouse.yaml mapping with
`mode: upsert` and `cdc.format: debezium`; runs between the producer's rounds land exactly the state the log leads to,
and the code location shows the table with its id_unique check."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg

from kafscale_lakehouse.apps.demo_producer import run_demo_producer
from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, load_config
from kafscale_lakehouse.connections import catalog_settings, segment_store_from_config
from kafscale_lakehouse.definitions import defs
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.checks import ID_UNIQUE, RECORD_ID_UNIQUE
from kafscale_lakehouse.format import decode_segment
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.upsert.changes import debezium_reference_state

CDC_TOPIC = "store-status"
CDC_TABLE = "rpc.store_status"
PARTITIONS = 2
EPOCH = datetime(1970, 1, 1)


def logged_changes(config, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record the producer wrote to `topic`, in log order per partition."""
    store = segment_store_from_config(config)
    found = []
    for partition in range(PARTITIONS):
        for ref in store.list_segments(topic, partition).segments:
            segment = decode_segment(store.read(ref.kfs_key), key=ref.kfs_key, topic=topic, partition=partition)
            found += [(partition, r["offset"], r["key"], r["value"]) for r in segment.records.to_pylist()]
    return found


def test_demo_cdc_topic_lands_in_its_upsert_table_as_the_logs_state(tmp_path: Path, spark, monkeypatch) -> None:
    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text((REPO_ROOT / "lakehouse.yaml").read_text())
    config = load_config(config_path)
    [mapping] = [m for m in config.mappings if m.topic == CDC_TOPIC]
    assert (mapping.table, mapping.mode, mapping.id_columns) == (CDC_TABLE, "upsert", ["store_id"])

    for _ in range(3):  # each call is a restarted producer: it resumes the log (Debezium's snapshot reads, op r)
        run_demo_producer(config, partitions=PARTITIONS, interval_seconds=0.01, rounds=2, cdc=True)
        [result] = ingest(config, spark, topics=[CDC_TOPIC])
        assert not result.failed

        changes = logged_changes(config, CDC_TOPIC)
        expected = debezium_reference_state(changes, CDC_TOPIC, [c.name for c in mapping.schema_config.columns])
        table = open_table(load_catalog(catalog_settings(config)), CDC_TABLE)
        rows = table.scan().to_arrow().to_pylist()
        found: dict[int, dict[str, Any]] = {}
        for row in rows:
            assert row["store_id"] not in found, f"store {row['store_id']} has two rows"
            row["updated_at"] = (row["updated_at"] - EPOCH) // timedelta(microseconds=1)
            found[row["store_id"]] = {name: row[name] for name in expected.get(row["store_id"], row)}
        assert found == expected

    # The log holds every kind of change, and keys come back after their delete.
    ops = [json.loads(value)["op"] if value is not None else "tombstone" for _, _, _, value in changes]
    assert {"c", "u", "d", "r", "tombstone"} <= set(ops)
    deleted_then_back = set()
    seen_deleted: set[int] = set()
    for _, _, key, value in changes:
        store = json.loads(key)["store_id"]
        op = json.loads(value)["op"] if value is not None else "tombstone"
        if op == "d":
            seen_deleted.add(store)
        elif op in ("c", "r") and store in seen_deleted:
            deleted_then_back.add(store)
    assert deleted_then_back, "no store was created again after its delete"
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[4]"]

    # The code location (what `make demo` shows): the table's asset, its id_unique check in place of record_id_unique.
    monkeypatch.setenv(CONFIG_PATH_ENV_VAR, str(config_path))
    graph = defs().resolve_asset_graph()
    checks = {key.name for key in graph.asset_check_keys if key.asset_key == dg.AssetKey(["rpc", "store_status"])}
    assert ID_UNIQUE in checks and RECORD_ID_UNIQUE not in checks
