"""Dagster names derived from KafScale topics and Iceberg table identifiers, in one place.

Dagster names (jobs, partitions definitions) must match `^[A-Za-z0-9_]+$`, while Kafka topics may contain
`.`, `-` and `_`, and table identifiers contain `.`. `dagster_name_part` escapes them injectively, so two
different topics (`orders.v1`, `orders-v1`, `orders_v1`) never share a Dagster name.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from kafscale_lakehouse.config import AssetConfig, LakehouseConfig, MappingConfig, name_part
from kafscale_lakehouse.engine.tables import table_asset_path

# The config's escaping (config/topic_patterns.py), which pattern-mapped table names use too: one implementation.
dagster_name_part = name_part


def table_asset_key(table: str) -> dg.AssetKey:
    """The asset of an Iceberg table: the identifier split on `.` (`rpc.pizzas` -> `["rpc", "pizzas"]`)."""
    return dg.AssetKey(table_asset_path(table))


def topic_asset_key(topic: str) -> dg.AssetKey:
    """The observable source asset of a KafScale topic: `["kafscale", <topic>]` (key parts may hold `.` and `-`)."""
    return dg.AssetKey(["kafscale", topic])


# The group of a mapping's assets and the kinds of its table asset, unless `mappings[].asset` or the component's
# `translation` say otherwise.
ASSET_GROUP = "kafscale"
TABLE_KINDS = ("iceberg", "pyspark")


def mapping_asset_key(mapping: MappingConfig) -> dg.AssetKey:
    """The table asset of a mapping: `asset.key_prefix` + (`asset.key`, else the table identifier split on `.`)."""
    path = mapping.asset.key if mapping.asset.key is not None else table_asset_path(mapping.table)
    return dg.AssetKey([*(mapping.asset.key_prefix or ()), *path])


def mapping_topic_key(mapping: MappingConfig) -> dg.AssetKey:
    """The topic asset of a mapping: `asset.topic_key`, else `kafscale/<topic>`."""
    topic_key = mapping.asset.topic_key
    return dg.AssetKey(topic_key) if topic_key is not None else topic_asset_key(mapping.topic)


def mapping_group(mapping: MappingConfig) -> str:
    return mapping.asset.group or ASSET_GROUP


def mapping_kinds(mapping: MappingConfig) -> set[str]:
    return set(mapping.asset.kinds if mapping.asset.kinds is not None else TABLE_KINDS)


def mapping_description(mapping: MappingConfig) -> str:
    """`asset.description` with `{table}` and `{topic}` filled in, else what the table holds."""
    if mapping.asset.description is not None:
        return mapping.asset.description.replace("{table}", mapping.table).replace("{topic}", mapping.topic)
    return (f"Iceberg table {mapping.table}, landed from KafScale topic {mapping.topic!r}; partitions are Kafka "
            "partition ids.")


def asset_key_of_table(mappings: Sequence[MappingConfig], table: str) -> dg.AssetKey:
    """The table asset of the mapping of `table` (its own key when no mapping names it)."""
    for mapping in mappings:
        if mapping.table == table:
            return mapping_asset_key(mapping)
    return table_asset_key(table)


def with_translation(config: LakehouseConfig, translation: AssetConfig | None) -> LakehouseConfig:
    """`config` with each mapping's unset `asset` keys taken from `translation` (the component's default)."""
    if translation is None:
        return config
    defaults = translation.model_dump(exclude_none=True)
    for mapping in config.mappings:
        own = mapping.asset.model_dump(exclude_none=True)
        mapping.asset = AssetConfig.model_validate({**defaults, **own})
    return config


def partitions_def_name(topic: str) -> str:
    """The name of the dynamic partitions definition (Kafka partition ids) of a topic."""
    return f"kafscale_{dagster_name_part(topic)}_partitions"


def topic_partitions_def(topic: str) -> dg.DynamicPartitionsDefinition:
    """The dynamic partitions of a topic's table asset: one partition key per Kafka partition id (`"0"`, `"1"`, ...)."""
    return dg.DynamicPartitionsDefinition(name=partitions_def_name(topic))


def ingest_job_name(table: str) -> str:
    """The job that materializes a table's asset (sensors request runs of it)."""
    return f"ingest_{dagster_name_part(table)}"


def pool_name(table: str) -> str:
    """The concurrency pool serializing commits to a table: `kafscale_<table>` with the table escaped like every other
    Dagster name (`rpc.pizzas` -> `kafscale_rpc_dot_pizzas`), so two tables never share a pool."""
    return f"kafscale_{dagster_name_part(table)}"


def kafka_partition_key(partition: int) -> str:
    """The Dagster partition key of a Kafka partition id."""
    return str(partition)


def kafka_partition_id(partition_key: str) -> int:
    """The Kafka partition id of a Dagster partition key; a key that is no non-negative integer is an error naming
    it."""
    if not (partition_key.isascii() and partition_key.isdigit()):
        raise ValueError(
            f"Dagster partition key {partition_key!r} is not a Kafka partition id (a non-negative integer)"
        )
    return int(partition_key)
