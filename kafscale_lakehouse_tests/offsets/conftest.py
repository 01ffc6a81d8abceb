"""Both offset-store backends behind one fixture, plus raw access to what each stored (to check exact bytes and to
tamper with leases the way another process or an expiry would)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets import EtcdOffsetStore, LocalOffsetStore, OffsetStore
from kafscale_lakehouse.offsets.records import broker_next_offset_key

# etcd grants at least 2 s whatever is asked, so both backends use 2 s in lease timing tests.
SHORT_TTL_SECONDS = 2


@dataclass
class Backend:
    """Opens stores on one shared place and reads/writes its raw keys behind the store's back."""

    name: str
    prefix: str
    etcd_endpoint: str | None = None
    sqlite_path: Path | None = None

    def open(self, lease_ttl_seconds: int = 30) -> OffsetStore:
        if self.name == "etcd":
            return EtcdOffsetStore(EtcdClient([self.etcd_endpoint], retry_seconds=5), key_prefix=self.prefix,
                                   lease_ttl_seconds=lease_ttl_seconds)
        return LocalOffsetStore(self.sqlite_path, key_prefix=self.prefix, lease_ttl_seconds=lease_ttl_seconds)

    def raw(self, key: str) -> bytes | None:
        if self.name == "etcd":
            with EtcdClient([self.etcd_endpoint]) as client:
                return client.get(key)
        with sqlite3.connect(self.sqlite_path) as conn:
            row = conn.execute("SELECT value FROM entries WHERE key = ? UNION ALL "
                               "SELECT value FROM leases WHERE key = ?", (key, key)).fetchone()
        return None if row is None else bytes(row[0])

    def put_raw(self, key: str, value: bytes) -> None:
        if self.name == "etcd":
            with EtcdClient([self.etcd_endpoint]) as client:
                client.put(key, value)
            return
        with sqlite3.connect(self.sqlite_path) as conn:
            conn.execute("INSERT OR REPLACE INTO entries (key, value) VALUES (?, ?)", (key, value))

    def delete_lease_key(self, key: str) -> None:
        if self.name == "etcd":
            with EtcdClient([self.etcd_endpoint]) as client:
                assert client.delete(key)
            return
        with sqlite3.connect(self.sqlite_path) as conn:
            assert conn.execute("DELETE FROM leases WHERE key = ?", (key,)).rowcount == 1

    def publish_broker_watermark(self, topic: str, partition: int, next_offset: int) -> None:
        if self.name == "etcd":
            self.put_raw(broker_next_offset_key(topic, partition), str(next_offset).encode())
        else:
            self.open().record_broker_watermark(topic, partition, next_offset)


@pytest.fixture(params=["etcd", "local"])
def backend(request, unique_prefix, tmp_path) -> Iterator[Backend]:
    if request.param == "etcd":
        server = request.getfixturevalue("etcd_server")
        yield Backend("etcd", unique_prefix, etcd_endpoint=server.endpoint)
    else:
        backend = Backend("local", unique_prefix, sqlite_path=tmp_path / "offsets.sqlite")
        backend.open()  # creates the schema, so raw writes work before any store call
        yield backend


@pytest.fixture
def topic(unique_prefix) -> str:
    # Broker watermark keys are not under our prefix, so topics are unique per test as well.
    return f"orders-{unique_prefix}"
