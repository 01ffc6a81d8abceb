"""Where each Kafka partition of a run starts, and the table and the offsets store side by side.

The table is the source of truth: a partition starts at the next offset our latest commit recorded in the table
(`kafscale.offsets.<topic>`, engine/tables/summary.py). The offsets store (etcd or the local sqlite store) is a cache
and KafScale's compatible view; `partition_starts` decides, under the run's leases, for each partition:
- the table holds offsets of it: start there; the store is repaired to say the same (either direction; a store
  ahead of the table loses, with a warning), unless another writer continued the partition in the table beyond our
  last commit (the Go processor after a roll-back): then the partition is refused, naming what to do;
- the store holds offsets of ours (it names this table, see below) but the table none: the partition stops with
  `offsets_disagree_error`: reading from the store's offset would leave records out, from the start would be a guess;
- the store holds offsets without an identity (KafScale's Go iceberg-processor wrote the table): a *hand-over*,
  which waits (bounded) for a lease the Go processor may still hold (`acquire_partition_leases`) and continues after
  etcd's offset, or after the last offset the table already holds beyond it (the Go processor writes the table before
  etcd, so a crash between the two leaves rows etcd does not count): nothing twice, and it says so in the log;
- neither: nothing committed, the partition starts at its oldest segment.

Every commit records, next to the KafScale-compatible offsets, the table they are the position of (its name, UUID and
the partitions it holds offsets of: `offsets.TableIdentity`, key `<prefix>/tables/<topic>`), so a table dropped and
recreated, renamed and replaced, rolled back before our first commit, its snapshots expired after another engine's
commit, or landed by another deployment, is recognised. `kafscale-lakehouse offsets show|reset` settles a
disagreement: `reset_from_table` the way the table says (read those partitions again from their oldest segment),
`reset_from_store` the way the store says (the table records the store's position in a snapshot without data files
and goes on from it). Moving a position explicitly (`offsets reset --to-offset`) is replay.py's.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import And, EqualTo, GreaterThan
from pyiceberg.table import Table

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.offsets import (
    CommittedOffset,
    Lease,
    LeaseHeldError,
    OffsetStore,
    OffsetStoreError,
    TableIdentity,
)

log = logging.getLogger(__name__)

RESET_OWNER = "kafscale-lakehouse-offsets-reset"
# How long a hand-over waits for a held lease, in lease TTLs: a Go processor never releases its lease when it stops
# (its release runs on the context SIGTERM cancelled, processor.go:131), so a stopped or killed one loses it at most
# one TTL after its last renewal; waiting two covers that with room to spare.
LEASE_WAIT_TTLS = 2
LEASE_POLL_SECONDS = 0.5


class LeaseNotReleasedError(LeaseHeldError, EngineError):
    """A lease on a hand-over partition was still held after the bounded wait."""

    def __init__(self, held: LeaseHeldError, waited_seconds: float) -> None:
        self.key, self.topic, self.partition = held.key, held.topic, held.partition
        self.current_owner = held.current_owner
        OffsetStoreError.__init__(self, f"{held} after waiting {waited_seconds:g}s for its release: the table was "
                                        "written by another processor (KafScale's Go iceberg-processor?) that still "
                                        "runs; stop it first (README: switching from the Go processor)")


class HandoverConflictError(EngineError, ValueError):
    """The table holds offsets beyond etcd's that are not the run right after it: we cannot tell where to go on."""


def handover_partitions(table_next: dict[int, int], etcd_committed: dict[int, CommittedOffset]) -> set[int]:
    """Partitions with offsets in etcd but none of ours in the table: the Go processor's, not yet continued."""
    return {p for p, committed in etcd_committed.items() if p not in table_next and committed.offset >= 0}


def acquire_handover_lease(offsets: OffsetStore, topic: str, partition: int, owner_id: str) -> Lease:
    """`offsets.acquire_lease`, waiting up to `LEASE_WAIT_TTLS` lease TTLs for a holder to go away."""
    wait_seconds = LEASE_WAIT_TTLS * offsets.lease_ttl_seconds
    deadline = time.monotonic() + wait_seconds
    announced = False
    while True:
        try:
            return offsets.acquire_lease(topic, partition, owner_id)
        except LeaseHeldError as held:
            if time.monotonic() >= deadline:
                raise LeaseNotReleasedError(held, wait_seconds) from None
            if not announced:
                log.info("topic %s partition %d: waiting up to %gs for %s (held by %r, maybe the Go processor "
                         "being stopped) to be released", topic, partition, wait_seconds, held.key,
                         held.current_owner)
                announced = True
        time.sleep(LEASE_POLL_SECONDS)


