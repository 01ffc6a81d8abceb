"""`ForkingRunLauncher` against a real code server (a gRPC server Dagster starts for a module, as `dagster dev` does):
runs are forked from one process that built the location's definitions once, a forked run is cancelled by
`terminate`, a reload of the location gets a new forker with the new code, and a location that cannot be forked from
safely launches its runs through the code server as the default launcher does."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget

from kafscale_lakehouse.local_processes import start_ticks
from kafscale_lakehouse.orchestration.forking_launcher import RUN_WORKER_PID_TAG, RUN_WORKER_START_TAG

pytestmark = pytest.mark.integration

LOCATION = "forked_location"
RUN_TIMEOUT_SECONDS = 120
LAUNCHER = {"run_launcher": {"module": "kafscale_lakehouse.orchestration.forking_launcher",
                             "class": "ForkingRunLauncher"}}

LOCATION_MODULE = '''
import os
import threading
import time

import dagster as dg

VERSION = {version!r}
BUILT_IN: list[int] = []  # the processes that built the definitions
if {start_thread!r}:
    threading.Thread(target=time.sleep, args=(3600,), name="poller", daemon=True).start()


@dg.op
def record(context: dg.OpExecutionContext) -> None:
    context.log_event(dg.AssetObservation(asset_key="probe", metadata={{
        "pid": os.getpid(), "parent": os.getppid(), "built_in": ",".join(map(str, BUILT_IN)), "version": VERSION}}))


@dg.op
def wait() -> None:
    time.sleep(300)


@dg.job
def probe() -> None:
    record()


@dg.job
def slow() -> None:
    wait()


@dg.definitions
def defs() -> dg.Definitions:
    BUILT_IN.append(os.getpid())
    return dg.Definitions(jobs=[probe, slow], executor=dg.in_process_executor)
'''


def write_location(directory: Path, *, version: str = "v1", start_thread: bool = False) -> None:
    (directory / f"{LOCATION}.py").write_text(LOCATION_MODULE.format(version=version, start_thread=start_thread))


@contextmanager
def deployment(directory: Path) -> Iterator[tuple[dg.DagsterInstance, WorkspaceProcessContext]]:
    with dg.instance_for_test(overrides=LAUNCHER) as instance, WorkspaceProcessContext(
        instance, ModuleTarget(module_name=LOCATION, attribute=None, working_directory=str(directory),
                               location_name=LOCATION)) as workspace:
        yield instance, workspace
        instance.run_launcher.dispose()


def launch(instance: dg.DagsterInstance, workspace: WorkspaceProcessContext, job_name: str) -> str:
    context = workspace.create_request_context()
    location = context.get_code_location(LOCATION)
    assert location is not None, context.get_code_location_error(LOCATION)
    remote_job = location.get_repository("__repository__").get_full_job(job_name)
    run = create_run_for_test(instance, job_name=job_name, remote_job_origin=remote_job.get_remote_origin(),
                              job_code_origin=remote_job.get_python_origin(), job_snapshot=remote_job.job_snapshot)
    instance.launch_run(run.run_id, context)
    return run.run_id


def wait_for(instance: dg.DagsterInstance, run_id: str, *statuses: dg.DagsterRunStatus) -> dg.DagsterRun:
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in statuses:
            return run
        time.sleep(0.2)
    messages = [entry.message for entry in instance.all_logs(run_id)]
    raise AssertionError(f"run {run_id} not in {statuses} after {RUN_TIMEOUT_SECONDS} s: {run.status}, {messages}")


def probe_of(instance: dg.DagsterInstance, run_id: str) -> dict[str, object]:
    observations = [entry.asset_observation
                    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION)]
    assert len(observations) == 1, observations
    return {key: value.value for key, value in observations[0].metadata.items()}


def engine_messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.message for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]


def test_runs_are_forked_from_one_process_that_built_the_definitions_once(tmp_path: Path) -> None:
    write_location(tmp_path)
    with deployment(tmp_path) as (instance, workspace):
        probes = []
        for _ in range(2):
            run_id = launch(instance, workspace, "probe")
            run = wait_for(instance, run_id, dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)
            assert run.status == dg.DagsterRunStatus.SUCCESS, engine_messages(instance, run_id)
            probe = probe_of(instance, run_id)
            assert probe["pid"] == int(run.tags[RUN_WORKER_PID_TAG])
            assert int(run.tags[RUN_WORKER_START_TAG]) > 0
            probes.append(probe)
        forker = probes[0]["parent"]
        # Both run workers are children of one process, which built the definitions; neither built them again.
        assert [p["parent"] for p in probes] == [forker, forker]
        assert [p["built_in"] for p in probes] == [str(forker), str(forker)]
        assert probes[0]["pid"] != probes[1]["pid"]


def test_a_forked_run_is_cancelled_by_terminate(tmp_path: Path) -> None:
    write_location(tmp_path)
    with deployment(tmp_path) as (instance, workspace):
        run_id = launch(instance, workspace, "slow")
        wait_for(instance, run_id, dg.DagsterRunStatus.STARTED)
        time.sleep(1)  # into the op
        assert instance.run_launcher.terminate(run_id)
        run = wait_for(instance, run_id, dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE,
                       dg.DagsterRunStatus.SUCCESS)
        assert run.status == dg.DagsterRunStatus.CANCELED, engine_messages(instance, run_id)


def test_terminate_signals_no_process_that_took_a_gone_workers_pid(tmp_path: Path) -> None:
    """A run whose worker died without ending it (killed) names a pid that another process may have by now: here a
    `sleep`, started at another time than the tags say. It is not interrupted; the run is marked canceling and the
    run's events say why."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        with dg.instance_for_test(overrides=LAUNCHER) as instance:
            run = create_run_for_test(instance, job_name="probe", status=dg.DagsterRunStatus.STARTED, tags={
                RUN_WORKER_PID_TAG: str(other.pid), RUN_WORKER_START_TAG: str(start_ticks(other.pid) - 1)})
            assert instance.run_launcher.terminate(run.run_id) is False
            assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELING
            assert any(f"pid {other.pid} is gone" in message for message in engine_messages(instance, run.run_id))
        time.sleep(0.5)
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()


def test_a_reloaded_location_gets_a_new_forker_with_its_new_code(tmp_path: Path) -> None:
    write_location(tmp_path, version="v1")
    with deployment(tmp_path) as (instance, workspace):
        first = launch(instance, workspace, "probe")
        wait_for(instance, first, dg.DagsterRunStatus.SUCCESS)
        write_location(tmp_path, version="v2")
        workspace.reload_code_location(LOCATION)
        second = launch(instance, workspace, "probe")
        wait_for(instance, second, dg.DagsterRunStatus.SUCCESS)
        before, after = probe_of(instance, first), probe_of(instance, second)
        assert (before["version"], after["version"]) == ("v1", "v2")
        assert before["parent"] != after["parent"]
        assert after["built_in"] == str(after["parent"])


def test_a_location_that_leaves_a_thread_running_launches_through_its_code_server(tmp_path: Path) -> None:
    write_location(tmp_path, start_thread=True)
    with deployment(tmp_path) as (instance, workspace):
        run_id = launch(instance, workspace, "probe")
        run = wait_for(instance, run_id, dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)
        assert run.status == dg.DagsterRunStatus.SUCCESS, engine_messages(instance, run_id)
        assert RUN_WORKER_PID_TAG not in run.tags
        probe = probe_of(instance, run_id)
        assert probe["built_in"] == str(probe["pid"])  # a run worker of its own, as the default launcher starts
        assert any("not forked" in message and "poller" in message for message in engine_messages(instance, run_id))

