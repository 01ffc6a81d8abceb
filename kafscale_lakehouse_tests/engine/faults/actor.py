"""One actor of a fault-matrix case in a process of its own, held or killed at a named interleaving point.

    python -m kafscale_lakehouse_tests.engine.faults.actor <actor> <point> <action> <signal dir> -- <CLI arguments>

Test-only: production code has no fault hooks, so this wraps, by module attribute (as `mock.patch` would), the
functions the actor's command calls, then hands over to the CLI's `main()`. The first time the actor reaches the
point it writes `<signal dir>/reached` and then, by `action`:
- `kill`: SIGKILL itself (leases, run records and written files stay as a crash leaves them);
- `pause`: waits for `<signal dir>/go` (its lease keeper keeps renewing), then goes on;
- `freeze`: SIGSTOPs itself, lease keeper included, so its leases expire while it still "runs" (a worker declared
  dead but alive); the test SIGCONTs it;
- `unknown` (only `inside-*`): the catalog applied the commit, the answer is lost: raises pyiceberg's
  `CommitStateUnknownException` (what a 5xx answer raises) and goes on;
- `late` (only `inside-*`): the answer is lost at once (`CommitStateUnknownException`) and the catalog applies the
  commit only when `<signal dir>/go` appears (a request stuck in a proxy or a catalog's queue): the run ends, the
  process stays until then, and writes `<signal dir>/applied` or `<signal dir>/refused`.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException

import kafscale_lakehouse.engine.ingestion.replay as replay
import kafscale_lakehouse.engine.ingestion.run as run
import kafscale_lakehouse.engine.maintenance as maintenance
import kafscale_lakehouse.engine.spark.writes as spark_writes
import kafscale_lakehouse.engine.tables.upserts as upserts
from kafscale_lakehouse.apps import cli

log = logging.getLogger("kafscale_lakehouse_tests.engine.faults.actor")

ACTIONS = ("kill", "pause", "freeze", "unknown", "late")
COMMIT_ONLY_ACTIONS = ("unknown", "late")
PAUSE_LIMIT_SECONDS = 600

# Where each point is, per actor: (module, attribute, "before" | "after" the call). `inside-commit` is the catalog's
# commit of the actor's table commit (see `_install_inside_commit`).
POINTS: dict[str, dict[str, tuple[Any, str, str]]] = {
    "ingest": {
        "before-lease": (run, "acquire_partition_leases", "before"),
        "during-cleanup": (run, "clean_ended_runs", "before"),
        "after-plan": (run, "_plan", "after"),
        "after-write": (run, "_write", "after"),
        "before-commit": (run, "commit_append", "before"),
        "inside-commit": (run, "commit_append", "inside"),
        "after-commit": (run, "commit_append", "after"),
        "before-forget": (run.PreparedIngest, "forget_run", "before"),
    },
    # `publish: audited` (engine/tables/audit.py): the commit goes to the audit branch, then the checks run on it and
    # `publish_audit` fast-forwards main (`inside-publish`: the catalog applied the fast-forward, the answer not back)
    "ingest-audited": {
        "before-commit": (run, "commit_append", "before"),
        "inside-commit": (run, "commit_append", "inside"),
        "after-commit": (run, "commit_append", "after"),
        "before-publish": (run, "publish_audit", "before"),
        "inside-publish": (run, "publish_audit", "inside"),
        "after-publish": (run, "publish_audit", "after"),
    },
    "replay": {
        "before-lease": (replay, "_lease", "before"),
        "after-write": (replay, "run_ingestion_spark_job", "after"),
        "before-commit": (replay, "commit_rewrite", "before"),
        "inside-commit": (replay, "commit_rewrite", "inside"),
        "after-commit": (replay, "commit_rewrite", "after"),
    },
    "move-back": {
        "before-lease": (replay, "_lease", "before"),
        "before-commit": (replay, "commit_rewrite", "before"),
        "inside-commit": (replay, "commit_rewrite", "inside"),
        "after-commit": (replay, "commit_rewrite", "after"),
    },
    "compact": {
        "after-write": (maintenance, "run_rewrite_job", "after"),
        "before-commit": (maintenance, "commit_rewrite", "before"),
        "inside-commit": (maintenance, "commit_rewrite", "inside"),
        "after-commit": (maintenance, "commit_rewrite", "after"),
    },
    "manifests": {
        "before-commit": (maintenance, "commit_rewrite", "before"),
        "inside-commit": (maintenance, "commit_rewrite", "inside"),
        "after-commit": (maintenance, "commit_rewrite", "after"),
    },
    "expire": {
        "before-commit": (maintenance, "expire_planned_snapshots", "before"),
        "inside-commit": (maintenance, "expire_planned_snapshots", "inside"),
        "after-commit": (maintenance, "expire_planned_snapshots", "after"),
    },
    "orphans": {
        "after-listing": (maintenance, "_list_files", "after"),
    },
}

# Actors that are no primary of the fault matrix (its invariants are an append table's). `upsert`: `ingest` of an upsert
# mapping (mode upsert, engine/upsert/ kills it): its commit reads the run's files (and deletes them), writes the
# rewritten files and the new rows (`after-rewrite`), then commits one overwrite snapshot.
OTHER_POINTS: dict[str, dict[str, tuple[Any, str, str]]] = {
    # A batch of tables sharing a dead-letter table, landed as `land_tables` lands them (batch_run.py, command
    # `land-batch <config>`): the first table to reach a point holds or kills the whole process.
    "batch": {
        "before-lease": (run, "acquire_partition_leases", "before"),
        "after-write": (run, "run_batch_spark_job", "after"),
        "before-commit": (run, "commit_append", "before"),
        "inside-commit": (run, "commit_append", "inside"),
        "after-commit": (run, "commit_append", "after"),
        "before-forget": (run.PreparedIngest, "forget_run", "before"),
    },
    "upsert": {
        "before-lease": (run, "acquire_partition_leases", "before"),
        "during-cleanup": (run, "clean_ended_runs", "before"),
        "after-plan": (run, "_plan", "after"),
        "after-write": (run, "_write", "after"),
        "before-commit": (run, "commit_upsert", "before"),
        "after-rewrite": (upserts, "commit_rewrite", "before"),
        "inside-commit": (upserts, "commit_rewrite", "inside"),
        "after-commit": (run, "commit_upsert", "after"),
        "before-forget": (run.PreparedIngest, "forget_run", "before"),
    },
    # A downstream asset's materialization by the Iceberg IO manager (io_run.py, command `materialize <spec>
    # <partition>`): the table prepared (`before-write`), the DataFrame's files written (`after-write`), an upsert's
    # plan made and its files rewritten (`after-rewrite`), the commit, the commit returned (`after-commit`: the
    # materialization is not recorded yet).
    "io": {
        "before-write": (spark_writes, "prepare_table", "after"),
        "after-write": (spark_writes, "commit_files", "before"),
        "after-rewrite": (upserts, "commit_rewrite", "before"),
        "inside-commit": (spark_writes, "commit_files", "inside"),
        "after-commit": (spark_writes, "commit_files", "after"),
    },
}

_reached = False
_inside_table_commit = False


def _at_point(point: str, action: str, signal_dir: Path) -> None:
    """Reaching the point: tell the test, then act (once per process)."""
    global _reached
    if _reached:
        return
    _reached = True
    log.warning("FAULT POINT %s: %s", point, action)
    for handler in logging.getLogger().handlers:
        handler.flush()
    (signal_dir / "reached").write_text(f"{point} {action} {os.getpid()}\n")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "pause":
        _wait_for_go(point, signal_dir)
    log.warning("FAULT POINT %s: going on", point)


def _wait_for_go(point: str, signal_dir: Path) -> None:
    deadline = time.monotonic() + PAUSE_LIMIT_SECONDS
    while not (signal_dir / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"paused at {point} for {PAUSE_LIMIT_SECONDS}s without a go")
        time.sleep(0.05)


def _wrap(function: Callable[..., Any], when: str, point: str, action: str, signal_dir: Path) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _inside_table_commit
        if when == "before":
            _at_point(point, action, signal_dir)
        if when == "inside":
            _inside_table_commit = True
        try:
            result = function(*args, **kwargs)
        finally:
            _inside_table_commit = False
        if when == "after":
            _at_point(point, action, signal_dir)
        return result

    return wrapper


def _install_inside_commit(point: str, action: str, signal_dir: Path) -> None:
    """The catalog applies the actor's table commit; then the point (the answer is not yet back)."""
    for catalog_class in (RestCatalog, SqlCatalog):
        real = catalog_class.commit_table

        def commit_table(self: Any, table: Any, requirements: Any, updates: Any, _real: Any = real) -> Any:
            if action == "late" and _inside_table_commit and not _reached:
                _at_point(point, action, signal_dir)

                def apply_later() -> None:
                    _wait_for_go(point, signal_dir)
                    try:
                        _real(self, table, requirements, updates)
                    except Exception as exc:  # any refusal: the test reads it from the file
                        log.warning("FAULT POINT %s: the late commit was refused: %r", point, exc)
                        (signal_dir / "refused").write_text(repr(exc))
                    else:
                        log.warning("FAULT POINT %s: the late commit was applied", point)
                        (signal_dir / "applied").write_text("applied\n")

                threading.Thread(target=apply_later, name="late-commit").start()  # not a daemon: the process waits
                raise CommitStateUnknownException("fault injected: the answer was lost; the catalog applies it later")
            response = _real(self, table, requirements, updates)
            if _inside_table_commit and not _reached:
                _at_point(point, action, signal_dir)
                if action == "unknown":
                    raise CommitStateUnknownException("fault injected: the commit was applied, the answer lost (503)")
            return response

        catalog_class.commit_table = commit_table  # type: ignore[method-assign]


