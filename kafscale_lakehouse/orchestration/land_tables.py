"""`land_tables`: one run that lands many tables, requested by the namespace watch (namespace_sensor.py).

Dagster cannot put assets with different partitions definitions in one run, and each table's asset is partitioned by
its own topic's Kafka partitions. So the batched run is an op job, not an asset job. Its op, in one process (one
launch, one Spark session and one set of clients for the batch):
1. prepares every table its run config lists as the table's own asset does (`prepare_ingest`: its leases, its
   offsets, its planned segments);
2. writes every table's segments in ONE Spark job, then commits each table on its own (`commit_ingests`: one Iceberg
   commit per table, each re-checking its own offsets, so a table's failed commit undoes nothing of another's);
3. logs for each table what the asset's run records: an `AssetMaterialization` per Kafka partition with the same
   metadata (assets.py), then the table's check results as `AssetCheckEvaluation`s (checks.py's evaluations).
Dagster files them under the table's asset, its partitions and its checks, so the table's partition status,
freshness, metadata plots and check history read the same whichever run landed it; the asset's lineage is its
definition's and stays the same.

A table that fails (its leases, its commit, a segment) is logged and the others go on: the tables that landed stay
landed. The run then fails naming the tables that did not land; the namespace watch requests those again after its
backoff (sensors.py `retry_wait`). When the shared Spark job itself fails, no table of the batch commits (each is
requested again, as after a failed job of its own run).

A table's concurrency pool is not held by this op (Dagster pools are per op, this op serves many tables): the watch
never puts a table in a batch while another run of it (its own job or a batch) is queued or running, and the
per-partition leases keep a manual run of the same table from committing beside it.
"""

# No `from __future__ import annotations`: Dagster reads the context and config parameter annotations at runtime.
from collections.abc import Iterator, Mapping

import dagster as dg
from pyiceberg.table import Table

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import (
    IngestContext,
    IngestFailedError,
    IngestResult,
    PreparedIngest,
    TopicScan,
    commit_ingests,
    prepare_ingest,
)
from kafscale_lakehouse.engine.tables import FRESHNESS, ID_UNIQUE, OFFSETS_CONTIGUOUS, RECORD_ID_UNIQUE, SCHEMA_VALID
from kafscale_lakehouse.offsets.ranges import parse_ranges
from kafscale_lakehouse.orchestration.assets import (
    landed_materializations,
    partial_commit_materializations,
    scan_topic_now,
)
from kafscale_lakehouse.orchestration.checks import (
    evaluate_freshness,
    evaluate_id_unique,
    evaluate_offsets_contiguous,
    evaluate_record_id_unique,
    evaluate_schema_valid,
)
from kafscale_lakehouse.orchestration.naming import kafka_partition_key, table_asset_key
from kafscale_lakehouse.orchestration.resources import (
    IcebergCatalogResource,
    OffsetStoreResource,
    SegmentStoreResource,
    SparkResource,
    ingest_context,
)
from kafscale_lakehouse.storage import NamespaceListing

LAND_TABLES_JOB = "land_tables"
LAND_TABLES_OP = "land_listed_tables"  # the op; a job and an op cannot share a name
# The tables a `land_tables` run lands, comma-separated: the watch keeps them out of other batches while it is active.
BATCH_TABLES_TAG = "kafscale/batch_tables"


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
        checks = _BatchChecks(lakehouse_config, segment_store, offset_store, iceberg_catalog)
        failed: dict[str, str] = {}
        prepared: list[tuple[MappingConfig, TableToLand, PreparedIngest]] = []
        try:
            for entry in config.tables:
                mapping = mappings.get(entry.table)
                if mapping is None:
                    failed[entry.table] = "no mapping of the lakehouse config lands this table"
                    continue
                try:
                    prepared.append((mapping, entry, _prepare(context, mapping, entry, engine)))
                except Exception as exc:  # noqa: BLE001 - this table's (its leases, its table); the others go on
                    context.log.error("table %s (topic %s) did not land: %s", mapping.table, mapping.topic, exc)
                    failed[mapping.table] = str(exc)
            # One Spark job for every table's segments, then one commit per table.
            outcomes = commit_ingests([run for _, _, run in prepared])
        finally:
            for _, _, run in prepared:
                run.release_leases()  # commit_ingests releases them on every path; releasing is idempotent
        for (mapping, entry, run), outcome in zip(prepared, outcomes, strict=True):
            try:
                yield from _table_events(context, mapping, entry, run.result, outcome, checks)
            except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others; reported below
                context.log.error("table %s (topic %s) did not land: %s", mapping.table, mapping.topic, exc)
                failed[mapping.table] = str(exc)
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


