"""Session fixtures: the real servers of shared/infra.md, started once per test run, and shared paths."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from kafscale_lakehouse.testing.servers import Etcd, SeaweedFS

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("KAFSCALE_SHARED_DIR", REPO_ROOT.parent / "shared"))
FIXTURE_SEGMENTS = SHARED / "fixtures" / "segments"

# Fixtures that start a real server (or need one): a test that uses any of them, directly or through another
# fixture, is an integration test. Modules that start servers of their own mark themselves.
SERVER_FIXTURES = frozenset({"seaweedfs", "etcd_server", "spark", "private_etcd", "registry", "store"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def fixture_segments_dir() -> Path:
    if not FIXTURE_SEGMENTS.is_dir():
        pytest.fail(f"golden fixtures not found at {FIXTURE_SEGMENTS} (set KAFSCALE_SHARED_DIR)")
    return FIXTURE_SEGMENTS


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> SeaweedFS:
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory) -> Etcd:
    server = Etcd(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture
def unique_prefix() -> str:
    """A key prefix no other test uses, so tests can share one server."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafscale-lakehouse-tests")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()
