"""`land_tables`: one run that lands many tables, requested by the namespace watch (namespace_sensor.py).

Dagster cannot put assets with different partitions definitions in one run, and each table's asset is partitioned by
its own topic's Kafka partitions. So the batched run is an op job, not an asset job. Its op, in one process (one
launch, one Spark session and one set of clients for the batch):
1. prepares every table its run config lists as the table's own asset does (`prepare_ingest`: its leases, its
   offsets, its planned segments);
2. writes every table's segments in ONE Spark job, then commits each table on its own (`commit_ingests`: one Iceberg
   commit per table, each re-checking its own offsets, so a table's failed commit undoes nothing of another's);
3. logs for each table, as soon as its checks are done, what the asset's run records: an `AssetMaterialization` per
   Kafka partition with the same metadata (assets.py), then the table's check results as `AssetCheckEvaluation`s
   (checks.py's evaluations).
Dagster files them under the table's asset, its partitions and its checks, so the table's partition status,
freshness, metadata plots and check history read the same whichever run landed it; the asset's lineage is its
definition's and stays the same.

A table that fails (its leases, its commit, a segment) is logged and the others go on: the tables that landed stay
landed. The run then fails naming the tables that did not land; the namespace watch requests those again after its
backoff (sensors.py `retry_wait`). When the shared Spark job itself fails, no table of the batch commits (each is
requested again, as after a failed job of its own run).

A table's concurrency pool is not held by this op (Dagster pools are per op, this op serves many tables): the watch
never puts a table in a batch while another run of it (its own job or a batch) is queued or running and has not
committed, and the per-partition leases keep a manual run of the same table from committing beside it. Once every
table of the batch committed (or failed) and let go of its leases, the run tags itself `BATCH_COMMITTED_TAG` and only
records events from then on: the watch may request its tables again meanwhile, and that run records its own events
after this one ended (`RECORD_AFTER_TAG`), so a partition's latest materialization is its latest commit's.
"""

# No `from __future__ import annotations`: Dagster reads the context and config parameter annotations at runtime.
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import dagster as dg
from pyiceberg.table import Table

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import (
    BATCH_TABLE_THREADS,
    IngestContext,
    IngestFailedError,
    IngestResult,
    PreparedIngest,
    TableOffsetsReader,
    TopicOffsets,
    TopicScan,
    WatchSources,
    commit_ingests,
    prepare_ingest,
    scan_retention,
    scan_topic,
)
from kafscale_lakehouse.engine.tables import (
    FRESHNESS,
    ID_UNIQUE,
    OFFSETS_CONTIGUOUS,
    RECORD_ID_UNIQUE,
    RETENTION_HEADROOM,
    SCHEMA_VALID,
    read_topic_offsets,
)
from kafscale_lakehouse.offsets.ranges import parse_ranges
from kafscale_lakehouse.orchestration.assets import (
    landed_materializations,
    partial_commit_materializations,
)
from kafscale_lakehouse.orchestration.checks import (
    IntegrityScope,
    evaluate_freshness,
    evaluate_id_unique,
    evaluate_offsets_contiguous,
    evaluate_record_id_unique,
    evaluate_retention_headroom,
    evaluate_schema_valid,
    integrity_scopes,
)
from kafscale_lakehouse.orchestration.naming import kafka_partition_key, table_asset_key
from kafscale_lakehouse.orchestration.resources import (
    IcebergCatalogResource,
    OffsetStoreResource,
    SegmentStoreResource,
    SparkResource,
    ingest_context,
)
from kafscale_lakehouse.orchestration.sensors import ACTIVE_RUN_STATUSES
from kafscale_lakehouse.storage import DiscoveryMode, TopicRetention, discover_partitions

log = logging.getLogger(__name__)