def command(actor: str, point: str, action: str, signal_dir: Path, cli_args: list[str]) -> list[str]:
    """The command line of `actor` held or killed at `point` (see the module docstring)."""
    return [sys.executable, "-m", "kafscale_lakehouse_tests.engine.faults.actor", actor, point, action, str(signal_dir),
            "--", *cli_args]


def install(actor: str, point: str, action: str, signal_dir: Path) -> None:
    if action not in ACTIONS or (action in COMMIT_ONLY_ACTIONS and not point.startswith("inside-")):
        raise SystemExit(f"action {action!r} is not one of {ACTIONS} at {point!r} ({COMMIT_ONLY_ACTIONS}: "
                         "inside-commit and inside-publish only)")
    try:
        owner, attribute, when = {**POINTS, **OTHER_POINTS}[actor][point]
    except KeyError:
        points = sorted({**POINTS, **OTHER_POINTS}.get(actor, {}))
        raise SystemExit(f"actor {actor!r} has no point {point!r}; points: {points}") from None
    setattr(owner, attribute, _wrap(getattr(owner, attribute), when, point, action, signal_dir))
    if when == "inside":
        _install_inside_commit(point, action, signal_dir)


if __name__ == "__main__":
    actor_name, point_name, action_name, directory, separator, *cli_args = sys.argv[1:]
    assert separator == "--", sys.argv
    install(actor_name, point_name, action_name, Path(directory))
    if cli_args[:1] == ["land-batch"]:
        from kafscale_lakehouse_tests.engine.faults.batch_run import main as land_batch

        sys.exit(land_batch(cli_args[1]))
    if cli_args[:1] == ["materialize"]:
        from kafscale_lakehouse_tests.engine.faults.io_run import main as materialize

        sys.exit(materialize(*cli_args[1:]))
    sys.exit(cli.main(cli_args))
