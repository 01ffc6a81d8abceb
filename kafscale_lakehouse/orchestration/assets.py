"""One asset per mapping (the Iceberg table, partitioned by Kafka partition id) and its upstream observable source
asset (the KafScale topic).

The table asset runs the ingestion in its own body, through the engine (`engine.ingestion.run`): `prepare_ingest`
(leases, offsets, the planned segments), then `commit_ingest` (one Spark job whose tasks decode the segments and
write Parquet data files, one Iceberg commit that re-checks the start offsets, then the offsets store). The leases
are released before the body hands anything to Dagster, on every path. It returns a `MaterializeResult`: each
Kafka partition's materialization carries the run's metadata and its own (metadata.py). A run that could commit
only some partitions yields a materialization for each partition that landed, then fails naming the rest.

Several Kafka partitions materialize in one run (`BackfillPolicy.single_run`) and one Iceberg commit; the table's
pool serializes runs on one table. The asset has no output to store; its IO manager key names what loads the table
for downstream assets (`io_manager.py`).
"""

# No `from __future__ import annotations`: Dagster reads the context and resource parameter annotations at runtime.
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta

import dagster as dg
from pyiceberg.table import Table

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import (
    IngestContext,
    IngestFailedError,
    IngestResult,
    TableOffsetsReader,
    TopicScan,
    WatchSources,
    commit_ingest,
    prepare_ingest,
    scan_retention,
    scan_topic,
)
from kafscale_lakehouse.engine.tables import OFFSETS_CONTIGUOUS, RECORD_ID_UNIQUE, RowCount
from kafscale_lakehouse.offsets.ranges import OffsetRange, parse_ranges
from kafscale_lakehouse.orchestration.metadata import (
    TABLE_NAME_KEY,
    TOPIC_KEY,
    landed_partition_metadata,
    partition_metadata,
    partition_row_counts,
    row_counts_from,
    row_counts_metadata,
    run_metadata,
    table_metadata,
)
from kafscale_lakehouse.orchestration.naming import (
    dagster_name_part,
    kafka_partition_id,
    kafka_partition_key,
    pool_name,
    table_asset_key,
    topic_asset_key,
    topic_partitions_def,
)
from kafscale_lakehouse.orchestration.resources import (
    IcebergCatalogResource,
    OffsetStoreResource,
    SegmentStoreResource,
    SparkResource,
    ingest_context,
)
from kafscale_lakehouse.orchestration.sensors import PLANNED_RANGES_TAG, retention_metadata, topic_observation_metadata
from kafscale_lakehouse.storage import DiscoveryMode

ICEBERG_IO_MANAGER_KEY = "iceberg_io_manager"
ASSET_GROUP = "kafscale"


def scan_topic_now(config: LakehouseConfig, mapping: MappingConfig, segment_store: SegmentStoreResource,
                   offset_store: OffsetStoreResource, iceberg_catalog: IcebergCatalogResource, *,
                   lag_only: bool = False) -> TopicScan:
    """The mapping's topic partitions now: committed offsets (the table's where it holds them, else the store's),
    broker offsets, completed segments. Without cursors each partition is listed from its committed next offset on,
    so the cost is that of the pending segments; with `lag_only` (the freshness check) only the partitions without a
    broker watermark are (`scan_topic`)."""
    return scan_topic(watch_sources_now(config, segment_store, offset_store, iceberg_catalog), mapping.topic,
                      table=mapping.table, lag_only=lag_only)


def watch_sources_now(config: LakehouseConfig, segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,
                      iceberg_catalog: IcebergCatalogResource) -> WatchSources:
    """The connections of a scan from a step's resources."""
    return WatchSources(store=segment_store.open_store(), offsets=offset_store.offset_store(),
                        discovery_mode=DiscoveryMode.parse(config.discovery.mode), etcd=offset_store.etcd_client(),
                        tables=TableOffsetsReader(iceberg_catalog.settings()),
                        orphan_grace_seconds=config.processor.orphan_segment_grace_seconds)


