"""Fixtures for schema.mode off/lenient/strict: a real schema registry (http.server on loopback), ingest worlds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.schema_registry.conftest import RegistryServer


@pytest.fixture
def registry() -> Iterator[RegistryServer]:
    server = RegistryServer().start()
    yield server
    server.stop()


@pytest.fixture
def embedded_world(tmp_path, unique_prefix) -> IngestWorld:
    """A local segment directory, a sqlite catalog and warehouse, the sqlite offsets store."""
    return IngestWorld("embedded", tmp_path, unique_prefix, topic=f"pizzas-{unique_prefix}")


@pytest.fixture
def production_world(tmp_path, seaweedfs, etcd_server, unique_prefix) -> IngestWorld:
    """Segments in the SeaweedFS bucket, the SeaweedFS Iceberg REST catalog, offsets and leases in etcd."""
    return IngestWorld("production", tmp_path, unique_prefix, seaweedfs=seaweedfs,
                       etcd_endpoint=etcd_server.endpoint, topic=f"pizzas-{unique_prefix}")
