"""`errors_total{stage="discover"}`: the broker metadata snapshot that ingest runs would fail on, counted by
serve-metrics against a real etcd (its own: the snapshot key is global) and the SeaweedFS catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.storage import METADATA_SNAPSHOT_KEY
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.support.servers import Etcd

pytestmark = pytest.mark.integration

MAIN_SNAPSHOT = Path(__file__).parents[2] / "storage" / "fixtures" / "metadata_snapshot_main.json"


@pytest.fixture(scope="module")
def own_etcd(tmp_path_factory) -> Etcd:
    server = Etcd(tmp_path_factory.mktemp("metrics-etcd")).start()
    yield server
    server.stop()


def discover_errors(world: IngestWorld, mode: str, snapshot: bytes | None) -> list[float | None]:
    """`errors_total{stage="discover"}` over two scrapes with this snapshot in etcd (None: no snapshot)."""
    with EtcdClient([world.etcd_endpoint]) as client:
        if snapshot is None:
            client.delete(METADATA_SNAPSHOT_KEY)
        else:
            client.put(METADATA_SNAPSHOT_KEY, snapshot)
    document = world.config_document()
    document["discovery"]["mode"] = mode
    collector = LakehouseStateCollector(world.config(document))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        return [registry.get_sample_value("kafscale_processor_errors_total", {"stage": "discover"}) for _ in (1, 2)]
    finally:
        collector.close()


def test_discover_errors_count_the_snapshots_runs_cannot_use(tmp_path, seaweedfs, own_etcd, unique_prefix, caplog):
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=own_etcd.endpoint)
    main_shape = MAIN_SNAPSHOT.read_bytes()
    assert discover_errors(world, "etcd", main_shape) == [0, 0]  # today's broker: readable
    assert discover_errors(world, "auto", main_shape) == [0, 0]
    assert discover_errors(world, "etcd", None) == [1, 2]  # etcd mode: every run would fail
    assert discover_errors(world, "auto", None) == [0, 0]  # auto: runs list S3, as Go does
    malformed = json.dumps({"Topics": [{"Topic": "orders", "ErrorCode": "none"}]}).encode()
    assert discover_errors(world, "auto", malformed) == [1, 2]  # auto: runs fall back with a warning; counted here
    assert "Topics[0].ErrorCode" in caplog.text
    # Without etcd discovery the stage is not reported at all (as Go, which never increments it then).
    assert discover_errors(world, "s3", None) == [None, None]
