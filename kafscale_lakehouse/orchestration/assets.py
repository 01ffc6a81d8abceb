"""One asset per mapping (the Iceberg table, partitioned by Kafka partition id) and its upstream observable source
asset (the KafScale topic).

The table asset only prepares the run (`engine.ingest.prepare_ingest`: leases, offsets, the planned segments); the
IO manager (`io_manager.py`) writes and commits it. Several Kafka partitions materialize in
one run (`BackfillPolicy.single_run`) and one Iceberg commit; the table's pool serializes runs on one table.
"""

# No `from __future__ import annotations`: Dagster reads the context and resource parameter annotations at runtime.
from datetime import timedelta

import dagster as dg

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion.run import PreparedIngest, prepare_ingest
from kafscale_lakehouse.engine.ingestion.topic_scan import TopicScan, WatchSources, scan_topic
from kafscale_lakehouse.offsets.ranges import parse_ranges
from kafscale_lakehouse.orchestration.naming import (
    dagster_name_part,
    kafka_partition_id,
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
from kafscale_lakehouse.orchestration.sensors import PLANNED_RANGES_TAG, topic_observation_metadata
from kafscale_lakehouse.storage import DiscoveryMode

ICEBERG_IO_MANAGER_KEY = "iceberg_io_manager"
ASSET_GROUP = "kafscale"


def scan_topic_now(config: LakehouseConfig, topic: str, segment_store: SegmentStoreResource,
                   offset_store: OffsetStoreResource) -> TopicScan:
    """The topic's partitions now: committed and broker offsets, completed segments. Without cursors each partition
    is listed from its committed next offset on, so the cost is that of the pending segments."""
    sources = WatchSources(store=segment_store.open_store(), offsets=offset_store.offset_store(),
                           discovery_mode=DiscoveryMode.parse(config.discovery.mode), etcd=offset_store.etcd_client())
    return scan_topic(sources, topic)


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
    def observe_topic(segment_store: SegmentStoreResource, offset_store: OffsetStoreResource):  # noqa: ANN202
        scan = scan_topic_now(config, topic, segment_store, offset_store)
        ends = ",".join(f"{p}:{s.log_end}:{s.segments_end}" for p, s in sorted(scan.partitions.items()))
        metadata = topic_observation_metadata(scan) if scan.partitions else {"partitions": 0}
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
        io_manager_key=ICEBERG_IO_MANAGER_KEY,
        group_name=ASSET_GROUP,
        kinds={"iceberg", "pyspark"},
        owners=list(mapping.owners),
        tags=dict(mapping.tags),
        freshness_policy=table_freshness_policy(mapping),
        description=f"Iceberg table {table}, landed from KafScale topic {topic!r}; partitions are Kafka partition ids.",
        metadata={"dagster/table_name": table, "kafscale/topic": topic},
    )
    def ingest_table(context: dg.AssetExecutionContext, spark: SparkResource, segment_store: SegmentStoreResource,
                     offset_store: OffsetStoreResource, iceberg_catalog: IcebergCatalogResource) -> PreparedIngest:
        partitions = sorted(kafka_partition_id(key) for key in context.partition_keys)
        context.log.info("topic %s → %s: preparing Kafka partitions %s", topic, table, partitions)
        planned_tag = context.run.tags.get(PLANNED_RANGES_TAG)
        planned = parse_ranges(planned_tag, where=f"run tag {PLANNED_RANGES_TAG}") if planned_tag else None
        engine = ingest_context(config, spark, segment_store, offset_store, iceberg_catalog)
        return prepare_ingest(engine, mapping, partitions=partitions, run_id=context.run.run_id, planned=planned)

    return ingest_table
