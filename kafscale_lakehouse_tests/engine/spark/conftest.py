"""A real Spark engine (Spark Connect server) for the test run: loopback, a free port, stopped at the end."""

from __future__ import annotations

import gc
import os

import pytest

from kafscale_lakehouse.engine.spark.engine import ConnectAddress, start_connect_server, stop_connect_server
from kafscale_lakehouse.testing.servers import free_ports


def _close_connect_clients() -> None:
    """Close this process's Spark Connect clients while their engine still answers: an open client's exit handler
    retries the stopped engine for minutes and holds the test process (and CI) at exit."""
    from pyspark.sql.connect.client import SparkConnectClient

    for client in [o for o in gc.get_objects() if isinstance(o, SparkConnectClient)]:
        if not client.is_closed:
            client.close()


@pytest.fixture(autouse=True)
def embedded_functions_after_each_test():
    """A client of the engine switches `pyspark.sql.functions` to Spark Connect for its process
    (engine/spark/session.py); the tests after each of these use the embedded session again."""
    yield
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture(scope="session")
def spark_engine(tmp_path_factory) -> ConnectAddress:
    [port] = free_ports(1)
    address = ConnectAddress("127.0.0.1", port)
    log_path = tmp_path_factory.mktemp("spark-engine") / "engine.log"
    server = start_connect_server(address, "local[2]", {"spark.sql.shuffle.partitions": "2"}, ui_enabled=False,
                                  log_path=log_path)
    yield address
    _close_connect_clients()
    stop_connect_server(server)
    with pytest.raises(ProcessLookupError):  # JVM and Python workers are gone, nothing left listening
        os.killpg(server.pid, 0)
