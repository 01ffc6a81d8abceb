"""The Go iceberg-processor's Prometheus metrics, derived from durable state on every scrape: the collector that
`kafscale-lakehouse serve-metrics` serves (its HTTP server and endpoints are in apps/metrics_server.py).

KafScale's Go processor counts in its own long-running process. Here ingestion runs in Dagster run pods (or
`kafscale-lakehouse ingest`) that come and go, so this small process derives every series from durable state when
Prometheus scrapes it, under the Go processor's names and labels, and dashboards built for it keep working:

| series | from |
|---|---|
| `kafscale_processor_records_total{topic,result="written"}` | sum of `added-records` of our snapshots |
| `kafscale_processor_records_total{topic,result="invalid"}` | sum of `kafscale.dead-letter.records` of our snapshots |
| `kafscale_processor_records_total{topic,result="dropped"}` | always 0 (see below) |
| `kafscale_processor_records_total{topic,result="skipped_lfs"}` | sum of `kafscale.lfs.skipped` (lfs mode skip) |
| `kafscale_processor_lfs_resolved_total{topic}` | sum of `kafscale.lfs.resolved` |
| `kafscale_processor_lfs_resolved_bytes_total{topic}` | sum of `kafscale.lfs.resolved-bytes` |
| `kafscale_processor_lfs_resolution_errors_total{topic,reason}` | sums of `kafscale.lfs.errors.<reason>` |
| `kafscale_processor_lfs_resolution_duration_seconds{topic}` | from `kafscale.lfs.resolution-buckets`, `-seconds` |
| `kafscale_processor_batches_total{topic}` | number of our snapshots (one per commit, as Go counts a write + commit) |
| `kafscale_processor_write_latency_ms{topic}` | histogram of `kafscale.write-latency-ms` of our snapshots |
| `kafscale_processor_last_offset{topic,partition}` | last committed offset in etcd / the offsets store |
| `kafscale_processor_watermark_offset{topic,partition}` | the same (Go sets both to the last committed offset) |
| `kafscale_processor_watermark_timestamp_ms{topic,partition}` | timestamp of the last record committed (below) |
| `kafscale_processor_lag{topic,partition}` | our addition: broker `next_offset` (else segments' end) - next offset |
| `kafscale_processor_stalled_segment_age_seconds{topic,partition}` | our addition: a stalled partition (below) |
| `kafscale_processor_errors_total{stage}` | this process's failures to read state (`checkpoint`, `sink`, `discover`) |

"Our snapshots" are those of the mapping's table (current snapshot and its ancestors) whose summary carries
`kafscale.offsets.<topic>`; compaction and other engines' snapshots do not. Snapshot summaries are in the table
metadata, so a scrape costs one catalog `load_table` per mapping and no manifest reads. Each snapshot is counted
once by id, so the counters never go down when old snapshots expire; a restarted `serve-metrics` starts again from
the snapshots still in the table's history (older snapshots written by the Go processor carry no latency and are
not observed). `dropped` (Go: records at or below the committed offset, read again and filtered) stays 0: a run
here starts reading at the committed offset and records nothing of the kind.

Go sets `watermark_timestamp_ms` to the Kafka timestamp of the last record of its last write (`last.Timestamp` in
processor.go), and writes the wall-clock time of the commit as `last_timestamp_ms` in etcd; we do both the same way.
The record timestamp is not in etcd, so it comes from the snapshot summary; a partition whose newest commit predates
that property (or was made by the Go processor) has no `watermark_timestamp_ms` until our next commit of it.

`errors_total` counts what this process failed to read (etcd or the offsets store: `checkpoint`; the catalog or a
table: `sink`; with `discovery.mode` etcd or auto, the broker's metadata snapshot: `discover`, when it is missing in
etcd mode or unreadable in either, where Go counts `discover` only in etcd mode and falls back to S3 in auto mode),
across scrapes. Go's `decode`, `lfs` and `schema` stages are failures of ingest runs, which are not counted here:
they are in Dagster (run status, asset checks) or the exit code of `kafscale-lakehouse ingest`. When etcd or the
catalog is down, `/metrics` still answers:
the series of the failing source are left out of that scrape and `errors_total` goes up.

`stalled_segment_age_seconds` is there only for a partition that waits behind an incomplete segment (the broker
uploads `.kfs` and `.index` in parallel, and a failed upload leaves one without the other) for longer than the grace
period: the runs of that partition fail naming the object until `kafscale-lakehouse offsets skip` records its offsets
as skipped. It comes from a listing of each partition from its committed next offset in the segment store (a third
source, with a shorter deadline); when the store does not answer, the series is left out and a warning logged. That
listing is kept between scrapes (listed again in the background after `STALLED_REFRESH_SECONDS`, its ages advanced
meanwhile): only the first scrape of the process waits for it.

`retention_headroom_seconds` and `replay_window_seconds` come from the same listing, for the same partitions (those
with records not landed) of topics whose retention is limited: the seconds before the topic's `retention.ms` (its
config in etcd, set through the broker) deletes the oldest segment holding records not landed (negative: past due,
records will be lost), and the age of the partition's oldest segment, how far back a replay can reach
(storage/retention.py).

With `topic_pattern` mappings, the topics scraped are those the patterns match, listed again every
`TOPICS_REFRESH_SECONDS` (one discovery request), so a topic that appears gets its series without a restart.

With many mapped topics, each source reads its topics `READ_THREADS` at a time, and the catalog is read while etcd
is: at 200 tables a scrape took 4.6-5.2 s reading them one after the other (benchmarks/metrics_scrape.py).

Readiness (`/readyz`) is asked of the collector too: `readiness_problems` probes etcd (or the offsets store) and the
catalog with the same per-source deadline as a scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar, cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from kafscale_lakehouse.config import LakehouseConfig, redact_url
from kafscale_lakehouse.connections import (
    catalog_settings,
    etcd_client_from_config,
    offset_store_from_config,
    segment_store_from_config,
)
from kafscale_lakehouse.engine.ingestion import (
    ERROR_DECODE,
    ERROR_RESOLVE,
    ListedPartitions,
    NamespaceWatchMemory,
    TopicOffsets,
    stalled_partitions,
    watched_partitions,
    with_pattern_topics,
)
from kafscale_lakehouse.engine.ingestion.lag import lag as partition_lag
from kafscale_lakehouse.engine.tables import (
    LFS_DURATION_BUCKETS_SECONDS,
    CatalogError,
    LfsStats,
    ancestry,
    catalog_endpoint,
    catalog_errors,
    is_kafscale_commit,
    load_catalog,
    parse_commit,
)
from kafscale_lakehouse.etcd import EtcdClient, EtcdError, EtcdUnavailableError
from kafscale_lakehouse.offsets import OffsetStore, OffsetStoreError, OffsetStoreUnavailableError
from kafscale_lakehouse.storage import (
    METADATA_SNAPSHOT_KEY,
    DiscoveryMode,
    MetadataSnapshotError,
    StorageError,
    TopicRetention,
    parse_metadata_snapshot,
    topic_retention,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

NAMESPACE = "kafscale_processor"
# Milliseconds (the Go processor's name says ms but it kept Prometheus' second-sized default buckets).
WRITE_LATENCY_BUCKETS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 300000)
RESULT_WRITTEN, RESULT_INVALID, RESULT_DROPPED, RESULT_SKIPPED_LFS = "written", "invalid", "dropped", "skipped_lfs"
# The Go processor's stages this process can fail in (Go also has decode, lfs and schema: ingest runs' failures).
STAGE_CHECKPOINT, STAGE_SINK, STAGE_DISCOVER = "checkpoint", "sink", "discover"
# How long one source (offsets, catalog) may take per scrape or readiness check, and the segment store's listing for
# stalled partitions per scrape: all three together stay under Prometheus' default 10 s scrape timeout.
SOURCE_TIMEOUT_SECONDS = 4.0
SEGMENTS_TIMEOUT_SECONDS = 2.0
# etcd: how long an unreachable etcd is retried, and each RPC's timeout; the sum stays inside SOURCE_TIMEOUT_SECONDS,
# so an etcd that is down is reported as unreachable (naming its endpoints), not as a timeout.
ETCD_RETRY_SECONDS = 1.0
ETCD_RPC_TIMEOUT_SECONDS = 1.5
# Per source, topics are read this many at a time: at 200 tables, serial `loadTable`s (10-40 ms each) alone took
# seconds. Below the 10 connections the REST catalog's HTTP pool keeps.
READ_THREADS = 8
# The stalled-segment listing (a few S3 requests per partition with data to land: 3 s for 400 partitions, ~2-3 CPU-s
# of botocore) is kept between scrapes: it is listed again in the background once older than STALLED_REFRESH_SECONDS,
# and served with its ages advanced while younger than STALLED_MAX_AGE_SECONDS (a segment is only reported stalled
# after processor.orphan_segment_grace_seconds, 300 s by default, so a listing this old says the same). Only the first
# scrape of the process waits for it. Once a minute: every 20 s, its CPU slowed the scrapes beside it at 200 tables.
STALLED_REFRESH_SECONDS = 60.0
# `topic_pattern` mappings: the topics are listed again (one discovery request) at most this often.
TOPICS_REFRESH_SECONDS = 30.0
STALLED_MAX_AGE_SECONDS = 180.0


class SourceTimeoutError(RuntimeError):
    """A source did not answer before the deadline (or an earlier call to it still has not returned)."""


# -------------------------------------------------------------------------------------- bounded calls


class _BoundedCaller:
    """Calls one source in a daemon thread and waits for it at most until a deadline.

    pyiceberg's REST client has no request timeout, so a hung catalog would otherwise hang scrapes and readiness
    checks. One call is in flight at a time: a call that never returns keeps the slot, so later calls fail fast
    instead of piling up threads; daemon threads do not hold up the process when it stops.
    """

    def __init__(self, name: str, timeout_seconds: float) -> None:
        self.name = name
        self.timeout_seconds = timeout_seconds
        self._slot = threading.Semaphore(1)

    def call(self, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.timeout_seconds
        if not self._slot.acquire(timeout=self.timeout_seconds):
            raise SourceTimeoutError(
                f"{self.name}: an earlier request has not returned after {self.timeout_seconds:g}s"
            )
        finished = threading.Event()
        results: list[T] = []
        failures: list[BaseException] = []

        def work() -> None:
            try:
                results.append(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                failures.append(exc)
            finally:
                self._slot.release()
                finished.set()

        threading.Thread(target=work, name=f"serve-metrics {self.name}", daemon=True).start()
        if not finished.wait(max(0.0, deadline - time.monotonic())):
            raise SourceTimeoutError(f"{self.name} did not answer within {self.timeout_seconds:g}s")
        if failures:
            raise failures[0]
        return results[0]


def describe_failure(exc: BaseException) -> str:
    """One line for logs and `/readyz`: our typed errors name the endpoint and never a secret; anything else is
    shown by its type only (a library message might carry a URL with credentials)."""
    if isinstance(exc, (EtcdError, OffsetStoreError, CatalogError, SourceTimeoutError, MetadataSnapshotError)):
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return type(exc).__name__


# ------------------------------------------------------------------------------------------ state


@dataclass
class TopicTotals:
    """Counters of one topic from its table's snapshots, each snapshot counted once (by id)."""

    written: int = 0
    invalid: int = 0
    batches: int = 0
    latency_bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(WRITE_LATENCY_BUCKETS_MS) + 1))
    latency_sum_ms: float = 0.0
    watermark_timestamps: dict[int, int] = field(default_factory=dict)  # partition -> ms, from the newest commit
    lfs: LfsStats = field(default_factory=LfsStats)
    seen_snapshot_ids: set[int] = field(default_factory=set, repr=False)
    metadata_location: str | None = None

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        """Prometheus `le` buckets (cumulative) of the write latency, ending with `+Inf`."""
        return _cumulative_buckets(WRITE_LATENCY_BUCKETS_MS, self.latency_bucket_counts)

    def add_new_snapshots(self, table: Table, topic: str) -> None:
        """Count the snapshots of `table`'s current ancestry not seen before that carry `topic`'s offsets.

        The walk stops at the first snapshot seen before: its ancestors were seen with it. Unchanged metadata is
        not walked at all."""
        if table.metadata_location == self.metadata_location:
            return
        table_name = ".".join(table.name())
        newer_timestamps: dict[int, int] = {}  # the walk goes newest first: the first value of a partition wins
        for snapshot in ancestry(table):
            if snapshot.snapshot_id in self.seen_snapshot_ids:
                break
            # Parsed before it is marked seen: a corrupt summary fails this scrape (counted) and the next one again.
            commit = parse_commit(snapshot, table_name=table_name) if is_kafscale_commit(snapshot, topic) else None
            self.seen_snapshot_ids.add(snapshot.snapshot_id)
            if commit is None:
                continue
            self.batches += 1
            self.written += commit.added_records or 0
            self.invalid += commit.dead_letter_records or 0
            if commit.write_latency_ms is not None:
                self.observe_latency(commit.write_latency_ms)
            self.lfs.add(commit.lfs)
            for partition, timestamp in commit.watermark_timestamps.items():
                newer_timestamps.setdefault(partition, timestamp)
        self.watermark_timestamps.update(newer_timestamps)
        self.metadata_location = table.metadata_location

    def observe_latency(self, latency_ms: float) -> None:
        index = next(
            (i for i, bound in enumerate(WRITE_LATENCY_BUCKETS_MS) if latency_ms <= bound),
            len(WRITE_LATENCY_BUCKETS_MS),
        )
        self.latency_bucket_counts[index] += 1
        self.latency_sum_ms += latency_ms

    def copy(self) -> TopicTotals:
        lfs = LfsStats()
        lfs.add(self.lfs)
        return TopicTotals(
            self.written,
            self.invalid,
            self.batches,
            list(self.latency_bucket_counts),
            self.latency_sum_ms,
            dict(self.watermark_timestamps),
            lfs,
            metadata_location=self.metadata_location,
        )


