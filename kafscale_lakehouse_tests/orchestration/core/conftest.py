"""Fixtures for the Dagster core tests: one world per test on the shared servers, and Dagster runs of its config."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
import pytest

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.orchestration.naming import ingest_job_name, partitions_def_name
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


@pytest.fixture
def production_world(tmp_path, seaweedfs, etcd_server, unique_prefix) -> IngestWorld:
    """Segments in the SeaweedFS bucket, the SeaweedFS Iceberg REST catalog, offsets and leases in etcd."""
    return IngestWorld("production", tmp_path, unique_prefix, seaweedfs=seaweedfs,
                       etcd_endpoint=etcd_server.endpoint, topic=f"pizzas.{unique_prefix}")


@pytest.fixture
def embedded_world(tmp_path, unique_prefix) -> IngestWorld:
    """A local segment directory, a sqlite catalog and warehouse, the sqlite offsets store."""
    return IngestWorld("embedded", tmp_path, unique_prefix, topic=f"pizzas-{unique_prefix}")


def run_ingest_job(config: LakehouseConfig, instance: dg.DagsterInstance, partitions: Sequence[int],
                   *, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """One run of the mapping's ingest job over Kafka `partitions` (registered as dynamic partitions first), as the
    sensor requests it: a partition key range in the tags."""
    [mapping] = config.mappings
    keys = [str(p) for p in sorted(partitions)]
    known = set(instance.get_dynamic_partitions(partitions_def_name(mapping.topic)))
    instance.add_dynamic_partitions(partitions_def_name(mapping.topic), [k for k in keys if k not in known])
    job = build_definitions(config).resolve_job_def(ingest_job_name(mapping.table))
    return job.execute_in_process(instance=instance, raise_on_error=raise_on_error,
                                  tags={PARTITION_RANGE_START_TAG: keys[0], PARTITION_RANGE_END_TAG: keys[-1]})