LAND_TABLES_JOB = "land_tables"
LAND_TABLES_OP = "land_listed_tables"  # the op; a job and an op cannot share a name
# The tables a `land_tables` run lands, comma-separated: the watch keeps them out of other batches while it is active
# and has not committed them (`BATCH_COMMITTED_TAG`).
BATCH_TABLES_TAG = "kafscale/batch_tables"
# Set by a `land_tables` run once every table of it committed (or failed) and let go of its leases: from then on the
# run only records events (checks, materializations: a third of a batch's time), so the watch counts it in no slot and
# may request its tables again (namespace_sensor.py `_tables_in_flight`).
BATCH_COMMITTED_TAG = "kafscale/batch_committed"
# The `land_tables` runs, comma-separated, still recording the events of tables this run lands again: it records its
# own only after they ended, so each partition's latest materialization stays its latest commit's.
RECORD_AFTER_TAG = "kafscale/record_after"
# How long a run waits for those runs before it records its events anyway (warning).
RECORD_AFTER_MAX_SECONDS = 600.0
# The niceness a committed batch adds to the thread that records its checks and events: bookkeeping, off every table's
# path to its next commit, so on a deployment's shared cores the runs still landing tables go first
# (benchmarks/README.md, an eleventh session: fanout.py's p90 at 200 topics 109-126 s against 126-149 s).
RECORDING_NICENESS = 10


class TableToLand(dg.Config):
    """One table of a batch: its Kafka partitions with pending segments and, as the watch planned them, their offset
    ranges (`{"<partition>": [start, end]}`; the run re-checks them against the table, which wins)."""

    table: str
    partitions: list[int]
    planned_ranges: str | None = None


class LandTablesConfig(dg.Config):
    tables: list[TableToLand]


def land_tables_run_config(tables: list[TableToLand]) -> dict:
    """The run config of a `land_tables` run over `tables`."""
    return {"ops": {LAND_TABLES_OP: {"config": LandTablesConfig(tables=tables).model_dump()}}}


def build_land_tables_job(config: LakehouseConfig) -> dg.JobDefinition:
    """The `land_tables` job of `config`'s mappings."""
    mappings = {mapping.table: mapping for mapping in config.mappings}
    lakehouse_config = config  # the op's `config` parameter is its run config

    @dg.op(name=LAND_TABLES_OP, out={}, tags={"kind": "iceberg"},
           description="Lands the listed tables: one Spark job for all, then each its own commit, materializations "
                       "and check results; fails at the end naming the tables that did not land.")
    def land_tables(context: dg.OpExecutionContext, config: LandTablesConfig, spark: SparkResource,  # noqa: ANN202
                    segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,
                    iceberg_catalog: IcebergCatalogResource):
        engine = ingest_context(lakehouse_config, spark, segment_store, offset_store, iceberg_catalog)
        failed: dict[str, str] = {}
        entries: list[tuple[MappingConfig, TableToLand]] = []
        for entry in config.tables:
            mapping = mappings.get(entry.table)
            if mapping is None:
                failed[entry.table] = "no mapping of the lakehouse config lands this table"
                continue
            entries.append((mapping, entry))
        # One log event for the batch (each is a write to the event log: hundreds a run add up).
        context.log.info("landing %d tables: %s", len(entries), "; ".join(
            f"topic {m.topic} → {m.table} Kafka partitions {sorted(e.partitions)}" for m, e in entries))
        prepared: list[tuple[MappingConfig, TableToLand, PreparedIngest]] = []
        # The tables prepare on threads (their leases, offsets and plans are round trips to etcd, the catalog and
        # S3); Dagster's events and logs stay on this thread.
        preparing = _prepare_all(context.run.run_id, entries, engine)
        try:
            for (mapping, entry), run in zip(entries, preparing, strict=True):
                if isinstance(run, Exception):  # this table's (its leases, its table); the others go on
                    context.log.error("table %s (topic %s) did not land: %s", mapping.table, mapping.topic, run)
                    failed[mapping.table] = str(run)
                else:
                    prepared.append((mapping, entry, run))
            # One Spark job for every table's segments, then one commit per table (concurrent, each on its own).
            outcomes = commit_ingests([run for _, _, run in prepared])
        finally:
            for _, _, run in prepared:
                run.release_leases()  # commit_ingests releases them on every path; releasing is idempotent
        _mark_committed(context)
        with _recording_priority(context):
            yield from _record(context, lakehouse_config, prepared, outcomes, segment_store, offset_store,
                               iceberg_catalog, failed)
        if failed:
            raise dg.Failure(
                description=f"{len(failed)} of {len(config.tables)} tables did not land: "
                            + "; ".join(f"{table}: {reason}" for table, reason in failed.items()),
                metadata={"failed_tables": dg.MetadataValue.json(failed)})

    @dg.job(name=LAND_TABLES_JOB, executor_def=dg.in_process_executor,
            description="Lands many tables in one run (the namespace watch requests it, processor.watch: namespace).")
    def land_tables_job() -> None:
        land_tables()

    return land_tables_job


