"""The Kafka partitions of each mapped topic as Dagster partitions of its table asset, registered when the
definitions load, so a partition can be materialized by hand (`dg launch --assets rpc/pizzas --partition 0`, a job
launch, the UI's Materialize) on a new instance before any sensor tick.

The partitions definition stays dynamic (`naming.topic_partitions_def`): a Kafka topic gains partitions while the
code location runs, and the sensors register them as they appear without reloading it. What loading adds is the
partitions that exist now, from the broker's metadata snapshot in etcd or the partition directories of the segment
store (`discovery.mode`), into the instance of the process that loads the definitions (`$DAGSTER_HOME`'s: the code
server, `dg launch`, `dagster asset materialize`). Registering is idempotent and only adds keys.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import dagster as dg

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.connections import etcd_client_from_config, segment_store_from_config
from kafscale_lakehouse.orchestration.naming import kafka_partition_key, partitions_def_name, topic_partitions_def
from kafscale_lakehouse.storage import DiscoveryMode, discover_partitions

log = logging.getLogger(__name__)

# An etcd that does not answer while the location loads is retried this long (the sensors register the partitions
# once it answers); the client's default would hold every load for 15 s.
LOAD_ETCD_RETRY_SECONDS = 2.0


def unregistered_partitions(instance: dg.DagsterInstance, topic: str,
                            partitions: Iterable[int]) -> list[dg.AddDynamicPartitionsRequest]:
    """The request that registers the Kafka `partitions` of `topic` Dagster does not know yet (none when it knows
    them all)."""
    known = set(instance.get_dynamic_partitions(partitions_def_name(topic)))
    new_keys = [key for key in map(kafka_partition_key, sorted(partitions)) if key not in known]
    return [topic_partitions_def(topic).build_add_request(new_keys)] if new_keys else []


def register_topic_partitions(config: LakehouseConfig, instance: dg.DagsterInstance) -> dict[str, list[str]]:
    """Register the partitions each mapped topic has now as its table asset's partitions in `instance`; returns the
    keys added per topic. A topic without partitions yet gets none (its sensor registers them when they appear)."""
    topics = [mapping.topic for mapping in config.mappings]
    if not topics:
        return {}
    etcd = etcd_client_from_config(config, retry_seconds=LOAD_ETCD_RETRY_SECONDS) if config.etcd.endpoints else None
    try:
        discovery = discover_partitions(DiscoveryMode.parse(config.discovery.mode), segment_store_from_config(config),
                                        etcd, topics=topics)
    finally:
        if etcd is not None:
            etcd.close()
    added: dict[str, list[str]] = {}
    for topic in topics:
        for request in unregistered_partitions(instance, topic, discovery.partitions.get(topic, [])):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            added[topic] = list(request.partition_keys)
    if added:
        log.info("registered the Kafka partitions found in %s: %s", discovery.source.value,
                 "; ".join(f"{topic} {', '.join(keys)}" for topic, keys in added.items()))
    return added