def build_topic_source_asset(config: LakehouseConfig, mapping: MappingConfig) -> dg.AssetsDefinition:
    """`kafscale/<topic>`: an observable external asset (an `AssetSpec`), observed with the broker watermark, the
    completed segments and the lag per partition."""
    topic = mapping.topic
    key = topic_asset_key(topic)
    spec = dg.AssetSpec(
        key=key, group_name=ASSET_GROUP, owners=list(mapping.owners), tags=dict(mapping.tags), kinds={"kafka"},
        description=f"KafScale topic {topic!r}: completed segments in the segment store, broker watermarks in etcd.",
        metadata={"kafscale/topic": topic})

    @dg.multi_observable_source_asset(name=f"observe_{dagster_name_part(topic)}", specs=[spec])
    # Dagster reads a return annotation as the output type, so the generator is left unannotated.
    def observe_topic(segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,  # noqa: ANN202
                      iceberg_catalog: IcebergCatalogResource):
        sources = watch_sources_now(config, segment_store, offset_store, iceberg_catalog)
        scan = scan_topic(sources, topic, table=mapping.table)
        ends = ",".join(f"{p}:{s.log_end}:{s.segments_end}" for p, s in sorted(scan.partitions.items()))
        metadata = topic_observation_metadata(scan) if scan.partitions else {"partitions": 0}
        if scan.partitions:
            metadata.update(retention_metadata(*scan_retention(sources, topic, scan)))
        yield dg.ObserveResult(asset_key=key, metadata=metadata, data_version=dg.DataVersion(ends or "empty"))

    return observe_topic


def table_freshness_policy(mapping: MappingConfig) -> dg.FreshnessPolicy:
    """Fails when no commit landed in `freshness_fail_window_seconds` (Dagster evaluates it whether runs happen or
    not, so a stalled sensor or failing runs show); warns after `freshness_warn_window_seconds` when set."""
    warn = mapping.freshness_warn_window_seconds
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(seconds=mapping.freshness_fail_window_seconds),
                                          warn_window=timedelta(seconds=warn) if warn is not None else None)


def build_table_asset(config: LakehouseConfig, mapping: MappingConfig) -> dg.AssetsDefinition:
    """The mapping's Iceberg table; a materialization of Kafka partitions ingests what is pending in each."""
    topic, table = mapping.topic, mapping.table

    @dg.asset(
        key=table_asset_key(table),
        deps=[topic_asset_key(topic)],
        partitions_def=topic_partitions_def(topic),
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=pool_name(table),
        # Nothing is stored (a MaterializeResult has no value); downstream assets load the table through it.
        io_manager_key=ICEBERG_IO_MANAGER_KEY,
        group_name=ASSET_GROUP,
        kinds={"iceberg", "pyspark"},
        owners=list(mapping.owners),
        tags=dict(mapping.tags),
        freshness_policy=table_freshness_policy(mapping),
        description=f"Iceberg table {table}, landed from KafScale topic {topic!r}; partitions are Kafka partition ids.",
        metadata={TABLE_NAME_KEY: table, TOPIC_KEY: topic},
        # publish audited: the body runs these blocking checks on the audited snapshot before main moves to it
        check_specs=audited_check_specs(mapping),
    )
    # A generator (a partial commit yields the partitions that landed, then fails), left unannotated: Dagster reads a
    # return annotation as the output type.
    def ingest_table(context: dg.AssetExecutionContext, spark: SparkResource,  # noqa: ANN202
                     segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,
                     iceberg_catalog: IcebergCatalogResource):
        partitions = sorted(kafka_partition_id(key) for key in context.partition_keys)
        context.log.info("topic %s → %s: ingesting Kafka partitions %s", topic, table, partitions)
        planned_tag = context.run.tags.get(PLANNED_RANGES_TAG)
        planned = parse_ranges(planned_tag, where=f"run tag {PLANNED_RANGES_TAG}") if planned_tag else None
        engine = ingest_context(config, spark, segment_store, offset_store, iceberg_catalog)
        result, failure = ingest_partitions(engine, mapping, partitions, run_id=context.run.run_id, planned=planned)
        yield from landed_table_events(context, result, failure, iceberg_catalog, mapping)

    return ingest_table


