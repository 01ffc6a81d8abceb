"""Leases on several partitions for tests that commit offsets the way an ingest run does (one lease per partition,
all released at the end, as `PreparedIngest.release_leases`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

from kafscale_lakehouse.offsets import Lease, OffsetStore


@contextmanager
def held_leases(store: OffsetStore, topic: str, partitions: Iterable[int], owner_id: str) -> Iterator[dict[int, Lease]]:
    """`{partition: lease}` for every partition, released on exit (those already taken are released on a failure)."""
    with ExitStack() as stack:
        yield {p: stack.enter_context(store.acquire_lease(topic, p, owner_id)) for p in sorted(set(partitions))}
