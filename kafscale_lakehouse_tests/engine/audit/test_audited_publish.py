"""`publish: audited` on the real servers (SeaweedFS S3 + Iceberg REST catalog, etcd, local Spark): a run commits to
the audit branch, the blocking checks run on that snapshot, and main fast-forwards only when they pass. An injected
duplicate record_id never reaches main, read by pyiceberg and by DuckDB (the files main's metadata plans) after the
branch commit, before and after the checks; the operator commands settle a failed audit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest

import kafscale_lakehouse.engine.ingestion.run as run_module
import kafscale_lakehouse.engine.maintenance as maintenance_module
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.maintenance import MaintenanceSettings, maintain_table
from kafscale_lakehouse.engine.tables.audit import branch_head, drop_audit, pending_audit, publish_audit
from kafscale_lakehouse.engine.tables.checks import RECORD_ID_UNIQUE
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld

BRANCH = "kafscale-audit"


def audited_document(world: IngestWorld) -> dict[str, Any]:
    document = world.config_document()
    document["mappings"][0]["publish"] = "audited"
    return document


def main_record_ids(world: IngestWorld, copies: Path) -> tuple[list[str], list[str]]:
    """record_ids of main as a fresh pyiceberg reader and as DuckDB over the files main's metadata plans."""
    table = world.table()
    by_pyiceberg = [r for r, _, _ in world.table_rows(table)]
    copies.mkdir(parents=True, exist_ok=True)
    for old in copies.glob("*.parquet"):
        old.unlink()
    for number, task in enumerate(table.scan().plan_files()):
        with table.io.new_input(task.file.file_path).open() as source:
            (copies / f"{number}.parquet").write_bytes(source.read())
    by_duckdb = ([row[0] for row in duckdb.sql(f"select record_id from read_parquet('{copies}/*.parquet')").fetchall()]
                 if any(copies.glob("*.parquet")) else [])
    return by_pyiceberg, by_duckdb


def repeated(record_ids: list[str]) -> list[str]:
    return sorted(r for r, n in Counter(record_ids).items() if n > 1)


def inject_duplicate_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's commit carries its first data file twice: every row of that file is then in the snapshot twice."""
    real_commit_append = run_module.commit_append

    def commit_twice(table, files, *args, **kwargs):
        return real_commit_append(table, [*files, files[0]], *args, **kwargs)

    monkeypatch.setattr(run_module, "commit_append", commit_twice)


def read_main_around_the_audit(monkeypatch: pytest.MonkeyPatch, world: IngestWorld, copies: Path) -> list[tuple]:
    """main read after the branch commit, right before and right after the checks run."""
    seen: list[tuple] = []
    real_audit = run_module.audit_snapshot

    def audit(*args, **kwargs):
        seen.append(("before checks", *main_record_ids(world, copies)))
        report = real_audit(*args, **kwargs)
        seen.append(("after checks", *main_record_ids(world, copies)))
        return report

    monkeypatch.setattr(run_module, "audit_snapshot", audit)
    return seen


