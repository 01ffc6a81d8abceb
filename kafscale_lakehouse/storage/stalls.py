"""A partition stopped for longer than a grace period at an incomplete segment: which object, which offsets.

KafScale's broker (v1.6.0) uploads a segment's `.kfs` and `.index` in parallel (`pkg/storage/log.go`, `uploadFlush`);
when one upload fails the flush fails and its records are gone from the broker's buffer, while the other object
stays: an orphan that no broker will complete. A listing stops at the first incomplete segment (store.py), so the
partition waits behind it. Within the grace period that may be an upload still under way (store.py logs it at info);
after it, it is an error that names the object and the offsets it should hold, until an operator skips them
(`kafscale-lakehouse offsets skip`, recorded in the table as `kafscale.skipped.<topic>`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from kafscale_lakehouse.format.errors import SegmentFormatError
from kafscale_lakehouse.storage.errors import StorageError
from kafscale_lakehouse.storage.store import IncompleteSegment, SegmentListing, SegmentStore

log = logging.getLogger(__name__)

GRACE_KEY = "processor.orphan_segment_grace_seconds"


@dataclass(frozen=True)
class StalledSegment:
    """The incomplete segment a partition waits behind, older than the grace period."""

    segment: IncompleteSegment
    # Offset after the last one it should hold: its `.kfs` footer's, else the next segment's base offset; None when
    # neither is known (no readable footer and nothing listed after it yet).
    end_offset: int | None
    age_seconds: float
    kfs_finished: bool = False  # its `.kfs` ends with a valid footer: the records are there, only the `.index` is not

    @property
    def topic(self) -> str:
        return self.segment.topic

    @property
    def partition(self) -> int:
        return self.segment.partition

    @property
    def start_offset(self) -> int:
        return self.segment.base_offset

    @property
    def key(self) -> str:
        """The object that is there (the `.kfs` when both are: it is the one not finished)."""
        return self.segment.kfs_key or self.segment.index_key or ""  # an incomplete segment has one at least

    def offsets_text(self) -> str:
        if self.end_offset is None:
            return f"offsets from {self.start_offset} on (where they end is known once a later segment exists)"
        return f"offsets {self.start_offset}..{self.end_offset - 1}"

    def describe(self) -> str:
        return (f"topic {self.topic} partition {self.partition} stops at {self.key} ({self.segment.reason}), "
                f"incomplete for {self.age_seconds:.0f}s, longer than {GRACE_KEY}: the broker's upload of this "
                f"segment failed, so {self.offsets_text()} it should hold cannot be read. `kafscale-lakehouse offsets "
                f"skip --topic {self.topic} --partition {self.partition} --segment {self.key} --yes` records them as "
                "skipped in the table and goes on"
                + ("; its .kfs is finished, so an .index rebuilt from it lands them instead (README, orphaned segment "
                   "objects)" if self.kfs_finished else ""))


def find_stalled_segment(store: SegmentStore, listing: SegmentListing, *, grace_seconds: float,
                         now: datetime | None = None) -> StalledSegment | None:
    """The first incomplete segment of `listing` (one partition's) when the partition waits behind it (it comes
    before every segment listed after it, or it is the next one to read) and it is older than `grace_seconds`;
    None otherwise. Costs a HEAD and a 16-byte read for an orphan `.kfs`, nothing else."""
    if not listing.incomplete:
        return None
    first = min(listing.incomplete, key=lambda item: item.base_offset)
    if listing.segments and first.next_base_offset is None:
        return None  # the newest object, after segments still to read: the partition does not wait behind it yet
    age = ((now or datetime.now(UTC)) - first.last_modified).total_seconds()
    if age < grace_seconds:
        return None
    footer_end = _footer_end(store, first)
    end = footer_end if footer_end is not None else first.next_base_offset
    return StalledSegment(first, end, age, kfs_finished=footer_end is not None)


def _footer_end(store: SegmentStore, segment: IncompleteSegment) -> int | None:
    """The offset after the last one its `.kfs` footer names; None without a `.kfs` or a valid footer."""
    if segment.kfs_key is None:
        return None
    try:
        footer = store.read_footer(segment.kfs_key, store.size(segment.kfs_key))
    except (SegmentFormatError, StorageError) as exc:
        log.debug("no footer in %s: %s", segment.kfs_key, exc)
        return None
    return footer.last_offset + 1 if footer.last_offset >= segment.base_offset else None
