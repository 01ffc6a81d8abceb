"""Where serve-metrics listens: `--address`, then `$KAFSCALE_METRICS_ADDR`, then the Go processor's `:9093`."""

from __future__ import annotations

import signal
import socket

import pytest

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.apps.metrics_server import METRICS_ADDRESS_ENV, parse_metrics_address, resolve_metrics_address
from kafscale_lakehouse.config import ConfigError
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld


@pytest.mark.parametrize(("text", "expected"), [
    (":9093", ("", 9093)),  # all interfaces, as Go's ":9093"
    ("0.0.0.0:9100", ("0.0.0.0", 9100)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("metrics.local:80", ("metrics.local", 80)),
    ("[::]:9093", ("::", 9093)),
])
def test_addresses_in_go_form_are_accepted(text, expected):
    assert parse_metrics_address(text, source="--address") == expected


@pytest.mark.parametrize("text", ["9093", "localhost:", "localhost:http", ":65536", "::1:9093"])
def test_a_bad_address_is_an_error_naming_where_it_came_from(text):
    with pytest.raises(ConfigError) as raised:
        parse_metrics_address(text, source=METRICS_ADDRESS_ENV)

    assert str(raised.value).startswith(f"{METRICS_ADDRESS_ENV}: {text!r}")


def test_the_option_wins_over_the_environment_which_wins_over_the_default(monkeypatch):
    monkeypatch.delenv(METRICS_ADDRESS_ENV, raising=False)
    assert resolve_metrics_address(None) == ("", 9093)
    monkeypatch.setenv(METRICS_ADDRESS_ENV, "127.0.0.1:9200")
    assert resolve_metrics_address(None) == ("127.0.0.1", 9200)
    assert resolve_metrics_address(":9300") == ("", 9300)


@pytest.fixture
def keep_sigterm_handler():
    """The CLI installs its SIGTERM handler for its own process; pytest's is put back afterwards."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_cli_reports_a_bad_address_and_a_port_in_use_in_one_line(tmp_path, unique_prefix, capsys, monkeypatch,
                                                                  keep_sigterm_handler):
    config_path = IngestWorld("embedded", tmp_path, unique_prefix, f"orders-{unique_prefix}").write_config_file()
    monkeypatch.setenv(METRICS_ADDRESS_ENV, "no-port")

    assert cli.main(["serve-metrics", "--config", str(config_path)]) == 2
    assert capsys.readouterr().err == (f"error: {METRICS_ADDRESS_ENV}: 'no-port' is not HOST:PORT or :PORT with a "
                                       "port 0-65535 (e.g. :9093)\n")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve-metrics", "--config", str(config_path), "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