class LakehouseStateCollector:
    """A `prometheus_client` collector that reads etcd (or the offsets store) and the catalog on every scrape.

    Thread-safe: each source is called by one thread at a time (`_BoundedCaller`), and the error counter is locked.
    """

    def __init__(self, config: LakehouseConfig, *, source_timeout_seconds: float = SOURCE_TIMEOUT_SECONDS) -> None:
        self._config = config
        self._topics = [(m.topic, m.table) for m in config.mappings]
        self._etcd: EtcdClient | None = None
        if config.offsets.backend == "etcd":
            self._etcd = etcd_client_from_config(config, retry_seconds=ETCD_RETRY_SECONDS)
            # Per-RPC timeout (the client's default is 5 s); read when the client connects on its first call.
            self._etcd.timeout_seconds = ETCD_RPC_TIMEOUT_SECONDS
        self._offsets: OffsetStore = offset_store_from_config(config, self._etcd)
        self._offsets_name = "etcd" if self._etcd is not None else "offsets store"
        self._catalog_settings = catalog_settings(config)
        self._catalog: Catalog | None = None
        settings = self._catalog_settings
        catalog_where = redact_url(settings.uri or settings.warehouse or settings.name)
        # The names appear in timeout messages (logs, /readyz): where each source is, never a credential.
        self._offsets_caller = _BoundedCaller(self._offsets.location, source_timeout_seconds)
        self._catalog_caller = _BoundedCaller(f"Iceberg catalog at {catalog_where}", source_timeout_seconds)
        self._segments = segment_store_from_config(config)
        self._segments_caller = _BoundedCaller(self._segments.location,
                                               min(source_timeout_seconds, SEGMENTS_TIMEOUT_SECONDS))
        self._totals: dict[str, TopicTotals] = {}
        self._errors = {STAGE_CHECKPOINT: 0, STAGE_SINK: 0}
        self._discovery_mode = DiscoveryMode.parse(config.discovery.mode)
        if self._etcd is not None and self._discovery_mode is not DiscoveryMode.S3:
            self._errors[STAGE_DISCOVER] = 0
        self._errors_lock = threading.Lock()
        self._stalled: tuple[float, _SegmentsView] | None = None  # (listed at, result)
        self._partitions = NamespaceWatchMemory()  # with S3 discovery: each topic's partition prefixes
        self._topics_listed_at: float | None = None
        self._discovery_caller = _BoundedCaller(f"topic discovery of {self._segments.location}",
                                                min(source_timeout_seconds, SEGMENTS_TIMEOUT_SECONDS))
        self._stalled_refreshing = threading.Event()

    # ---- reading ----------------------------------------------------------------------------------------

    def _count_error(self, stage: str) -> None:
        with self._errors_lock:
            self._errors[stage] += 1

    def errors(self) -> dict[str, int]:
        with self._errors_lock:
            return dict(self._errors)

    def _read_offsets(self) -> dict[str, TopicOffsets]:
        """Per topic; a topic whose keys cannot be read is left out (and counted); an unreachable store ends it."""
        def read(topic: str) -> TopicOffsets | None:
            try:
                return TopicOffsets(self._offsets.committed_offsets(topic), self._offsets.broker_watermarks(topic))
            except (EtcdUnavailableError, OffsetStoreUnavailableError):
                raise  # the other topics would only wait for the same unreachable store
            except (EtcdError, OffsetStoreError) as exc:
                self._count_error(STAGE_CHECKPOINT)
                log.warning(
                    "cannot read the offsets of topic %s from %s: %s",
                    topic,
                    self._offsets.location,
                    describe_failure(exc),
                )
                return None

        found = {topic: offsets for topic, offsets in self._each_topic(read) if offsets is not None}
        if self._etcd is not None and STAGE_DISCOVER in self._errors:
            self._check_metadata_snapshot(self._etcd)
        return found

    def _check_metadata_snapshot(self, etcd: EtcdClient) -> None:
        """Count (`discover`) a broker metadata snapshot that ingest runs could not use: missing in etcd mode,
        unreadable in etcd or auto mode (runs in auto mode then list S3 instead, with a warning)."""
        where = f"{METADATA_SNAPSHOT_KEY} in etcd at {', '.join(etcd.endpoints)}"
        try:
            raw = etcd.get(METADATA_SNAPSHOT_KEY)
            if raw is None:
                if self._discovery_mode is DiscoveryMode.ETCD:
                    raise MetadataSnapshotError(f"{where} does not exist", key=METADATA_SNAPSHOT_KEY)
                return
            parse_metadata_snapshot(raw, where)
        except (EtcdUnavailableError, OffsetStoreUnavailableError):
            raise
        except (EtcdError, MetadataSnapshotError) as exc:
            self._count_error(STAGE_DISCOVER)
            log.warning("discovery.mode %s: %s", self._discovery_mode.value, describe_failure(exc))

    def _connected_catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog(self._catalog_settings)
        return self._catalog

    def _read_tables(self) -> dict[str, TopicTotals]:
        """Per topic; a table that cannot be read is left out (and counted); an unreachable catalog ends it."""
        catalog = self._connected_catalog()
        endpoint = catalog_endpoint(catalog)
        tables = dict(self._topics)
        for topic in tables:
            self._totals.setdefault(topic, TopicTotals())

        def read(topic: str) -> TopicTotals | None:
            table_name, totals = tables[topic], self._totals[topic]
            try:
                with catalog_errors(endpoint):
                    table = catalog.load_table(table_name)
                totals.add_new_snapshots(table, topic)
            except (NoSuchTableError, NoSuchNamespaceError):
                log.debug("table %s of topic %s does not exist yet", table_name, topic)  # its counters are 0
            except CatalogError:
                self._catalog = None  # connect afresh next time (new session, new token)
                raise
            except Exception as exc:
                self._count_error(STAGE_SINK)
                log.warning(
                    "cannot read table %s of topic %s from the catalog at %s: %s",
                    table_name,
                    topic,
                    endpoint,
                    describe_failure(exc),
                )
                log.debug("reading table %s failed", table_name, exc_info=True)
                return None
            return totals.copy()

        return {topic: totals for topic, totals in self._each_topic(read) if totals is not None}

    def _each_topic(self, read: Callable[[str], T]) -> list[tuple[str, T]]:
        """`read` of every mapped topic, `READ_THREADS` at a time, in mapping order; the first exception `read`
        lets through is raised (after the reads under way finish)."""
        topics = [topic for topic, _table in self._topics]
        if len(topics) <= 1:
            return [(topic, read(topic)) for topic in topics]
        with ThreadPoolExecutor(min(READ_THREADS, len(topics)), thread_name_prefix="serve-metrics read") as pool:
            return list(zip(topics, pool.map(read, topics), strict=True))

    def _read_stalled(self, offsets: dict[str, TopicOffsets]) -> _SegmentsView:
        """Per topic (of those whose offsets were read), the partitions waiting behind an incomplete segment past the
        grace period: listed from the committed next offset, or from the start for partitions nothing is committed
        of. A partition whose broker watermark is at its committed next offset holds no pending segment (a segment
        only holds offsets the broker assigned) and is not listed. So a refresh costs a few requests per partition
        with data to land, whatever the namespace keeps (a listing of the whole namespace, as this did with the
        namespace watch, grew with the retained segments: ~7M objects a day at 200 topics and a segment per 10 s).
        A topic's partitions are those etcd holds offsets or watermarks of and those `discovery.mode` finds, as the
        namespace watch finds them (`watched_partitions`: the broker's metadata snapshot, or each topic's partition
        prefixes in the store, listed about once a minute). A partition without a broker watermark (a topic
        `kafscale-cli restore` made) is listed to its newest completed segment, where its lag is measured to."""
        grace = self._config.processor.orphan_segment_grace_seconds
        try:
            in_store = watched_partitions(self._discovery_mode, self._segments, self._etcd, self._partitions,
                                          sorted(offsets))
        except (EtcdError, MetadataSnapshotError) as exc:  # counted as `discover` errors by the offsets' read
            log.debug("stalled segments: the partitions etcd holds offsets or watermarks of only (%s)", exc)
            in_store = {}

        def read(topic: str) -> tuple[ListedPartitions, TopicRetention | None] | None:
            if topic not in offsets:
                return None
            watermarks = offsets[topic].watermarks
            next_offsets: dict[int, int | None] = dict.fromkeys(sorted({*in_store.get(topic, []), *watermarks}))
            next_offsets.update({p: c.next_offset for p, c in offsets[topic].committed.items()})
            pending = {p: next_offset for p, next_offset in next_offsets.items()
                       if watermarks.get(p) is None or watermarks[p] != (next_offset or 0)}
            listed = stalled_partitions(self._segments, topic, pending, grace_seconds=grace,
                                        listed_whole=[p for p in pending if watermarks.get(p) is None])
            try:
                retention = topic_retention(self._segments, self._etcd, topic,
                                            {p: (n, watermarks.get(p)) for p, n in pending.items()},
                                            datetime.now(UTC), list_unlimited=False)
            except (EtcdError, StorageError) as exc:  # the stalled segments are still served
                log.warning("cannot read the retention of topic %s: %s", topic, describe_failure(exc))
                retention = None
            return listed, retention

        found = {topic: read for topic, read in self._each_topic(read) if read is not None}
        return _SegmentsView({topic: listed for topic, (listed, _) in found.items()},
                             {topic: retention for topic, (_, retention) in found.items() if retention is not None})

    def _list_stalled(self, offsets: dict[str, TopicOffsets]) -> _SegmentsView:
        """`_read_stalled`, kept for the next scrapes (even when the scrape that started it stopped waiting)."""
        listed_at = time.monotonic()
        try:
            stalled = self._read_stalled(offsets)
            self._stalled = (listed_at, stalled)
            return stalled
        finally:
            self._stalled_refreshing.clear()

    def _current_stalled(self, offsets: dict[str, TopicOffsets]) -> _SegmentsView:
        """The stalled partitions: listed now on the first scrape (within the segment store's deadline), afterwards
        the last listing with its ages advanced, listed again in the background when older than
        `STALLED_REFRESH_SECONDS`; none when the last listing is older than `STALLED_MAX_AGE_SECONDS`."""
        where = f"segments from {self._segments.location}"
        if self._stalled is None:
            if self._stalled_refreshing.is_set():
                return _SegmentsView({}, {})  # the first listing has not finished yet: no waiting for it again
            self._stalled_refreshing.set()
            read = self._read_source(self._segments_caller, lambda: {"view": self._list_stalled(offsets)}, None, where)
            return read.get("view", _SegmentsView({}, {}))
        listed_at, view = self._stalled
        age = time.monotonic() - listed_at
        if age > STALLED_REFRESH_SECONDS and not self._stalled_refreshing.is_set():
            self._stalled_refreshing.set()

            def refresh() -> None:
                try:
                    self._list_stalled(offsets)
                except Exception as exc:  # noqa: BLE001 - a background listing: logged, retried on a later scrape
                    log.warning("cannot read %s: %s", where, describe_failure(exc))

            threading.Thread(target=refresh, name="serve-metrics segments", daemon=True).start()
        if age > STALLED_MAX_AGE_SECONDS:
            log.warning("cannot read %s: the last listing is %.0f s old (more than %.0f s); stalled partitions are "
                        "left out", where, age, STALLED_MAX_AGE_SECONDS)
            return _SegmentsView({}, {})
        return view.aged(age)

    def _read_source(self, caller: _BoundedCaller, read: Callable[[], dict], stage: str | None, where: str) -> dict:
        try:
            return caller.call(read)
        except Exception as exc:
            if stage is not None:  # None: a source of our own addition, not one of the Go processor's stages
                self._count_error(stage)
            log.warning("cannot read %s: %s", where, describe_failure(exc))
            log.debug("reading %s failed", where, exc_info=True)
            return {}

    # ---- prometheus_client Collector ---------------------------------------------------------------------

    def _refresh_pattern_topics(self) -> None:
        """With `topic_pattern` mappings, the mapped topics are those that match now: listed again every
        `TOPICS_REFRESH_SECONDS`; when the listing fails, the topics known so far are kept."""
        now = time.monotonic()
        if not self._config.pattern_mappings or (
                self._topics_listed_at is not None and now - self._topics_listed_at < TOPICS_REFRESH_SECONDS):
            return
        try:
            resolution = self._discovery_caller.call(
                lambda: with_pattern_topics(self._config, self._segments, self._etcd))
        except Exception as exc:  # noqa: BLE001 - the known topics are scraped; the next scrape lists again
            log.warning("cannot list the topics of the topic patterns: %s", describe_failure(exc))
            return
        self._topics = [(m.topic, m.table) for m in resolution.config.mappings]
        self._topics_listed_at = now

    def collect(self) -> Iterator[Metric]:
        self._refresh_pattern_topics()
        # The catalog is read while etcd and then the segment store are (the stalled listing starts from the
        # committed offsets): a scrape takes the longer of the two, not their sum.
        tables: list[dict] = []
        catalog_reader = threading.Thread(target=lambda: tables.append(self._read_source(
            self._catalog_caller,
            self._read_tables,
            STAGE_SINK,
            f"tables from the {self._catalog_settings.type} catalog",
        )), name="serve-metrics catalog", daemon=True)
        catalog_reader.start()
        offsets = self._read_source(
            self._offsets_caller, self._read_offsets, STAGE_CHECKPOINT, f"offsets from {self._offsets.location}"
        )
        segments = self._current_stalled(offsets)
        catalog_reader.join()
        totals = tables[0]
        yield from _table_families(totals)
        yield from _offset_families(offsets, totals, segments.listed)
        yield _stalled_family(segments.listed)
        yield from _retention_families(segments.retention)
        errors = CounterMetricFamily(
            f"{NAMESPACE}_errors_total",
            "Failures of serve-metrics to read etcd/offsets (checkpoint), the catalog "
            "(sink) or the broker's metadata snapshot (discover); failed ingest runs are in "
            "Dagster.",
            labels=["stage"],
        )
        for stage, count in sorted(self.errors().items()):
            errors.add_metric([stage], count)
        yield errors

    # ---- readiness --------------------------------------------------------------------------------------

    def readiness_problems(self) -> dict[str, str]:
        """`{dependency: what failed}` for etcd (or the offsets store) and the catalog; empty when both answer."""
        problems: dict[str, str] = {}
        checks = (
            (self._offsets_name, self._offsets_caller, self._probe_offsets),
            ("catalog", self._catalog_caller, self._probe_catalog),
        )
        for name, caller, probe in checks:
            try:
                caller.call(probe)
            except Exception as exc:  # noqa: BLE001 - reported as not ready
                problems[name] = describe_failure(exc)
        return problems

    def _probe_offsets(self) -> None:
        if self._etcd is not None:
            self._etcd.get_entry(f"{self._config.offsets.key_prefix}/offsets/")
        elif self._topics:
            self._offsets.committed_offsets(self._topics[0][0])

    def _probe_catalog(self) -> None:
        catalog = self._connected_catalog()
        try:
            with catalog_errors(catalog_endpoint(catalog)):
                if self._topics:
                    catalog.table_exists(self._topics[0][1])  # a HEAD request on a REST catalog
                else:
                    catalog.list_namespaces()
        except NoSuchNamespaceError:
            pass  # the catalog answered (table_exists falls back to load_table on older REST servers)
        except CatalogError:
            self._catalog = None
            raise

    def close(self) -> None:
        self._offsets.close()
        if self._etcd is not None:
            self._etcd.close()


