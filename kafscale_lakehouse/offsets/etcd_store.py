"""The `etcd` offset store: KafScale's keys and bytes, etcd leases, fenced transactions.

A lease key is put with an etcd lease of TTL `lease_ttl_seconds` in a transaction "if version(key) == 0", as the
Go processor does. Unlike the Go processor, renewals and commits are fenced: they compare that the lease key is still
attached to our etcd lease, so a worker whose lease expired or was taken over cannot write.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping

from kafscale_lakehouse.etcd import EtcdClient, EtcdCompare, LeaseIs, ModRevisionIs, PutOp, VersionIs
from kafscale_lakehouse.offsets.errors import CommitConflictError, LeaseHeldError, LeaseLostError
from kafscale_lakehouse.offsets.records import (
    decode_lease_owner,
    decode_partition_offsets,
    encode_lease,
    plan_offset_writes,
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

# A commit retries when another committer of the same topic changed the watermarks between our read and write.
# Every failed attempt means another commit landed, so the topic as a whole always progresses; a deadline with
# jittered backoff (not a fixed attempt count) keeps one committer from starving behind a busy neighbour.
_COMMIT_DEADLINE_SECONDS = 60.0
_COMMIT_BACKOFF_SECONDS = (0.005, 0.5)
_CLAIM_ATTEMPTS = 3


class EtcdOffsetStore(OffsetStore):
    """Offsets and leases in etcd. `Lease.fence` is the etcd lease id the lease key is attached to."""

    def __init__(self, client: EtcdClient, key_prefix: str = DEFAULT_KEY_PREFIX,
                 lease_ttl_seconds: int = DEFAULT_LEASE_TTL_SECONDS) -> None:
        super().__init__(f"etcd {', '.join(client.endpoints)}", key_prefix, lease_ttl_seconds)
        self.client = client

    def _read(self, key: str) -> bytes | None:
        return self.client.get(key)

    def _read_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        return [(entry.key, entry.value) for entry in self.client.get_prefix(prefix)]

    def _claim_lease(self, topic: str, partition: int, owner_id: str) -> Lease:
        key = self.keys.lease(topic, partition)
        lease_id = self.client.grant_lease(self.lease_ttl_seconds)
        try:
            for _ in range(_CLAIM_ATTEMPTS):
                value = encode_lease(owner_id, now_ms() + self.lease_ttl_seconds * 1000)
                self.client.transaction([VersionIs(key, 0)], [PutOp(key, value, lease_id)])
                # Read back rather than trust the answer: a retried transaction may already have applied.
                entry = self.client.get_entry(key)
                if entry is not None and entry.lease_id == lease_id:
                    return Lease(self, topic, partition, owner_id, fence=lease_id)
                if entry is not None:
                    raise LeaseHeldError(self.location, key, topic, partition,
                                         decode_lease_owner(self.location, key, entry.value))
                # The holder released between our transaction and the read: claim again.
            raise LeaseHeldError(self.location, key, topic, partition, "(released and re-claimed repeatedly)")
        except BaseException:
            self._revoke_quietly(lease_id, key)
            raise

    def _revoke_quietly(self, lease_id: int, key: str) -> None:
        try:
            self.client.revoke_lease(lease_id)
        except Exception as exc:  # noqa: BLE001 - an unused etcd lease expires on its own
            log.warning("could not revoke unused etcd lease %x for %s (expires in %ss): %s",
                        lease_id, key, self.lease_ttl_seconds, exc)

    def _renew_lease(self, lease: Lease) -> None:
        remaining = self.client.refresh_lease(lease.fence)
        if remaining <= 0:
            raise LeaseLostError(self.location, lease.key, lease.topic, lease.partition,
                                 f"etcd lease {lease.fence:x} expired")
        # Refresh lease_expires_at in the value, as the Go processor does, but only while the key is ours.
        value = encode_lease(lease.owner_id, now_ms() + self.lease_ttl_seconds * 1000)
        if not self.client.transaction([LeaseIs(lease.key, lease.fence)], [PutOp(lease.key, value, lease.fence)]):
            raise LeaseLostError(self.location, lease.key, lease.topic, lease.partition,
                                 "lease key was deleted or re-created by another owner")

    def _release_lease(self, lease: Lease) -> None:
        # Revoking deletes the attached lease key; a key another owner created since is left alone.
        self.client.revoke_lease(lease.fence)

    def _write_offsets(self, topic: str, leases: list[Lease], offsets: Mapping[int, tuple[int, int]],
                       allow_backwards: bool) -> None:
        topic_watermark_key = self.keys.topic_watermark(topic)
        offsets_prefix = self.keys.offsets_prefix(topic)
        watermarks_prefix = self.keys.partition_watermarks_prefix(topic)
        deadline = time.monotonic() + _COMMIT_DEADLINE_SECONDS
        attempt = 0
        while True:
            attempt += 1
            # Every fenced commit rewrites the topic watermark, so comparing its mod_revision serialises commits
            # of one topic: it detects any commit that landed between these reads and our transaction.
            topic_watermark = self.client.get_entry(topic_watermark_key)
            offset_entries = {entry.key: entry for entry in self.client.get_prefix(offsets_prefix)}
            watermark_entries = self.client.get_prefix(watermarks_prefix)
            writes = plan_offset_writes(
                self.location, self.keys, topic, offsets,
                committed=decode_partition_offsets(
                    self.location, offsets_prefix, ((e.key, e.value) for e in offset_entries.values())),
                partition_watermarks=decode_partition_offsets(
                    self.location, watermarks_prefix, ((e.key, e.value) for e in watermark_entries)),
                now_ms=now_ms(), allow_backwards=allow_backwards,
            )
            compares: list[EtcdCompare] = [LeaseIs(lease.key, lease.fence) for lease in leases]
            compares.append(ModRevisionIs(topic_watermark_key, topic_watermark.mod_revision if topic_watermark else 0))
            for partition in offsets:
                key = self.keys.offset(topic, partition)
                entry = offset_entries.get(key)
                compares.append(ModRevisionIs(key, entry.mod_revision if entry else 0))
            if self.client.transaction(compares, [PutOp(key, value) for key, value in writes.items()]):
                return
            self._raise_if_lost(leases)
            if time.monotonic() >= deadline:
                raise CommitConflictError(
                    f"{self.location}: offsets of {topic} kept changing for {_COMMIT_DEADLINE_SECONDS:.0f} s "
                    f"({attempt} commit attempts)"
                )
            low, high = _COMMIT_BACKOFF_SECONDS
            delay = random.uniform(0, min(high, low * 2 ** min(attempt, 10)))  # noqa: S311 - retry jitter
            log.info("offset commit of %s on %s raced with another writer (attempt %d); retrying in %.3f s",
                     topic, self.location, attempt, delay)
            time.sleep(delay)

    def _put_fenced(self, leases: list[Lease], key: str, value: bytes) -> None:
        if not self.client.transaction([LeaseIs(lease.key, lease.fence) for lease in leases], [PutOp(key, value)]):
            self._raise_if_lost(leases)
            raise AssertionError(f"{self.location}: fenced put of {key} refused although every lease is held")

    def _delete(self, key: str) -> None:
        self.client.delete(key)

    def _live_lease_owner(self, lease_key: str) -> str | None:
        # An expired etcd lease deletes its key, so a present key is a live lease.
        value = self.client.get(lease_key)
        return None if value is None else decode_lease_owner(self.location, lease_key, value)

    def _raise_if_lost(self, leases: list[Lease]) -> None:
        lost = []
        for lease in leases:
            entry = self.client.get_entry(lease.key)
            if entry is None or entry.lease_id != lease.fence:
                reason = "lease key is gone (expired or deleted)" if entry is None else (
                    f"lease key now belongs to {decode_lease_owner(self.location, lease.key, entry.value)!r}")
                lost.append((lease, reason))
        if lost:
            raise leases_lost_error(lost)