def _offsets_beyond(table: Table, topic: str, partition: int, offset: int) -> pa.Array:
    """The distinct offsets of `topic`/`partition` in the table above `offset` (file statistics prune the scan)."""
    found = table.scan(row_filter=And(EqualTo("topic", topic), EqualTo("partition", partition),
                                      GreaterThan("offset", offset)), selected_fields=("offset",)).to_arrow()
    return pc.unique(found.column("offset"))


def continued_elsewhere(table: Table, topic: str, table_next: dict[int, int],
                        etcd_committed: dict[int, CommittedOffset], location: str) -> dict[int, str]:
    """`{partition: error}` for partitions another writer (the Go processor after a roll-back) continued in the
    table after our last commit: etcd is ahead of our offsets and the table holds rows beyond them. Repairing etcd
    from our offsets would read those records again, so such a partition is refused, naming what to do."""
    errors = {}
    for partition, next_offset in table_next.items():
        committed = etcd_committed.get(partition)
        if committed is None or committed.next_offset is None or committed.next_offset <= next_offset:
            continue
        beyond = _offsets_beyond(table, topic, partition, next_offset - 1)
        if len(beyond):
            errors[partition] = (
                f"the table {'.'.join(table.name())} holds offsets {pc.min(beyond).as_py()}..{pc.max(beyond).as_py()} "
                f"of partition {partition} beyond our last commit (next offset {next_offset}), and {location} is at "
                f"offset {committed.offset}: another processor (the Go processor after a roll-back?) continued it; "
                f"not read again (README: switching back)")
    return errors


def handover_start(table: Table, topic: str, partition: int, committed: CommittedOffset, location: str) -> int:
    """The next offset to read on a hand-over partition: after etcd's offset and after any row beyond it."""
    offsets = _offsets_beyond(table, topic, partition, committed.offset)
    start = committed.next_offset
    if start is None:  # not a hand-over partition (handover_partitions): nothing to continue from
        raise HandoverConflictError(f"topic {topic} partition {partition}: {location} holds no committed offset")
    if len(offsets):
        last = pc.max(offsets).as_py()
        if pc.min(offsets).as_py() != start or len(offsets) != last - committed.offset:
            raise HandoverConflictError(
                f"topic {topic} partition {partition}: {location} says offset "
                f"{committed.offset} was the last committed, but the table {'.'.join(table.name())} holds "
                f"{len(offsets)} "
                f"offsets in {pc.min(offsets).as_py()}..{last} beyond it, not one run after it; the "
                f"table and etcd disagree, resolve by hand before ingesting"
            )
        log.warning(
            "topic %s partition %d: the table already holds offsets %d..%d beyond %s's offset %d (the Go "
            "processor wrote them and stopped before committing); continuing after them",
            topic,
            partition,
            start,
            last,
            location,
            committed.offset,
        )
        start = last + 1
    log.info(
        "topic %s partition %d: hand-over from the Go processor: the table has no offsets of ours, continuing "
        "from %s's offset %d at offset %d",
        topic,
        partition,
        location,
        committed.offset,
        start,
    )
    return start




def table_identity(table: Table, next_offsets: dict[int, int]) -> TableIdentity:
    """The identity of `table` holding `next_offsets` of a topic."""
    return TableIdentity(".".join(table.name()), str(table.metadata.table_uuid), tuple(sorted(next_offsets)))


def describe_identity(identity: TableIdentity, table: Table) -> str:
    if identity.uuid == str(table.metadata.table_uuid):
        return f"this table (uuid {identity.uuid})"
    return f"table {identity.name} (uuid {identity.uuid}), not this one"


def offsets_disagree_error(table: Table, topic: str, partition: int, committed: CommittedOffset,
                           identity: TableIdentity, location: str) -> str:
    name = ".".join(table.name())
    return (
        f"table {name} (uuid {table.metadata.table_uuid}) holds no offsets of topic {topic} partition {partition} "
        f"(no retained snapshot carries kafscale.offsets.{topic}: dropped and recreated, rolled back before our "
        f"first commit, or its snapshots expired), but {location} holds next offset {committed.next_offset} "
        f"committed for {describe_identity(identity, table)}. Nothing is read until they agree: "
        f"`kafscale-lakehouse offsets show --topic {topic}` shows both sides; `kafscale-lakehouse offsets reset "
        f"--topic {topic} --from-table --yes` makes the store say what the table says (partitions without offsets "
        f"in the table go on after the rows it holds, else from their oldest segment), `... --from-store --yes` "
        f"makes the table say what the store says (it goes on after the store's offsets)")


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition's position as the table, the offsets store and the broker see it."""

    partition: int
    table_next: int | None
    store_next: int | None
    broker_next: int | None

    @property
    def agree(self) -> bool:
        return self.table_next == self.store_next