def _record(context: dg.OpExecutionContext, lakehouse_config: LakehouseConfig,
            prepared: list[tuple[MappingConfig, TableToLand, PreparedIngest]],
            outcomes: list[IngestResult | Exception], segment_store: SegmentStoreResource,
            offset_store: OffsetStoreResource, iceberg_catalog: IcebergCatalogResource,
            failed: dict[str, str]) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """After the batch's commits: each table's checks, then its events (`failed` gets the tables that did not land),
    once the runs of `RECORD_AFTER_TAG` ended."""
    _wait_for_runs(context, [r for r in context.run.tags.get(RECORD_AFTER_TAG, "").split(",") if r])
    checks = _BatchChecks(lakehouse_config, segment_store, offset_store, iceberg_catalog,
                          {run.mapping.table: run.table for _, _, run in prepared},
                          {run.mapping.topic for _, _, run in prepared}, context.instance)
    latest = _latest_materializations(context, [table_asset_key(run.mapping.table) for _, _, run in prepared])
    with ThreadPoolExecutor(BATCH_TABLE_THREADS, thread_name_prefix="checks") as pool:
        # Each table's events are recorded as soon as its checks are done, while the others' still run: the
        # event-log writes (one per event; on sqlite the slowest part of a batch) overlap the checks.
        checking = {pool.submit(_outcome, _table_events, mapping, entry, run, outcome, checks,
                                latest.get(table_asset_key(mapping.table))): mapping
                    for (mapping, entry, run), outcome in zip(prepared, outcomes, strict=True)}
        for future in as_completed(checking):
            mapping, table_events = checking[future], future.result()
            if isinstance(table_events, _NotLanded):
                yield from table_events.events
                if isinstance(table_events.error, IngestFailedError):  # what its partial commit landed
                    yield from partial_commit_materializations(table_asset_key(mapping.table),
                                                               table_events.error.result, iceberg_catalog,
                                                               context.log, context.instance)
                context.log.error("table %s (topic %s) did not land: %s", mapping.table, mapping.topic,
                                  table_events.error)
                failed[mapping.table] = str(table_events.error)
            elif isinstance(table_events, Exception):  # one table's failure must not stop the others
                context.log.error("table %s (topic %s) did not land: %s", mapping.table, mapping.topic,
                                  table_events)
                failed[mapping.table] = str(table_events)
            else:
                yield from table_events


_T = TypeVar("_T")


def _mark_committed(context: dg.OpExecutionContext) -> None:
    """`BATCH_COMMITTED_TAG` on this run: its tables may go into the next batch while it records their events."""
    try:
        context.instance.add_run_tags(context.run_id, {BATCH_COMMITTED_TAG: "true"})
    except Exception as exc:  # noqa: BLE001 - the watch then waits for the run's end, as it did before this tag
        context.log.warning("could not tag run %s as committed (%s): its tables wait for its end to land again",
                            context.run_id, exc)