def _table_families(totals: dict[str, TopicTotals]) -> Iterable[Metric]:
    records = CounterMetricFamily(
        f"{NAMESPACE}_records_total", "Records processed, by result.", labels=["topic", "result"]
    )
    batches = CounterMetricFamily(
        f"{NAMESPACE}_batches_total", "Batches committed (one per Iceberg commit).", labels=["topic"]
    )
    latency = HistogramMetricFamily(
        f"{NAMESPACE}_write_latency_ms", "Milliseconds from the start of a run's write to its commit.", labels=["topic"]
    )
    lfs_resolved = CounterMetricFamily(
        f"{NAMESPACE}_lfs_resolved_total", "Total LFS blobs resolved per topic.", labels=["topic"]
    )
    lfs_bytes = CounterMetricFamily(
        f"{NAMESPACE}_lfs_resolved_bytes_total", "Total bytes resolved from LFS per topic.", labels=["topic"]
    )
    lfs_errors = CounterMetricFamily(
        f"{NAMESPACE}_lfs_resolution_errors_total",
        "Total LFS resolution errors per topic and reason.",
        labels=["topic", "reason"],
    )
    lfs_duration = HistogramMetricFamily(
        f"{NAMESPACE}_lfs_resolution_duration_seconds", "LFS resolution duration in seconds.", labels=["topic"]
    )
    for topic, topic_totals in sorted(totals.items()):
        records.add_metric([topic, RESULT_WRITTEN], topic_totals.written)
        records.add_metric([topic, RESULT_INVALID], topic_totals.invalid)
        records.add_metric([topic, RESULT_DROPPED], 0)
        records.add_metric([topic, RESULT_SKIPPED_LFS], topic_totals.lfs.skipped)
        batches.add_metric([topic], topic_totals.batches)
        latency.add_metric([topic], topic_totals.cumulative_buckets(), topic_totals.latency_sum_ms)
        lfs = topic_totals.lfs
        lfs_resolved.add_metric([topic], lfs.resolved)
        lfs_bytes.add_metric([topic], lfs.resolved_bytes)
        for reason in (ERROR_DECODE, ERROR_RESOLVE):
            lfs_errors.add_metric([topic, reason], lfs.errors.get(reason, 0))
        lfs_duration.add_metric(
            [topic], _cumulative_buckets(LFS_DURATION_BUCKETS_SECONDS, lfs.duration_buckets), lfs.resolution_seconds
        )
    return records, batches, latency, lfs_resolved, lfs_bytes, lfs_errors, lfs_duration