def test_a_clean_run_publishes_and_an_injected_duplicate_never_reaches_main(production_world, spark, monkeypatch,
                                                                            tmp_path, cli_main):
    world = production_world
    world.write_segments(0, 60, records_per_segment=30)
    world.write_segments(1, 40, records_per_segment=20)
    config = world.config(audited_document(world))
    config_path = world.write_config_file(audited_document(world))
    copies = tmp_path / "main-files"

    [clean] = ingest(config, spark)
    assert clean.published is True and clean.audit is not None and clean.audit.passed
    table = world.assert_exactly_once(runs=1)
    assert table.current_snapshot().snapshot_id == clean.snapshot_id, "main fast-forwarded to the audited snapshot"
    assert BRANCH not in table.metadata.refs, "the branch is removed once published"

    world.write_segments(0, 30, base_offset=60, records_per_segment=30)
    inject_duplicate_file(monkeypatch)
    seen = read_main_around_the_audit(monkeypatch, world, copies)
    with pytest.raises(IngestFailedError) as failed:
        ingest(config, spark)

    result = failed.value.result
    message = str(failed.value)
    assert result.published is False and not result.audit.passed
    assert RECORD_ID_UNIQUE in message and result.run_id in message and world.table_name in message
    assert "audit drop --table" in message
    assert [label for label, _, _ in seen] == ["before checks", "after checks"]
    for label, by_pyiceberg, by_duckdb in seen:
        assert len(by_pyiceberg) == len(by_duckdb) == 100, label  # run 1's rows only, each once
        assert repeated(by_pyiceberg) == repeated(by_duckdb) == [], label
    by_pyiceberg, by_duckdb = main_record_ids(world, copies)
    assert repeated(by_duckdb) == [] and len(by_duckdb) == 100
    table = world.table()
    assert table.current_snapshot().snapshot_id == clean.snapshot_id, "main stays where it was"
    assert branch_head(table, BRANCH) == result.snapshot_id, "the branch keeps the audited snapshot"
    assert read_topic_offsets(table, world.topic) == {0: 60, 1: 40}
    assert world.store_next_offsets() == {0: 60, 1: 40}, "the store mirrors main"
    monkeypatch.undo()

    # The next run refuses, naming the check and the commands, while the failed audit is pending.
    world.write_segments(1, 20, base_offset=40, records_per_segment=20)
    with pytest.raises(IngestFailedError, match=f"{RECORD_ID_UNIQUE}.*audit publish --table {world.table_name}"):
        ingest(config, spark)
    assert world.lease_keys() == []

    assert cli_main("audit", "drop", "--table", world.table_name, "--config", str(config_path)) == 0
    assert BRANCH not in world.table().metadata.refs
    [again] = ingest(config, spark)
    assert again.published is True
    # Three commits of ours exist (the dropped one stays in the metadata until expiry), each offset once in main.
    world.assert_exactly_once(runs=3)
    assert repeated(main_record_ids(world, copies)[1]) == []


def test_audit_publish_fast_forwards_main_to_the_failed_snapshot_as_it_is(production_world, spark, monkeypatch,
                                                                          cli_main):
    world = production_world
    world.write_segments(0, 40, records_per_segment=20)
    document = audited_document(world)
    config, config_path = world.config(document), world.write_config_file(document)
    inject_duplicate_file(monkeypatch)
    with pytest.raises(IngestFailedError):
        ingest(config, spark)
    monkeypatch.undo()
    assert world.table_rows() == [], "main holds no row: the first run's commit is only on the branch"
    assert world.store_next_offsets() == {}

    assert cli_main("audit", "show", "--table", world.table_name, "--config", str(config_path)) == 0
    assert cli_main("audit", "publish", "--table", world.table_name, "--config", str(config_path)) == 0

    table = world.table()
    assert pending_audit(table, BRANCH) is None and BRANCH not in table.metadata.refs
    assert read_topic_offsets(table, world.topic) == {0: 40}
    assert world.store_next_offsets() == {0: 40}, "the store follows main"
    ids = [r for r, _, _ in world.table_rows(table)]
    assert len(ids) > 40 and repeated(ids), "published as it is, duplicates included (the operator's choice)"


def test_a_run_killed_after_the_branch_commit_is_published_by_the_next_run_exactly_once(production_world, spark):
    world = production_world
    world.write_segments(0, 60, records_per_segment=30)
    world.write_segments(1, 30, records_per_segment=30)
    document = audited_document(world)
    config = world.config(document)
    ingest(config, spark)
    world.write_segments(0, 40, base_offset=60, records_per_segment=20)
    config_path = world.write_config_file(document)

    # The ingestion kill point after commit_append: in audited mode the snapshot is on the branch, unchecked.
    world.run_killed(config_path, "after-iceberg-commit")

    table = world.table()
    pending = pending_audit(table, BRANCH)
    assert pending is not None and pending.based_on_main
    assert read_topic_offsets(table, world.topic) == {0: 60, 1: 30}, "main does not hold the killed run's commit"
    assert len(world.table_rows(table)) == 90
    assert world.store_next_offsets() == {0: 60, 1: 30}

    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
    [result] = ingest(config, spark)
    assert result.records == 0, "the killed run's range was published, not read again"
    table = world.assert_exactly_once(runs=2)
    assert table.current_snapshot().snapshot_id == pending.snapshot_id
    assert BRANCH not in table.metadata.refs
    assert world.recorded_runs() == []


