"""The table and the offsets store side by side: who the store's offsets belong to, and `kafscale-lakehouse offsets`.

Every commit records, next to the KafScale-compatible offsets, the table they are the position of (its name, UUID
and the partitions it holds offsets of: `offsets.TableIdentity`, key `<prefix>/tables/<topic>`). A run that finds
offsets of ours in the store for a partition the table holds no offsets of (the table was dropped and recreated,
renamed and replaced, rolled back before our first commit, its snapshots expired after another engine's commit, or
another deployment landed the topic elsewhere) stops that partition with `offsets_disagree_error`: reading from the
store's offset would leave records out of this table, reading from the start would be a guess. `reset_from_table`
settles it the way the table says (read those partitions again from their oldest segment), `reset_from_store` the
way the store says (the table records the store's position in a snapshot without data files, and goes on from it).
Offsets without an identity are the Go processor's and are handed over (cutover.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from pyiceberg.table import Table

from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.offsets import CommittedOffset, Lease, OffsetStore, TableIdentity

log = logging.getLogger(__name__)

RESET_OWNER = "kafscale-lakehouse-offsets-reset"


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
        f"in the table start again at their oldest segment), `... --from-store --yes` makes the table say what the "
        f"store says (it goes on after the store's offsets)")


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
    partitions the table holds are set to the table's (backwards too), the others are deleted (nothing committed:
    the next run starts at the oldest segment), and the table is recorded as the offsets' owner.
    `LeaseHeldError` when a run holds a partition: stop the runs (the sensor) first."""
    table_next = read_topic_offsets(table, topic)
    store_next = store.committed_offsets(topic)
    leases: dict[int, Lease] = {}
    try:
        for partition in sorted(set(table_next) | set(store_next)):
            leases[partition] = store.acquire_lease(topic, partition, RESET_OWNER)
        dropped = [leases[p] for p in sorted(leases) if p not in table_next]
        if dropped:
            store.forget_offsets(dropped)
        if table_next:
            kept = [leases[p] for p in sorted(table_next)]
            store.repair_offsets(kept, {p: (o, 0) for p, o in table_next.items()})
            store.record_table_identity(kept, table_identity(table, table_next))
        log.warning("topic %s: offsets in %s reset from table %s: %s; deleted for partitions %s", topic,
                    store.location, ".".join(table.name()), table_next, [lease.partition for lease in dropped])
    finally:
        for lease in leases.values():
            lease.release()
    return offsets_view(table, topic, store)


def reset_from_store(table: Table, topic: str, store: OffsetStore) -> OffsetsView:
    """Make the table say what the store says, for the partitions the store has offsets of and the table has none
    of: one snapshot without data files records the store's next offsets (`kafscale.offsets.<topic>`, carried
    forward as ever), then the table is recorded as the offsets' owner. Partitions the table holds are kept."""
    table_next = read_topic_offsets(table, topic)
    store_next = {p: c.next_offset for p, c in store.committed_offsets(topic).items() if c.next_offset is not None}
    adopted = {p: o for p, o in store_next.items() if p not in table_next}
    leases: dict[int, Lease] = {}
    try:
        for partition in sorted(set(table_next) | set(store_next)):
            leases[partition] = store.acquire_lease(topic, partition, RESET_OWNER)
        if adopted:
            commit_append(table, [], topic, adopted, adopted, f"offsets-reset-{uuid.uuid4().hex[:12]}")
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
