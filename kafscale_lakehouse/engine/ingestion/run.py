"""One ingestion run of a topic→table mapping, without Dagster: the exactly-once commit protocol (docs/architecture.md).

    context = IngestContext.from_config(config, spark)
    result = ingest_mapping(context, config.mappings[0])

A run: claim a lease per Kafka partition → start offsets from the table (etcd repaired from it) → plan whole
completed segments up to the run's byte budget → one Spark job reads them and writes Parquet data files
(`spark_job.run_ingestion_spark_job`: each task decodes its segments and writes its files, no record goes
through the JVM)
→ keep, per partition, only the files below the first segment that could not be read → one
Iceberg commit that re-checks the start offsets → etcd offsets, fenced by the leases → leases released.
A partition that cannot advance (corrupt segment, gap, lease held elsewhere) does not stop the others; the run then
ends with `IngestFailedError` naming what is at fault, after committing what was complete.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.types import TimestamptzType
from pyspark.sql import SparkSession

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.connections import (
    catalog_settings,
    etcd_client_from_config,
    offset_store_from_config,
    schema_registry_client,
    segment_store_from_config,
)
from kafscale_lakehouse.engine.ingestion.lag import lag_and_reference
from kafscale_lakehouse.engine.ingestion.lfs import LFS_ERROR_TYPE, lfs_read_settings
from kafscale_lakehouse.engine.ingestion.planning import (
    PARTITION_PLANNING_ERRORS,
    gap_error,
    plan_partition,
    recheck_planned,
)
from kafscale_lakehouse.engine.ingestion.positions import acquire_partition_leases, partition_starts, table_identity
from kafscale_lakehouse.engine.ingestion.rows import DeadLetterFileWriter, InvalidRecord
from kafscale_lakehouse.engine.ingestion.segment_reader import (
    INVALID_REASON_COLUMN,
    SEGMENT_GAP_ERROR_TYPE,
    SegmentReadFailure,
    SegmentRunPartition,
    segment_run_partitions,
)
from kafscale_lakehouse.engine.ingestion.spark_job import (
    BatchTableJob,
    DeadLetterFiles,
    IngestionTaskOutput,
    ingestion_task_spec,
    run_batch_spark_job,
    run_ingestion_spark_job,
    split_dead_letter_files,
)
from kafscale_lakehouse.engine.ingestion.topic_patterns import with_pattern_topics
from kafscale_lakehouse.engine.ingestion.validation import (
    RecordValidation,
    resolve_record_validation,
    with_registered_schemas,
)
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.audit import (
    AUDIT_COMMANDS,
    AuditError,
    AuditReport,
    audit_snapshot,
    audited_snapshot_state,
    publish_audit,
    settle_pending_audit,
)
from kafscale_lakehouse.engine.tables.catalogs import (
    CatalogSettings,
    PartitionFieldSpec,
    add_missing_column,
    evolve_partition_spec,
    load_catalog,
    open_table,
)
from kafscale_lakehouse.engine.tables.commits import delete_data_files
from kafscale_lakehouse.engine.tables.dead_letters import (
    dead_letter_target,
    open_dead_letter_table,
    publish_dead_letters,
    publish_pending_dead_letters,
    stage_dead_letters,
)
from kafscale_lakehouse.engine.tables.run_files import (
    RunRecord,
    clean_ended_runs,
    forget_run,
    record_commit_attempt,
    register_run,
)
from kafscale_lakehouse.engine.tables.summary import (
    WATERMARK_TIMESTAMP_PROPERTY,
    WRITE_LATENCY_PROPERTY,
    LfsStats,
    lfs_summary_properties,
    read_topic_offsets,
    skipped_summary_properties,
)
from kafscale_lakehouse.engine.tables.upserts import (
    NOT_EVENT_REASON_COLUMN,
    ChangeEventRows,
    ChangeEvents,
    UpsertKey,
    commit_upsert,
    judge_change_events,
    read_run_rows,
)
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets import Lease, LeaseLostError, OffsetStore, TableIdentity
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema import evolve_table_schema, table_schema
from kafscale_lakehouse.schema.columns import KAFKA_TIMESTAMP_COLUMN, Column, with_kafka_timestamp_column
from kafscale_lakehouse.storage import (
    DiscoveryMode,
    SegmentOverlapError,
    SegmentRef,
    SegmentStore,
    discover_partitions,
)
from kafscale_lakehouse.value_formats.registered_tables import RegisteredValueSchemas
from kafscale_lakehouse.value_formats.registry import SchemaRegistryClient

log = logging.getLogger(__name__)


class IngestFailedError(RuntimeError):
    """Some partitions could not advance, or the run found an earlier run's dead letters lost; `result` says which
    and why (what was complete is committed)."""

    def __init__(self, result: IngestResult) -> None:
        self.result = result
        problems = "; ".join(f"partition {p.partition}: {p.error}" for p in result.partitions.values() if p.error)
        if result.invalid_count and result.dead_letter_table is None:
            problems = "; ".join(filter(None, [problems, _describe_invalid(result)]))
        problems = "; ".join(filter(None, [problems, *(f"dead letters lost: {m}" for m in result.dead_letters_lost)]))
        problems = "; ".join(filter(None, [problems, result.audit_error]))
        super().__init__(f"topic {result.topic} → table {result.table} (run {result.run_id}): {problems}")


@dataclass
class PartitionOutcome:
    partition: int
    start_offset: int | None  # next offset before the run (None: nothing committed, starts at the oldest segment)
    end_offset: int | None  # next offset after the run
    records: int = 0
    value_bytes: int = 0
    data_files: int = 0
    segments: int = 0
    # broker next_offset - end_offset, else (no next_offset key: a restored topic) the end of the completed
    # segments the run listed - end_offset; None for a partition that could not be planned
    lag: int | None = None
    segments_end: int | None = None  # the offset after the newest completed segment the run listed
    skipped: OffsetRange | None = None  # offsets deleted before ingestion, skipped by config
    error: str | None = None
    dead_lettered: int = 0  # invalid records of the committed range, now in the dead-letter table
    committed: OffsetRange | None = None  # what the run's commit covers (set once it is about to commit)


@dataclass
class IngestResult:
    topic: str
    table: str
    run_id: str
    snapshot_id: int | None = None
    partitions: dict[int, PartitionOutcome] = field(default_factory=dict)
    invalid_count: int = 0
    invalid_samples: list[InvalidRecord] = field(default_factory=list)
    dead_letter_table: str | None = None  # where invalid records go; None: they fail the run
    dead_letter_snapshot_id: int | None = None
    # Staged by an earlier run, gone before published: each names that run, the record count and the offsets to
    # replay. Recorded on the dead-letter table before this run commits, so they fail this run only.
    dead_letters_lost: list[str] = field(default_factory=list)
    # publish audited (engine/tables/audit.py): the checks on the run's snapshot, whether main was fast-forwarded
    # to it (None: published directly), and why not
    audit: AuditReport | None = None
    published: bool | None = None
    audit_error: str | None = None

    @property
    def failed(self) -> bool:
        """A partition could not advance, invalid records had nowhere to go, dead letters were found lost, or an
        audited snapshot was not published."""
        invalid_failed = self.invalid_count > 0 and self.dead_letter_table is None
        return (invalid_failed or bool(self.dead_letters_lost) or self.audit_error is not None
                or any(p.error for p in self.partitions.values()))

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions.values())

    def committed_ranges(self) -> dict[int, OffsetRange]:
        """The offset ranges the run committed, per partition (none when nothing was committed, or its audited
        snapshot was not published: main, which readers see, holds none of them)."""
        if self.snapshot_id is None or self.published is False:
            return {}
        return {p: o.committed for p, o in self.partitions.items() if o.committed is not None}


@dataclass
class IngestContext:
    """The connections one process uses for every run (Dagster resources build the same)."""

    config: LakehouseConfig
    spark: SparkSession
    store: SegmentStore
    offsets: OffsetStore
    catalog_settings: CatalogSettings
    etcd: EtcdClient | None = None
    registry: SchemaRegistryClient | None = None
    owner_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    _catalog: Catalog | None = field(default=None, init=False, repr=False, compare=False)
    _connecting: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: LakehouseConfig, spark: SparkSession) -> IngestContext:
        etcd = etcd_client_from_config(config) if config.etcd.endpoints else None
        return cls(
            config=config,
            spark=spark,
            store=segment_store_from_config(config),
            offsets=offset_store_from_config(config, etcd),
            catalog_settings=catalog_settings(config),
            etcd=etcd,
            registry=schema_registry_client(config),
        )

    def catalog(self) -> Catalog:
        """The catalog of `catalog_settings`, connected at the first use and shared by the runs and threads of this
        context: a batch of 100 tables connected 100 times (a REST catalog: a config request and, with a credential,
        a token request each, a quarter of preparing a table). pyiceberg's REST catalog asks for a new token when one
        expires, so a long-lived context keeps working."""
        with self._connecting:
            if self._catalog is None:
                self._catalog = load_catalog(self.catalog_settings)
            return self._catalog

    def close(self) -> None:
        self.offsets.close()
        if self.etcd is not None:
            self.etcd.close()

    def __enter__(self) -> IngestContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@timed("open/create table")
def open_mapping_table(context: IngestContext, mapping: MappingConfig, columns: Sequence[Column],
                       registered_values: RegisteredValueSchemas | None = None) -> Table:
    """The mapping's table, created when allowed, with its schema evolved to the mapped columns; an Avro mapping's
    (`registered_values`) is created from the oldest version of its value subject (`with_registered_schemas`
    evolves it through the others). `kafka_timestamp_column` adds `kafka_timestamp`; a changed `partition_spec`
    evolves the table's spec."""
    schema = table_schema(columns) if registered_values is None else registered_values.first_table_schema()
    partition_fields = [PartitionFieldSpec(f.source, f.transform, f.field_name) for f in mapping.partition_spec]
    table = open_table(
        context.catalog(),
        mapping.table,
        schema=with_kafka_timestamp_column(schema) if mapping.kafka_timestamp_column else schema,
        create_if_missing=mapping.create_table_if_missing,
        partition_fields=partition_fields,
        properties=mapping.table_properties,
    )
    evolve_table_schema(table, columns, allow_type_widening=mapping.schema_config.allow_type_widening)
    if mapping.kafka_timestamp_column:
        add_missing_column(table, KAFKA_TIMESTAMP_COLUMN, TimestamptzType())
    evolve_partition_spec(table, mapping.table, partition_fields)
    return table