@contextmanager
def _recording_priority(context: dg.OpExecutionContext) -> Iterator[None]:
    """This thread (and the threads it starts meanwhile: Linux keeps a nice value per thread) at `RECORDING_NICENESS`
    more than it was, and back when done if the process may raise it again (a run worker's process ends anyway; an
    unprivileged `execute_in_process` keeps it lowered)."""
    thread = threading.get_native_id()
    try:
        before = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, before + RECORDING_NICENESS)
    except OSError as exc:  # no such call or not allowed here: it records at the priority it has
        context.log.debug("could not lower this run's CPU priority (%s)", exc)
        yield
        return
    try:
        yield
    finally:
        with suppress(OSError):  # raising a priority again needs CAP_SYS_NICE
            os.setpriority(os.PRIO_PROCESS, thread, before)


def _wait_for_runs(context: dg.OpExecutionContext, run_ids: Sequence[str]) -> None:
    """Wait until the runs `run_ids` (`RECORD_AFTER_TAG`) are no longer active, at most `RECORD_AFTER_MAX_SECONDS`."""
    deadline = time.monotonic() + RECORD_AFTER_MAX_SECONDS
    for run_id in run_ids:
        logged = False
        while (run := context.instance.get_run_by_id(run_id)) is not None and run.status in ACTIVE_RUN_STATUSES:
            if time.monotonic() >= deadline:
                context.log.warning("run %s still %s after %.0f s: recording this run's events before its own, so a "
                                    "partition's latest materialization may be its older one until the next run",
                                    run_id, run.status.value.lower(), RECORD_AFTER_MAX_SECONDS)
                return
            if not logged:
                context.log.info("committed; waiting for run %s, which committed some of these tables before, to "
                                 "record its events first", run_id)
                logged = True
            time.sleep(0.5)


def _latest_materializations(context: dg.OpExecutionContext, asset_keys: Sequence[dg.AssetKey]
                             ) -> Mapping[dg.AssetKey, dg.EventLogEntry | None]:
    """The tables' latest materializations (their previous row counts) in one event-log read, not two to four each.
    When that read fails, none: each table then reads its partitions' latest counts on its own thread, where a
    failure is that table's (its commit landed; the others go on)."""
    try:
        return context.instance.get_latest_materialization_events(asset_keys)
    except Exception as exc:  # noqa: BLE001 - each table's own reads report it, if they fail too
        context.log.warning("could not read the latest materializations of %d tables at once (%s); each table reads "
                            "its own", len(asset_keys), exc)
        return {}


def _outcome(function: Callable[..., _T], *args: Any) -> _T | Exception:
    """`function(*args)`, or the exception it raised (a table's, on a worker thread: reported on the op's)."""
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001 - returned, the caller reports it as the table's
        return exc


def _prepare_all(run_id: str, entries: list[tuple[MappingConfig, TableToLand]],
                 engine: IngestContext) -> list[PreparedIngest | Exception]:
    """`_prepare` of every table on `BATCH_TABLE_THREADS` threads: each its run, or the exception it raised. When this
    thread is interrupted, what was prepared lets go of its leases (its run record stays for the next run)."""
    with ThreadPoolExecutor(BATCH_TABLE_THREADS, thread_name_prefix="prepare") as pool:
        futures = [pool.submit(_outcome, _prepare, run_id, mapping, entry, engine) for mapping, entry in entries]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            pool.shutdown(wait=True)
            for future in futures:
                run = None if future.cancelled() or future.exception() is not None else future.result()
                if isinstance(run, PreparedIngest):
                    run.release_leases()
            raise


def _prepare(run_id: str, mapping: MappingConfig, entry: TableToLand, engine: IngestContext) -> PreparedIngest:
    """The table's leases, offsets and planned segments (`prepare_ingest`, as its own asset's run does)."""
    where = f"the {LAND_TABLES_OP} config of table {mapping.table}"
    planned = parse_ranges(entry.planned_ranges, where=where) if entry.planned_ranges else None
    return prepare_ingest(engine, mapping, partitions=sorted(entry.partitions), run_id=run_id, planned=planned)


