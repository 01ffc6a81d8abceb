"""The `OffsetStore` interface shared by the etcd and local (sqlite) backends, and the `Lease` handle.

A lease is claimed per (topic, partition) for an owner id and kept alive by a daemon thread every TTL/3. Use it as a
context manager: it is released on every exit path, including exceptions and KeyboardInterrupt. SIGTERM does not
unwind Python frames by itself; the CLI installs a handler that raises SystemExit so `with` blocks run there too.
A crashed process cannot release: its lease then expires after `lease_ttl_seconds`.

Offsets are written only by `commit_offsets` / `repair_offsets`, which are fenced: in one atomic write they check
that every given lease is still ours and write the offsets, the per-partition watermarks and the topic watermark;
if a lease was lost nothing is written and `LeaseLostError` names the partition.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafscale_lakehouse.offsets.errors import LeaseLostError
from kafscale_lakehouse.offsets.records import (
    BROKER_TOPICS_PREFIX,
    NOT_COMMITTED,
    CommittedOffset,
    OffsetKeys,
    TableIdentity,
    broker_partitions_prefix,
    decode_broker_watermarks,
    decode_offset,
    decode_partition_offsets,
    validate_partition,
    validate_topic,
)

log = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "processors"
DEFAULT_LEASE_TTL_SECONDS = 30


def now_ms() -> int:
    """Wall-clock unix milliseconds, the unit of `updated_at` and `lease_expires_at` (shared across processes)."""
    return time.time_ns() // 1_000_000


class Lease:
    """Our claim on one (topic, partition). Obtain it from `OffsetStore.acquire_lease`.

    `lost` turns true (and `lost_event` is set) when etcd/sqlite says the lease expired or its key changed, or when
    no renewal succeeded for a whole TTL; a lost lease is never renewed again and cannot commit.
    """

    def __init__(self, store: OffsetStore, topic: str, partition: int, owner_id: str, fence: Any) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        self.owner_id = owner_id
        self.key = store.keys.lease(topic, partition)
        # Backend-specific proof that the lease key is still the one we created (etcd: lease id; sqlite: claim token).
        self.fence = fence
        self.lost_event = threading.Event()
        self.lost_reason: str | None = None
        self._released = threading.Event()
        self._keeper: threading.Thread | None = None

    def __repr__(self) -> str:
        state = "released" if self.released else "lost" if self.lost else "held"
        return f"Lease({self.key}, owner={self.owner_id!r}, {state})"

    @property
    def lost(self) -> bool:
        return self.lost_event.is_set()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def ensure_held(self) -> None:
        """Raise `LeaseLostError` if this lease is known to be lost or was released (commits also check the store)."""
        if self.released:
            raise LeaseLostError(self.store.location, self.key, self.topic, self.partition, "already released")
        if self.lost:
            raise LeaseLostError(self.store.location, self.key, self.topic, self.partition, self.lost_reason or "lost")

    def mark_lost(self, reason: str) -> None:
        if self.released or self.lost:
            return
        self.lost_reason = reason
        self.lost_event.set()
        log.warning("lease %s on %s lost: %s", self.key, self.store.location, reason)

    def release(self) -> None:
        """Stop renewing and give the lease up; idempotent. Failures are logged: the lease then expires by TTL."""
        if self.released:
            return
        self._released.set()
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=self.store.lease_ttl_seconds)
        try:
            self.store._release_lease(self)
        except Exception as exc:  # noqa: BLE001 - release must not mask the error that is unwinding us
            log.warning("could not release lease %s on %s (it expires within %ss): %s",
                        self.key, self.store.location, self.store.lease_ttl_seconds, exc)
        else:
            log.debug("released lease %s", self.key)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _start_keeper(self) -> None:
        self._keeper = threading.Thread(
            target=self._keep_alive, name=f"lease-keeper-{self.topic}-{self.partition}", daemon=True
        )
        self._keeper.start()

    def _keep_alive(self) -> None:
        ttl = self.store.lease_ttl_seconds
        renew_every = ttl / 3
        last_renewed = time.monotonic()
        wait = renew_every
        # `_released.wait` doubles as the sleep, so release() wakes the keeper at once.
        while not self._released.wait(wait):
            try:
                self.store._renew_lease(self)
            except LeaseLostError as exc:
                self.mark_lost(exc.reason)
                return
            except Exception as exc:  # noqa: BLE001 - transient (etcd down, sqlite locked): retry until the TTL runs out
                unrenewed = time.monotonic() - last_renewed
                if unrenewed >= ttl:
                    self.mark_lost(f"not renewed for {unrenewed:.1f}s (TTL {ttl}s); last error: {exc}")
                    return
                log.warning("renewing lease %s failed (%s); retrying", self.key, exc)
                wait = min(renew_every, 1.0)
            else:
                last_renewed = time.monotonic()
                wait = renew_every


def leases_lost_error(lost: Sequence[tuple[Lease, str]]) -> LeaseLostError:
    """Mark each `(lease, reason)` lost and return the error a refused fenced write raises (naming the first)."""
    for lease, reason in lost:
        lease.mark_lost(reason)
    lease, reason = lost[0]
    others = f" (also lost: partitions {[other.partition for other, _ in lost[1:]]})" if len(lost) > 1 else ""
    return LeaseLostError(lease.store.location, lease.key, lease.topic, lease.partition,
                          f"{reason}; nothing was written{others}")


class OffsetStore(ABC):
    """Committed offsets, watermarks and leases of the processor (docs/kafscale-format.md §7)."""

    def __init__(self, location: str, key_prefix: str, lease_ttl_seconds: int) -> None:
        if not isinstance(lease_ttl_seconds, int) or lease_ttl_seconds < 1:
            raise ValueError(f"lease_ttl_seconds: {lease_ttl_seconds!r}, expected an integer >= 1")
        if not key_prefix:
            raise ValueError("key_prefix: must not be empty")
        self.location = location
        self.keys = OffsetKeys(key_prefix)
        self.lease_ttl_seconds = lease_ttl_seconds

    # ---- reads ------------------------------------------------------------------------------------------------

    def committed_offsets(self, topic: str) -> dict[int, CommittedOffset]:
        """Committed offsets of every partition of `topic` that has one, read at one point in time."""
        validate_topic(topic)
        prefix = self.keys.offsets_prefix(topic)
        return decode_partition_offsets(self.location, prefix, self._read_prefix(prefix))

    def committed_offset(self, topic: str, partition: int) -> CommittedOffset:
        """The committed offset of one partition; `offset == -1` when nothing was committed."""
        validate_topic(topic)
        validate_partition(partition)
        key = self.keys.offset(topic, partition)
        value = self._read(key)
        return NOT_COMMITTED if value is None else decode_offset(self.location, key, value)

    def broker_watermarks(self, topic: str) -> dict[int, int]:
        """`{partition: next_offset}` published by the KafScale broker (the log end; read-only for us)."""
        validate_topic(topic)
        return decode_broker_watermarks(self.location, topic, self._read_prefix(broker_partitions_prefix(topic)))

    def committed_offsets_by_topic(self, topics: Iterable[str]) -> dict[str, dict[int, CommittedOffset]]:
        """`committed_offsets` of each of `topics`, all read in ONE prefix read at one point in time (a watch over
        hundreds of topics: one request, not one per topic)."""
        wanted = set(topics)
        for topic in wanted:
            validate_topic(topic)
        prefix = self.keys.all_offsets_prefix()
        entries = _by_topic(self._read_prefix(prefix), prefix, wanted)
        return {topic: decode_partition_offsets(self.location, self.keys.offsets_prefix(topic), entries.get(topic, []))
                for topic in wanted}

    def broker_watermarks_by_topic(self, topics: Iterable[str]) -> dict[str, dict[int, int]]:
        """`broker_watermarks` of each of `topics`, in ONE prefix read of the broker's topics."""
        wanted = set(topics)
        for topic in wanted:
            validate_topic(topic)
        entries = _by_topic(self._read_prefix(BROKER_TOPICS_PREFIX), BROKER_TOPICS_PREFIX, wanted)
        return {topic: decode_broker_watermarks(self.location, topic, entries.get(topic, [])) for topic in wanted}

    # ---- leases -----------------------------------------------------------------------------------------------

    def acquire_lease(self, topic: str, partition: int, owner_id: str) -> Lease:
        """Claim (topic, partition) for `owner_id` and start keeping it alive; `LeaseHeldError` if it is taken."""
        validate_topic(topic)
        validate_partition(partition)
        if not owner_id:
            raise ValueError("lease owner id must not be empty")
        lease = self._claim_lease(topic, partition, owner_id)
        lease._start_keeper()
        log.info("acquired lease %s for %s on %s", lease.key, owner_id, self.location)
        return lease

    # ---- fenced writes ----------------------------------------------------------------------------------------

    def confirm_lease(self, lease: Lease) -> None:
        """Check with the store (not the keeper's last word) that `lease` is still ours, renewing it on the way;
        `LeaseLostError` (and the lease marked lost) when it is gone or taken over."""
        lease.ensure_held()
        try:
            self._renew_lease(lease)
        except LeaseLostError as exc:
            lease.mark_lost(str(exc))
            raise

    def commit_offsets(self, leases: Iterable[Lease], offsets: Mapping[int, tuple[int, int]]) -> None:
        """Record `{partition: (next offset, last_timestamp_ms)}` under our leases, atomically.

        Offsets only move forward here (`OffsetRegressionError` otherwise). Every lease must belong to this store
        and one topic and every partition needs a lease; if any lease is lost, nothing is written.
        """
        self._fenced_write(leases, offsets, allow_backwards=False)

    def repair_offsets(self, leases: Iterable[Lease], offsets: Mapping[int, tuple[int, int]]) -> None:
        """Overwrite offsets with the values recovered from the Iceberg table (the source of truth; this store is a
        cache), even when that moves them backwards. Fenced like `commit_offsets`."""
        self._fenced_write(leases, offsets, allow_backwards=True)

    def _fenced_write(self, leases: Iterable[Lease], offsets: Mapping[int, tuple[int, int]],
                      allow_backwards: bool) -> None:
        lease_list = list(leases)
        if not lease_list:
            raise ValueError("a fenced offset write needs at least one lease")
        topics = {lease.topic for lease in lease_list}
        if len(topics) != 1:
            raise ValueError(f"leases span several topics {sorted(topics)}; commit one topic at a time")
        topic = topics.pop()
        foreign = [lease.key for lease in lease_list if lease.store is not self]
        if foreign:
            raise ValueError(f"leases {foreign} belong to another offset store than {self.location}")
        leased = {lease.partition for lease in lease_list}
        unleased = sorted(set(offsets) - leased)
        if unleased:
            raise ValueError(f"{topic}: no lease given for partitions {unleased}")
        if not offsets:
            return
        for lease in lease_list:
            lease.ensure_held()
        self._write_offsets(topic, lease_list, offsets, allow_backwards)
        log.info("%s next offsets of %s on %s: %s", "repaired" if allow_backwards else "committed", topic,
                 self.location, {p: o for p, (o, _) in sorted(offsets.items())})

    # ---- the table the offsets belong to ------------------------------------------------------------------------

    def table_identity(self, topic: str) -> TableIdentity | None:
        """The table our offsets of `topic` were committed for; None when none was recorded (the Go processor's
        offsets, or nothing committed)."""
        validate_topic(topic)
        key = self.keys.table(topic)
        value = self._read(key)
        return None if value is None else TableIdentity.decode(self.location, key, value)

    def record_table_identity(self, leases: Sequence[Lease], identity: TableIdentity) -> None:
        """Record that the offsets of the leases' topic are `identity`'s, fenced by the leases (`LeaseLostError`)."""
        lease_list = list(leases)
        if not lease_list:
            raise ValueError("recording a table identity needs at least one lease")
        for lease in lease_list:
            lease.ensure_held()
        self._put_fenced(lease_list, self.keys.table(lease_list[0].topic), identity.encode())

    def forget_offsets(self, leases: Sequence[Lease]) -> None:
        """Delete the committed offsets of the leased partitions and the topic's table identity (`offsets reset`:
        the store then says what a table without offsets says, nothing committed). Each lease is confirmed first."""
        lease_list = list(leases)
        for lease in lease_list:
            self.confirm_lease(lease)
        for lease in lease_list:
            self._delete(self.keys.offset(lease.topic, lease.partition))
        if lease_list:
            self._delete(self.keys.table(lease_list[0].topic))

    # ---- run records (where a run's data files are; engine/tables/run_files.py) --------------------------------------

    def record_run(self, leases: Sequence[Lease], run_id: str, value: bytes) -> None:
        """Write the record of `run_id` before it writes any file, fenced by its leases (`LeaseLostError`)."""
        lease_list = list(leases)
        if not lease_list:
            raise ValueError("a run record needs at least one lease")
        for lease in lease_list:
            lease.ensure_held()
        self._put_fenced(lease_list, self.keys.run(lease_list[0].topic, run_id), value)

    def recorded_runs(self, topic: str) -> list[tuple[str, bytes]]:
        """`(run_id, record)` of every run of `topic` whose files are not yet known to be settled."""
        validate_topic(topic)
        prefix = self.keys.runs_prefix(topic)
        return [(key[len(prefix):], value) for key, value in self._read_prefix(prefix)]

    def forget_run(self, topic: str, run_id: str) -> None:
        self._delete(self.keys.run(topic, run_id))

    def lease_holder(self, topic: str, partition: int) -> str | None:
        """The owner id of the live lease on (topic, partition), or None when nobody holds it."""
        return self._live_lease_owner(self.keys.lease(topic, partition))

    # ---- backend primitives -----------------------------------------------------------------------------------

    @abstractmethod
    def _read(self, key: str) -> bytes | None: ...

    @abstractmethod
    def _read_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        """`(key, value)` of every key starting with `prefix`, consistent at one point in time."""

    @abstractmethod
    def _claim_lease(self, topic: str, partition: int, owner_id: str) -> Lease:
        """Create the lease key if absent (or expired) and return its handle; raise `LeaseHeldError` otherwise."""

    @abstractmethod
    def _renew_lease(self, lease: Lease) -> None:
        """Extend the lease by a TTL; raise `LeaseLostError` when it is gone or no longer ours."""

    @abstractmethod
    def _release_lease(self, lease: Lease) -> None:
        """Delete the lease key if it is still ours."""

    @abstractmethod
    def _write_offsets(self, topic: str, leases: list[Lease], offsets: Mapping[int, tuple[int, int]],
                       allow_backwards: bool) -> None:
        """Atomically: check every lease is still ours, then write `plan_offset_writes`; mark lost leases."""

    @abstractmethod
    def _put_fenced(self, leases: list[Lease], key: str, value: bytes) -> None:
        """Atomically: check every lease is still ours (`LeaseLostError` otherwise), then put `key`."""

    @abstractmethod
    def _delete(self, key: str) -> None: ...

    @abstractmethod
    def _live_lease_owner(self, lease_key: str) -> str | None: ...

    def close(self) -> None:  # noqa: B027 - an optional hook; most stores hold nothing to release
        """Release backend resources (connections); leases must be released by their holders first."""

    def __enter__(self) -> OffsetStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _by_topic(entries: Iterable[tuple[str, bytes]], prefix: str,
              topics: set[str]) -> dict[str, list[tuple[str, bytes]]]:
    """The `<prefix><topic>/...` entries of `topics`, by topic (a topic name holds no `/`)."""
    grouped: dict[str, list[tuple[str, bytes]]] = {}
    for key, value in entries:
        topic, slash, _ = key[len(prefix):].partition("/")
        if slash and topic in topics:
            grouped.setdefault(topic, []).append((key, value))
    return grouped