AUDITED_CHECKS = (RECORD_ID_UNIQUE, OFFSETS_CONTIGUOUS)


def audited_check_specs(mapping: MappingConfig) -> list[dg.AssetCheckSpec]:
    """A `publish: audited` table's blocking checks, evaluated in the asset's body on the audit branch's snapshot
    (engine/tables/audit.py) instead of after the commit, so main never holds rows that fail them."""
    if mapping.publish != "audited":
        return []
    return [dg.AssetCheckSpec(name, asset=table_asset_key(mapping.table), blocking=True,
                              description=f"{name} on the audited snapshot, before main is fast-forwarded to it")
            for name in AUDITED_CHECKS]


def audit_metadata(result: IngestResult) -> "dict[str, dg.RawMetadataValue]":
    """Whether the run's audited snapshot was published to main, and its id (none for a direct publish)."""
    if result.published is None:
        return {}
    return {"published": result.published,
            "audit_snapshot_id": result.snapshot_id if result.snapshot_id is not None else dg.MetadataValue.null()}


def audited_check_results(mapping: MappingConfig, result: IngestResult) -> list[dg.AssetCheckResult]:
    """The audited checks' results of the run: the engine's audit of its snapshot, or, when it committed nothing,
    a pass that says main did not change."""
    if mapping.publish != "audited":
        return []
    asset_key, report = table_asset_key(mapping.table), result.audit
    if report is None:
        return [dg.AssetCheckResult(asset_key=asset_key, check_name=name, passed=True,
                                    description="nothing landed in this run: main is unchanged")
                for name in AUDITED_CHECKS]
    failures = {f.check: f.message for f in report.failures}
    metadata: dict[str, dg.RawMetadataValue] = {
        "audit_snapshot_id": report.snapshot_id, "audit_branch": report.branch,
        "published": bool(result.published),
        "offset_ranges_scanned": dg.MetadataValue.json({str(p): [r.start, r.end] for p, r in report.ranges.items()}),
        "rows_scanned": report.rows_scanned,
        "duplicate_samples": dg.MetadataValue.json(report.duplicates),
    }
    outcome = "main fast-forwarded to it" if result.published else f"not published: {result.audit_error}"

    def describe(name: str) -> str:
        if name in failures:
            return f"audited snapshot {report.snapshot_id}: {failures[name]}; main was not moved to it"
        return f"audited snapshot {report.snapshot_id} passed; {outcome}"

    return [dg.AssetCheckResult(asset_key=asset_key, check_name=name, passed=name not in failures, metadata=metadata,
                                severity=dg.AssetCheckSeverity.ERROR, description=describe(name))
            for name in AUDITED_CHECKS]


def ingest_partitions(engine: IngestContext, mapping: MappingConfig, partitions: Sequence[int], *, run_id: str,
                      planned: Mapping[int, OffsetRange] | None) -> tuple[IngestResult, IngestFailedError | None]:
    """Prepare, write and commit the run; returns its result and, when some partitions could not advance, the
    engine's error (what was complete is committed). The leases are released before this returns, on every path:
    none is held while Dagster handles the result."""
    prepared = prepare_ingest(engine, mapping, partitions=partitions, run_id=run_id, planned=planned)
    try:
        return commit_ingest(prepared), None
    except IngestFailedError as exc:
        return exc.result, exc
    finally:
        prepared.release_leases()  # commit_ingest releases them on every path too; releasing is idempotent


