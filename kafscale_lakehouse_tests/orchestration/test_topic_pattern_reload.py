"""`dagster dev` (webserver, daemon, code server) on a `topic_pattern` mapping: a topic created while it runs gets its
table asset without a restart, because the pattern sensor asks the webserver to reload the code location.

The topics hold no segment, so no ingest run (and no Spark) is launched: only the definitions are under test.
"""

from __future__ import annotations

import os
import time
import urllib.error

import pytest
import yaml

from kafscale_lakehouse.orchestration.dagster_home import write_dagster_home
from kafscale_lakehouse.orchestration.topic_patterns import WEBSERVER_URL_ENV_VAR
from kafscale_lakehouse_tests.orchestration.smoke.test_dagster_dev import (
    BIN,
    REPO_ROOT,
    DagsterDev,
    _start,
    _stop,
    _tail,
)
from kafscale_lakehouse_tests.support.servers import free_ports

pytestmark = pytest.mark.integration

ASSETS_QUERY = "{ assetNodes { assetKey { path } } }"
RELOAD_TIMEOUT_SECONDS = 240


def table_assets(dev: DagsterDev) -> set[str]:
    return {"/".join(node["assetKey"]["path"]) for node in dev.graphql(ASSETS_QUERY)["assetNodes"]
            if node["assetKey"]["path"][0] == "raw"}


def test_a_topic_created_while_dagster_dev_runs_gets_its_asset_through_a_reload(tmp_path):
    segments = tmp_path / "segments" / "dev"
    (segments / "t-one" / "0").mkdir(parents=True)
    (tmp_path / "lakehouse.yaml").write_text(yaml.safe_dump({
        "segments": {"local_root": "segments"}, "s3": {"namespace": "dev"},
        "iceberg": {"catalog": {"type": "sql", "uri": "sqlite:///catalog.db"}, "warehouse": "warehouse"},
        "offsets": {"backend": "local", "local_path": "offsets.db"}, "discovery": {"mode": "s3"},
        "mappings": [{"topic_pattern": "t-.*", "table": "raw.{topic}", "create_table_if_missing": True,
                      "maintenance": {"enabled": False}}],
    }))
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    write_dagster_home(dagster_home, REPO_ROOT / "dagster.yaml")  # as `make demo`
    [port] = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home),
           "KAFSCALE_LAKEHOUSE_CONFIG": str(tmp_path / "lakehouse.yaml"), WEBSERVER_URL_ENV_VAR: url}
    log_path = tmp_path / "dagster.log"
    process = _start([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port),
                      "-m", "kafscale_lakehouse.definitions"], tmp_path, env, log_path)
    dev = DagsterDev(url)
    try:
        deadline = time.monotonic() + RELOAD_TIMEOUT_SECONDS
        while True:
            try:
                assert table_assets(dev) == {"raw/t_dash_one"}
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, f"dagster dev did not answer:\n{_tail(log_path)}"
                time.sleep(2)

        (segments / "t-two" / "0").mkdir(parents=True)  # the topic appears
        while table_assets(dev) != {"raw/t_dash_one", "raw/t_dash_two"}:
            assert time.monotonic() < deadline, f"no asset for t-two:\n{_tail(log_path)}"
            time.sleep(3)
        log = log_path.read_text(errors="replace")
        assert "new topics 't-two' (mappings[0].topic_pattern): asked the webserver" in log
    finally:
        _stop(process)