def test_a_run_refuses_when_main_moved_off_the_pending_audit(production_world, spark, monkeypatch):
    world = production_world
    world.write_segments(0, 40, records_per_segment=20)
    config = world.config(audited_document(world))
    ingest(config, spark)
    world.write_segments(0, 20, base_offset=40, records_per_segment=20)
    inject_duplicate_file(monkeypatch)
    with pytest.raises(IngestFailedError):
        ingest(config, spark)
    monkeypatch.undo()
    table = world.table()
    audited = branch_head(table, BRANCH)
    table.append(table.scan(limit=1).to_arrow())  # another engine commits to main meanwhile

    with pytest.raises(IngestFailedError, match="main moved"):
        ingest(config, spark)
    assert branch_head(world.table(), BRANCH) == audited, "the branch keeps the audited snapshot"



def test_maintenance_replay_and_reset_from_store_wait_while_an_audit_is_pending(production_world, spark, monkeypatch,
                                                                              cli_main, capsys):
    world = production_world
    world.write_segments(0, 20, records_per_segment=20)
    config = world.config(audited_document(world))
    config_path = world.write_config_file(audited_document(world))
    ingest(config, spark)
    world.write_segments(0, 20, base_offset=20, records_per_segment=20)
    ingest(config, spark)  # main now holds two small data files: compaction would rewrite them
    world.write_segments(0, 20, base_offset=40, records_per_segment=20)
    inject_duplicate_file(monkeypatch)
    with pytest.raises(IngestFailedError):
        ingest(config, spark)
    monkeypatch.undo()
    table = world.table()
    main_before = table.current_snapshot().snapshot_id
    settings = MaintenanceSettings(min_input_files=2, manifest_min_count=1)

    summary = maintain_table(spark, table, settings, expiry=False, orphans=False)

    assert summary.rewrites_skipped is not None and "audit publish --table" in summary.rewrites_skipped
    assert summary.files_compacted == 0 and summary.compaction_snapshot_id is None
    table = world.table()
    assert table.current_snapshot().snapshot_id == main_before, "main is untouched: the audit can still publish"
    replay = ("offsets", "replay", "--topic", world.topic, "--partition", "0", "--from", "0", "--to", "10", "--yes",
              "--config", str(config_path))
    assert cli_main(*replay) == 2
    assert "audit drop --table" in capsys.readouterr().err
    assert world.table().current_snapshot().snapshot_id == main_before, "a replay would move main off the audit"
    assert cli_main("offsets", "reset", "--topic", world.topic, "--from-store", "--yes",
                    "--config", str(config_path)) == 2
    assert "audit drop --table" in capsys.readouterr().err
    drop_audit(table, BRANCH)
    summary = maintain_table(spark, world.table(), settings, expiry=False, orphans=False)
    assert summary.rewrites_skipped is None and summary.files_compacted == 2


def test_a_rollback_of_main_under_a_pending_audit_is_not_undone_by_its_publication(production_world, spark):
    world = production_world
    world.write_segments(0, 40, records_per_segment=20)
    document = audited_document(world)
    config = world.config(document)
    ingest(config, spark)
    world.write_segments(0, 20, base_offset=40, records_per_segment=20)
    ingest(config, spark)
    world.write_segments(0, 20, base_offset=60, records_per_segment=20)
    world.run_killed(world.write_config_file(document), "after-iceberg-commit")
    table = world.table()
    rolled_back_to = table.current_snapshot().parent_snapshot_id
    table.manage_snapshots().rollback_to_snapshot(rolled_back_to).commit()  # an operator undoes the second run
    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)

    # main (now the first run's snapshot) is an ancestor of the audited snapshot, but not its parent: publishing it
    # would bring the rolled-back commit back.
    with pytest.raises(IngestFailedError, match="main moved"):
        ingest(config, spark)
    assert world.table().current_snapshot().snapshot_id == rolled_back_to

    drop_audit(world.table(), BRANCH)
    [result] = ingest(config, spark)
    assert result.published is True and result.records == 40, "the rolled-back and the dropped offsets land again"
    world.assert_exactly_once(runs=4)  # our four commits stay in the metadata; main holds each offset once


