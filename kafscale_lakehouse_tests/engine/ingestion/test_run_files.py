"""The per-run clean-up owns only its own files (engine/tables/run_files.py): a live run's files and another table's
files are never touched, whatever their age; an ended run's are (test_crash_recovery covers the crashed run).

The clean-up it replaces deleted every unreferenced `kafscale-*` file older than an hour under the table's data
path. These tests set that age to zero (`ORPHAN_FILE_MIN_AGE`, gone now) so that "older than the clean-up age"
holds without waiting an hour: on the old code each of them loses files.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import kafscale_lakehouse.engine.ingestion.run as ingest_module
from kafscale_lakehouse.connections import offset_store_from_config
from kafscale_lakehouse.engine.ingestion.positions import reset_from_store
from kafscale_lakehouse.engine.ingestion.run import (
    IngestContext,
    IngestFailedError,
    IngestResult,
    catalog_settings,
    ingest,
    ingest_mapping,
)
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.offsets import LeaseLostError
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _old_cleanup_age_elapsed(monkeypatch):
    monkeypatch.setattr(ingest_module, "ORPHAN_FILE_MIN_AGE", timedelta(0), raising=False)


def test_a_live_run_keeps_its_files_while_another_run_prepares(production_world, spark, monkeypatch):
    world = production_world
    world.write_segments(0, 100, records_per_segment=50)
    world.write_segments(1, 60, records_per_segment=30)
    config = world.config()
    mapping = config.mappings[0]
    paused, resume = threading.Event(), threading.Event()
    real_commit_append = ingest_module.commit_append

    def commit_after_a_pause(table, data_files, topic, start_offsets, *args, **kwargs):
        if set(start_offsets) == {0}:  # run A: its files are written, its commit waits
            paused.set()
            assert resume.wait(300)
        return real_commit_append(table, data_files, topic, start_offsets, *args, **kwargs)

    monkeypatch.setattr(ingest_module, "commit_append", commit_after_a_pause)
    outcome: dict[str, object] = {}

    def run_a() -> None:
        try:
            with IngestContext.from_config(config, spark) as context:
                outcome["a"] = ingest_mapping(context, mapping, partitions=[0])
        except BaseException as exc:
            outcome["a"] = exc

    thread = threading.Thread(target=run_a, name="run-a")
    thread.start()
    try:
        assert paused.wait(300), "run A never reached its commit"
        files_of_a = world.table_data_files()
        assert files_of_a, "run A wrote its data files"
        with IngestContext.from_config(config, spark) as context:
            result_b = ingest_mapping(context, mapping, partitions=[1])  # prepares (clean-up) and commits
        assert result_b.records == 60
        assert files_of_a <= world.table_data_files(), "run B deleted files of the live run A"
    finally:
        resume.set()
        thread.join(300)
    assert isinstance(outcome.get("a"), IngestResult), outcome.get("a")
    table = world.assert_exactly_once(runs=2)
    assert world.table_data_files() == world.referenced_data_files(table)
    assert world.recorded_runs() == []


def test_a_run_that_opened_the_table_before_an_ended_runs_commit_keeps_that_runs_files(embedded_world, spark,
                                                                                       monkeypatch):
    """Run A commits and dies before forgetting its record; run B, which opened the table before
    A's commit, takes the lease once A's is gone and cleaned up with its old view: A's committed files deleted."""
    world = embedded_world
    world.write_segments(0, 100, records_per_segment=50)
    config = world.config()
    mapping = config.mappings[0]
    real_acquire, real_forget = ingest_module.acquire_partition_leases, ingest_module.forget_run
    interleaved: list[IngestResult] = []
    started: list[bool] = []

    def run_a_commits_and_dies_first(*args, **kwargs):
        if not started:  # run B has opened the table; run A runs to its commit, and dies before forgetting
            started.append(True)
            monkeypatch.setattr(ingest_module, "forget_run", lambda *a, **k: None)
            with IngestContext.from_config(config, spark) as context_a:
                interleaved.append(ingest_mapping(context_a, mapping, partitions=[0]))
            monkeypatch.setattr(ingest_module, "forget_run", real_forget)
            assert world.recorded_runs(), "run A's record is left behind"
        return real_acquire(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "acquire_partition_leases", run_a_commits_and_dies_first)
    with IngestContext.from_config(config, spark) as context_b:
        result_b = ingest_mapping(context_b, mapping, partitions=[0])
    assert interleaved and interleaved[0].records == 100
    assert result_b.records == 0, "run B starts where run A's commit ended"
    table = world.table()
    assert world.referenced_data_files(table) <= world.table_data_files(), "run B deleted files of A's commit"
    assert table.scan().to_arrow().num_rows == 100
    world.assert_exactly_once(runs=1)
    assert world.recorded_runs() == []


def test_rename_and_recreate_keeps_the_backup_readable(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 100, records_per_segment=50)
    ingest(world.config(), spark)
    catalog = load_catalog(catalog_settings(world.config()))
    backup_name = f"{world.table_name}_backup"
    catalog.rename_table(world.table_name, backup_name)
    backup_files = world.table_data_files(catalog.load_table(backup_name))
    assert backup_files

    world.write_segments(0, 40, base_offset=100, records_per_segment=20)
    # create_table_if_missing creates the table again under its old name; the store's offsets are the backup's
    with pytest.raises(IngestFailedError, match="holds no offsets of topic"):
        ingest(world.config(), spark)
    with offset_store_from_config(world.config()) as store:
        reset_from_store(world.table(), world.topic, store)  # the operator: go on where the backup stopped
    [result] = ingest(world.config(), spark)
    assert result.records == 40

    backup = catalog.load_table(backup_name)
    assert world.table_data_files(backup) == backup_files, "the new table's run deleted the backup's files"
    assert backup.scan().to_arrow().num_rows == 100
    recreated = world.table()
    assert recreated.location() != backup.location(), "the new table must not share the backup's location"
    assert str(recreated.metadata.table_uuid) != str(backup.metadata.table_uuid)


def test_a_run_record_is_written_only_under_live_leases(tmp_path):
    with LocalOffsetStore(tmp_path / "offsets.db", lease_ttl_seconds=5) as store:
        lease = store.acquire_lease("orders", 0, "worker-a")
        store.record_run([lease], "run-a", b'{"x":1}')
        assert store.recorded_runs("orders") == [("run-a", b'{"x":1}')]
        assert store.lease_holder("orders", 0) == "worker-a"
        lease.release()
        assert store.lease_holder("orders", 0) is None
        with pytest.raises(LeaseLostError):
            store.record_run([lease], "run-b", b"{}")
        other = store.acquire_lease("orders", 0, "worker-b")
        with pytest.raises(LeaseLostError, match="orders"):
            store._put_fenced([lease], store.keys.run("orders", "run-c"), b"{}")  # lease taken over
        other.release()
        assert [run_id for run_id, _ in store.recorded_runs("orders")] == ["run-a"]
        store.forget_run("orders", "run-a")
        assert store.recorded_runs("orders") == []
