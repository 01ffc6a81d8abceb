"""Dagster names derived from KafScale topics and Iceberg table identifiers, in one place.

Dagster names (jobs, partitions definitions) must match `^[A-Za-z0-9_]+$`, while Kafka topics may contain
`.`, `-` and `_`, and table identifiers contain `.`. `dagster_name_part` escapes them injectively, so two
different topics (`orders.v1`, `orders-v1`, `orders_v1`) never share a Dagster name.
"""

from __future__ import annotations

import dagster as dg

from kafscale_lakehouse.config import name_part
from kafscale_lakehouse.engine.tables import table_asset_path

# The config's escaping (config/topic_patterns.py), which pattern-mapped table names use too: one implementation.
dagster_name_part = name_part


def table_asset_key(table: str) -> dg.AssetKey:
    """The asset of an Iceberg table: the identifier split on `.` (`rpc.pizzas` -> `["rpc", "pizzas"]`)."""
    return dg.AssetKey(table_asset_path(table))


def topic_asset_key(topic: str) -> dg.AssetKey:
    """The observable source asset of a KafScale topic: `["kafscale", <topic>]` (key parts may hold `.` and `-`)."""
    return dg.AssetKey(["kafscale", topic])


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