class _NotLanded(Exception):  # noqa: N818 - a table's outcome, not raised out of the op
    """A table that did not land: its `error`, after the `events` recorded before it failed (the op adds those of
    what a partial commit landed)."""

    def __init__(self, error: Exception, events: list[dg.AssetMaterialization] | None = None) -> None:
        super().__init__(str(error))
        self.error, self.events = error, events or []


def _table_events(mapping: MappingConfig, entry: TableToLand, run: PreparedIngest,
                  outcome: IngestResult | Exception, checks: "_BatchChecks", latest: dg.EventLogEntry | None,
                  ) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """One table of the batch after its commit (on a worker thread): its materializations and its check results;
    `_NotLanded` when it did not land. `latest`: the table asset's latest materialization before the run."""
    if isinstance(outcome, Exception):
        raise _NotLanded(outcome)
    asset_key = table_asset_key(mapping.table)
    result = run.result
    table = checks.landed_table(result)
    partition_keys = [kafka_partition_key(p) for p in sorted(entry.partitions)]
    materializations = landed_materializations(asset_key, partition_keys, result, table, checks.instance, latest)
    log.info("table %s: run %s committed %d records of topic %s in snapshot %s", result.table, result.run_id,
             result.records, result.topic, result.snapshot_id)
    metadata = materializations[0].metadata if materializations else None
    try:
        evaluations = checks.evaluations(mapping, table, metadata)
    except Exception as exc:
        raise _NotLanded(exc, materializations) from exc
    return [*materializations, *evaluations]


class _BatchChecks:
    """The checks of the tables a batch landed: the resources they read, the tables as their commits left them
    (read again only when the commit did not leave them current), and the partitions, offsets and broker watermarks
    of the batch's topics, read once for all. The freshness checks list no segment of a partition with a broker
    watermark (its lag is measured against it, `scan_topic(lag_only=True)`); they used to share a listing of the
    whole namespace, whose cost grew with every segment the namespace keeps. Safe on several threads."""

    def __init__(self, lakehouse: LakehouseConfig, segment_store: SegmentStoreResource,
                 offset_store: OffsetStoreResource, catalog: IcebergCatalogResource,
                 tables: Mapping[str, Table], topics: Iterable[str], instance: dg.DagsterInstance) -> None:
        self.lakehouse, self.segment_store, self.offset_store, self.catalog = (lakehouse, segment_store,
                                                                               offset_store, catalog)
        self.instance = instance  # the checks' latest evaluations tell what they read (integrity_scope)
        self._tables = dict(tables)
        self._topics = sorted(topics)
        self._sources: WatchSources | None = None
        self._partitions: dict[str, list[int]] = {}
        self._offsets: dict[str, TopicOffsets] = {}
        self._scopes: dict[dg.AssetKey, IntegrityScope] = {}
        self._lock = threading.Lock()

    def landed_table(self, result: IngestResult) -> Table:
        """The table `result`'s run committed to, as of its commit: the one the run held (commit_append refreshes it)
        unless something moved it since (then loaded)."""
        table = self._tables.get(result.table)
        if table is None or (result.snapshot_id is not None
                             and table.metadata.current_snapshot_id != result.snapshot_id):
            table = self.catalog.load_table(result.table)
            self._tables[result.table] = table
        return table

    def evaluations(self, mapping: MappingConfig, table: Table,
                    metadata: Mapping[str, dg.MetadataValue] | None) -> list[dg.AssetCheckEvaluation]:
        """The table's checks (build_table_checks) on what the run landed (`table` after its commit, `metadata`
        its materialization's), as evaluations of the table's checks."""
        with self._lock:  # the partitions are discovered once, at the first table's checks (after every commit)
            if self._sources is None:
                sources = WatchSources(
                    store=self.segment_store.open_store(), offsets=self.offset_store.offset_store(),
                    discovery_mode=DiscoveryMode.parse(self.lakehouse.discovery.mode),
                    etcd=self.offset_store.etcd_client(), tables=_LandedTableOffsets(self._tables, self.catalog),
                    orphan_grace_seconds=self.lakehouse.processor.orphan_segment_grace_seconds)
                self._partitions = discover_partitions(sources.discovery_mode, sources.store, sources.etcd,
                                                       topics=self._topics).partitions
                # Every topic's offsets and watermarks in two etcd reads (after all the batch's commits), as the
                # namespace watch reads them, not two per table.
                committed = sources.offsets.committed_offsets_by_topic(self._topics)
                watermarks = sources.offsets.broker_watermarks_by_topic(self._topics)
                self._offsets = {topic: TopicOffsets(committed[topic], watermarks[topic]) for topic in self._topics}
                # What each table's integrity checks read, from their latest evaluations: one event-log query.
                self._scopes = integrity_scopes(self.instance, [table_asset_key(t) for t in self._tables])
                self._sources = sources
            sources = self._sources
        scan = scan_topic(sources, mapping.topic, table=mapping.table,
                          partitions=self._partitions.get(mapping.topic, []), offsets=self._offsets.get(mapping.topic),
                          lag_only=True)
        scope = self._scopes[table_asset_key(mapping.table)]
        # A batch over hundreds of topics lists segments only of topics whose retention is limited.
        retention = scan_retention(sources, mapping.topic, scan, list_unlimited=False)
        return list(table_check_evaluations(self.lakehouse, mapping, table, metadata, scan, scope, retention))