@dataclass(frozen=True)
class _SegmentsView:
    """What a listing of the partitions with records not landed found: per topic, stalled segments and where the
    completed segments end (`ListedPartitions`), and its retention."""

    listed: dict[str, ListedPartitions]
    retention: dict[str, TopicRetention]

    def aged(self, seconds: float) -> _SegmentsView:
        """As seen `seconds` after the listing: ages grow, headroom shrinks."""
        listed = {topic: replace(found, stalled={p: replace(segment, age_seconds=segment.age_seconds + seconds)
                                                 for p, segment in found.stalled.items()})
                  for topic, found in self.listed.items()}
        retention = {topic: replace(found, partitions={p: replace(
            r, headroom_seconds=None if r.headroom_seconds is None else r.headroom_seconds - seconds,
            replay_window_seconds=None if r.replay_window_seconds is None else r.replay_window_seconds + seconds)
            for p, r in found.partitions.items()}) for topic, found in self.retention.items()}
        return _SegmentsView(listed, retention)


def _retention_families(retention: dict[str, TopicRetention]) -> Iterable[Metric]:
    headroom = GaugeMetricFamily(
        f"{NAMESPACE}_retention_headroom_seconds",
        "Seconds before the topic's retention.ms deletes the oldest segment holding records not landed; negative: "
        "past due (kafscale-lakehouse addition).",
        labels=["topic", "partition"],
    )
    window = GaugeMetricFamily(
        f"{NAMESPACE}_replay_window_seconds",
        "Age of the partition's oldest segment: how far back a replay can reach (kafscale-lakehouse addition).",
        labels=["topic", "partition"],
    )
    for topic, found in sorted(retention.items()):
        for partition, r in sorted(found.partitions.items()):
            if r.headroom_seconds is not None:
                headroom.add_metric([topic, str(partition)], round(r.headroom_seconds, 3))
            if r.replay_window_seconds is not None:
                window.add_metric([topic, str(partition)], round(r.replay_window_seconds, 3))
    return [headroom, window]


