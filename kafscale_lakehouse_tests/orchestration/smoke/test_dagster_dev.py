"""Smoke test of the embedded demo: `dagster dev` (webserver + daemon) on lakehouse.yaml next to the demo producer.

Everything runs in a temporary directory with its own DAGSTER_HOME, on a free loopback port. The sensor must launch
an ingest run that succeeds, with one materialization per Kafka partition and every asset check passing, all read
back through the webserver's GraphQL API; the sensor's observation of the topic must be there too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale_lakehouse.apps.workload import PIZZA_TOPIC
from kafscale_lakehouse.engine.tables.checks import CHECK_NAMES
from kafscale_lakehouse.orchestration.dagster_home import write_dagster_home
from kafscale_lakehouse.orchestration.forking_launcher import RUN_WORKER_PID_TAG
from kafscale_lakehouse.orchestration.naming import ingest_job_name
from kafscale_lakehouse.orchestration.sensors import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG, sensor_name
from kafscale_lakehouse_tests.support.servers import free_ports

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
TABLE = "rpc.pizzas"
PARTITIONS = 3
RUN_TIMEOUT_SECONDS = 240
STOP_GRACE_SECONDS = 30

RUNS_QUERY = """
query Runs($job: String!) {
  runsOrError(filter: {pipelineName: $job}) {
    __typename
    ... on Runs { results { runId status tags { key value } } }
  }
}"""
RUN_FAILURE_QUERY = """
query Failure($runId: ID!) {
  logsForRun(runId: $runId) {
    ... on EventConnection { events { __typename ... on MessageEvent { message }
                                      ... on ExecutionStepFailureEvent { error { message } } } }
  }
}"""
MATERIALIZATIONS_QUERY = """
query Materializations($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: 50) {
        runId partition
        metadataEntries { label ... on IntMetadataEntry { intValue } }
      }
      assetObservations(limit: 1) { metadataEntries { label ... on IntMetadataEntry { intValue } } }
    }
  }
}"""
CHECKS_QUERY = """
query Checks($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks { name } } } }
  }
}"""
CHECK_EXECUTIONS_QUERY = """
query Executions($path: [String!]!, $check: String!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $check, limit: 10) {
    runId status evaluation { success description }
  }
}"""


@dataclass
class DagsterDev:
    url: str

    def graphql(self, query: str, **variables) -> dict:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert "errors" not in answer, f"GraphQL errors: {answer['errors']}"
        return answer["data"]


def _start(command: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    # A session of its own, so stopping the process group also stops dagster's code servers and run workers.
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    """Ctrl-C for the whole process group, as in a terminal; SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_SECONDS), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            os.killpg(process.pid, 0)  # children left behind?
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
        time.sleep(1)


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def demo(tmp_path):
    """`dagster dev` and the demo producer in `tmp_path`, stopped at the end."""
    shutil.copy(REPO_ROOT / "lakehouse.yaml", tmp_path / "lakehouse.yaml")
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    write_dagster_home(dagster_home, REPO_ROOT / "dagster.yaml")  # as `make demo`
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home),
           "KAFSCALE_LAKEHOUSE_CONFIG": str(tmp_path / "lakehouse.yaml"),
           "KAFSCALE_SPARK_CONF_UI": "spark.ui.enabled=false"}
    producer_command = [str(BIN / "kafscale-lakehouse"), "demo-producer", "--partitions", str(PARTITIONS),
                        "--interval-seconds", "2", "--records-per-segment", "20"]
    # As `make demo`: one round first, so the topic exists when the definitions load.
    subprocess.run([*producer_command, "--rounds", "1"], cwd=tmp_path, env=env, check=True, timeout=60,
                   capture_output=True)
    [port] = free_ports(1)
    processes = [
        _start(producer_command, tmp_path, env, tmp_path / "producer.log"),
        _start([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port),
                "-m", "kafscale_lakehouse.definitions"], tmp_path, env, tmp_path / "dagster.log"),
    ]
    try:
        yield DagsterDev(f"http://127.0.0.1:{port}"), tmp_path
    finally:
        for process in reversed(processes):
            _stop(process)


def _wait_for_sensor_run(dev: DagsterDev, log_path: Path) -> dict:
    """The first run of the ingest job, once it finished; fails with its error if it failed."""
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    runs: list[dict] = []
    while time.monotonic() < deadline:
        try:
            answer = dev.graphql(RUNS_QUERY, job=ingest_job_name(TABLE))["runsOrError"]
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(2)  # the webserver is still starting
            continue
        runs = answer.get("results", [])
        finished = [run for run in runs if run["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
        if finished:
            run = finished[-1]  # the oldest finished run
            if run["status"] != "SUCCESS":
                events = dev.graphql(RUN_FAILURE_QUERY, runId=run["runId"])["logsForRun"]["events"]
                errors = [e.get("error", {}).get("message") or e.get("message") for e in events
                          if e["__typename"] in ("ExecutionStepFailureEvent", "RunFailureEvent")]
                pytest.fail(f"run {run['runId']} ended {run['status']}: {errors}")
            return run
        time.sleep(2)
    pytest.fail(f"no finished run of {ingest_job_name(TABLE)} within {RUN_TIMEOUT_SECONDS}s (runs: {runs}); "
                f"dagster dev log:\n{_tail(log_path)}")


def test_dagster_dev_sensor_launches_a_run_whose_materializations_and_checks_pass(demo):
    dev, directory = demo
    run = _wait_for_sensor_run(dev, directory / "dagster.log")

    tags = {tag["key"]: tag["value"] for tag in run["tags"]}
    assert tags["dagster/sensor_name"] == sensor_name(TABLE)
    assert (tags[PARTITION_RANGE_START_TAG], tags[PARTITION_RANGE_END_TAG]) == ("0", str(PARTITIONS - 1))
    assert RUN_WORKER_PID_TAG not in tags  # launched by Dagster's own launcher (the forking one is an opt-in)

    path = TABLE.split(".")
    asset = dev.graphql(MATERIALIZATIONS_QUERY, path=path)["assetOrError"]
    in_run = [m for m in asset["assetMaterializations"] if m["runId"] == run["runId"]]
    assert sorted(m["partition"] for m in in_run) == [str(p) for p in range(PARTITIONS)]
    for materialization in in_run:
        records = {e["label"]: e.get("intValue") for e in materialization["metadataEntries"]}["records"]
        assert records >= 20 and records % 20 == 0  # whole segments of 20 orders

    checks = dev.graphql(CHECKS_QUERY, path=path)["assetNodeOrError"]["assetChecksOrError"]["checks"]
    assert sorted(check["name"] for check in checks) == sorted(CHECK_NAMES)
    for name in CHECK_NAMES:
        executions = dev.graphql(CHECK_EXECUTIONS_QUERY, path=path, check=name)["assetCheckExecutions"]
        [execution] = [e for e in executions if e["runId"] == run["runId"]]
        assert execution["status"] == "SUCCEEDED", f"check {name}: {execution}"
        assert execution["evaluation"]["success"] is True

    topic = dev.graphql(MATERIALIZATIONS_QUERY, path=["kafscale", PIZZA_TOPIC])["assetOrError"]
    [observation] = topic["assetObservations"]
    assert "lag" in {entry["label"] for entry in observation["metadataEntries"]}