def ingest(
    config: LakehouseConfig,
    spark: SparkSession,
    *,
    topics: Iterable[str] | None = None,
    context: IngestContext | None = None,
) -> list[IngestResult]:
    """Run every mapping (or those of `topics`) once; raises `IngestFailedError` for the first failed mapping
    after all mappings ran. A polling caller passes its long-lived `context`; otherwise one is opened and closed."""
    if context is None:
        with IngestContext.from_config(config, spark) as own_context:
            return ingest(config, spark, topics=topics, context=own_context)
    wanted = None if topics is None else set(topics)
    # `topic_pattern` mappings: a mapping per matching topic that exists now (a polling caller picks up new ones).
    resolved = with_pattern_topics(config, context.store, context.etcd).config
    mappings = [m for m in resolved.mappings if wanted is None or m.topic in wanted]
    if wanted is not None and not mappings:
        raise ValueError(f"no mapping in the config for topic(s) {sorted(wanted)}")
    results, failures = [], []
    for mapping in mappings:
        try:
            results.append(ingest_mapping(context, mapping))
        except IngestFailedError as exc:
            results.append(exc.result)
            failures.append(exc)
    if failures:
        raise failures[0]
    return results


@timed("discover partitions")
def discover_topic_partitions(context: IngestContext, topic: str) -> list[int]:
    mode = DiscoveryMode.parse(context.config.discovery.mode)
    return discover_partitions(mode, context.store, context.etcd, topics=[topic]).partitions.get(topic, [])


