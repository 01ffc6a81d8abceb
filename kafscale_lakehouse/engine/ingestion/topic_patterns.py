"""The config's `topic_pattern` mappings resolved against the topics that exist, for everything that runs mappings:
`ingest` (and `ingest --once`), the CLI, the Dagster definitions and their pattern sensor, metrics and reports.

Which topics exist is `discovery.mode`'s answer, read at its cheapest: with etcd, the broker's metadata snapshot (one
get); with S3, the topic "directories" under the namespace (one listing, not one per topic). A config without
patterns costs nothing here (no request). The pure part (templates, precedence, problems) is
`config.resolve_topic_patterns`.
"""

from __future__ import annotations

import logging

from kafscale_lakehouse.config import LakehouseConfig, TopicPatternResolution, resolve_topic_patterns
from kafscale_lakehouse.connections import etcd_client_from_config, segment_store_from_config
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.storage import DiscoveryMode, SegmentStore, discover_partitions

log = logging.getLogger(__name__)


def discover_topics(mode: DiscoveryMode, store: SegmentStore, etcd: EtcdClient | None) -> list[str]:
    """The topics that exist: the metadata snapshot's healthy topics (etcd), else the namespace's topic directories."""
    if mode is DiscoveryMode.S3 or (mode is DiscoveryMode.AUTO and etcd is None):
        return store.list_topics()
    return sorted(discover_partitions(mode, store, etcd).partitions)


def with_pattern_topics(config: LakehouseConfig, store: SegmentStore | None = None,
                        etcd: EtcdClient | None = None) -> TopicPatternResolution:
    """`config` with a mapping for each existing topic its `topic_pattern` mappings match (`store` and `etcd`: the
    caller's connections; without them, built from `config` for this call). Problems (a topic two patterns match, a
    table taken) are logged as errors naming the keys; those topics are left out."""
    if not config.pattern_mappings:
        return TopicPatternResolution(config)
    own_etcd = etcd is None and store is None and bool(config.etcd.endpoints)
    if store is None:
        store = segment_store_from_config(config)
    if own_etcd:
        etcd = etcd_client_from_config(config)
    try:
        topics = discover_topics(DiscoveryMode.parse(config.discovery.mode), store, etcd)
    finally:
        if own_etcd and etcd is not None:
            etcd.close()
    resolution = resolve_topic_patterns(config, topics)
    for problem in resolution.problems:
        log.error("topic patterns: %s", problem)
    if resolution.pattern_of:
        log.info("topic patterns: %d topic(s) of %d found matched: %s", len(resolution.pattern_of), len(topics),
                 ", ".join(resolution.pattern_topics[:20]) + (", ..." if len(resolution.pattern_of) > 20 else ""))
    return resolution
