"""`cdc` change events landing in an upsert table on the real servers: a Debezium-shaped topic with creates, updates,
snapshot reads, deletes (whose `before` holds the key alone) and tombstones, some in the JSON converter's
`{schema, payload}` wrapper, over several runs and a run SIGKILLed before its commit, ends with exactly the state a
reference computes from the log; pyiceberg and DuckDB read it."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld
from kafscale_lakehouse_tests.engine.upsert.test_upsert_ingest import STATUSES, STORE_COLUMNS

KEYS = 30
EPOCH = datetime(1970, 1, 1)
MAPPED = ("store_id", "status", "seats", "opened")


def cdc_document(world: IngestWorld, cdc: dict[str, Any]) -> dict[str, Any]:
    document = world.config_document()
    document["mappings"][0].update(mode="upsert", id_columns=["store_id"], schema={"columns": STORE_COLUMNS},
                                   cdc=cdc, partition_spec=[{"source": "store_id", "transform": "bucket[3]"}])
    return document


class DebeziumLog:
    """Debezium change events of stores (a store's events in partition store % 2) and the state they lead to."""

    def __init__(self, world: IngestWorld, seed: int) -> None:
        self.world, self.random = world, random.Random(seed)
        self.rows: dict[int, dict[str, Any]] = {}  # the source database
        self.next_offset = {0: 0, 1: 0}
        self.log: dict[int, list[tuple[int, Record]]] = {0: [], 1: []}

    def _wrap(self, document: dict[str, Any]) -> bytes:
        if self.random.random() < 0.3:  # the JSON converter with schemas.enable
            document = {"schema": {"type": "struct", "optional": False}, "payload": document}
        return json.dumps(document).encode()

    def _row(self, store: int) -> dict[str, Any]:
        row = {"store_id": store, "status": self.random.choice(STATUSES), "seats": self.random.randrange(300),
               "opened": 1_700_000_000_000_000 + self.random.randrange(10**9)}
        if self.random.random() < 0.2:
            del row["seats"]
        return row

    def write(self, changes: int) -> None:
        by_partition: dict[int, list[Record]] = {0: [], 1: []}
        for _ in range(changes):
            store = self.random.randrange(KEYS)
            key = self._wrap({"store_id": store})
            partition = store % 2
            source = {"connector": "postgresql", "db": "shop", "table": "stores", "lsn": self.random.randrange(10**9)}
            if store in self.rows and self.random.random() < 0.25:
                before = {"store_id": store}  # REPLICA IDENTITY DEFAULT: the primary key alone
                del self.rows[store]
                event = {"before": before, "after": None, "op": "d", "source": source, "ts_ms": 1}
                by_partition[partition].append(Record(key=key, value=self._wrap(event)))
                if self.random.random() < 0.7:  # tombstones.on.delete
                    by_partition[partition].append(Record(key=key, value=None))
                continue
            op = "u" if store in self.rows else self.random.choice(["c", "r"])
            after = self._row(store)
            event = {"before": self.rows.get(store), "after": after, "op": op, "source": source, "ts_ms": 1}
            self.rows[store] = after
            by_partition[partition].append(Record(key=key, value=self._wrap(event)))
        for partition, records in by_partition.items():
            if records:
                base = self.next_offset[partition]
                self.world.write_records(partition, base, records)
                self.log[partition].extend(enumerate(records, start=base))
                self.next_offset[partition] += len(records)

    def expected_state(self) -> dict[int, dict[str, Any]]:
        """Computed from the log alone (not from `rows`)."""
        entries = [(p, offset, r.key, r.value) for p, records in self.log.items() for offset, r in records]
        return debezium_reference_state(entries, self.world.topic, MAPPED)


def debezium_reference_state(entries: Iterable[tuple[int, int, bytes | None, bytes | None]], topic: str,
                             columns: Sequence[str], id_column: str = "store_id") -> dict[Any, dict[str, Any]]:
    """The rows a Debezium log leads to, by `id_column` (read from the record key, `{schema, payload}` unwrapped):
    per key its last event's `after` image (`columns` of it, None where missing) and its record's base columns; a
    delete (`op` d) or a tombstone removes the key. `entries`: (partition, offset, key, value) in log order per
    partition (a key lives in one partition)."""
    state: dict[Any, dict[str, Any]] = {}
    for partition, offset, key, value in entries:
        parsed_key = json.loads(key)
        identity = parsed_key.get("payload", parsed_key)[id_column]
        if value is None:
            state.pop(identity, None)
            continue
        event = json.loads(value)
        event = event.get("payload", event)
        if event["op"] == "d":
            state.pop(identity, None)
            continue
        after = event["after"]
        state[identity] = {**{name: after.get(name) for name in columns}, "partition": partition, "offset": offset,
                           "record_id": f"{topic}:{partition}:{offset}", "value": value, "key": key}
    return state


def assert_cdc_state(world: IngestWorld, log: DebeziumLog, tmp_path: Path) -> None:
    table = world.table()
    found: dict[int, dict[str, Any]] = {}
    for row in table.scan().to_arrow().to_pylist():
        assert row["store_id"] not in found, f"store {row['store_id']} has two rows"
        row["opened"] = (row["opened"] - EPOCH) // timedelta(microseconds=1)
        found[row["store_id"]] = {name: row[name] for name in (*MAPPED, "partition", "offset", "record_id", "value",
                                                                 "key")}
    expected = log.expected_state()
    assert set(expected) == set(log.rows), "the reference disagrees with the source database"
    assert sorted(found) == sorted(expected)
    for store, row in expected.items():
        assert found[store] == row, f"store {store}"
    assert read_topic_offsets(table, world.topic) == {p: n for p, n in log.next_offset.items() if n}
    # DuckDB reads the current snapshot's Parquet files as they are: the same stores and statuses.
    copies = tmp_path / f"snapshot-{table.metadata.current_snapshot_id}"
    copies.mkdir()
    for number, task in enumerate(table.scan().plan_files()):
        with table.io.new_input(task.file.file_path).open() as source:
            (copies / f"{number}.parquet").write_bytes(source.read())
    read = duckdb.sql(f"select store_id, status from read_parquet('{copies}/*.parquet')").fetchall()
    assert sorted(read) == sorted((s, r["status"]) for s, r in expected.items())


def test_debezium_topic_over_runs_and_a_killed_run_ends_in_the_logs_state(production_world, spark, tmp_path):
    world = production_world
    log = DebeziumLog(world, seed=1321)
    document = cdc_document(world, {"format": "debezium"})
    config = world.config(document)
    log.write(90)
    ingest(config, spark)
    assert_cdc_state(world, log, tmp_path)
    log.write(90)
    config_path = world.write_config_file(document)
    done = world.run_process(sys.executable, "-m", "kafscale_lakehouse_tests.engine.upsert.crash_upsert",
                             "before-upsert-commit", "--config", str(config_path))
    assert done.returncode == -9 and "KILL POINT before-upsert-commit" in done.stderr, done.stderr[-4000:]
    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
    log.write(90)
    ingest(config, spark)
    assert_cdc_state(world, log, tmp_path)
    log.write(90)
    ingest(config, spark)
    assert_cdc_state(world, log, tmp_path)
    assert world.recorded_runs() == []


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