def ingest_mapping(
    context: IngestContext,
    mapping: MappingConfig,
    *,
    partitions: Sequence[int] | None = None,
    run_id: str | None = None,
) -> IngestResult:
    """One run for one mapping over `partitions` (default: every discovered partition). See the module docstring."""
    return commit_ingest(prepare_ingest(context, mapping, partitions=partitions, run_id=run_id))


@dataclass
class _PartitionPlan:
    """The run's one copy of a partition's planned range."""

    outcome: PartitionOutcome
    commit_start: int  # the table's next offset, what the commit re-checks (the oldest segment's: nothing committed)
    read: OffsetRange  # what the Spark tasks read: from `commit_start`, or past a skipped gap, to the planned end
    segments: list[SegmentRef]


@dataclass
class PreparedIngest:
    """Phase one of a run, done: leases held, offsets settled, segments planned into the Spark job's input
    partitions.

    Hand it to `commit_ingest` (which always releases the leases) or call `release_leases()`. The Dagster asset
    returns it and the IO manager commits it.
    """

    context: IngestContext
    mapping: MappingConfig
    validation: RecordValidation
    table: Table
    dead_letters: Table | None  # the dead-letter table, when invalid records go to one
    result: IngestResult
    leases: dict[int, Lease]
    plans: dict[int, _PartitionPlan]
    commit_properties: dict[str, str] = field(default_factory=dict)  # settled dead letters, for the commit
    registered: bool = False  # the run's record (run_files.py) is in the offsets store
    record: RunRecord | None = None  # that record, as last written

    def record_commit_attempt(self, table: Table, partitions: Iterable[int], *, staged: bool = False,
                              ref: str = MAIN_BRANCH) -> None:
        """Before each commit to `ref` of `table` is sent (run_files.record_commit_attempt), fenced by the leases of
        the partitions it commits (raises when one is lost)."""
        if self.record is not None:
            leases = [self.leases[p] for p in partitions]
            self.record = record_commit_attempt(self.context.offsets, leases, self.record, table, staged=staged,
                                                ref=ref)

    def data_dir(self, table: Table) -> str | None:
        """The writer directory the run's record names for `table` (None: no record, so a new one)."""
        uuid = str(table.metadata.table_uuid)
        return next((t.data_dir for t in self.record.tables if t.uuid == uuid), None) if self.record else None

    def input_partitions(self) -> list[SegmentRunPartition]:
        """The planned segments in groups of at most `processor.target_file_size_bytes`: one Spark task each."""
        max_bytes = self.context.config.processor.target_file_size_bytes
        return [
            run
            for _, plan in sorted(self.plans.items())
            for run in segment_run_partitions(self.mapping.topic, plan.read, plan.segments, max_bytes)
        ]

    def release_leases(self) -> None:
        for lease in self.leases.values():
            lease.release()

    def forget_run(self) -> None:
        if self.registered:
            forget_run(self.context.offsets, self.mapping.topic, self.result.run_id)
            self.registered = False


def prepare_ingest(
    context: IngestContext,
    mapping: MappingConfig,
    *,
    partitions: Sequence[int] | None = None,
    run_id: str | None = None,
    planned: Mapping[int, OffsetRange] | None = None,
) -> PreparedIngest:
    """Phase one. `planned` is what the sensor planned to ingest per partition: re-checked against the table's
    committed offsets (the table wins; a difference is logged), not used in their place."""
    run_id = run_id or uuid.uuid4().hex
    topic = mapping.topic
    result = IngestResult(topic=topic, table=mapping.table, run_id=run_id)
    # Registry errors (down, 404) are raised here, before anything is read: never invalid records.
    validation = resolve_record_validation(context.config, mapping, context.registry)
    table = open_mapping_table(context, mapping, validation.columns, validation.registered_values)
    validation = with_registered_schemas(validation, table, mapping.table)
    catalog = table.catalog  # the one open_mapping_table loaded: a REST catalog costs round trips to load
    if mapping.publish == "audited":
        # Before any offset is read: main is where runs start, so an audit left pending is published (its checks
        # pass now) or the run refuses, naming the check and the operator commands (an IngestFailedError, so the
        # other mappings of an `ingest` pass go on).
        try:
            settle_pending_audit(table, mapping.audit_branch, topic)
        except AuditError as exc:  # refused (AuditPendingError), or its publication's outcome unknown
            result.audit_error = str(exc)
            raise IngestFailedError(result) from exc
    # Of a run that stopped between its commit and publishing; what can no longer be published is reported.
    pending_dead_letters = publish_pending_dead_letters(table, catalog)
    result.dead_letters_lost = pending_dead_letters.lost
    dead_letters = None
    if validation.dead_letter_table is not None:
        dead_letters = open_dead_letter_table(catalog, validation.dead_letter_table)
        result.dead_letter_table = validation.dead_letter_table
    wanted = sorted(partitions) if partitions is not None else discover_topic_partitions(context, topic)
    leases: dict[int, Lease] = {}
    prepared = PreparedIngest(
        context,
        mapping,
        validation,
        table,
        dead_letters,
        result,
        leases,
        {},
        pending_dead_letters.published_through_properties(),
    )
    try:
        identity = context.offsets.table_identity(topic)
        refused = acquire_partition_leases(table, topic, context.offsets, identity, wanted,
                                           f"{context.owner_id}-{run_id[:8]}", leases)
        for partition, error in refused.items():
            result.partitions[partition] = PartitionOutcome(partition, None, None, error=error)
        if leases:
            written_to = [t for t in (table, dead_letters) if t is not None]
            # Files of ended runs of this topic (run_files.py: only those known to have ended uncommitted), then
            # this run's own record, before it writes anything.
            clean_ended_runs(context.offsets, topic, written_to)
            prepared.record = register_run(context.offsets, list(leases.values()), run_id, written_to)
            prepared.registered = True
            _plan(prepared, planned or {}, identity)
    except BaseException:
        prepared.release_leases()
        prepared.forget_run()  # nothing was written yet
        raise
    return prepared


