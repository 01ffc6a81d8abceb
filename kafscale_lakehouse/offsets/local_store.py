"""The `local` offset store: one sqlite file with the same keys, bytes and semantics as the etcd store.

`entries` holds the offsets/watermarks keys (and broker watermarks published by the embedded demo producer);
`leases` holds lease keys with their expiry and a random claim token that fences renewals and commits. Every write
is one `BEGIN IMMEDIATE` transaction, so several processes can share the file; expiry uses the wall clock.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kafscale_lakehouse.offsets.errors import LeaseHeldError, LeaseLostError, OffsetStoreUnavailableError
from kafscale_lakehouse.offsets.records import (
    broker_next_offset_key,
    decode_lease_owner,
    decode_partition_offsets,
    encode_lease,
    plan_offset_writes,
    validate_partition,
    validate_topic,
)
from kafscale_lakehouse.offsets.store import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_LEASE_TTL_SECONDS,
    Lease,
    OffsetStore,
    leases_lost_error,
    now_ms,
)

log = logging.getLogger(__name__)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS leases ("
    " key TEXT PRIMARY KEY, value BLOB NOT NULL, token TEXT NOT NULL, expires_at_ms INTEGER NOT NULL)",
)


class LocalOffsetStore(OffsetStore):
    """Offsets and leases in a sqlite file at `path`. `Lease.fence` is the claim token of the lease row."""

    def __init__(self, path: str | Path, key_prefix: str = DEFAULT_KEY_PREFIX,
                 lease_ttl_seconds: int = DEFAULT_LEASE_TTL_SECONDS, busy_timeout_seconds: float = 30) -> None:
        self.path = Path(path)
        super().__init__(f"sqlite {self.path}", key_prefix, lease_ttl_seconds)
        self.busy_timeout_seconds = busy_timeout_seconds
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OffsetStoreUnavailableError(f"{self.location}: cannot create its directory: {exc}") from exc
        with self._transaction() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction on a fresh connection (sqlite connections must not be shared across threads).

        Writes take the database write lock up front (`BEGIN IMMEDIATE`), so a read-check-write cannot interleave
        with another process; waiting for that lock is bounded by `busy_timeout_seconds`.
        """
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_seconds, isolation_level=None)
        except sqlite3.Error as exc:
            raise OffsetStoreUnavailableError(f"{self.location}: cannot open: {exc}") from exc
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise OffsetStoreUnavailableError(f"{self.location}: {exc}") from exc
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    @staticmethod
    def _select_prefix(conn: sqlite3.Connection, prefix: str) -> list[tuple[str, bytes]]:
        # BINARY collation orders keys by their UTF-8 bytes, as etcd does.
        rows = conn.execute(
            "SELECT key, value FROM entries WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix)
        )
        return [(key, bytes(value)) for key, value in rows]

    def _read(self, key: str) -> bytes | None:
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _read_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        with self._transaction(write=False) as conn:
            return self._select_prefix(conn, prefix)

    def record_broker_watermark(self, topic: str, partition: int, next_offset: int) -> None:
        """Publish the log end of a locally produced partition, as a KafScale broker does in etcd (demo producer)."""
        validate_topic(topic)
        validate_partition(partition)
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO entries (key, value) VALUES (?, ?)",
                         (broker_next_offset_key(topic, partition), str(next_offset).encode()))

    def _claim_lease(self, topic: str, partition: int, owner_id: str) -> Lease:
        key = self.keys.lease(topic, partition)
        token = uuid.uuid4().hex
        with self._transaction() as conn:
            now = now_ms()
            row = conn.execute("SELECT value, expires_at_ms FROM leases WHERE key = ?", (key,)).fetchone()
            if row is not None and row[1] > now:
                raise LeaseHeldError(self.location, key, topic, partition,
                                     decode_lease_owner(self.location, key, bytes(row[0])))
            expires = now + self.lease_ttl_seconds * 1000
            conn.execute("INSERT OR REPLACE INTO leases (key, value, token, expires_at_ms) VALUES (?, ?, ?, ?)",
                         (key, encode_lease(owner_id, expires), token, expires))
        return Lease(self, topic, partition, owner_id, fence=token)

    def _renew_lease(self, lease: Lease) -> None:
        with self._transaction() as conn:
            now = now_ms()
            expires = now + self.lease_ttl_seconds * 1000
            renewed = conn.execute(
                "UPDATE leases SET value = ?, expires_at_ms = ? WHERE key = ? AND token = ? AND expires_at_ms > ?",
                (encode_lease(lease.owner_id, expires), expires, lease.key, lease.fence, now),
            ).rowcount
        if not renewed:
            raise LeaseLostError(self.location, lease.key, lease.topic, lease.partition,
                                 "lease expired or was taken over")

    def _release_lease(self, lease: Lease) -> None:
        with self._transaction() as conn:
            conn.execute("DELETE FROM leases WHERE key = ? AND token = ?", (lease.key, lease.fence))

    def _put_fenced(self, leases: list[Lease], key: str, value: bytes) -> None:
        with self._transaction() as conn:
            now = now_ms()
            lost = []
            for lease in leases:
                row = conn.execute("SELECT token, expires_at_ms FROM leases WHERE key = ?", (lease.key,)).fetchone()
                if row is None or row[0] != lease.fence:
                    lost.append((lease, "lease key is gone or belongs to another owner"))
                elif row[1] <= now:
                    lost.append((lease, "lease expired"))
            if lost:
                raise leases_lost_error(lost)
            conn.execute("INSERT OR REPLACE INTO entries (key, value) VALUES (?, ?)", (key, value))

    def _delete(self, key: str) -> None:
        with self._transaction() as conn:
            conn.execute("DELETE FROM entries WHERE key = ?", (key,))

    def _live_lease_owner(self, lease_key: str) -> str | None:
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT value, expires_at_ms FROM leases WHERE key = ?", (lease_key,)).fetchone()
        if row is None or row[1] <= now_ms():
            return None
        return decode_lease_owner(self.location, lease_key, bytes(row[0]))

    def _write_offsets(self, topic: str, leases: list[Lease], offsets: Mapping[int, tuple[int, int]],
                       allow_backwards: bool) -> None:
        offsets_prefix = self.keys.offsets_prefix(topic)
        watermarks_prefix = self.keys.partition_watermarks_prefix(topic)
        with self._transaction() as conn:
            now = now_ms()
            lost = []
            for lease in leases:
                row = conn.execute("SELECT token, expires_at_ms FROM leases WHERE key = ?", (lease.key,)).fetchone()
                if row is None or row[0] != lease.fence:
                    lost.append((lease, "lease key is gone or belongs to another owner"))
                elif row[1] <= now:
                    lost.append((lease, "lease expired"))
            if lost:
                raise leases_lost_error(lost)
            writes = plan_offset_writes(
                self.location, self.keys, topic, offsets,
                committed=decode_partition_offsets(self.location, offsets_prefix,
                                                   self._select_prefix(conn, offsets_prefix)),
                partition_watermarks=decode_partition_offsets(self.location, watermarks_prefix,
                                                              self._select_prefix(conn, watermarks_prefix)),
                now_ms=now, allow_backwards=allow_backwards,
            )
            conn.executemany("INSERT OR REPLACE INTO entries (key, value) VALUES (?, ?)", list(writes.items()))
