"""Session fixtures: the real servers of shared/infra.md, started once per test run, and shared paths."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale_lakehouse.apps.warm_cli import WARM_CLI_VARIABLE
from kafscale_lakehouse.engine.spark.engine import (
    CLASS_ARCHIVE_VARIABLE,
    ConnectAddress,
    start_connect_server,
    stop_connect_server,
)
from kafscale_lakehouse.engine.spark.local_engine import AUTO_ENGINE_VARIABLE
from kafscale_lakehouse_tests.support.servers import Etcd, SeaweedFS, free_ports

# Tests choose their Spark (the `spark` session, the `spark_engine`); the CLI and Dagster runs they start would
# otherwise start local engines that outlive the test (engine/spark/local_engine.py; its own tests turn it on).
os.environ[AUTO_ENGINE_VARIABLE] = "0"
# Nor the warm `ingest --once` process (apps/warm_cli.py, off unless a user's environment turns it on; its own
# tests turn it on).
os.environ[WARM_CLI_VARIABLE] = "0"
# Nor a class-data archive written by every local engine as it stops (engine/spark/engine.py; its own test turns it
# on): up to minutes of a stopping engine on a busy machine.
os.environ[CLASS_ARCHIVE_VARIABLE] = "0"

REPO_ROOT = Path(__file__).resolve().parent.parent
# Files the tests read, kept in the repository (fixtures/README.md): golden segments, the Dagster chart's schemas.
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_SEGMENTS = FIXTURES / "segments"

# Fixtures that start a real server (or need one): a test that uses any of them, directly or through another
# fixture, is an integration test. Modules that start servers of their own mark themselves.
SERVER_FIXTURES = frozenset({"seaweedfs", "etcd_server", "spark", "private_etcd", "registry", "store",
                               "spark_engine", "spark_engine_server", "kafscale_broker"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def signal_handlers_restored() -> Iterator[None]:
    """Each test ends with this process's handlers of the signals that end a process as it found them: a handler that
    code run in-process installs (the CLI's SIGTERM, the warm client's forwarding, a library's SIGINT) must not decide
    what a later test's Ctrl-C or SIGTERM does (pytest-xdist's processes run the modules in another order)."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(scope="session")
def fixture_segments_dir() -> Path:
    if not FIXTURE_SEGMENTS.is_dir():
        pytest.fail(f"golden fixtures not found at {FIXTURE_SEGMENTS}: the repository's checkout is incomplete")
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


def _close_connect_clients() -> None:
    """Close this process's Spark Connect clients while their engine still answers: an open client's exit handler
    retries the stopped engine for minutes and holds the test process (and CI) at exit."""
    from pyspark.sql.connect.client import SparkConnectClient

    for found in gc.get_objects():
        try:
            client = found if isinstance(found, SparkConnectClient) else None
        except ReferenceError:  # a weakref.proxy whose object is gone: isinstance reads its __class__
            continue
        if client is not None and not client.is_closed:
            client.close()


@pytest.fixture(scope="session")
def spark_engine_server(tmp_path_factory) -> Iterator[tuple[ConnectAddress, subprocess.Popen]]:
    """A real Spark engine (Spark Connect server) for the test run: loopback, a free port, stopped at the end. Its
    process for the tests that hang it (SIGSTOP to its group); the others take `spark_engine`."""
    [port] = free_ports(1)
    address = ConnectAddress("127.0.0.1", port)
    log_path = tmp_path_factory.mktemp("spark-engine") / "engine.log"
    server = start_connect_server(address, "local[2]", {"spark.sql.shuffle.partitions": "2"}, ui_enabled=False,
                                  log_path=log_path)
    yield address, server
    _close_connect_clients()
    stop_connect_server(server)
    with pytest.raises(ProcessLookupError):  # JVM and Python workers are gone, nothing left listening
        os.killpg(server.pid, 0)


@pytest.fixture(scope="session")
def spark_engine(spark_engine_server) -> ConnectAddress:
    return spark_engine_server[0]


@contextlib.contextmanager
def hung(engine: subprocess.Popen) -> Iterator[None]:
    """The Spark engine stopped (SIGSTOP to its group: it accepts connections and never answers), continued after."""
    os.killpg(engine.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(engine.pid, signal.SIGCONT)


def pytest_configure(config: pytest.Config) -> None:
    """One fault-matrix seed for the whole test run: pytest-xdist's workers inherit this environment and must collect
    the same sample of cases (a seed of their own each would differ, and xdist refuses the run). And the repository on
    the path of every process a test starts."""
    from kafscale_lakehouse_tests.engine.faults.matrix import SEED_VARIABLE

    os.environ.setdefault(SEED_VARIABLE, str(time.time_ns() % 1_000_000))
    # The wheel and the editable install hold the product package only; the processes the tests start (Spark engines
    # and their Python workers, held runs, CLIs) import test modules too (a function a job pickles by reference).
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, paths)])


def pytest_report_header(config: pytest.Config) -> str:
    """The fault matrix's seed and sample, so a failing case can be run again (engine/faults/matrix.py)."""
    from kafscale_lakehouse_tests.engine.faults.matrix import selection

    return selection().describe()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The seed again at the end: `-q` (CI's `make test`) prints no header."""
    ran = [r for reports in terminalreporter.stats.values() for r in reports
           if "engine/faults/" in getattr(r, "nodeid", "")]
    if ran:
        from kafscale_lakehouse_tests.engine.faults.matrix import selection

        terminalreporter.write_line(selection().describe())