class _LandedTableOffsets(TableOffsetsReader):
    """The freshness scans' table offsets from the batch's tables as their commits left them, not loaded again."""

    def __init__(self, tables: Mapping[str, Table], catalog: IcebergCatalogResource) -> None:
        super().__init__(catalog.settings())
        self._tables = tables

    def read(self, table: str, topic: str) -> dict[int, int] | None:
        loaded = self._tables.get(table)
        return read_topic_offsets(loaded, topic) if loaded is not None else super().read(table, topic)


def table_check_evaluations(lakehouse: LakehouseConfig, mapping: MappingConfig, table: Table,
                            metadata: Mapping[str, dg.MetadataValue] | None,
                            scan: TopicScan, scope: IntegrityScope,
                            retention: tuple[TopicRetention | None, str | None]) -> Iterator[dg.AssetCheckEvaluation]:
    """The checks of `build_table_checks` as evaluations of the table's checks: on `table`, the run's
    materialization `metadata` and `scan`, its topic now; the integrity checks read `scope`."""
    asset_key = table_asset_key(mapping.table)
    upsert = mapping.mode == "upsert"
    results = {SCHEMA_VALID: (evaluate_schema_valid(metadata, lakehouse.schema_config.mode), True)}
    if upsert:
        results[ID_UNIQUE] = (evaluate_id_unique(table, mapping.topic, list(mapping.id_columns), metadata, scope),
                              True)
    else:
        results[RECORD_ID_UNIQUE] = (evaluate_record_id_unique(table, mapping.topic, metadata, scope), True)
    results[OFFSETS_CONTIGUOUS] = (evaluate_offsets_contiguous(table, mapping.topic, scope), True)
    results[FRESHNESS] = (evaluate_freshness(scan.partitions, mapping.freshness_max_lag_records, scan.table_error),
                          False)
    results[RETENTION_HEADROOM] = (evaluate_retention_headroom(
        *retention, warn_seconds=mapping.retention_headroom_warn_seconds), False)
    for name, (check, blocking) in results.items():
        yield dg.AssetCheckEvaluation(asset_key=asset_key, check_name=name, passed=check.passed,
                                      metadata=check.metadata, severity=check.severity,
                                      description=check.description, blocking=blocking)