@dataclass(frozen=True)
class OffsetsView:
    table: str
    table_uuid: str
    topic: str
    store: str
    identity: TableIdentity | None
    partitions: tuple[PartitionOffsets, ...]

    def lines(self) -> list[str]:
        owner = ("none recorded (the Go processor's offsets, or nothing committed)" if self.identity is None else
                 f"{self.identity.name} (uuid {self.identity.uuid}, partitions {list(self.identity.partitions)})")
        lines = [f"topic {self.topic} -> table {self.table} (uuid {self.table_uuid})",
                 f"offsets store {self.store}: offsets belong to {owner}",
                 f"{'partition':>9} {'table next':>12} {'store next':>12} {'broker next':>12}  agree"]
        lines += [f"{p.partition:>9} {_text(p.table_next):>12} {_text(p.store_next):>12} {_text(p.broker_next):>12}  "
                  f"{'yes' if p.agree else 'NO'}" for p in self.partitions]
        return lines


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


def offsets_view(table: Table, topic: str, store: OffsetStore) -> OffsetsView:
    table_next = read_topic_offsets(table, topic)
    store_next = {p: c.next_offset for p, c in store.committed_offsets(topic).items()}
    broker = store.broker_watermarks(topic)
    partitions = sorted(set(table_next) | set(store_next) | set(broker))
    return OffsetsView(".".join(table.name()), str(table.metadata.table_uuid), topic, store.location,
                       store.table_identity(topic),
                       tuple(PartitionOffsets(p, table_next.get(p), store_next.get(p), broker.get(p))
                             for p in partitions))


def reset_from_table(table: Table, topic: str, store: OffsetStore) -> OffsetsView:
    """Make the store say what the table says, under the leases of every partition either side knows: offsets of
    partitions the table holds are set to the table's (backwards too), and the table is recorded as the offsets'
    owner. A partition the table holds no offsets of but rows of (another engine expired the snapshots carrying our
    offsets) is set after its highest landed offset, as the Go processor's offsets are handed over (`handover_start`:
    not recorded as the table's, so the next run continues there); the others are deleted (nothing committed: the
    next run starts at the oldest segment). `LeaseHeldError` when a run holds a partition: stop the runs first."""
    table_next = read_topic_offsets(table, topic)
    store_next = store.committed_offsets(topic)
    landed: dict[int, int] = {}
    for partition in sorted(set(store_next) - set(table_next)):
        offsets = _offsets_beyond(table, topic, partition, -1)
        if len(offsets):
            landed[partition] = pc.max(offsets).as_py() + 1
    leases: dict[int, Lease] = {}
    try:
        for partition in sorted(set(table_next) | set(store_next)):
            leases[partition] = store.acquire_lease(topic, partition, RESET_OWNER)
        dropped = [leases[p] for p in sorted(leases) if p not in table_next]
        if dropped:
            store.forget_offsets(dropped)  # and the table identity: `landed` partitions are then hand-overs
        if landed:
            store.repair_offsets([leases[p] for p in sorted(landed)], {p: (o, 0) for p, o in landed.items()})
            log.warning("topic %s: table %s holds no offsets but rows of partitions %s: %s set after the highest "
                        "landed offsets, %s", topic, ".".join(table.name()), sorted(landed), store.location, landed)
        if table_next:
            kept = [leases[p] for p in sorted(table_next)]
            store.repair_offsets(kept, {p: (o, 0) for p, o in table_next.items()})
            store.record_table_identity(kept, table_identity(table, table_next))
        log.warning("topic %s: offsets in %s reset from table %s: %s; deleted for partitions %s", topic,
                    store.location, ".".join(table.name()), table_next,
                    [lease.partition for lease in dropped if lease.partition not in landed])
    finally:
        for lease in leases.values():
            lease.release()
    return offsets_view(table, topic, store)


def reset_from_store(table: Table, topic: str, store: OffsetStore, *, audit_branch: str | None = None) -> OffsetsView:
    """Make the table say what the store says, for the partitions the store has offsets of and the table has none
    of: one snapshot without data files records the store's next offsets (`kafscale.offsets.<topic>`, carried
    forward as ever), then the table is recorded as the offsets' owner. Partitions the table holds are kept.
    `audit_branch` (an audited mapping): the commit refuses while that branch holds a pending audit, checked in
    each attempt (`AuditPendingError`)."""
    table_next = read_topic_offsets(table, topic)
    store_next = {p: c.next_offset for p, c in store.committed_offsets(topic).items() if c.next_offset is not None}
    adopted = {p: o for p, o in store_next.items() if p not in table_next}
    leases: dict[int, Lease] = {}
    try:
        for partition in sorted(set(table_next) | set(store_next)):
            leases[partition] = store.acquire_lease(topic, partition, RESET_OWNER)
        if adopted:
            commit_append(table, [], topic, adopted, adopted, f"offsets-reset-{uuid.uuid4().hex[:12]}",
                          audit_branch=audit_branch)
        recorded = read_topic_offsets(table, topic)
        if recorded:
            kept = [leases[p] for p in sorted(recorded)]
            store.repair_offsets(kept, {p: (o, 0) for p, o in recorded.items()})
            store.record_table_identity(kept, table_identity(table, recorded))
        log.warning("topic %s: table %s now records the offsets of %s for partitions %s", topic,
                    ".".join(table.name()), store.location, adopted)
    finally:
        for lease in leases.values():
            lease.release()
    return offsets_view(table, topic, store)


