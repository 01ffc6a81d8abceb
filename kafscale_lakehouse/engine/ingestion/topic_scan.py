"""What a topic holds now, per Kafka partition: the committed next offset, the end of the completed segments and the
broker's watermark. The sensor scans with its listing cursors (only new segments are listed); the observation and
the freshness check scan afresh (each partition listed from its committed next offset). No Dagster here.

The committed next offset is the table's (its latest commit of ours, `kafscale.offsets.<topic>`) wherever the table
holds the partition, else the offsets store's (a hand-over from the Go processor, or nothing landed yet): the store
is a cache the next run repairs from the table, so after an operator rolls the table back the scan sees the rolled-back
offsets as pending. Reading the table costs one catalog load per scan (a REST `loadTable` is one request).

`scan_namespace` scans many topics at once for the namespace watch: only the partitions whose broker watermark moved
past what is known of them are listed, each from its cursor (`skip_settled`), partitions are discovered once, the
offsets store's offsets and watermarks of every topic are two prefix reads, and the tables' offsets (one catalog load
each, 9-41 ms on a REST catalog; reused while the store's offsets stay put, up to `TABLE_OFFSETS_MAX_AGE_SECONDS`), the
listings and the new segments' footers (the newest per partition) are read on `NAMESPACE_SCAN_THREADS` threads, so a
tick over 200 topics costs a listing per partition with new data, two etcd reads, and the slowest few loads, not 200
sequential ones. A freshness check lists nothing of a partition with a watermark (`lag_only`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from kafscale_lakehouse.config import LakehouseConfig, ProcessorConfig
from kafscale_lakehouse.connections import (
    catalog_settings,
    etcd_client_from_config,
    offset_store_from_config,
    segment_store_from_config,
)
from kafscale_lakehouse.engine.ingestion.lag import lag_and_reference
from kafscale_lakehouse.engine.tables.catalogs import (
    CatalogError,
    CatalogSettings,
    catalog_endpoint,
    catalog_errors,
    load_catalog,
)
from kafscale_lakehouse.engine.tables.summary import CorruptOffsetsPropertyError, read_topic_offsets
from kafscale_lakehouse.etcd import EtcdClient, EtcdError
from kafscale_lakehouse.offsets import CommittedOffset, OffsetStore
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.storage import (
    DiscoveryMode,
    MetadataSnapshotError,
    ObjectKind,
    OffsetBeyondSegmentsError,
    SegmentRef,
    SegmentStore,
    StorageError,
    TopicRetention,
    discover_partitions,
    find_stalled_segment,
    list_partitions_of,
    segment_key,
    segments_from,
    topic_retention,
)

log = logging.getLogger(__name__)

# Bounds the footer reads of one partition in one scan over a large backlog; the cursor catches up over later scans.
SEGMENTS_PER_PARTITION_PER_SCAN = 1000
# Topics whose offsets (etcd ranges, catalog loads) one namespace scan reads at the same time: latency-bound requests.
NAMESPACE_SCAN_THREADS = 32
# With S3 discovery, how often a namespace scan lists a topic's partitions again (a watermark in etcd shows a new
# partition at once; a partition the broker publishes none for is found within this).
PARTITION_DISCOVERY_SECONDS = 60.0
# How long a namespace scan may reuse a table's offsets while the offsets store's stay put (a catalog load per table
# per tick was most of an idle tick at 200 topics); also how late it sees a table rolled back behind the store's back.
TABLE_OFFSETS_MAX_AGE_SECONDS = 60.0


@dataclass(frozen=True)
class PartitionCursor:
    """Where the listing of one partition resumes, and how far its completed segments reach."""

    last_kfs_key: str | None  # the `.kfs` key the next listing starts after (None: from the committed next offset)
    segments_end: int | None  # last offset of the newest completed segment seen + 1 (None: none seen yet)
    next_offset: int | None = None  # the committed next offset last seen: when it moves back, list again from it


@dataclass(frozen=True)
class PartitionState:
    """What one scan knows about a Kafka partition."""

    partition: int
    next_offset: int | None  # the committed next offset to ingest (the table's, else the store's); None: nothing
    segments_end: int | None  # end (exclusive) of the completed segments seen; None when none seen
    log_end: int | None  # the broker's watermark (its next offset); None when it publishes none
    # Why the partition cannot be listed from its committed offset (it is not pending), or the incomplete segment it
    # waits behind for longer than the grace period (storage/stalls.py; what comes before it is still pending).
    error: str | None = None
    store_next_offset: int | None = None  # what the offsets store says
    table_next_offset: int | None = None  # what the table says; None: it holds no offsets of the partition (or unread)

    @property
    def offsets_disagree(self) -> bool:
        """The table holds the partition at another offset than the store (rolled back, or a store update lost)."""
        return self.table_next_offset is not None and self.table_next_offset != self.store_next_offset

    @property
    def table_behind_store(self) -> bool:
        """The table lacks offsets the store says landed: it was rolled back (the next run lands them again)."""
        return (self.table_next_offset is not None and self.store_next_offset is not None
                and self.table_next_offset < self.store_next_offset)

    @property
    def pending(self) -> bool:
        """A completed segment holds offsets at or after the committed next offset."""
        return self.segments_end is not None and self.segments_end > (self.next_offset or 0)

    @property
    def pending_range(self) -> OffsetRange | None:
        """The offsets a run should ingest (start 0 when nothing is committed: from the oldest segment on)."""
        if not self.pending:
            return None
        return OffsetRange(self.partition, self.next_offset or 0, self.segments_end)  # type: ignore[arg-type]

    @property
    def lag(self) -> int:
        """Records the broker has that are not committed yet, against the end of the completed segments when the
        broker publishes no watermark (a restored topic; engine/ingestion/lag.py)."""
        return lag_and_reference(self.log_end, self.segments_end, self.next_offset)[0]


@dataclass(frozen=True)
class TopicScan:
    partitions: dict[int, PartitionState]
    cursors: dict[int, PartitionCursor]  # the listing cursors to resume from next time
    new_segments: int  # completed segments listed for the first time in this scan
    table_error: str | None = None  # why the table's offsets could not be read (the store's were used)
    # The completed segments each listed partition's listing returned (a partition left unlisted is absent), and the
    # partitions listed from their committed next offset (no cursor): their segments are all the pending ones.
    listed: dict[int, list[SegmentRef]] = field(default_factory=dict)
    listed_from_committed: frozenset[int] = frozenset()


class TableOffsetsReader:
    """The next offsets a table holds of a topic (its latest commit of ours), for scans: one catalog load of the table
    per read. The catalog is connected on the first read, so an unreachable catalog fails reads, not the sources."""

    def __init__(self, settings: CatalogSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._catalog: Catalog | None = None
        self._connecting = threading.Lock()  # a namespace scan reads tables on several threads
        self._clock = clock
        self._kept: dict[tuple[str, str], _KeptTableOffsets] = {}

    def read_reusing(self, table: str, topic: str, store_offsets: Mapping[int, int | None],
                     max_age_seconds: float) -> dict[int, int] | None:
        """`read`, or the offsets the last read found when the offsets store's (`store_offsets`) have not moved
        since and that read is younger than its reuse age: between 1/2 and 1 x `max_age_seconds`, drawn per read so
        that many tables' reloads spread over ticks instead of all falling due on one. Our runs move the store right
        after they commit, so what is reused is a table nobody committed to since, or (the table held what the store
        did, and the store only moved forward since) the store's offsets, as the run that moved both left them: at
        hundreds of tables every batch's tables were loaded again on the tick after it. A table changed without the
        store (an operator's rollback) is seen within `max_age_seconds`."""
        key = (table, topic)
        now = self._clock()
        kept = self._kept.get(key)
        if kept is not None and now < kept.until:
            if kept.store_offsets == store_offsets:
                return kept.offsets
            if kept.in_sync and _moved_forward(kept.store_offsets, store_offsets):
                # Our runs write the store right after their table commit: a table that was where the store was
                # has moved with it (what else moved the table shows when its reuse age ends, as above).
                followed = _committed(store_offsets)
                self._kept[key] = _KeptTableOffsets(dict(store_offsets), followed, kept.until)
                return followed
        offsets = self.read(table, topic)
        self._kept[key] = _KeptTableOffsets(dict(store_offsets), offsets,
                                            now + max_age_seconds * random.uniform(0.5, 1.0))  # noqa: S311
        return offsets

    def read(self, table: str, topic: str) -> dict[int, int] | None:
        """`{partition: next offset}` of `topic` in `table` (empty: no commit of ours); None when the table does not
        exist. `CatalogError` when the catalog fails, `CorruptOffsetsPropertyError` for an unreadable summary."""
        with self._connecting:
            if self._catalog is None:
                self._catalog = load_catalog(self._settings)
            catalog = self._catalog
        with catalog_errors(catalog_endpoint(catalog)):
            try:
                loaded = catalog.load_table(table)
            except (NoSuchTableError, NoSuchNamespaceError):
                return None
        return read_topic_offsets(loaded, topic)


@dataclass(frozen=True)
class _KeptTableOffsets:
    store_offsets: dict[int, int | None]  # the offsets store's next offsets when the table was read
    offsets: dict[int, int] | None
    until: float  # reused up to this clock reading

    @property
    def in_sync(self) -> bool:
        """The table held exactly what the store did (both having something)."""
        return bool(self.offsets) and self.offsets == _committed(self.store_offsets)


def _committed(offsets: Mapping[int, int | None]) -> dict[int, int]:
    """The partitions of `offsets` with a committed next offset."""
    return {p: o for p, o in offsets.items() if o is not None}


def _moved_forward(before: Mapping[int, int | None], after: Mapping[int, int | None]) -> bool:
    """No partition of `before` is gone or went back in `after`."""
    return all((moved := after.get(p)) is not None and moved >= o for p, o in _committed(before).items())


@dataclass(frozen=True)
class TopicOffsets:
    """What the offsets store holds of a topic: our committed offsets and the broker's watermarks."""

    committed: Mapping[int, CommittedOffset]
    watermarks: Mapping[int, int]


@dataclass
class WatchSources:
    """The connections a scan reads (the sensors build them once per process, on the first tick)."""

    store: SegmentStore
    offsets: OffsetStore
    discovery_mode: DiscoveryMode
    etcd: EtcdClient | None = None
    # `processor.orphan_segment_grace_seconds`: how long a partition may wait behind an incomplete segment unreported.
    orphan_grace_seconds: float = field(default_factory=lambda: ProcessorConfig().orphan_segment_grace_seconds)
    tables: TableOffsetsReader | None = None  # None: the store's offsets are taken as they are
    # What a namespace watch keeps between its scans (`scan_namespace`).
    memory: NamespaceWatchMemory = field(default_factory=lambda: NamespaceWatchMemory())

    @classmethod
    def from_config(cls, config: LakehouseConfig) -> WatchSources:
        etcd = etcd_client_from_config(config) if config.etcd.endpoints else None
        return cls(store=segment_store_from_config(config), offsets=offset_store_from_config(config, etcd),
                   discovery_mode=DiscoveryMode.parse(config.discovery.mode), etcd=etcd,
                   orphan_grace_seconds=config.processor.orphan_segment_grace_seconds,
                   tables=TableOffsetsReader(catalog_settings(config)))


def scan_topic(sources: WatchSources, topic: str, cursors: Mapping[int, PartitionCursor] | None = None, *,
               table: str | None = None, partitions: Sequence[int] | None = None,
               offsets: TopicOffsets | None = None, table_offsets_max_age_seconds: float = 0,
               read_newest_footers: bool = True,
               skip_settled: bool = False, held: bool = False, lag_only: bool = False) -> TopicScan:
    """Discover the partitions of `topic`, list their new completed segments and read offsets and watermarks.

    `cursors` (from the previous scan) resume each partition's listing; a partition without one is listed from its
    committed next offset (`storage.segments_from`, which finds a segment that holds it mid-way). With `table` (and
    `sources.tables`), the table's offsets win over the store's (the module docstring). `partitions`: the topic's
    partitions as discovered already (a namespace scan discovers every topic's at once); `offsets`: the topic's
    stored offsets and broker watermarks as read already (a namespace scan reads every topic's in two requests);
    `table_offsets_max_age_seconds` > 0: the table's offsets may be reused (`TableOffsetsReader.read_reusing`);
    `read_newest_footers=False`: a partition listed from its cursor leaves its newest new segment unread (no footer
    read; its segments end does not count it yet, the cursor stays before it): for a table that cannot take it now.
    The namespace watch's rules, where a partition is not listed at all (no stall is looked for; its cursor keeps its
    place, at the committed next offset when it had none): `skip_settled`, a partition whose broker watermark is where
    what is known of it ends (its committed next offset, or the completed segments its cursor saw), since no segment
    holds offsets the broker has not assigned; `held` (the table has a run in flight), a partition with a cursor.
    `lag_only` (a freshness check): a partition with a broker watermark is not listed either, since its lag is measured
    against the watermark (`lag.lag_and_reference`); its completed segments are not known then, nor a stall."""
    cursors = cursors or {}
    if partitions is None:
        discovered = discover_partitions(sources.discovery_mode, sources.store, sources.etcd, topics=[topic])
        partitions = discovered.partitions.get(topic, [])
    partition_ids = list(partitions)
    if offsets is None:
        offsets = TopicOffsets(sources.offsets.committed_offsets(topic), sources.offsets.broker_watermarks(topic))
    stored = {p: c.next_offset for p, c in offsets.committed.items()}
    table_offsets, table_error = _table_offsets(sources, table, topic, stored, table_offsets_max_age_seconds)
    committed = {**stored, **table_offsets}
    watermarks = offsets.watermarks
    # Partitions with a watermark but no segment directory yet (S3 discovery) still count for lag.
    partition_ids = sorted(set(partition_ids) | set(watermarks))
    store = sources.store
    new_cursors: dict[int, PartitionCursor] = dict(cursors)
    states: dict[int, PartitionState] = {}
    new_segments = 0
    listed: dict[int, list[SegmentRef]] = {}
    from_committed: set[int] = set()
    for partition in partition_ids:
        next_offset = committed.get(partition)
        store_next, table_next = stored.get(partition), table_offsets.get(partition)
        previous = cursors.get(partition)
        if previous is not None and previous.next_offset is not None and (next_offset or 0) < previous.next_offset:
            # Moved back (the table rolled back, a position moved): the segments before the cursor are pending again.
            previous = None
        watermark = watermarks.get(partition)
        known_end = max(next_offset or 0, (previous.segments_end or 0) if previous is not None else 0)
        if ((held and previous is not None) or (skip_settled and watermark == known_end)
                or (lag_only and watermark is not None)):
            if previous is None:  # settled: nothing to list, now or before the committed next offset
                from_committed.add(partition)
                listed[partition] = []
                start_after = (segment_key(store.namespace, topic, partition, next_offset - 1, ObjectKind.SEGMENT)
                               if next_offset else None)
                previous = PartitionCursor(start_after, next_offset or None, next_offset)
            new_cursors[partition] = replace(previous, next_offset=next_offset)
            states[partition] = PartitionState(partition, next_offset, previous.segments_end, watermark,
                                               store_next_offset=store_next, table_next_offset=table_next)
            continue
        if previous is None:
            from_committed.add(partition)
            try:
                listing = segments_from(store, topic, partition, next_offset, limit=SEGMENTS_PER_PARTITION_PER_SCAN,
                                        newest_footer_only=True)
            except OffsetBeyondSegmentsError as exc:  # the other partitions go on; no cursor: retried next scan
                states[partition] = PartitionState(partition, next_offset, None, watermarks.get(partition), str(exc),
                                                   store_next, table_next)
                continue
            segments_end = None
        else:
            listing = store.list_segments(topic, partition, after=previous.last_kfs_key,
                                          limit=SEGMENTS_PER_PARTITION_PER_SCAN, newest_footer_only=True,
                                          read_newest_footer=read_newest_footers)
            segments_end = previous.segments_end
        listed[partition] = listing.segments
        if listing.segments:
            segments_end = max(segments_end or 0, listing.segments[-1].last_offset + 1)
            new_segments += len(listing.segments)
        new_cursors[partition] = PartitionCursor(listing.cursor, segments_end, next_offset)
        states[partition] = PartitionState(partition, next_offset, segments_end, watermarks.get(partition),
                                           store_next_offset=store_next, table_next_offset=table_next)
        # A segment left unread comes before any incomplete one listed: the partition does not wait behind those.
        stalled = None if listing.unread_base_offset is not None else find_stalled_segment(
            store, listing, grace_seconds=sources.orphan_grace_seconds)
        if stalled is not None:
            states[partition] = replace(states[partition], error=stalled.describe())
    return TopicScan(states, new_cursors, new_segments, table_error, listed, frozenset(from_committed))


@dataclass(frozen=True)
class NamespaceScan:
    """A scan of many topics: each topic's scan, and the bytes of its pending segments per partition (the `.kfs`
    objects holding offsets from the committed next offset to the end of the completed ones)."""

    topics: dict[str, TopicScan]
    pending_bytes: dict[str, dict[int, int]]
    partitions_listed: int  # partitions whose segments were listed (the others had nothing new to list)
    list_requests: int  # listing requests of this scan (pages; partition discovery included)

    def topic_pending_bytes(self, topic: str) -> int:
        return sum(self.pending_bytes.get(topic, {}).values())


class NamespaceWatchMemory:
    """What a namespace watch keeps between scans in its process (lost with it; the next scan rebuilds it by listing
    each partition from its committed next offset): per partition, the completed segments listed at or after the
    committed next offset (base offset -> last offset, `.kfs` bytes), which give the pending bytes without listing
    them again; and, with S3 discovery, each topic's partitions and when to list them again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # topics are scanned on several threads
        self._segments: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
        self._partitions: dict[str, list[int]] = {}
        self._partitions_due: dict[str, float] = {}

    def knows(self, topic: str, partition: int) -> bool:
        """The partition was listed from its committed next offset in this process (its pending segments are known)."""
        with self._lock:
            return (topic, partition) in self._segments

    def record(self, topic: str, scan: TopicScan) -> None:
        """The segments `scan` listed; those wholly before a partition's committed next offset are forgotten."""
        with self._lock:
            for partition, state in scan.partitions.items():
                key = (topic, partition)
                if partition in scan.listed_from_committed:
                    self._segments[key] = {}
                elif key not in self._segments:
                    continue  # not listed from its committed offset in this process: listed so next time
                known = self._segments[key]
                known.update((s.base_offset, (s.last_offset, s.kfs_size)) for s in scan.listed.get(partition, []))
                start = state.next_offset or 0
                for base in [base for base, (last, _) in known.items() if last < start]:
                    del known[base]

    def segment_bytes(self, topic: str, partition: int, start: int, end: int) -> int:
        """Bytes of the segments known to hold offsets in `[start, end)`."""
        with self._lock:
            known = self._segments.get((topic, partition), {})
            return sum(size for base, (last, size) in known.items() if base < end and last >= start)

    def s3_partitions(self, store: SegmentStore, topics: Sequence[str]) -> dict[str, list[int]]:
        """`discovery.mode` s3 without a namespace listing: each topic's partition "directories", listed (one
        request per topic, on `NAMESPACE_SCAN_THREADS` threads) every scan while the topic has none (a topic not
        created yet), else again when last listed between 1/2 and 1 x `PARTITION_DISCOVERY_SECONDS` ago (drawn per
        topic, so the topics' listings spread over ticks). A new partition of a known topic is scanned at once when
        the broker publishes a watermark for it (`scan_topic`), else after its topic's next listing here."""
        now = self._clock()
        with self._lock:
            due = [topic for topic in topics
                   if not self._partitions.get(topic) or now >= self._partitions_due.get(topic, now)]
        if due:
            found = list_partitions_of(store, due, NAMESPACE_SCAN_THREADS)
            with self._lock:
                for topic, partitions in found.items():
                    self._partitions[topic] = partitions
                    self._partitions_due[topic] = now + PARTITION_DISCOVERY_SECONDS * random.uniform(0.5, 1.0)  # noqa: S311
        with self._lock:
            return {topic: self._partitions.get(topic, []) for topic in topics}


def scan_namespace(sources: WatchSources, tables: Mapping[str, str],
                   cursors: Mapping[str, Mapping[int, PartitionCursor]] | None = None, *,
                   unread_newest: Collection[str] = ()) -> NamespaceScan:
    """`scan_topic` of every topic of `tables` (`{topic: table}`), listing only the partitions that may hold a
    completed segment not seen yet: those whose broker watermark (etcd) is not where their completed segments seen
    end, or that publish none, or have no cursor yet; each from its cursor (`StartAfter`), so a listing returns the
    new objects only. Topics are scanned on `NAMESPACE_SCAN_THREADS` threads.

    Per tick: two etcd prefix reads (every topic's offsets and watermarks), partition discovery (`discovery.mode`
    etcd or auto: the broker's metadata snapshot, one etcd read; s3: `NamespaceWatchMemory.s3_partitions`, a listing
    per topic about once a minute, every tick for a topic without partitions yet), one list request per partition
    whose watermark moved past its segments seen (or that has none) and one 16-byte footer read per partition with
    new segments (the newest), and the table loads due (`TableOffsetsReader.read_reusing`). Nothing grows with the
    segments the namespace keeps: an idle partition costs no request, and a partition's pending bytes come from what
    earlier listings found (`NamespaceWatchMemory`; a partition not listed from its committed next offset in this
    process yet is listed from there once).

    A partition whose watermark equals the end of what is known of it (the completed segments seen, or the committed
    next offset: a partition that landed everything) cannot hold another segment (a segment holds offsets the broker
    assigned), so it is not listed (`scan_topic`'s `skip_settled`); a segment uploaded beyond the watermark the broker
    published is seen when the watermark next moves. Stall detection (an incomplete segment the partition waits
    behind) still runs on every partition listed, and a partition waiting behind one is listed every tick (its
    segments never reach the watermark). `cursors`: `{topic: partition cursors}` of the previous scan;
    `unread_newest`: topics whose tables have a run in flight: their partitions with a cursor are not listed (their
    segments wait for the tick after).
    """
    cursors = cursors or {}
    topics = list(tables)
    memory = sources.memory
    before = sources.store.request_counts["list"]
    partitions = watched_partitions(sources.discovery_mode, sources.store, sources.etcd, memory, topics)
    committed = sources.offsets.committed_offsets_by_topic(tables)
    watermarks = sources.offsets.broker_watermarks_by_topic(tables)

    def scan(topic: str) -> TopicScan:
        previous = cursors.get(topic, {})
        scanned = scan_topic(sources, topic, {p: c for p, c in previous.items() if memory.knows(topic, p)},
                             table=tables[topic], partitions=partitions.get(topic, []),
                             offsets=TopicOffsets(committed[topic], watermarks[topic]),
                             table_offsets_max_age_seconds=TABLE_OFFSETS_MAX_AGE_SECONDS, skip_settled=True,
                             held=topic in unread_newest)
        memory.record(topic, scanned)
        return replace(scanned, cursors={**previous, **scanned.cursors})

    if len(topics) <= 1:
        scans = [scan(topic) for topic in topics]
    else:
        with ThreadPoolExecutor(max_workers=min(NAMESPACE_SCAN_THREADS, len(topics)),
                                thread_name_prefix="namespace-scan") as pool:
            scans = list(pool.map(scan, topics))
    by_topic = dict(zip(topics, scans, strict=True))
    pending = {topic: {p: memory.segment_bytes(topic, p, r.start, r.end) for p, state in scan.partitions.items()
                       if (r := state.pending_range) is not None}
               for topic, scan in by_topic.items()}
    return NamespaceScan(by_topic, pending, sum(len(scan.listed) for scan in scans),
                         sources.store.request_counts["list"] - before)


def watched_partitions(mode: DiscoveryMode, store: SegmentStore, etcd: EtcdClient | None,
                       memory: NamespaceWatchMemory, topics: Sequence[str]) -> dict[str, list[int]]:
    """Each topic's partitions by `discovery.mode`, without listing the namespace: the broker's metadata snapshot
    (one etcd read), else (`s3`, or `auto` without etcd or when the snapshot cannot be read)
    `memory.s3_partitions` (each topic's partition prefixes, listed about once a minute)."""
    if mode is not DiscoveryMode.S3 and etcd is not None:
        try:
            return discover_partitions(DiscoveryMode.ETCD, store, etcd, topics=topics).partitions
        except (EtcdError, MetadataSnapshotError) as exc:
            if mode is DiscoveryMode.ETCD:
                raise
            log.warning("discovery.mode auto: listing the partitions of %s because %s", store.location, exc)
    elif mode is DiscoveryMode.ETCD:
        raise ValueError("discovery mode etcd needs an etcd client")
    return memory.s3_partitions(store, topics)


def _table_offsets(sources: WatchSources, table: str | None, topic: str, stored: Mapping[int, int | None],
                   max_age_seconds: float) -> tuple[dict[int, int], str | None]:
    """The table's next offsets of `topic` ({} when not read or it holds none), and why they could not be read."""
    if table is None or sources.tables is None:
        return {}, None
    try:
        if max_age_seconds > 0:
            return sources.tables.read_reusing(table, topic, stored, max_age_seconds) or {}, None
        return sources.tables.read(table, topic) or {}, None
    except (CatalogError, CorruptOffsetsPropertyError) as exc:
        return {}, f"table {table}: its offsets of topic {topic} cannot be read ({exc}); the offsets store's are used"


def scan_retention(sources: WatchSources, topic: str, scan: TopicScan, now: datetime | None = None, *,
                   list_unlimited: bool = True) -> tuple[TopicRetention | None, str | None]:
    """The topic's retention headroom and replay window for the partitions of `scan` (storage/retention.py), or None
    and why it cannot be read (etcd or the segment store failing, a topic config that is not KafScale's)."""
    positions = {p: (s.next_offset, s.log_end) for p, s in scan.partitions.items()}
    try:
        return topic_retention(sources.store, sources.etcd, topic, positions, now or datetime.now(UTC),
                               list_unlimited=list_unlimited), None
    except (EtcdError, StorageError) as exc:
        return None, f"cannot read the retention of topic {topic}: {exc}"
