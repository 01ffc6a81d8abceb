"""`make demo`'s canceller (scripts/run-demo.sh): started when stopping begins, since importing Dagster takes seconds;
once imported it reads one line from stdin, and on `cancel` cancels the runs in flight of $DAGSTER_HOME's instance
(`cancel_runs_in_flight`); anything else (end of input) leaves the runs alone."""

from __future__ import annotations

import sys

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

MESSAGE = "make demo is stopping"


def cancel_runs_in_flight(instance: DagsterInstance) -> None:
    """Runs whose worker executes (STARTED) are marked canceling: Dagster records them canceled, not failed, when the
    interrupt reaches them. Runs launched but not executing yet (STARTING: the worker may still be importing) and
    queued ones are canceled outright: a worker that starts after that does not execute the run, where one that
    found its run canceling marked it failed ("started a new run worker while the run was already in state
    CANCELING")."""
    for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED])):
        instance.report_run_canceling(run, message=MESSAGE)
    for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.QUEUED,
                                                      DagsterRunStatus.NOT_STARTED])):
        instance.report_run_canceled(run, message=MESSAGE)


if __name__ == "__main__":
    if sys.stdin.readline().strip() == "cancel":
        cancel_runs_in_flight(DagsterInstance.get())
