"""The upsert tests' change log: changes of stores written as segments to an `IngestWorld`'s topic, and the state a
reference computes from the log alone, which the upsert table must equal (every key, every column).

`StoreChanges(world, seed)` writes plain values (updates, and tombstones about 1 in 6); with `debezium=True`,
Debezium change events of a `stores` table (c/r creates, u updates, d deletes whose `before` holds the key alone,
most followed by a tombstone; some in the JSON converter's `{schema, payload}` wrapper). A store's changes live in
partition `store % 2`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

STORE_COLUMNS = [
    {"name": "store_id", "type": "long", "required": True},
    {"name": "status", "type": "string"},
    {"name": "seats", "type": "int"},
    {"name": "opened", "type": "timestamp"},
]
MAPPED = tuple(c["name"] for c in STORE_COLUMNS)
STATUSES = ("open", "closed", "renovating", "busy")
EPOCH = datetime(1970, 1, 1)
PARTITIONS = 2


class StoreChanges:
    """Changes of `keys` stores (see the module docstring), appended as one segment per partition per `write`."""

    def __init__(self, world: IngestWorld, seed: int, *, debezium: bool = False, keys: int = 40) -> None:
        self.world, self.random, self.debezium, self.keys = world, random.Random(seed), debezium, keys
        self.rows: dict[int, dict[str, Any]] = {}  # the source database (Debezium)
        self.next_offset = dict.fromkeys(range(PARTITIONS), 0)
        self.log: dict[int, list[tuple[int, Record]]] = {p: [] for p in range(PARTITIONS)}

    def write(self, changes: int) -> None:
        by_partition: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        for _ in range(changes):
            store = self.random.randrange(self.keys)
            records = self._debezium(store) if self.debezium else [self._plain(store)]
            by_partition[store % PARTITIONS].extend(records)
        for partition, records in by_partition.items():
            if records:
                base = self.next_offset[partition]
                self.world.write_records(partition, base, records)
                self.log[partition].extend(enumerate(records, start=base))
                self.next_offset[partition] += len(records)

    def _plain(self, store: int) -> Record:
        key = json.dumps({"store_id": store}).encode()
        if self.random.random() < 1 / 6:
            return Record(key=key, value=None, timestamp_ms=1_700_000_000_000)
        value = {"store_id": store, "status": self.random.choice(STATUSES), "seats": self.random.randrange(200),
                 "opened": f"2024-0{self.random.randrange(1, 10)}-01"}
        if self.random.random() < 0.3:
            del value["seats"]
        return Record(key=key, value=json.dumps(value).encode(), timestamp_ms=1_700_000_000_000)

    def _wrap(self, document: dict[str, Any]) -> bytes:
        if self.random.random() < 0.3:  # the JSON converter with schemas.enable
            document = {"schema": {"type": "struct", "optional": False}, "payload": document}
        return json.dumps(document).encode()

    def _debezium(self, store: int) -> list[Record]:
        key = self._wrap({"store_id": store})
        source = {"connector": "postgresql", "db": "shop", "table": "stores", "lsn": self.random.randrange(10**9)}
        if store in self.rows and self.random.random() < 0.25:
            del self.rows[store]
            # REPLICA IDENTITY DEFAULT: `before` holds the primary key alone
            event = {"before": {"store_id": store}, "after": None, "op": "d", "source": source, "ts_ms": 1}
            records = [Record(key=key, value=self._wrap(event))]
            if self.random.random() < 0.7:  # tombstones.on.delete
                records.append(Record(key=key, value=None))
            return records
        op = "u" if store in self.rows else self.random.choice(["c", "r"])
        after = {"store_id": store, "status": self.random.choice(STATUSES), "seats": self.random.randrange(300),
                 "opened": 1_700_000_000_000_000 + self.random.randrange(10**9)}
        if self.random.random() < 0.2:
            del after["seats"]
        event = {"before": self.rows.get(store), "after": after, "op": op, "source": source, "ts_ms": 1}
        self.rows[store] = after
        return [Record(key=key, value=self._wrap(event))]

    def entries(self) -> list[tuple[int, int, bytes | None, bytes | None]]:
        """(partition, offset, key, value) of every record written, in log order per partition."""
        return [(p, offset, r.key, r.value) for p, records in self.log.items() for offset, r in records]

    def expected_state(self) -> dict[int, dict[str, Any]]:
        """store_id → the row its last record makes (mapped columns, base columns), from the log alone."""
        if self.debezium:
            state = debezium_reference_state(self.entries(), self.world.topic, MAPPED)
            assert set(state) == set(self.rows), "the reference disagrees with the source database"
            for row in state.values():
                row["opened"] = EPOCH + timedelta(microseconds=row["opened"])
            return state
        state = {}
        for partition, offset, key, value in self.entries():
            store = json.loads(key)["store_id"]
            if value is None:
                state.pop(store, None)
                continue
            document = json.loads(value)
            state[store] = {"store_id": store, "status": document["status"], "seats": document.get("seats"),
                            "opened": datetime.fromisoformat(f"{document['opened']}T00:00:00"),
                            **_base_columns(self.world.topic, partition, offset, key, value)}
        return state


def _base_columns(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> dict[str, Any]:
    return {"partition": partition, "offset": offset, "record_id": f"{topic}:{partition}:{offset}", "value": value,
            "key": key}


def debezium_reference_state(entries: Iterable[tuple[int, int, bytes | None, bytes | None]], topic: str,
                             columns: Sequence[str], id_column: str = "store_id") -> dict[Any, dict[str, Any]]:
    """The rows a Debezium log leads to, by `id_column` (read from the record key, `{schema, payload}` unwrapped):
    per key its last event's `after` image (`columns` of it, None where missing) and its record's base columns; a
    delete (`op` d) or a tombstone removes the key. `entries`: (partition, offset, key, value) in log order per
    partition (a key lives in one partition)."""
    state: dict[Any, dict[str, Any]] = {}
    for partition, offset, key, value in entries:
        if key is None:
            raise ValueError(f"{topic}:{partition}:{offset} has no record key")
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
        state[identity] = {**{name: after.get(name) for name in columns},
                           **_base_columns(topic, partition, offset, key, value)}
    return state


def assert_state(world: IngestWorld, changes: StoreChanges, duckdb_copies: Path | None = None) -> None:
    """The table holds exactly the reference's rows (one per store, every column), its offsets are the log's end,
    the offsets store follows it; with `duckdb_copies`, DuckDB reads the current snapshot's Parquet files (copied
    there) as the same stores and statuses."""
    table = world.table()
    found: dict[int, dict[str, Any]] = {}
    names = (*MAPPED, "partition", "offset", "record_id", "value", "key")
    for row in table.scan().to_arrow().to_pylist():
        assert row["store_id"] not in found, f"store {row['store_id']} has two rows"
        found[row["store_id"]] = {name: row[name] for name in names}
    expected = changes.expected_state()
    assert sorted(found) == sorted(expected), "the table's stores are not those the log leaves"
    for store, row in expected.items():
        assert found[store] == row, f"store {store}"
    assert read_topic_offsets(table, world.topic) == {p: n for p, n in changes.next_offset.items() if n}
    assert world.store_next_offsets() == read_topic_offsets(table, world.topic)
    assert world.table_data_files() >= world.referenced_data_files(table)
    if duckdb_copies is not None:
        copies = duckdb_copies / f"snapshot-{table.metadata.current_snapshot_id}"
        copies.mkdir(parents=True)
        for number, task in enumerate(table.scan().plan_files()):
            with table.io.new_input(task.file.file_path).open() as source:
                (copies / f"{number}.parquet").write_bytes(source.read())
        read = duckdb.sql(f"select store_id, status from read_parquet('{copies}/*.parquet')").fetchall()
        assert sorted(read) == sorted((s, r["status"]) for s, r in expected.items())

