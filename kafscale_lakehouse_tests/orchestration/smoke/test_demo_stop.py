"""`make demo`'s stop (scripts/run-demo.sh) cancels the runs in flight through scripts/cancel_demo_runs.py so that
none is recorded failed: a run whose worker was still starting when the demo stopped was marked canceling, and its
worker, once started, marked it failed ("started a new run worker while the run was already in state CANCELING")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import dagster as dg
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.execution.api import execute_run_iterator

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "cancel_demo_runs.py"


def load_canceller():
    spec = importlib.util.spec_from_file_location("cancel_demo_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dg.op
def land() -> None:
    pass


@dg.job
def demo_job() -> None:
    land()


def run_in(instance: dg.DagsterInstance, *events: DagsterEventType) -> str:
    run = instance.create_run_for_job(demo_job)
    for event_type in events:
        instance.report_dagster_event(DagsterEvent(event_type.value, job_name=demo_job.name), run.run_id)
    return run.run_id


def test_runs_in_flight_end_canceled_and_none_failed_even_when_a_worker_starts_after_the_stop():
    with dg.instance_for_test() as instance:
        starting = run_in(instance, DagsterEventType.PIPELINE_STARTING)
        started = run_in(instance, DagsterEventType.PIPELINE_STARTING, DagsterEventType.PIPELINE_START)
        not_started = run_in(instance)
        assert instance.get_run_by_id(starting).status == dg.DagsterRunStatus.STARTING

        load_canceller().cancel_runs_in_flight(instance)

        assert instance.get_run_by_id(started).status == dg.DagsterRunStatus.CANCELING  # the interrupt ends it
        assert instance.get_run_by_id(not_started).status == dg.DagsterRunStatus.CANCELED
        # The starting run's worker comes up after the stop, as a slow spawn does under load.
        list(execute_run_iterator(InMemoryJob(demo_job), instance.get_run_by_id(starting), instance))
        assert instance.get_run_by_id(starting).status == dg.DagsterRunStatus.CANCELED
        assert not instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