def _prepare(context: dg.OpExecutionContext, mapping: MappingConfig, entry: TableToLand,
             engine: IngestContext) -> PreparedIngest:
    """The table's leases, offsets and planned segments (`prepare_ingest`, as its own asset's run does)."""
    partitions = sorted(entry.partitions)
    where = f"the {LAND_TABLES_OP} config of table {mapping.table}"
    planned = parse_ranges(entry.planned_ranges, where=where) if entry.planned_ranges else None
    context.log.info("topic %s → %s: ingesting Kafka partitions %s", mapping.topic, mapping.table, partitions)
    return prepare_ingest(engine, mapping, partitions=partitions, run_id=context.run.run_id, planned=planned)


def _table_events(context: dg.OpExecutionContext, mapping: MappingConfig, entry: TableToLand, result: IngestResult,
                  outcome: IngestResult | Exception,
                  checks: "_BatchChecks") -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """One table of the batch after its commit: its materializations and its check results; raises when it did not
    land (after the materializations of the partitions a partial commit landed)."""
    asset_key = table_asset_key(mapping.table)
    if isinstance(outcome, IngestFailedError):
        yield from partial_commit_materializations(asset_key, outcome.result, checks.catalog, context.log)
    if isinstance(outcome, Exception):
        raise outcome
    table = checks.catalog.load_table(result.table)
    partition_keys = [kafka_partition_key(p) for p in sorted(entry.partitions)]
    materializations = landed_materializations(asset_key, partition_keys, result, table)
    yield from materializations
    context.log.info("table %s: run %s committed %d records of topic %s in snapshot %s", result.table,
                     result.run_id, result.records, result.topic, result.snapshot_id)
    metadata = materializations[0].metadata if materializations else None
    yield from checks.evaluations(mapping, table, metadata)


class _BatchChecks:
    """The checks of the tables a batch landed: the resources they read, and one listing of the namespace shared by
    the freshness checks of the batch (taken at the first one), instead of a listing per partition per table."""

    def __init__(self, lakehouse: LakehouseConfig, segment_store: SegmentStoreResource,
                 offset_store: OffsetStoreResource, catalog: IcebergCatalogResource) -> None:
        self.lakehouse, self.segment_store, self.offset_store, self.catalog = (lakehouse, segment_store,
                                                                               offset_store, catalog)
        self._listing: NamespaceListing | None = None

    def evaluations(self, mapping: MappingConfig, table: Table,
                    metadata: Mapping[str, dg.MetadataValue] | None) -> Iterator[dg.AssetCheckEvaluation]:
        """The table's four checks (build_table_checks) on what the run landed (`table` after its commit, `metadata`
        its materialization's), as evaluations of the table's checks."""
        if self._listing is None:
            self._listing = NamespaceListing.from_store(self.segment_store.open_store())
        scan = scan_topic_now(self.lakehouse, mapping, self.segment_store, self.offset_store, self.catalog,
                              store=self._listing)
        yield from table_check_evaluations(self.lakehouse, mapping, table, metadata, scan)


def table_check_evaluations(lakehouse: LakehouseConfig, mapping: MappingConfig, table: Table,
                            metadata: Mapping[str, dg.MetadataValue] | None,
                            scan: TopicScan) -> Iterator[dg.AssetCheckEvaluation]:
    """The four checks of `build_table_checks` as evaluations of the table's checks: on `table`, the run's
    materialization `metadata` and `scan`, its topic now."""
    asset_key = table_asset_key(mapping.table)
    upsert = mapping.mode == "upsert"
    results = {SCHEMA_VALID: (evaluate_schema_valid(metadata, lakehouse.schema_config.mode), True)}
    if upsert:
        results[ID_UNIQUE] = (evaluate_id_unique(table, mapping.topic, list(mapping.id_columns), metadata), True)
    else:
        results[RECORD_ID_UNIQUE] = (evaluate_record_id_unique(table, mapping.topic, metadata), True)
    results[OFFSETS_CONTIGUOUS] = (evaluate_offsets_contiguous(table, mapping.topic), True)
    results[FRESHNESS] = (evaluate_freshness(scan.partitions, mapping.freshness_max_lag_records, scan.table_error),
                          False)
    for name, (check, blocking) in results.items():
        yield dg.AssetCheckEvaluation(asset_key=asset_key, check_name=name, passed=check.passed,
                                      metadata=check.metadata, severity=check.severity,
                                      description=check.description, blocking=blocking)
