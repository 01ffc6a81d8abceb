"""A run the sensor requested that failed (a transient error) is requested again after a backoff that grows per
consecutive failure; a run that succeeded without progress, or was canceled, is not requested again."""

from __future__ import annotations

import json
import uuid

import dagster as dg

from kafscale_lakehouse.orchestration.naming import ingest_job_name
from kafscale_lakehouse.orchestration.sensors import (
    PLANNED_RANGES_TAG,
    RETRY_BACKOFF_CAP_SECONDS,
    SENSOR_REQUEST_TAG,
    retry_backoff_seconds,
)
from kafscale_lakehouse_tests.orchestration.sensors.conftest import POLL_INTERVAL_SECONDS, SensorWorld


def launch(world: SensorWorld, request: dg.RunRequest, status: dg.DagsterRunStatus) -> tuple[str, float]:
    """The run the daemon launches for `request`, ended with `status`: (run id, its end time)."""
    run = dg.DagsterRun(job_name=ingest_job_name(world.mapping.table), run_id=str(uuid.uuid4()),
                        tags=dict(request.tags), status=dg.DagsterRunStatus.STARTED)
    world.instance.add_run(run)
    if status == dg.DagsterRunStatus.FAILURE:
        world.instance.report_run_failed(run, "etcd unavailable")
    else:
        world.instance.handle_run_event(run.run_id, dg.DagsterEvent(
            event_type_value=(dg.DagsterEventType.RUN_SUCCESS if status == dg.DagsterRunStatus.SUCCESS
                              else dg.DagsterEventType.RUN_CANCELED).value, job_name=run.job_name))
    [record] = world.instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))
    assert record.dagster_run.status == status and record.end_time is not None
    return run.run_id, record.end_time


def test_a_failed_run_is_requested_again_after_a_growing_backoff_until_one_succeeds(embedded_world):
    world = embedded_world
    world.producer(partitions=1).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    first = world.tick()
    [request] = first.run_requests
    failed_run, failed_at = launch(world, request, dg.DagsterRunStatus.FAILURE)

    waiting = world.tick(first.cursor, at=failed_at + 1)
    assert waiting.run_requests == []
    assert (f"run {failed_run} failed (attempt 1); requested again in {POLL_INTERVAL_SECONDS - 1} s (backoff "
            f"{POLL_INTERVAL_SECONDS} s)") in waiting.skip_message

    retry = world.tick(waiting.cursor, at=failed_at + POLL_INTERVAL_SECONDS)
    [again] = retry.run_requests
    assert again.tags[PLANNED_RANGES_TAG] == request.tags[PLANNED_RANGES_TAG]
    assert again.tags[SENSOR_REQUEST_TAG] != request.tags[SENSOR_REQUEST_TAG]
    assert world.cursor_of(retry).request.attempt == 2

    # The retry failed too: the backoff doubles.
    _, failed_again_at = launch(world, again, dg.DagsterRunStatus.FAILURE)
    doubled = world.tick(retry.cursor, at=failed_again_at + POLL_INTERVAL_SECONDS)
    assert doubled.run_requests == [] and f"(backoff {2 * POLL_INTERVAL_SECONDS} s)" in doubled.skip_message
    third = world.tick(doubled.cursor, at=failed_again_at + 2 * POLL_INTERVAL_SECONDS)
    [third_request] = third.run_requests
    assert world.cursor_of(third).request.attempt == 3

    # It succeeded without ingesting them (nothing it could land): never requested again for this state.
    succeeded_run, succeeded_at = launch(world, third_request, dg.DagsterRunStatus.SUCCESS)
    idle = world.tick(third.cursor, at=succeeded_at + 10 * RETRY_BACKOFF_CAP_SECONDS)
    assert idle.run_requests == []
    assert (f"run {succeeded_run} requested for exactly these pending segments succeeded without committing "
            "anything") in idle.skip_message

    # New segments are a new state: requested at once, as the first attempt.
    world.producer(partitions=1).produce_round(now_ms=1_700_000_001_000, interval_ms=1000)
    grown = world.tick(idle.cursor, at=succeeded_at + 1)
    assert len(grown.run_requests) == 1 and world.cursor_of(grown).request.attempt == 1


def test_a_canceled_run_is_not_retried_and_a_request_that_launched_no_run_is(embedded_world):
    world = embedded_world
    world.producer(partitions=1).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    first = world.tick()
    requested_at = world.cursor_of(first).request.requested_at

    # The daemon launched no run for it (the launch failed, or the run was deleted): requested again after backoff.
    assert world.tick(first.cursor, at=requested_at + 1).run_requests == []
    relaunched = world.tick(first.cursor, at=requested_at + POLL_INTERVAL_SECONDS)
    [request] = relaunched.run_requests

    canceled_run, canceled_at = launch(world, request, dg.DagsterRunStatus.CANCELED)
    canceled = world.tick(relaunched.cursor, at=canceled_at + RETRY_BACKOFF_CAP_SECONDS)
    assert canceled.run_requests == []
    assert f"run {canceled_run} requested for exactly these pending segments was canceled" in canceled.skip_message


def test_the_backoff_doubles_per_failure_up_to_the_cap():
    assert [retry_backoff_seconds(5, n) for n in range(1, 5)] == [5, 10, 20, 40]
    assert retry_backoff_seconds(5, 30) == RETRY_BACKOFF_CAP_SECONDS


def test_a_cursor_written_before_requests_were_recorded_still_reads_and_does_not_loop(embedded_world):
    world = embedded_world
    world.producer(partitions=1).produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    first = world.tick()
    document = json.loads(first.cursor)
    document["partitions"] = {p: state[:2] for p, state in document["partitions"].items()}  # [key, end]
    del document["request"]

    again = world.tick(json.dumps(document))

    assert again.run_requests == [] and "already requested" in again.skip_message
