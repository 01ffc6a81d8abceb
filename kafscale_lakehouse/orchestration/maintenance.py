"""Table maintenance as Dagster jobs on schedules: thin over `engine.maintenance.maintain_mapping`, the same code as
`kafscale-lakehouse maintain`. One job and one schedule per mapping whose `maintenance.enabled` is true; the
schedule runs by default (`mappings[].maintenance.cron_schedule`). Each run records what it did as metadata."""

from __future__ import annotations

import dagster as dg

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.connections import table_maintenance
from kafscale_lakehouse.engine.maintenance import maintain_mapping
from kafscale_lakehouse.orchestration.naming import dagster_name_part
from kafscale_lakehouse.orchestration.resources import SPARK_RESOURCE_KEY, SparkResource


def maintenance_job_name(table: str) -> str:
    return f"maintain_{dagster_name_part(table)}"


def build_maintenance_job(config: LakehouseConfig, mapping: MappingConfig) -> dg.JobDefinition:
    @dg.op(name=f"{maintenance_job_name(mapping.table)}_op", required_resource_keys={SPARK_RESOURCE_KEY},
           description=f"Compaction, snapshot expiry, orphan-file removal and metadata properties of {mapping.table}.")
    def maintain(context) -> None:  # noqa: ANN001 - Dagster reads the annotation; `from __future__` hides it
        spark: SparkResource = getattr(context.resources, SPARK_RESOURCE_KEY)
        summary = maintain_mapping(spark.spark_session, table_maintenance(config, mapping))
        metadata = {key: value for key, value in summary.as_dict().items()
                    if value is not None and key != "properties_set"}
        metadata["properties_set"] = dg.MetadataValue.json(summary.properties_set)
        context.log_event(dg.AssetObservation(asset_key=dg.AssetKey(mapping.table.split(".")), metadata=metadata))

    @dg.job(name=maintenance_job_name(mapping.table), tags={"kafscale/maintenance": mapping.table},
            description=f"Maintain Iceberg table {mapping.table}.")
    def maintenance_job() -> None:
        maintain()

    return maintenance_job


def build_maintenance(config: LakehouseConfig) -> tuple[list[dg.JobDefinition], list[dg.ScheduleDefinition]]:
    jobs, schedules = [], []
    for mapping in config.mappings:
        if not mapping.maintenance.enabled:
            continue
        job = build_maintenance_job(config, mapping)
        jobs.append(job)
        schedules.append(dg.ScheduleDefinition(
            name=f"{job.name}_schedule", job=job, cron_schedule=mapping.maintenance.cron_schedule,
            default_status=dg.DefaultScheduleStatus.RUNNING))
    return jobs, schedules