def _stalled_family(listed: dict[str, ListedPartitions]) -> Metric:
    family = GaugeMetricFamily(
        f"{NAMESPACE}_stalled_segment_age_seconds",
        "Seconds since the incomplete segment a partition waits behind was written, for partitions waiting past "
        "processor.orphan_segment_grace_seconds (kafscale-lakehouse addition).",
        labels=["topic", "partition"],
    )
    for topic, found in sorted(listed.items()):
        for partition, segment in sorted(found.stalled.items()):
            family.add_metric([topic, str(partition)], round(segment.age_seconds, 3))
    return family


def _cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Prometheus `le` buckets (cumulative) of per-bucket `counts` (one more than `bounds`), ending with `+Inf`."""
    buckets, running = [], 0
    for bound, count in zip((*map(str, bounds), "+Inf"), counts, strict=False):
        running += count
        buckets.append((bound, float(running)))
    return buckets


def _offset_families(offsets: dict[str, TopicOffsets], totals: dict[str, TopicTotals],
                     listed: dict[str, ListedPartitions]) -> Iterable[Metric]:
    labels = ["topic", "partition"]
    last_offset = GaugeMetricFamily(
        f"{NAMESPACE}_last_offset", "Last committed offset per topic/partition.", labels=labels
    )
    watermark_offset = GaugeMetricFamily(
        f"{NAMESPACE}_watermark_offset", "Watermark offset per topic/partition.", labels=labels
    )
    watermark_timestamp = GaugeMetricFamily(
        f"{NAMESPACE}_watermark_timestamp_ms",
        "Kafka timestamp (unix ms) of the last committed record per topic/partition.",
        labels=labels,
    )
    lag = GaugeMetricFamily(
        f"{NAMESPACE}_lag",
        "Records the broker has that are not committed: broker next offset (else the end of the completed "
        "segments) - committed next offset (kafscale-lakehouse addition).",
        labels=labels,
    )
    for topic, topic_offsets in sorted(offsets.items()):
        timestamps = totals[topic].watermark_timestamps if topic in totals else {}
        for partition, committed in sorted(topic_offsets.committed.items()):
            if committed.next_offset is None:
                continue  # a record of "nothing committed"; Go never sets these gauges before a commit
            partition_labels = [topic, str(partition)]
            last_offset.add_metric(partition_labels, committed.offset)
            watermark_offset.add_metric(partition_labels, committed.offset)
            if partition in timestamps:
                watermark_timestamp.add_metric(partition_labels, timestamps[partition])
        # The broker's watermark, else (none published: a restored topic) where the completed segments end.
        segments_ends = listed[topic].segments_ends if topic in listed else {}
        for partition, log_end in sorted({**segments_ends, **topic_offsets.watermarks}.items()):
            partition_committed = topic_offsets.committed.get(partition)
            next_offset = partition_committed.next_offset if partition_committed is not None else None
            # `lag` is None only for an unknown log end; this one is known.
            lag.add_metric([topic, str(partition)], cast(int, partition_lag(log_end, next_offset)))
    return last_offset, watermark_offset, watermark_timestamp, lag
