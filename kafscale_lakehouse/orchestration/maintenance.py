"""Table maintenance in Dagster: one job, `maintain_tables`, and one schedule per distinct
`mappings[].maintenance.cron_schedule` (one schedule when the mappings share it, as pattern-mapped tables do).

A run loads each candidate table once, in parallel (`MEASURE_THREADS`), measures its need from its metadata
(`engine.maintenance.maintenance_need`: data files added since the last compaction, snapshots to expire, data
manifests), and maintains only the tables over a threshold, the most urgent first, at most `max_tables` of them
(the rest wait for the next run), with the table it loaded (`maintain_mapping`, the code of
`kafscale-lakehouse maintain`: properties, compaction, manifests, expiry, orphan removal). Each maintained table gets an
observation with what was done; the run's metadata lists the tables measured, maintained and left for later. A table
by hand: launch the job with `tables: [<table>]` and `force: true` (all its steps, whatever its need). Before, every
mapping had its own job and an hourly schedule that opened its table whether or not anything was due: at 200 tables,
200 runs an hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import dagster as dg
from pyiceberg.table import Table

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.connections import catalog_settings, table_maintenance
from kafscale_lakehouse.engine.maintenance import MaintenanceNeed, maintain_mapping, maintenance_need
from kafscale_lakehouse.engine.tables import TableNotFoundError, load_catalog, open_table
from kafscale_lakehouse.orchestration.naming import mapping_asset_key
from kafscale_lakehouse.orchestration.resources import SPARK_RESOURCE_KEY, SparkResource

MAINTENANCE_JOB = "maintain_tables"
MAINTENANCE_TAG = "kafscale/maintenance"
DEFAULT_MAX_TABLES_PER_RUN = 20
MEASURE_THREADS = 8


def build_maintenance_job(lakehouse: LakehouseConfig) -> dg.JobDefinition:
    mappings = {m.table: m for m in lakehouse.mappings if m.maintenance.enabled}

    # Op config: `tables` to consider (default: every mapping with maintenance enabled); at most `max_tables`
    # maintained per run; `force`: maintain the tables given whatever their need (by hand).
    @dg.op(name=f"{MAINTENANCE_JOB}_op", required_resource_keys={SPARK_RESOURCE_KEY},
           config_schema={"tables": dg.Field([str], default_value=[]),
                          "max_tables": dg.Field(int, default_value=DEFAULT_MAX_TABLES_PER_RUN),
                          "force": dg.Field(bool, default_value=False)},
           description="Measures each table's need (files since compaction, snapshots, manifests) from one load and "
                       "maintains those over a threshold (compaction, manifests, expiry, orphans, properties).")
    def maintain_tables(context) -> None:  # noqa: ANN001 - Dagster reads the annotation; `from __future__` hides it
        tables, max_tables, force = (context.op_config[k] for k in ("tables", "max_tables", "force"))
        unknown = sorted(set(tables) - set(mappings))
        if unknown:
            raise dg.Failure(f"tables {unknown} are not mapped tables with maintenance enabled "
                             f"({', '.join(sorted(mappings)) or 'none'})")
        candidates = [mappings[t] for t in tables] if tables else list(mappings.values())
        measured = measure_tables(lakehouse, candidates)
        due = sorted((m for m in measured if force or m[1].needed), key=lambda m: -m[1].urgency)
        chosen, later = due[:max_tables], due[max_tables:]
        context.log.info("%d tables measured, %d need maintenance, %d maintained now, %d next run",
                         len(measured), len(due), len(chosen), len(later))
        spark: SparkResource = getattr(context.resources, SPARK_RESOURCE_KEY)
        session = spark.spark_session if chosen else None
        failed: dict[str, str] = {}
        for mapping, need, table in chosen:
            context.log.info("table %s: %s", mapping.table, "; ".join(need.reasons) or "forced")
            try:
                summary = maintain_mapping(session, table_maintenance(lakehouse, mapping), table=table)
            except Exception as exc:  # noqa: BLE001 - the other tables are maintained; the run fails naming it
                context.log.error("table %s: maintenance failed: %s", mapping.table, exc)
                failed[mapping.table] = str(exc)
                continue
            metadata = {key: value for key, value in summary.as_dict().items()
                        if value is not None and key != "properties_set"}
            metadata["properties_set"] = dg.MetadataValue.json(summary.properties_set)
            metadata["reasons"] = dg.MetadataValue.json(list(need.reasons))
            context.log_event(dg.AssetObservation(asset_key=mapping_asset_key(mapping), metadata=metadata))
        context.log.info("maintained %s; left for the next run %s", [m.table for m, _, _ in chosen
                                                                      if m.table not in failed],
                         [m.table for m, _, _ in later])
        if failed:
            raise dg.Failure(f"maintenance failed for tables {sorted(failed)}",
                             metadata={"errors": dg.MetadataValue.json(failed)})

    @dg.job(name=MAINTENANCE_JOB, tags={MAINTENANCE_TAG: "tables"},
            description="Maintain the Iceberg tables that need it (one schedule for all tables).")
    def maintenance_job() -> None:
        maintain_tables()

    return maintenance_job


def measure_tables(config: LakehouseConfig, mappings: Sequence[MappingConfig], *,
                   now: datetime | None = None) -> list[tuple[MappingConfig, MaintenanceNeed, Table]]:
    """Each mapping's table loaded once (in parallel) with its need; tables that do not exist yet are left out."""
    if not mappings:
        return []
    catalog = load_catalog(catalog_settings(config))
    now = now or datetime.now(UTC)

    def measure(mapping: MappingConfig) -> tuple[MappingConfig, MaintenanceNeed, Table] | None:
        settings = table_maintenance(config, mapping).settings
        try:
            table = open_table(catalog, mapping.table)
        except TableNotFoundError:  # not created yet: nothing to maintain
            return None
        return mapping, maintenance_need(table, settings, now=now), table

    with ThreadPoolExecutor(max_workers=min(MEASURE_THREADS, len(mappings))) as pool:
        return [m for m in pool.map(measure, mappings) if m is not None]


def build_maintenance(config: LakehouseConfig) -> tuple[list[dg.JobDefinition], list[dg.ScheduleDefinition]]:
    """The maintenance job and its schedules (none when no mapping has maintenance enabled)."""
    enabled = [m for m in config.mappings if m.maintenance.enabled]
    if not enabled:
        return [], []
    job = build_maintenance_job(config)
    by_cron: dict[str, list[str]] = {}
    for mapping in enabled:
        by_cron.setdefault(mapping.maintenance.cron_schedule, []).append(mapping.table)
    schedules = []
    for index, (cron, tables) in enumerate(by_cron.items()):
        # One cron for all: the run considers every table; otherwise each schedule names its tables.
        only = len(by_cron) == 1
        run_config = {} if only else {"ops": {f"{MAINTENANCE_JOB}_op": {"config": {"tables": tables}}}}
        schedules.append(dg.ScheduleDefinition(
            name=f"{MAINTENANCE_JOB}_schedule" if only else f"{MAINTENANCE_JOB}_schedule_{index + 1}", job=job,
            cron_schedule=cron,
            run_config=run_config, default_status=dg.DefaultScheduleStatus.RUNNING,
            description=f"Maintains those of {len(tables)} tables that need it."))
    return [job], schedules