def test_a_run_whose_audit_another_process_settled_meanwhile_reports_it(production_world, spark, monkeypatch):
    """A run held after its branch commit (its leases expired) while another run published its snapshot, or an
    operator dropped it: the run says so instead of failing on a branch that is gone."""
    world = production_world
    world.write_segments(0, 20, records_per_segment=20)
    config = world.config(audited_document(world))
    real_commit_append = run_module.commit_append
    settle = {"how": "publish"}

    def commit_then_settled_elsewhere(table, *args, **kwargs):
        result = real_commit_append(table, *args, **kwargs)
        other = world.table()
        if settle["how"] == "publish":
            publish_audit(other, BRANCH, result.snapshot_id)
        else:
            drop_audit(other, BRANCH)
        return result

    monkeypatch.setattr(run_module, "commit_append", commit_then_settled_elsewhere)
    [published] = ingest(config, spark)
    assert published.published is True and published.audit_error is None
    world.assert_exactly_once(runs=1)

    world.write_segments(0, 20, base_offset=20, records_per_segment=20)
    settle["how"] = "drop"
    with pytest.raises(IngestFailedError, match="neither on branch kafscale-audit nor in main"):
        ingest(config, spark)
    monkeypatch.undo()
    [again] = ingest(config, spark)
    assert again.published is True and again.records == 20
    world.assert_exactly_once(runs=3)  # the dropped commit stays in the metadata; main holds each offset once


def test_an_audit_committed_while_compaction_runs_abandons_the_compaction(production_world, spark, monkeypatch):
    """Compaction found no pending audit before its Spark job; an audited run commits to the branch during the job
    (its checks fail: the audit stays pending). The compaction's commit re-checks in its attempt and is abandoned,
    so main stays the audited snapshot's parent and the audit can still be published."""
    world = production_world
    config = world.config(audited_document(world))
    for base in (0, 20):
        world.write_segments(0, 20, base_offset=base, records_per_segment=20)
        ingest(config, spark)  # two small files on main
    world.write_segments(0, 20, base_offset=40, records_per_segment=20)
    real_job = maintenance_module.run_rewrite_job

    def job_then_an_audited_run(*args, **kwargs):
        written = real_job(*args, **kwargs)
        with monkeypatch.context() as patched:
            inject_duplicate_file(patched)
            with pytest.raises(IngestFailedError):
                ingest(config, spark)
        return written

    monkeypatch.setattr(maintenance_module, "run_rewrite_job", job_then_an_audited_run)
    table = world.table()
    main_before = table.current_snapshot().snapshot_id

    summary = maintain_table(spark, table, MaintenanceSettings(min_input_files=2), manifests=False, expiry=False,
                             orphans=False)

    assert summary.rewrites_skipped is not None and "audit publish --table" in summary.rewrites_skipped
    table = world.table()
    assert table.current_snapshot().snapshot_id == main_before
    pending = pending_audit(table, BRANCH)
    assert pending is not None and pending.based_on_main
    assert publish_audit(table, BRANCH, pending.snapshot_id)


def test_an_audited_commit_retries_when_main_moves_before_it_lands(production_world, spark, monkeypatch):
    """Between the branch's start at main's head and the audited commit, another engine commits to main: the commit
    requires main unmoved, so it is refused and retried on the new head, and the audit publishes."""
    world = production_world
    config = world.config(audited_document(world))
    world.write_segments(0, 20, records_per_segment=20)
    ingest(config, spark)
    world.write_segments(0, 20, base_offset=20, records_per_segment=20)
    real_record = run_module.PreparedIngest.record_commit_attempt
    moved: list[int] = []

    def another_engine_commits_first(self, table, partitions, **kwargs):
        real_record(self, table, partitions, **kwargs)
        if not moved and not kwargs.get("staged"):
            other = world.table()
            other.append(other.scan(limit=1).to_arrow())
            moved.append(other.current_snapshot().snapshot_id)

    monkeypatch.setattr(run_module.PreparedIngest, "record_commit_attempt", another_engine_commits_first)

    [result] = ingest(config, spark)

    assert moved and result.published, result.audit_error
    table = world.table()
    assert read_topic_offsets(table, world.topic) == {0: 40}
    assert table.scan().to_arrow().num_rows == 41 and pending_audit(table, BRANCH) is None
