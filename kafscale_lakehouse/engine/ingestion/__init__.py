"""Ingestion runs of a topic→table mapping, without Dagster: what the layers above use."""

from kafscale_lakehouse.engine.ingestion.lag import lag, lag_and_reference
from kafscale_lakehouse.engine.ingestion.lfs import ERROR_DECODE, ERROR_RESOLVE
from kafscale_lakehouse.engine.ingestion.planning import (
    ListedPartitions,
    SkipPlan,
    SkipRefusedError,
    plan_skip,
    stalled_partitions,
)
from kafscale_lakehouse.engine.ingestion.positions import offsets_view, reset_from_store, reset_from_table
from kafscale_lakehouse.engine.ingestion.replay import ReplayError, move_position, plan_replay, replay_range
from kafscale_lakehouse.engine.ingestion.run import (
    BATCH_TABLE_THREADS,
    IngestContext,
    IngestFailedError,
    IngestResult,
    PartitionOutcome,
    PreparedIngest,
    commit_ingest,
    commit_ingests,
    ingest,
    open_mapping_table,
    prepare_ingest,
)
from kafscale_lakehouse.engine.ingestion.topic_patterns import discover_topics, with_pattern_topics
from kafscale_lakehouse.engine.ingestion.topic_scan import (
    PARTITION_DISCOVERY_SECONDS,
    TABLE_OFFSETS_MAX_AGE_SECONDS,
    NamespaceScan,
    NamespaceWatchMemory,
    PartitionCursor,
    PartitionState,
    TableOffsetsReader,
    TopicOffsets,
    TopicScan,
    WatchSources,
    scan_namespace,
    scan_topic,
    watched_partitions,
)
from kafscale_lakehouse.engine.ingestion.validation import resolve_record_validation

__all__ = [
    "BATCH_TABLE_THREADS",
    "ERROR_DECODE",
    "ERROR_RESOLVE",
    "PARTITION_DISCOVERY_SECONDS",
    "TABLE_OFFSETS_MAX_AGE_SECONDS",
    "IngestContext",
    "IngestFailedError",
    "IngestResult",
    "ListedPartitions",
    "NamespaceScan",
    "NamespaceWatchMemory",
    "PartitionCursor",
    "PartitionOutcome",
    "PartitionState",
    "PreparedIngest",
    "ReplayError",
    "SkipPlan",
    "SkipRefusedError",
    "TableOffsetsReader",
    "TopicOffsets",
    "TopicScan",
    "WatchSources",
    "commit_ingest",
    "commit_ingests",
    "discover_topics",
    "ingest",
    "lag",
    "lag_and_reference",
    "move_position",
    "offsets_view",
    "open_mapping_table",
    "plan_replay",
    "plan_skip",
    "prepare_ingest",
    "replay_range",
    "reset_from_store",
    "reset_from_table",
    "resolve_record_validation",
    "scan_namespace",
    "scan_topic",
    "stalled_partitions",
    "watched_partitions",
    "with_pattern_topics",
]
