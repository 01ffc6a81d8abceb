"""Fixtures for the ingest-run tests: a world per test on the shared servers, and the CLI run in this process."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld


@pytest.fixture
def production_world(tmp_path, seaweedfs, etcd_server, unique_prefix) -> IngestWorld:
    """Segments in the SeaweedFS bucket, the SeaweedFS Iceberg REST catalog, offsets and leases in etcd."""
    return IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                       etcd_endpoint=etcd_server.endpoint)


@pytest.fixture
def embedded_world(tmp_path, unique_prefix) -> IngestWorld:
    """A local segment directory, a sqlite catalog and warehouse, the sqlite offsets store."""
    return IngestWorld("embedded", tmp_path, unique_prefix, f"orders-{unique_prefix}")


@pytest.fixture
def cli_main(spark):
    """`kafscale-lakehouse` in this process (it reuses the shared Spark session); returns the exit code. (The SIGTERM
    handler the CLI installs is put back after the test by the root conftest's `signal_handlers_restored`.)"""
    return lambda *args: cli.main(list(args))