def landed_table_events(context: dg.AssetExecutionContext, result: IngestResult, failure: IngestFailedError | None,
                        catalog: IcebergCatalogResource, mapping: MappingConfig | None = None,
                        ) -> Iterator[dg.AssetMaterialization | dg.MaterializeResult | dg.AssetCheckResult]:
    """A run's materializations: the run's metadata and the table's on every partition of the run, each partition's
    own (`context.add_asset_metadata`) on it. After a partial commit: a materialization of each partition the commit
    covered, then `dg.Failure` with the engine's message (the other partitions show as failed). A `publish: audited`
    mapping's run also reports its audited checks; an audited snapshot that was not published materializes nothing."""
    check_results = audited_check_results(mapping, result) if mapping is not None else []
    if failure is not None:
        if result.published is not False:
            yield from partial_commit_materializations(context.asset_key, result, catalog, context.log,
                                                       context.instance)
        yield from check_results
        raise dg.Failure(description=str(failure), metadata={**run_metadata(result), **audit_metadata(result)}
                         ) from failure
    table = catalog.load_table(result.table)
    outcomes = {key: outcome for key in context.partition_keys
                if (outcome := result.partitions.get(kafka_partition_id(key))) is not None}
    counts = partition_row_counts(context.instance, context.asset_key, table,
                                  [outcome.partition for outcome in outcomes.values()])
    for partition_key, outcome in outcomes.items():
        context.add_asset_metadata(landed_partition_metadata(outcome, counts[outcome.partition]),
                                   partition_key=partition_key)
    context.log.info("table %s: run %s committed %d records of topic %s in snapshot %s", result.table,
                     result.run_id, result.records, result.topic, result.snapshot_id)
    yield dg.MaterializeResult(metadata={**run_metadata(result), **table_metadata(table, result.table),
                                         **row_counts_metadata(counts), **audit_metadata(result)},
                               check_results=check_results)


def landed_materializations(asset_key: dg.AssetKey, partition_keys: Sequence[str], result: IngestResult,
                            table: Table, instance: dg.DagsterInstance, latest: dg.EventLogEntry | None,
                            ) -> list[dg.AssetMaterialization]:
    """What `landed_table_events` records for a committed run (`table` loaded after its commit), as one
    materialization per partition key: for a run that lands several tables (`land_tables.py`), where no asset body
    returns a `MaterializeResult`. `latest`: the asset's latest materialization before the run, read with the
    batch's others (the previous row counts; `instance` holds older ones)."""
    outcomes = {key: outcome for key in partition_keys
                if (outcome := result.partitions.get(kafka_partition_id(key))) is not None}
    counts = row_counts_from(instance, asset_key, table, [outcome.partition for outcome in outcomes.values()],
                             latest)
    shared = {**run_metadata(result), **table_metadata(table, result.table), **row_counts_metadata(counts)}
    materializations = []
    for partition_key in partition_keys:
        outcome = outcomes.get(partition_key)
        own = landed_partition_metadata(outcome, counts[outcome.partition]) if outcome is not None else {}
        materializations.append(dg.AssetMaterialization(asset_key=asset_key, partition=partition_key,
                                                        metadata={**shared, **own}))
    return materializations


def partial_commit_materializations(asset_key: dg.AssetKey, result: IngestResult, catalog: IcebergCatalogResource,
                                    log: dg.DagsterLogManager, instance: dg.DagsterInstance,
                                    ) -> Iterator[dg.AssetMaterialization]:
    """A materialization of each Kafka partition the run's commit covered (none when nothing was committed)."""
    landed = [result.partitions[p] for p in sorted(result.committed_ranges())]
    if not landed:
        return
    table: Table | None = None
    counts: dict[int, RowCount] = {}
    try:
        table = catalog.load_table(result.table)
        counts = partition_row_counts(instance, asset_key, table, [outcome.partition for outcome in landed])
    except Exception as exc:  # noqa: BLE001 - the run's failure is what the step reports; this must not replace it
        log.warning("table %s: could not load it or count its rows for the metadata of the partitions committed in "
                    "snapshot %s: %s", result.table, result.snapshot_id, exc)
    shared = {**run_metadata(result), **(table_metadata(table, result.table) if table is not None else {}),
              **row_counts_metadata(counts)}
    for outcome in landed:
        count = counts.get(outcome.partition)
        own = landed_partition_metadata(outcome, count) if count is not None else partition_metadata(outcome)
        yield dg.AssetMaterialization(asset_key=asset_key, partition=kafka_partition_key(outcome.partition),
                                      metadata={**shared, **own})
