"""Where runs find the Spark engine and how it is started: pure logic, no server (the ingest through a real engine
is in test_engine_ingest.py)."""

from __future__ import annotations

import sys

import pytest

import kafscale_lakehouse.engine.spark.session as spark_module
from kafscale_lakehouse.config.spark_remote import parse_remote_url
from kafscale_lakehouse.engine.spark.engine import (
    CONNECT_SERVER_CLASS,
    SHARED_SESSION_ID,
    SPARK_REMOTE_VARIABLE,
    ConnectAddress,
    SparkEngineError,
    connect_server_command,
    connect_server_env,
    parse_engine_address,
    shared_session_url,
)
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse_tests.support.servers import free_ports


@pytest.mark.parametrize(("url", "expected"), [
    ("sc://127.0.0.1:15003", ConnectAddress("127.0.0.1", 15003)),
    ("sc://spark-engine.lakehouse.svc", ConnectAddress("spark-engine.lakehouse.svc", 15002)),
    ("sc://engine:15002/", ConnectAddress("engine", 15002)),
    ("sc://engine:15002/;user_id=runs", ConnectAddress("engine", 15002)),
])
def test_remote_urls(url, expected):
    assert parse_remote_url(url) == expected
    assert parse_remote_url(url).url == f"sc://{expected.host}:{expected.port}"


@pytest.mark.parametrize("url", ["http://engine:15002", "engine:15002", "sc://", "sc://engine:99999",
                                 "sc://engine:15002/db"])
def test_a_bad_remote_url_names_the_setting(url):
    with pytest.raises(ValueError, match=rf"^SPARK_REMOTE: {url!r} "):
        parse_remote_url(url, setting="SPARK_REMOTE")


@pytest.mark.parametrize(("url", "expected"), [
    ("sc://engine:15002", f"sc://engine:15002/;session_id={SHARED_SESSION_ID}"),
    ("sc://engine:15002/", f"sc://engine:15002/;session_id={SHARED_SESSION_ID}"),
    ("sc://engine:15002/;user_id=runs", f"sc://engine:15002/;user_id=runs;session_id={SHARED_SESSION_ID}"),
    ("sc://engine:15002/;session_id=0b7e3c1a-5d2f-4e8b-9a61-7c4d2e9f1b30",
     "sc://engine:15002/;session_id=0b7e3c1a-5d2f-4e8b-9a61-7c4d2e9f1b30"),
])
def test_runs_join_the_shared_session_unless_the_url_names_one(url, expected):
    assert shared_session_url(url) == expected
    assert parse_remote_url(shared_session_url(url)) == parse_remote_url(url)


@pytest.mark.parametrize("address", ["15002", ":15002", "host:", "host:0", "host:http"])
def test_a_bad_engine_address_is_refused(address):
    with pytest.raises(ValueError, match="--address"):
        parse_engine_address(address)


def test_a_loopback_engine_binds_only_loopback_and_runs_this_python():
    address = ConnectAddress("127.0.0.1", 15010)
    command = connect_server_command(address, "local[2]", {"spark.driver.memory": "2g"}, ui_enabled=False)
    env = connect_server_env({"SPARK_REMOTE": "sc://elsewhere:1", "PATH": "/bin"}, address)

    assert command[command.index("--class") + 1] == CONNECT_SERVER_CLASS
    assert command[command.index("--master") + 1] == "local[2]"
    settings = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "--conf")
    assert settings["spark.connect.grpc.binding.address"] == "127.0.0.1"  # Connect listens everywhere by default
    assert settings["spark.connect.grpc.binding.port"] == "15010"
    assert settings["spark.driver.bindAddress"] == settings["spark.driver.host"] == "127.0.0.1"
    assert settings["spark.driver.memory"] == "2g" and settings["spark.ui.enabled"] == "false"
    # The runs' shared session outlives idle hours (a dropped session id cannot be joined again).
    assert settings["spark.connect.session.manager.defaultSessionTimeout"] == "3650d"
    assert command[-1] == "spark-internal"
    # Its Python workers import this project; it is not a client of another engine.
    assert env["PYSPARK_PYTHON"] == sys.executable and env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert SPARK_REMOTE_VARIABLE not in env


def test_a_pod_engine_listens_on_every_interface_of_the_pod():
    command = connect_server_command(ConnectAddress("0.0.0.0", 15002), "local[4]", {})
    settings = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "--conf")

    assert settings["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert "spark.driver.bindAddress" not in settings


def test_spark_remote_wins_over_the_config_and_an_absent_engine_is_named(monkeypatch):
    closed_a, closed_b = free_ports(2)
    monkeypatch.setattr(spark_module, "ENGINE_WAIT_SECONDS", 0.5)
    monkeypatch.setenv(SPARK_REMOTE_VARIABLE, f"sc://127.0.0.1:{closed_a}")

    with pytest.raises(SparkEngineError, match=rf"^SPARK_REMOTE: no Spark engine accepts connections at "
                                                rf"sc://127.0.0.1:{closed_a} "):
        get_spark_session("local[2]", remote=f"sc://127.0.0.1:{closed_b}")

    monkeypatch.delenv(SPARK_REMOTE_VARIABLE)
    with pytest.raises(SparkEngineError, match=rf"^spark.remote: no Spark engine accepts connections at "
                                                rf"sc://127.0.0.1:{closed_b} "):
        get_spark_session("local[2]", remote=f"sc://127.0.0.1:{closed_b}")
    with pytest.raises(SparkEngineError, match=r"^SPARK_REMOTE: 'local\[2\]' is not a Spark Connect URL"):
        monkeypatch.setenv(SPARK_REMOTE_VARIABLE, "local[2]")
        get_spark_session("local[2]")
