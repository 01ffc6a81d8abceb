"""Taking a table over from KafScale's Go iceberg-processor (README "Switching from the Go processor and back").

A table the Go processor wrote has no `kafscale.offsets.<topic>` in its snapshots; where it stopped is in etcd
(`<prefix>/offsets/<topic>/<p>`, kafscale-format.md §7). Such a partition is a *hand-over*: our first run
- waits (bounded) for a lease the Go processor may still hold, instead of failing at once: a Go processor that was
  just stopped leaves its lease until its TTL runs out; one still running keeps it, and the run then stops naming the
  lease key and its owner;
- continues after etcd's offset, or after the last offset the table already holds beyond it (the Go processor
  writes the table before etcd, so a crash between the two leaves rows that etcd does not count): nothing twice;
- says so in the log. Its commit then records our offsets in the table, and every later run is an ordinary one.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import And, EqualTo, GreaterThan
from pyiceberg.table import Table

from kafscale_lakehouse.offsets import CommittedOffset, Lease, LeaseHeldError, OffsetStore, OffsetStoreError

log = logging.getLogger(__name__)

# How long a hand-over waits for a held lease, in lease TTLs: a holder that stopped without releasing its lease
# (killed) loses it after one TTL; waiting two covers a holder whose last renewal just happened.
LEASE_WAIT_TTLS = 2
LEASE_POLL_SECONDS = 0.5


class LeaseNotReleasedError(LeaseHeldError):
    """A lease on a hand-over partition was still held after the bounded wait."""

    def __init__(self, held: LeaseHeldError, waited_seconds: float) -> None:
        self.key, self.topic, self.partition = held.key, held.topic, held.partition
        self.current_owner = held.current_owner
        OffsetStoreError.__init__(self, f"{held} after waiting {waited_seconds:g}s for its release: the table was "
                                        "written by another processor (KafScale's Go iceberg-processor?) that still "
                                        "runs; stop it first (README: switching from the Go processor)")


class HandoverConflictError(ValueError):
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
