"""Storage layer: KafScale segments in S3 or a local directory; key parsing, completeness, discovery, gaps."""

from kafscale_lakehouse.storage.discovery import (
    METADATA_SNAPSHOT_KEY,
    Discovery,
    DiscoveryMode,
    discover_partitions,
    list_partitions_of,
    parse_metadata_snapshot,
)
from kafscale_lakehouse.storage.errors import (
    BucketNotFoundError,
    DuplicateSegmentError,
    MetadataSnapshotError,
    ObjectNotFoundError,
    OffsetBeyondSegmentsError,
    SegmentOverlapError,
    StorageAuthError,
    StorageError,
    StorageRequestError,
    StorageUnreachableError,
)
from kafscale_lakehouse.storage.gaps import Gap, find_gaps
from kafscale_lakehouse.storage.keys import (
    DEFAULT_NAMESPACE,
    ObjectKind,
    SegmentKey,
    namespace_prefix,
    parse_segment_key,
    partition_prefix,
    segment_key,
    topic_prefix,
)
from kafscale_lakehouse.storage.local_store import LocalSegmentStore
from kafscale_lakehouse.storage.namespace_listing import NamespaceListing
from kafscale_lakehouse.storage.offset_listing import segments_from
from kafscale_lakehouse.storage.retention import (
    PartitionRetention,
    RetentionPolicy,
    TopicConfigError,
    TopicRetention,
    topic_retention,
)
from kafscale_lakehouse.storage.s3_store import SSE_TYPES, S3SegmentStore, SseType
from kafscale_lakehouse.storage.stalls import StalledSegment, find_stalled_segment
from kafscale_lakehouse.storage.store import (
    IncompleteSegment,
    ObjectInfo,
    SegmentListing,
    SegmentRef,
    SegmentStore,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "METADATA_SNAPSHOT_KEY",
    "SSE_TYPES",
    "BucketNotFoundError",
    "Discovery",
    "DiscoveryMode",
    "DuplicateSegmentError",
    "Gap",
    "IncompleteSegment",
    "LocalSegmentStore",
    "MetadataSnapshotError",
    "NamespaceListing",
    "ObjectInfo",
    "ObjectKind",
    "ObjectNotFoundError",
    "OffsetBeyondSegmentsError",
    "PartitionRetention",
    "RetentionPolicy",
    "S3SegmentStore",
    "SegmentKey",
    "SegmentListing",
    "SegmentOverlapError",
    "SegmentRef",
    "SegmentStore",
    "SseType",
    "StalledSegment",
    "StorageAuthError",
    "StorageError",
    "StorageRequestError",
    "StorageUnreachableError",
    "TopicConfigError",
    "TopicRetention",
    "discover_partitions",
    "find_gaps",
    "find_stalled_segment",
    "list_partitions_of",
    "namespace_prefix",
    "parse_metadata_snapshot",
    "parse_segment_key",
    "partition_prefix",
    "segment_key",
    "segments_from",
    "topic_prefix",
    "topic_retention",
]
