"""The opt-in storage `kafscale-lakehouse dagster-home --kept-connections` puts in a DAGSTER_HOME
(`KeptConnectionsSqliteStorage`): Dagster's sqlite files, fewer connections.

Real sqlite files and real processes: what the daemon, the webserver and the runs of one host share."""

from __future__ import annotations

import collections
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.ref import InstanceRef
from sqlalchemy import event
from sqlalchemy.engine import Engine

from kafscale_lakehouse.apps.cli import main
from kafscale_lakehouse.orchestration.sqlite_storage import (
    KeptConnectionsEventLogStorage,
    KeptConnectionsRunStorage,
    KeptConnectionsScheduleStorage,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    assert main(["dagster-home", str(home), "--template", str(REPO_ROOT / "dagster.yaml"), "--kept-connections"]) == 0
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.get() as instance:
        yield instance


def _materialize(instance: dg.DagsterInstance, key: str, rows: int) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, metadata={"rows": rows}))


def _latest_rows(instance: dg.DagsterInstance, key: str) -> int | None:
    event = instance.get_latest_materialization_events([dg.AssetKey(key)]).get(dg.AssetKey(key))
    return None if event is None else event.asset_materialization.metadata["rows"].value


def test_the_kept_connections_keep_dagsters_sqlite_files(instance: dg.DagsterInstance, dagster_home: Path):
    assert isinstance(instance.event_log_storage, KeptConnectionsEventLogStorage)
    assert isinstance(instance.run_storage, KeptConnectionsRunStorage)
    assert isinstance(instance.schedule_storage, KeptConnectionsScheduleStorage)
    _materialize(instance, "orders", 7)
    assert (dagster_home / "history" / "runs" / "index.db").exists()
    assert (dagster_home / "history" / "runs.db").exists()
    assert (dagster_home / "schedules" / "schedules.db").exists()
    # Dagster's own `storage: sqlite` over the same directory reads what was written: the two are interchangeable.
    no_config = dagster_home / "no_config"  # no dagster.yaml: Dagster's defaults, `storage: sqlite` of the home
    no_config.mkdir()
    stock = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home), config_dir=str(no_config)))
    with stock:
        assert type(stock.event_log_storage).__name__ == "SqliteEventLogStorage"
        assert _latest_rows(stock, "orders") == 7


def test_events_written_reuse_the_index_connection(instance: dg.DagsterInstance):
    _materialize(instance, "warm", 0)  # the shards' first connections
    opened: collections.Counter[str] = collections.Counter()

    def on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        opened[Path(dbapi_connection.execute("PRAGMA database_list").fetchall()[0][2]).name] += 1

    event.listen(Engine, "connect", on_connect)  # every new sqlite connection of any engine
    try:
        for rows in range(40):
            _materialize(instance, "orders", rows)
    finally:
        event.remove(Engine, "connect", on_connect)
    # Dagster's own sqlite storage opens index.db for each of these writes (two or three times for a check's).
    assert opened["index.db"] == 0, opened
    assert _latest_rows(instance, "orders") == 39


def test_another_process_reads_and_writes_beside_the_kept_connections(instance: dg.DagsterInstance,
                                                                       dagster_home: Path):
    _materialize(instance, "orders", 1)
    child = textwrap.dedent("""
        import dagster as dg
        with dg.DagsterInstance.get() as instance:
            key = dg.AssetKey("orders")
            seen = instance.get_latest_materialization_events([key])[key].asset_materialization.metadata["rows"].value
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="orders", metadata={"rows": 2}))
            print(seen)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DAGSTER_HOME": str(dagster_home)}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "1"  # the child read this process's write
    assert _latest_rows(instance, "orders") == 2  # and this process, its connection kept, reads the child's


def test_a_runs_events_reach_a_watcher_while_it_runs(instance: dg.DagsterInstance):
    """The webserver shows a run's events live by watching `<run_id>.db` change: the run's own shard must still be
    written through to that file, not held in a kept connection's write-ahead log."""
    run_id = "0f2b6c84-0000-4000-8000-000000000001"
    seen: list[str] = []
    arrived = threading.Event()

    def on_event(entry: EventLogEntry, _cursor: str) -> None:
        seen.append(entry.user_message)
        arrived.set()

    instance.watch_event_logs(run_id, None, on_event)
    try:
        time.sleep(0.5)  # the watcher's observer thread starts
        instance.event_log_storage.store_event(EventLogEntry(
            error_info=None, level="INFO", user_message="landing 3 tables", run_id=run_id,
            timestamp=time.time(), step_key=None, job_name="land_tables", dagster_event=None))
        assert arrived.wait(10), "the watcher saw no event of the run"
        assert seen == ["landing 3 tables"]
    finally:
        instance.end_watch_event_logs(run_id, on_event)


def test_wipe_leaves_no_connection_on_deleted_files(instance: dg.DagsterInstance):
    _materialize(instance, "orders", 1)
    instance.wipe()
    assert _latest_rows(instance, "orders") is None
    _materialize(instance, "orders", 5)
    assert _latest_rows(instance, "orders") == 5


def test_the_repository_folder_keeps_dagsters_temporary_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`dagster dev` or `dg` run in the repository's folder without DAGSTER_HOME: a temporary instance configured by
    the folder's dagster.yaml, which must not need DAGSTER_HOME."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path), config_dir=str(REPO_ROOT))) as instance:
        assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"
        _materialize(instance, "orders", 3)
        assert _latest_rows(instance, "orders") == 3


def test_the_home_opens_without_dagster_home_set(dagster_home: Path, monkeypatch: pytest.MonkeyPatch):
    """`DagsterInstance.from_config(dir)` (benchmarks/fanout.py reads its instance so) with DAGSTER_HOME unset."""
    with dg.DagsterInstance.get() as instance:
        _materialize(instance, "orders", 4)
    monkeypatch.delenv("DAGSTER_HOME")
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        assert isinstance(instance.event_log_storage, KeptConnectionsEventLogStorage)
        assert _latest_rows(instance, "orders") == 4


def test_without_base_dir_or_dagster_home_the_error_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config_dir = tmp_path / "project"
    config_dir.mkdir()
    (config_dir / "dagster.yaml").write_text(  # a hand-written section without base_dir
        "storage:\n  custom:\n    module: kafscale_lakehouse.orchestration.sqlite_storage\n"
        "    class: KeptConnectionsSqliteStorage\n")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(DagsterInvalidConfigError, match="DAGSTER_HOME"):
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path / "tmp_home"), config_dir=str(config_dir)))
