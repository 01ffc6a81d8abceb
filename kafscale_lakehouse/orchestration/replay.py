"""`kafscale-lakehouse offsets replay` from the Dagster UI: one job per mapping, launched from the Launchpad with the
Kafka partition and the offset range as run config, thin over `engine.replay.replay_range` (the rows of the range
replaced by the records read again, in one commit). It runs in the table's pool, so it waits for ingestion runs of
the table instead of failing on their leases, and records what it replaced on the table asset."""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations at runtime.
import dagster as dg
from pydantic import Field

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import ReplayError, replay_range
from kafscale_lakehouse.engine.tables import RewriteAbandonedError, read_topic_offsets
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.orchestration.naming import dagster_name_part, mapping_asset_key, pool_name
from kafscale_lakehouse.orchestration.resources import (
    IcebergCatalogResource,
    OffsetStoreResource,
    SegmentStoreResource,
    SparkResource,
    ingest_context,
)


class ReplayConfig(dg.Config):
    partition: int = Field(ge=0, description="The Kafka partition.")
    from_offset: int = Field(ge=0, description="The first offset replayed.")
    to_offset: int | None = Field(default=None, ge=0, description="The offset after the last one replayed "
                                  "(default: the table's next offset of the partition).")


def replay_job_name(table: str) -> str:
    return f"replay_{dagster_name_part(table)}"


def build_replay_job(lakehouse: LakehouseConfig, mapping: MappingConfig) -> dg.JobDefinition:
    table_name = mapping.table

    @dg.op(name=f"{replay_job_name(table_name)}_op", pool=pool_name(table_name),
           description=f"Replace the rows of an offset range of one Kafka partition of {table_name} by the records "
                       f"read again from topic {mapping.topic!r}, in one commit.")
    def replay(context: dg.OpExecutionContext, config: ReplayConfig, spark: SparkResource,
               segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,
               iceberg_catalog: IcebergCatalogResource) -> None:
        end = config.to_offset
        if end is None:
            table = iceberg_catalog.load_table(table_name)
            end = read_topic_offsets(table, mapping.topic).get(config.partition, config.from_offset)
        try:
            offsets = OffsetRange(config.partition, config.from_offset, end)
            engine = ingest_context(lakehouse, spark, segment_store, offset_store, iceberg_catalog)
            result = replay_range(engine, mapping, offsets, run_id=f"replay-{context.run.run_id}")
        except (ValueError, ReplayError, RewriteAbandonedError) as err:
            raise dg.Failure(description=str(err)) from err
        context.log.info(result.describe())
        context.log_event(dg.AssetObservation(asset_key=mapping_asset_key(mapping), metadata={
            "kafscale/replay": f"partition {offsets.partition} offsets {offsets.start}..{offsets.end - 1}",
            "snapshot_id": result.snapshot_id, "rows_removed": result.rows_removed,
            "rows_added": result.rows_added, "files_removed": result.files_removed,
            "files_added": result.files_added}))

    @dg.job(name=replay_job_name(table_name), tags={"kafscale/replay": table_name},
            description=f"Replay an offset range of a Kafka partition into {table_name} (Launchpad: partition, "
                        "from_offset, to_offset).")
    def replay_job() -> None:
        replay()

    return replay_job