# ---- a run's start positions -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStart:
    """Where a leased partition starts (`next_offset`; None: nothing committed, the oldest segment), or why it
    cannot (`error`)."""

    partition: int
    next_offset: int | None = None
    error: str | None = None


def acquire_partition_leases(table: Table, topic: str, offsets: OffsetStore, identity: TableIdentity | None,
                             partitions: Sequence[int], owner: str, leases: dict[int, Lease]) -> dict[int, str]:
    """Take the lease of each partition into `leases` (filled as they are taken, so the caller releases what was
    taken if this raises); returns `{partition: error}` for leases held elsewhere. Partitions the Go processor wrote
    wait (bounded) for its lease to be released."""
    handover = {p for p in handover_partitions(read_topic_offsets(table, topic), offsets.committed_offsets(topic))
                if identity is None or p not in identity.partitions}
    errors = {}
    for partition in partitions:
        try:
            if partition in handover:
                leases[partition] = acquire_handover_lease(offsets, topic, partition, owner)
            else:
                leases[partition] = offsets.acquire_lease(topic, partition, owner)
        except LeaseHeldError as exc:
            errors[partition] = str(exc)
    return errors


def partition_starts(table: Table, topic: str, offsets: OffsetStore, leases: Mapping[int, Lease],
                     identity: TableIdentity | None) -> list[PartitionStart]:
    """The start of every leased partition (see the module docstring), in the order the run reports them: refused
    partitions first, then by partition. Repairs the store from the table and records the table's identity."""
    table_next_offsets = read_topic_offsets(table, topic)
    store_committed = offsets.committed_offsets(topic)
    this_table = table_identity(table, table_next_offsets)
    continued = continued_elsewhere(table, topic, table_next_offsets, store_committed, offsets.location)
    starts = [PartitionStart(p, error=error) for p, error in continued.items() if p in leases]
    leases = {p: lease for p, lease in leases.items() if p not in continued}
    repair_store(offsets, topic, table_next_offsets, store_committed, leases)
    if identity != this_table and leases and table_next_offsets:
        offsets.record_table_identity(list(leases.values()), this_table)  # the table's offsets are the store's
    for partition in sorted(leases):
        if partition in table_next_offsets:
            starts.append(PartitionStart(partition, table_next_offsets[partition]))
        elif partition in store_committed and identity is not None and partition in identity.partitions:
            # Our own offsets, but the table has none: never a silent fresh start or skip.
            starts.append(PartitionStart(partition, error=offsets_disagree_error(
                table, topic, partition, store_committed[partition], identity, offsets.location)))
        elif partition in store_committed:
            # The table has never been written by us: continue where the Go processor's etcd offsets stopped.
            try:
                starts.append(PartitionStart(partition, handover_start(
                    table, topic, partition, store_committed[partition], offsets.location)))
            except HandoverConflictError as exc:
                starts.append(PartitionStart(partition, error=str(exc)))
        else:
            starts.append(PartitionStart(partition))
    return starts


def repair_store(offsets: OffsetStore, topic: str, table_next_offsets: dict[int, int],
                 store_committed: dict[int, CommittedOffset], leases: Mapping[int, Lease]) -> None:
    """The store is a cache of the table's offsets: bring it in line (either direction) before anything else."""
    repairs = {}
    for partition in leases:
        if partition not in table_next_offsets:
            continue
        cached = store_committed.get(partition)
        cached_next = cached.next_offset if cached is not None else None
        if cached_next != table_next_offsets[partition]:
            if cached_next is not None and cached_next > table_next_offsets[partition]:
                log.warning(
                    "topic %s partition %d: %s says next offset %d but table says %d; the table wins",
                    topic,
                    partition,
                    offsets.location,
                    cached_next,
                    table_next_offsets[partition],
                )
            repairs[partition] = (table_next_offsets[partition], cached.last_timestamp_ms if cached else 0)
    if repairs:
        log.info(
            "topic %s: repairing offsets in %s from the table: %s",
            topic,
            offsets.location,
            {p: o for p, (o, _) in repairs.items()},
        )
        offsets.repair_offsets([leases[p] for p in repairs], repairs)