def commit_ingest(prepared: PreparedIngest, written: _Written | None = None) -> IngestResult:
    """Phase two: write the planned records, commit once, update etcd, release the leases; `IngestFailedError`
    when a partition could not advance (after committing what was complete). `written`: what a batch's Spark job
    wrote for it (`commit_ingests`); else its own Spark job writes."""
    result = prepared.result
    try:
        if prepared.plans:
            _write_and_commit(prepared, written)
        # Every file of the run is now committed or deleted; on an exception the record stays for the next run.
        prepared.forget_run()
        _record_lag(prepared)
    finally:
        prepared.release_leases()
    _log_result(result)
    if result.failed:
        raise IngestFailedError(result)
    return result


def _plan(prepared: PreparedIngest, planned: Mapping[int, OffsetRange], identity: TableIdentity | None) -> None:
    context, mapping, topic = prepared.context, prepared.mapping, prepared.mapping.topic
    starts = partition_starts(prepared.table, topic, context.offsets, prepared.leases, identity)
    allow_gaps = _allow_gaps(mapping, context.config)
    budget = max(1, context.config.processor.max_bytes_per_run // len(prepared.leases))
    for position in starts:
        partition, start = position.partition, position.next_offset
        if position.error is not None:
            prepared.result.partitions[partition] = PartitionOutcome(partition, None, None, error=position.error)
            continue
        recheck_planned(topic, partition, planned.get(partition), start)
        outcome = PartitionOutcome(partition, start, start)
        prepared.result.partitions[partition] = outcome
        try:
            planning = plan_partition(context.store, topic, partition, start, budget, allow_gaps,
                                      orphan_grace_seconds=context.config.processor.orphan_segment_grace_seconds)
        except PARTITION_PLANNING_ERRORS as exc:  # this partition's segments alone: the others go on
            log.error("topic %s partition %d stops: %s", topic, partition, exc)
            outcome.error = str(exc)
            continue
        outcome.skipped, outcome.error, outcome.segments_end = planning.skipped, planning.error, planning.segments_end
        if planning.plan is not None:
            plan = planning.plan
            prepared.plans[partition] = _PartitionPlan(outcome, plan.commit_start, plan.read, plan.segments)


def _record_lag(prepared: PreparedIngest) -> None:
    watermarks = prepared.context.offsets.broker_watermarks(prepared.mapping.topic)
    for outcome in prepared.result.partitions.values():
        if outcome.end_offset is not None:
            outcome.lag = lag_and_reference(watermarks.get(outcome.partition), outcome.segments_end,
                                            outcome.end_offset)[0]


# How many tables of a batch (a run that lands many) prepare, commit or are checked at once: their catalog, etcd and
# S3 round trips overlap; the CPU work between them is small.
BATCH_TABLE_THREADS = 8


def commit_ingests(prepared: Sequence[PreparedIngest], *,
                   threads: int = BATCH_TABLE_THREADS) -> list[IngestResult | Exception]:
    """Phase two of several tables (a run that lands many): ONE Spark job writes every table's planned records, then
    each table commits on its own (`commit_ingest`), so one table's failed commit undoes nothing of another's and
    each keeps its own exactly-once. The commits run on `threads` threads; tables that share a table (two topics
    into one, or one dead-letter table) commit one after another, in the order given. Returns per table its result
    or its exception (`IngestFailedError` for a partial commit); leases are released on every path. When the
    shared job fails, every table that wrote gets its error (the job deleted what it wrote; each table's run record
    stays for the next run, as after its own job)."""
    started = time.monotonic()
    writing: list[PreparedIngest] = []
    jobs: list[BatchTableJob] = []
    failures: dict[int, Exception] = {}  # by id() of the prepared run
    for p in prepared:
        if not p.plans:
            continue
        _log_reading(p)
        try:  # a table whose records do not fit it (its schema) fails alone, as in a run of its own
            jobs.append(BatchTableJob(p.table, ingestion_task_spec(**_job_arguments(p)), p.dead_letters))
            writing.append(p)
        except Exception as exc:  # noqa: BLE001 - reported as this table's below
            failures[id(p)] = exc
    written: dict[int, _Written] = {}
    if writing:
        try:
            outputs = run_batch_spark_job(writing[0].context.spark, writing[0].result.run_id, jobs)
            written = {id(p): _Written(o, started) for p, o in zip(writing, outputs, strict=True)}
        except Exception as exc:  # noqa: BLE001 - the job's failure is each of its tables'
            failures.update((id(p), exc) for p in writing)

    def commit(p: PreparedIngest) -> IngestResult | Exception:
        if id(p) in failures:
            p.release_leases()
            return failures[id(p)]
        try:
            return commit_ingest(p, written.get(id(p)))
        except Exception as exc:  # noqa: BLE001 - this table's; the others go on
            return exc

    outcomes: list[IngestResult | Exception | None] = [None] * len(prepared)

    def commit_lane(lane: list[int]) -> None:
        for i in lane:
            outcomes[i] = commit(prepared[i])

    lanes = _commit_lanes(prepared)
    if len(lanes) <= 1 or threads <= 1:
        for lane in lanes:
            commit_lane(lane)
    else:
        with ThreadPoolExecutor(min(threads, len(lanes)), thread_name_prefix="commit") as pool:
            list(pool.map(commit_lane, lanes))
    return [outcome for outcome in outcomes if outcome is not None]


def _commit_lanes(prepared: Sequence[PreparedIngest]) -> list[list[int]]:
    """The indexes of `prepared` in lanes that may commit at the same time: runs that write a table in common (their
    own, or their dead-letter table) share a lane, so concurrent commits never race for one table."""
    lane_of: dict[str, int] = {}
    lanes: list[list[int]] = []
    for i, p in enumerate(prepared):
        names = [p.mapping.table, *([p.result.dead_letter_table] if p.result.dead_letter_table else [])]
        joined = sorted({lane_of[n] for n in names if n in lane_of})
        if not joined:
            lanes.append([])
            target = len(lanes) - 1
        else:
            target = joined[0]
            for other in joined[1:]:  # this run joins lanes so far apart: merge them, keeping the order given
                lanes[target] = sorted(lanes[target] + lanes[other])
                lanes[other] = []
                lane_of.update((n, target) for n, lane in lane_of.items() if lane == other)
        lanes[target].append(i)
        lane_of.update(dict.fromkeys(names, target))
    return [lane for lane in lanes if lane]


def _write_and_commit(prepared: PreparedIngest, written: _Written | None = None) -> None:
    """The run's steps after planning: write (one Spark job, unless a batch's wrote it), select what commits, commit
    once, update the store."""
    written = written or _write(prepared)
    selected = _select_commit(prepared, written)
    if selected is not None and prepared.mapping.cdc is not None:
        selected = _judge_change_events(prepared, selected)
    if selected is None:
        return
    snapshot_id = _commit(prepared, written, selected)
    if prepared.result.published is not False:  # the store mirrors main: not an audited snapshot main lacks
        _update_store(prepared, selected, snapshot_id)


@dataclass(frozen=True)
class _Written:
    """What the run's Spark job returned: one output per task, and when writing started."""

    messages: list[IngestionTaskOutput]
    started: float


# The id of dead-letter files the driver writes (a cdc run's records that are no change event); the tasks' are below.
_DRIVER_DEAD_LETTER_TASK_ID = 90_000


@dataclass(frozen=True)
class _CommitSelection:
    """The partitions that commit, where each ends, their data files and the run's dead-letter files to keep."""

    committing: dict[int, _PartitionPlan]
    ends: dict[int, int]
    keep: dict[int, list[DataFile]]
    dead_letter_files: DeadLetterFiles
    change_events: ChangeEventRows | None = None  # a cdc mapping's rows, read and judged (`_judge_change_events`)


def _write(prepared: PreparedIngest) -> _Written:
    """Step 1: one Spark job reads the planned segments and writes data files (and dead-letter files), uncommitted."""
    _log_reading(prepared)
    started = time.monotonic()
    messages = run_ingestion_spark_job(prepared.context.spark, **_job_arguments(prepared))
    return _Written(messages, started)


def _log_reading(prepared: PreparedIngest) -> None:
    log.info("topic %s → %s run %s: reading %s", prepared.mapping.topic, prepared.mapping.table,
             prepared.result.run_id,
             {p: f"{plan.read} ({len(plan.segments)} segments)" for p, plan in prepared.plans.items()})


def _job_arguments(prepared: PreparedIngest) -> dict[str, Any]:
    """What the Spark job's tasks need to write the table's planned records (`ingestion_task_spec`'s arguments)."""
    context, mapping, result = prepared.context, prepared.mapping, prepared.result
    topic, run_id, config = mapping.topic, result.run_id, context.config
    dead_letters = prepared.dead_letters
    target = (
        None
        if dead_letters is None
        else (
            dead_letters,
            dead_letter_target(dead_letters, run_id, target_file_size_bytes=config.processor.target_file_size_bytes,
                               data_dir=prepared.data_dir(dead_letters)),
        )
    )
    return {
        "table": prepared.table,
        "run_id": run_id,
        "store": context.store,
        "topic": topic,
        "input_partitions": prepared.input_partitions(),
        "columns": _written_columns(mapping, prepared.validation.columns),
        "json_schema": prepared.validation.json_schema,
        "target_file_size_bytes": config.processor.target_file_size_bytes,
        "dead_letters": target,
        "lfs": lfs_read_settings(mapping.lfs, prepared.validation.mode),
        "numeric_timestamp_unit": mapping.schema_config.timestamp_unit,
        "framed_values": prepared.validation.framed_values,
        "kafka_timestamp": mapping.kafka_timestamp_column,
        "keys": prepared.validation.keys,
        "data_dir": prepared.data_dir(prepared.table),
    }


def _written_columns(mapping: MappingConfig, columns: Sequence[Column]) -> Sequence[Column]:
    """Change events (`cdc`) are coerced into the mapped columns at the commit, from each event's row image: the
    Spark tasks keep the columns (partition values need them) but require none, as the envelope has none of them."""
    if mapping.cdc is None:
        return columns
    return [replace(column, required=False) for column in columns]


def _select_commit(prepared: PreparedIngest, written: _Written) -> _CommitSelection | None:
    """Step 2: per partition, the files below its first unreadable segment commit if it still holds its lease;
    every other file is deleted now. None when nothing commits."""
    context, plans, leases, result = prepared.context, prepared.plans, prepared.leases, prepared.result
    messages = written.messages
    keep, drop, failures = _files_to_commit(messages, plans)
    for message in messages:
        stats = message.source_stats
        result.invalid_count += stats.invalid_count
        result.invalid_samples.extend(stats.invalid_samples[: max(0, 20 - len(result.invalid_samples))])
    io = prepared.table.io
    dead_letters = prepared.dead_letters
    if result.invalid_count and dead_letters is None:
        delete_data_files(io, [f.file_path for m in messages for f in m.data_files])
        return None  # nothing is committed while invalid records have nowhere to go (IngestFailedError follows)
    delete_data_files(io, [f.file_path for f in drop])

    ends = {p: plan.read.end for p, plan in plans.items()}
    for partition, failure in failures.items():
        ends[partition] = min(ends[partition], failure.next_offset)
        plans[partition].outcome.error = _failure_error(failure, plans[partition].segments,
                                                        _allow_gaps(prepared.mapping, context.config))
    committing = {p: plan for p, plan in plans.items() if ends[p] > plan.commit_start}
    for p in list(committing):
        try:
            # Ask the store, not only the keeper's flag: a lease taken over since the last renewal must not commit.
            context.offsets.confirm_lease(leases[p])
        except LeaseLostError as exc:
            # Only this partition is fenced off (the next run reads it again); the other partitions still commit.
            plans[p].outcome.error = f"lease lost before commit ({exc}); nothing committed"
            del committing[p]
    delete_data_files(io, [f.file_path for p, files in keep.items() if p not in committing for f in files])
    dead_letter_files = DeadLetterFiles()
    if dead_letters is not None:
        dead_letter_files = split_dead_letter_files(messages, {p: ends[p] for p in committing})
        delete_data_files(dead_letters.io, [f.file_path for f in dead_letter_files.drop])
    if not committing:
        return None
    return _CommitSelection(committing, ends, keep, dead_letter_files)


def _failure_error(failure: SegmentReadFailure, planned: Sequence[SegmentRef], allow_gaps: bool) -> str | None:
    """The partition's error for where its read stopped. A gap found by the reader (after a segment whose end was
    planned from its successor) is an error as the plan's gaps are, named after the segment that follows it; with
    `allow_gaps` none: the next run's plan starts at it and skips it, recorded."""
    if failure.error_type == LFS_ERROR_TYPE:
        return failure.message
    following = next((s for s in planned if s.base_offset > failure.base_offset), None)
    if failure.error_type == SegmentOverlapError.__name__ and following is not None:
        return f"segment {failure.key} could not be read: {failure.message} ({following.kfs_key})"
    if failure.error_type != SEGMENT_GAP_ERROR_TYPE:
        return f"segment {failure.key} could not be read: {failure.message}"
    if allow_gaps:
        log.warning("topic %s partition %d: %s; the next run skips them (allow_gaps)", failure.topic,
                    failure.partition, failure.message)
        return None
    if following is None:  # the run's byte budget ended its plan at that segment
        return f"gap: {failure.message} (deleted before ingestion?); set allow_gaps to skip them"
    return gap_error(failure.next_offset, following.base_offset, following.kfs_key)


def _allow_gaps(mapping: MappingConfig, config: LakehouseConfig) -> bool:
    return mapping.allow_gaps if mapping.allow_gaps is not None else config.processor.allow_gaps


def _commit(prepared: PreparedIngest, written: _Written, selected: _CommitSelection) -> int:
    """Step 3: one table commit (offsets re-checked), its dead letters staged before and published after it;
    returns the snapshot id."""
    mapping, result, plans = prepared.mapping, prepared.result, prepared.plans
    topic, run_id = mapping.topic, result.run_id
    messages, committing, ends = written.messages, selected.committing, selected.ends
    for p, plan in committing.items():
        _fill_outcome(plan, ends[p], messages)
    skipped = {
        p: (plan.outcome.skipped.start, plan.outcome.skipped.end)
        for p, plan in committing.items()
        if plan.outcome.skipped
    }
    properties = skipped_summary_properties(topic, skipped)
    properties[WRITE_LATENCY_PROPERTY] = str(round((time.monotonic() - written.started) * 1000))
    properties.update(prepared.commit_properties)
    properties[WATERMARK_TIMESTAMP_PROPERTY] = json.dumps(_last_record_timestamps(messages, committing, ends))
    properties.update(lfs_summary_properties(_committed_lfs_stats(prepared, messages, ends, committing)))
    staged = None
    dead_letters = prepared.dead_letters
    if dead_letters is not None:
        # Staged before the table commit, published right after it (engine/tables/dead_letters.py: why nothing is
        # lost or doubled).
        ranges = {p: (plans[p].commit_start, ends[p]) for p in committing}
        if selected.dead_letter_files.keep:
            prepared.record_commit_attempt(dead_letters, committing, staged=True)
        staged = stage_dead_letters(
            dead_letters,
            selected.dead_letter_files.keep,
            run_id=run_id,
            source_table=mapping.table,
            topic=topic,
            offset_ranges=ranges,
        )
        if staged is not None:
            properties.update(staged.summary_properties())
        for p in committing:
            plans[p].outcome.dead_lettered = selected.dead_letter_files.records.get(p, 0)
    files = [f for p in committing for f in selected.keep.get(p, [])]
    starts, commit_ends = {p: plans[p].commit_start for p in committing}, {p: ends[p] for p in committing}
    branch = mapping.audit_branch if mapping.publish == "audited" else MAIN_BRANCH
    before_attempt = lambda current: prepared.record_commit_attempt(current, committing, ref=branch)  # noqa: E731
    if mapping.mode == "upsert":  # one row per key: the run's latest records replace the keys' rows
        key = UpsertKey(tuple(mapping.id_columns), tuple(prepared.validation.columns), mapping.order_column)
        commit = commit_upsert(
            prepared.table, files if selected.change_events is None else selected.change_events, key, topic, starts,
            commit_ends, run_id,
            target_file_size_bytes=prepared.context.config.processor.target_file_size_bytes,
            events=_change_events(mapping), snapshot_properties=properties, before_attempt=before_attempt,
            data_dir=prepared.data_dir(prepared.table),
        )
    else:
        commit = commit_append(
            prepared.table, files, topic, starts, commit_ends, run_id,
            snapshot_properties=properties, before_attempt=before_attempt, branch=branch,
        )
    result.snapshot_id = commit.snapshot_id
    if staged is not None and dead_letters is not None:
        result.dead_letter_snapshot_id = publish_dead_letters(
            dead_letters, staged, source_snapshot_id=commit.snapshot_id
        )
    if mapping.publish == "audited":
        _audit_and_publish(prepared, commit.snapshot_id)
    return commit.snapshot_id


def _audit_and_publish(prepared: PreparedIngest, snapshot_id: int) -> None:
    """The blocking checks on the run's snapshot on the audit branch; main fast-forwards to it when they pass.
    Otherwise main stays, the branch keeps the snapshot and the run fails naming the table, the run and the check."""
    table, mapping, result = prepared.table, prepared.mapping, prepared.result
    try:
        state = audited_snapshot_state(table, mapping.audit_branch, snapshot_id)
        if state == "published":  # another run settled it while this one was held (its leases had expired)
            log.warning("topic %s → %s: audited snapshot %d of run %s was published by another run meanwhile",
                        mapping.topic, mapping.table, snapshot_id, result.run_id)
            result.published = True
            return
        if state == "gone":
            raise AuditError(f"table {mapping.table}: audited snapshot {snapshot_id} of run {result.run_id} is "
                             f"neither on branch {mapping.audit_branch} nor in main any more (dropped by an operator "
                             "while this run was held?); its offsets land again with the next run")
        report = audit_snapshot(table, mapping.audit_branch, mapping.topic)
    except AuditError as exc:
        result.published, result.audit_error = False, str(exc)
        log.error("topic %s → %s: %s", mapping.topic, mapping.table, exc)
        return
    result.audit = report
    if not report.passed:
        result.published = False
        result.audit_error = (
            f"audited snapshot {snapshot_id} of run {result.run_id} not published to main of table {mapping.table}: "
            f"{report.describe_failures()}; it stays on branch {mapping.audit_branch} and runs of this table refuse "
            f"until it is settled: {AUDIT_COMMANDS.format(table=mapping.table)}")
        log.error("topic %s → %s: %s", mapping.topic, mapping.table, result.audit_error)
        return
    try:
        publish_audit(table, mapping.audit_branch, snapshot_id)
    except AuditError as exc:
        result.published, result.audit_error = False, str(exc)
        log.error("topic %s → %s: %s", mapping.topic, mapping.table, exc)
        return
    result.published = True


def _judge_change_events(prepared: PreparedIngest, selected: _CommitSelection) -> _CommitSelection | None:
    """Step 2b, cdc mappings: the run's rows are read and judged (`upserts.judge_change_events`). Records that are no
    change event go to the dead-letter table when the run has one (lenient, or a configured one), as invalid values
    do; without one, a partition holding one stops before the first, its error naming the offset and why, and
    commits what lies before it. None when nothing commits."""
    mapping, result, plans = prepared.mapping, prepared.result, prepared.plans
    committing, ends = selected.committing, selected.ends
    events = _change_events(mapping)
    if events is None:
        return selected
    rows = read_run_rows(prepared.table, [f for p in committing for f in selected.keep.get(p, [])])
    key = UpsertKey(tuple(mapping.id_columns), tuple(prepared.validation.columns), mapping.order_column)
    judged = judge_change_events(rows, key, events)
    not_events = judged.not_events
    if not_events.num_rows == 0:
        return replace(selected, change_events=judged)
    by_partition = not_events.select(["partition", "offset", "record_id", NOT_EVENT_REASON_COLUMN]).to_pylist()
    counts = Counter(row["partition"] for row in by_partition)
    firsts: dict[int, dict] = {}
    for row in by_partition:  # judged in partition and offset order
        firsts.setdefault(row["partition"], row)
    dead_letters = prepared.dead_letters
    if dead_letters is not None:
        target = dead_letter_target(dead_letters, result.run_id,
                                    target_file_size_bytes=prepared.context.config.processor.target_file_size_bytes,
                                    data_dir=prepared.data_dir(dead_letters))
        writer = DeadLetterFileWriter(target, _DRIVER_DEAD_LETTER_TASK_ID)
        try:
            for batch in not_events.rename_columns({NOT_EVENT_REASON_COLUMN: INVALID_REASON_COLUMN}).to_batches():
                writer.add(batch)
            selected.dead_letter_files.keep.extend(writer.close())
        except BaseException:
            writer.discard()
            raise
        for p, count in counts.items():
            selected.dead_letter_files.records[p] = selected.dead_letter_files.records.get(p, 0) + count
        result.invalid_count += not_events.num_rows
        room = max(0, 20 - len(result.invalid_samples))
        result.invalid_samples.extend(InvalidRecord(r["record_id"], r[NOT_EVENT_REASON_COLUMN]) for r in
                                      not_events.select(["record_id", NOT_EVENT_REASON_COLUMN]).slice(0, room)
                                      .to_pylist())
        log.warning("topic %s → %s run %s: %s; to the dead-letter table %s", mapping.topic, mapping.table,
                    result.run_id, judged.describe_not_events(), result.dead_letter_table)
        return replace(selected, change_events=judged)
    partitions = judged.rows["partition"].to_numpy()
    offsets = judged.rows["offset"].to_numpy()
    keep = np.ones(judged.rows.num_rows, dtype=bool)
    for p, first in firsts.items():
        ends[p] = first["offset"]
        plans[p].outcome.error = (
            f"offset {first['offset']} ({first['record_id']}) is no change event: {first[NOT_EVENT_REASON_COLUMN]}; "
            "the partition stops there until the record or the mapping is fixed (or a dead-letter table takes it)")
        log.error("topic %s → %s partition %d: %s", mapping.topic, mapping.table, p, plans[p].outcome.error)
        keep &= ~((partitions == p) & (offsets >= ends[p]))
    for p in [p for p in committing if ends[p] <= plans[p].commit_start]:
        del committing[p]
    if not committing:
        return None
    mask = pa.array(keep)
    return replace(selected, change_events=ChangeEventRows(judged.rows.filter(mask), judged.deletes.filter(mask),
                                                           not_events.slice(0, 0)))


def _change_events(mapping: MappingConfig) -> ChangeEvents | None:
    cdc = mapping.cdc
    if cdc is None:
        return None
    return ChangeEvents(cdc.format, cdc.op_field, tuple(cdc.delete_ops), mapping.schema_config.timestamp_unit)


def _update_store(prepared: PreparedIngest, selected: _CommitSelection, snapshot_id: int) -> None:
    """Step 4: the offsets store (KafScale's keys) follows the table, fenced by the leases; a lost lease only
    leaves the store behind, and the next run repairs it from the table."""
    context, table, leases, topic = prepared.context, prepared.table, prepared.leases, prepared.mapping.topic
    committing, ends = selected.committing, selected.ends
    try:
        # Go's `last_timestamp_ms` is the wall-clock time of the commit (checkpoint.OffsetState.Timestamp).
        committed_at_ms = time.time_ns() // 1_000_000
        context.offsets.record_table_identity([leases[p] for p in committing],
                                              table_identity(table, read_topic_offsets(table, topic)))
        context.offsets.commit_offsets(
            [leases[p] for p in committing], {p: (ends[p], committed_at_ms) for p in committing}
        )
    except LeaseLostError as exc:
        log.warning(
            "topic %s: committed snapshot %d but could not update %s: %s",
            topic,
            snapshot_id,
            context.offsets.location,
            exc,
        )


def _files_to_commit(
    messages: list[IngestionTaskOutput],
    plans: dict[int, _PartitionPlan],
) -> tuple[dict[int, list[DataFile]], list[DataFile], dict[int, SegmentReadFailure]]:
    """Split the written files into those below each partition's first failed segment (by Kafka partition) and
    the rest."""
    failures: dict[int, SegmentReadFailure] = {}
    for message in messages:
        failure = message.failure
        if failure is not None and (
            failure.partition not in failures or failure.next_offset < failures[failure.partition].next_offset
        ):
            failures[failure.partition] = failure
    keep: dict[int, list[DataFile]] = {}
    drop: list[DataFile] = []
    for message in messages:
        stats = message.source_stats
        partitions = set(stats.rows)
        if len(partitions) > 1:
            raise AssertionError(f"a Spark write task saw Kafka partitions {sorted(partitions)}; expected one")
        if not partitions:
            continue  # no valid rows, so no data files
        [p] = partitions
        stopped = p in failures and stats.first_offset[p] >= failures[p].next_offset
        (drop if stopped else keep.setdefault(p, [])).extend(message.data_files)
    return keep, drop, failures


def _fill_outcome(plan: _PartitionPlan, end: int, messages: list[IngestionTaskOutput]) -> None:
    outcome, p = plan.outcome, plan.outcome.partition
    outcome.end_offset = end
    outcome.segments = sum(1 for s in plan.segments if s.base_offset < end)
    for message in messages:
        stats = message.source_stats
        if p in stats.rows and stats.first_offset[p] < end:
            outcome.records += stats.rows[p]
            outcome.value_bytes += stats.value_bytes[p]
            outcome.data_files += len(message.data_files)
    if outcome.start_offset is None:
        outcome.start_offset = plan.commit_start
    outcome.committed = OffsetRange(p, plan.commit_start, end)


def _last_record_timestamps(
    messages: list[IngestionTaskOutput], committing: Iterable[int], ends: dict[int, int]
) -> dict[str, int]:
    """`{"<partition>": timestamp}` of the last valid record committed per partition (partitions with one)."""
    last: dict[int, tuple[int, int]] = {}
    for message in messages:
        stats = message.source_stats
        for p in committing:
            if p in stats.last_timestamp_ms and stats.first_offset[p] < ends[p]:
                candidate = (stats.last_offset[p], stats.last_timestamp_ms[p])
                last[p] = max(last.get(p, candidate), candidate)
    return {str(p): timestamp for p, (_, timestamp) in sorted(last.items())}


def _committed_lfs_stats(
    prepared: PreparedIngest, messages: list[IngestionTaskOutput], ends: dict[int, int], committing: dict
) -> LfsStats:
    """LFS counts of the tasks whose records this commit covers (a dropped task's records are read again)."""
    total = LfsStats()
    runs = prepared.input_partitions()
    for message in messages:
        run = runs[message.task_id]
        if run.partition in committing and run.offsets.start < ends[run.partition]:
            total.add(message.source_stats.lfs)
    return total


def _describe_invalid(result: IngestResult) -> str:
    samples = ", ".join(s.describe() for s in result.invalid_samples[:5])
    return (
        f"{result.invalid_count} invalid records, nothing committed (configure a dead-letter table to divert "
        f"them): {samples}"
    )


def _log_result(result: IngestResult) -> None:
    for outcome in result.partitions.values():
        log.info(
            "topic %s partition %d → %s: offsets %s..%s, %d records, %d data files%s%s",
            result.topic,
            outcome.partition,
            result.table,
            outcome.start_offset,
            outcome.end_offset,
            outcome.records,
            outcome.data_files,
            f", lag {outcome.lag}" if outcome.lag is not None else "",
            f", ERROR {outcome.error}" if outcome.error else "",
        )
