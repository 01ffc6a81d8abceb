"""Table maintenance (engine/maintenance.py) next to ingestion, on the real servers: nothing lost, nothing doubled,
the offsets kept, and only the table's own unreferenced old files removed."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

import kafscale_lakehouse.engine.maintenance as maintenance
import kafscale_lakehouse.engine.tables.rewrites as table_rewrites
from kafscale_lakehouse.connections import catalog_settings, offset_store_from_config, table_maintenance
from kafscale_lakehouse.engine.ingestion.positions import reset_from_store
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.maintenance import (
    COMPACTION_PROPERTY,
    MANIFEST_REWRITE_PROPERTY,
    MaintenanceError,
    compact,
    data_manifest_count,
    expire_snapshots,
    maintain_mapping,
    remove_orphan_files,
    rewrite_manifests,
)
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.dead_letters import StagedDeadLetters, publish_pending_dead_letters
from kafscale_lakehouse.engine.tables.summary import read_committed_offsets, read_topic_offsets
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.schema.columns import Column

pytestmark = pytest.mark.integration


def _land_in_rounds(world, spark, rounds: int, records: int = 40) -> None:
    for i in range(rounds):
        for partition in (0, 1):
            world.write_segments(partition, records, base_offset=i * records, records_per_segment=records)
        ingest(world.config(), spark)


def _ingest_before_the_first_rewrite_commit(world, spark, monkeypatch, *, base_offset: int) -> list:
    """New segments, ingested by a run that commits right before the rewrite's first commit attempt (when it takes its
    no-retry view): the catalog refuses that attempt. Returns the list the run's result is appended to."""
    for partition in (0, 1):
        world.write_segments(partition, 40, base_offset=base_offset, records_per_segment=40)
    real_view = table_rewrites.without_client_retries
    raced: list = []

    def ingest_first(table):
        if not raced:
            raced.append(ingest(world.config(), spark))
        return real_view(table)

    monkeypatch.setattr(table_rewrites, "without_client_retries", ingest_first)
    return raced


def test_compaction_races_an_ingestion_commit_and_keeps_every_record_once(production_world, spark, monkeypatch):
    world = production_world
    _land_in_rounds(world, spark, rounds=4)
    before = world.table()
    small_files = len(world.referenced_data_files(before))
    offsets_before = read_topic_offsets(before, world.topic)
    assert small_files >= 8

    # An ingestion run commits between the compaction's read of the table and its commit: the catalog refuses the
    # compaction's first attempt, which retries on the new state.
    raced = _ingest_before_the_first_rewrite_commit(world, spark, monkeypatch, base_offset=160)
    result = compact(spark, world.table(), target_file_size_bytes=64 * 1024 * 1024, min_input_files=2)

    assert raced and result.attempts == 2
    assert result.files_compacted == small_files and result.files_written == 1
    table = world.assert_exactly_once(runs=5)  # every offset once, table and etcd agree, 5 ingestion snapshots
    assert read_topic_offsets(table, world.topic) == {0: 200, 1: 200} != offsets_before
    current = table.current_snapshot()
    assert current.summary.get(COMPACTION_PROPERTY)
    assert read_committed_offsets(table) == {world.topic: {0: 200, 1: 200}}, "offsets carried forward"
    assert len(world.referenced_data_files(table)) == 1 + 2  # the compacted file + the racing run's files


def test_manifest_rewrite_merges_the_manifests_of_many_commits_racing_an_ingestion_commit(production_world, spark,
                                                                                         monkeypatch):
    world = production_world
    _land_in_rounds(world, spark, rounds=5)
    before = world.table()
    files = world.referenced_data_files(before)
    assert data_manifest_count(before) == 5  # one per ingestion commit
    assert rewrite_manifests(before, min_count=6, target_size_bytes=8 << 20) == (5, 5), "below the minimum: nothing"
    assert world.table().metadata.current_snapshot_id == before.metadata.current_snapshot_id

    raced = _ingest_before_the_first_rewrite_commit(world, spark, monkeypatch, base_offset=200)
    assert rewrite_manifests(world.table(), min_count=5, target_size_bytes=8 << 20) == (6, 1)

    assert raced, "an ingestion commit came between the rewrite's read and its commit: it retried on the new state"
    table = world.assert_exactly_once(runs=6)
    current = table.current_snapshot()
    assert current.summary.get(MANIFEST_REWRITE_PROPERTY)
    assert int(current.summary["total-data-files"]) == len(world.referenced_data_files(table)) == len(files) + 2
    assert read_committed_offsets(table) == {world.topic: {0: 240, 1: 240}}, "offsets carried forward"
    assert data_manifest_count(table) == 1


def test_compaction_of_our_files_and_files_another_engine_wrote_with_pyiceberg(embedded_world, spark):
    world = embedded_world
    _land_in_rounds(world, spark, rounds=2)
    table = world.table()
    foreign = table.scan().to_arrow().slice(0, 3).to_pylist()  # 3 rows of another topic, written by pyiceberg
    for row in foreign:
        row.update(topic="written-by-another-engine", record_id=f"written-by-another-engine:0:{row['offset']}")
    table.append(pa.Table.from_pylist(foreign, schema=table.schema().as_arrow()))  # large_string/large_binary
    rows_before = world.table().scan().to_arrow().num_rows

    result = compact(spark, world.table(), target_file_size_bytes=64 * 1024 * 1024, min_input_files=2)

    assert result.files_compacted == 5 and result.files_written == 1  # our 4 and the other engine's 1, together
    table = world.assert_exactly_once(runs=2)
    assert table.scan().to_arrow().num_rows == rows_before == 160 + 3


def test_compaction_stopped_before_its_commit_leaves_nothing(production_world, spark, monkeypatch):
    world = production_world
    _land_in_rounds(world, spark, rounds=3)
    files_before = world.table_data_files()

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # the process is being stopped between writing and committing

    monkeypatch.setattr(maintenance, "commit_rewrite", stop)
    with pytest.raises(KeyboardInterrupt):
        compact(spark, world.table(), target_file_size_bytes=64 * 1024 * 1024, min_input_files=2)

    assert world.table_data_files() == files_before, "the compaction's files were deleted, nothing else"
    world.assert_exactly_once(runs=3)


def test_expiry_keeps_the_snapshots_that_carry_the_offsets(production_world, spark):
    world = production_world
    _land_in_rounds(world, spark, rounds=2)
    table = world.table()
    for _ in range(3):  # another engine's commits without our offsets
        with table.transaction() as transaction, transaction.update_snapshot().fast_append():
            pass
    table = world.table()
    offsets = read_topic_offsets(table, world.topic)
    [first_run, latest_run] = world.our_snapshots(table)

    expired = expire_snapshots(table, older_than=datetime.now(UTC) + timedelta(minutes=1), retain_last=1)

    table = world.table()
    assert first_run.snapshot_id in expired and latest_run.snapshot_id not in expired
    assert len(table.metadata.snapshots) == 4  # the three foreign ones and the newest with our offsets
    assert read_topic_offsets(table, world.topic) == offsets == {0: 80, 1: 80}
    for partition in (0, 1):
        world.write_segments(partition, 40, base_offset=80, records_per_segment=40)
    [result] = ingest(world.config(), spark)
    assert result.records == 80, "the next run starts where the table says, not from an older store value"
    world.assert_exactly_once(runs=2)  # the run expired, the one kept, and this one: 2 retained


def test_expiry_by_count_keeps_the_newest_and_the_offsets_chain(embedded_world, spark):
    world = embedded_world
    _land_in_rounds(world, spark, rounds=4)
    table = world.table()
    for _ in range(3):  # another engine's commits without our offsets, after our last one
        with table.transaction() as transaction, transaction.update_snapshot().fast_append():
            pass
    table = world.table()
    newest_first = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
    latest_run = world.our_snapshots(table)[-1]

    expired = expire_snapshots(table, older_than=datetime.now(UTC) - timedelta(days=1), retain_last=1,
                               max_snapshots=2)

    table = world.table()
    kept = {s.snapshot_id for s in table.metadata.snapshots}
    # The two newest by count, and the third foreign one and our latest commit as the chain back to the offsets.
    assert kept == {s.snapshot_id for s in newest_first[:3]} | {latest_run.snapshot_id}
    assert len(expired) == 7 - 4
    assert read_topic_offsets(table, world.topic) == {0: 160, 1: 160}
    with pytest.raises(ValueError, match="max_snapshots"):
        expire_snapshots(table, older_than=datetime.now(UTC), retain_last=3, max_snapshots=2)


@pytest.mark.parametrize("world_kind", ["embedded", "production"])  # the sqlite and the REST catalog enforce it
def test_expiry_re_plans_when_a_commit_lands_between_its_planning_and_its_commit(request, world_kind, spark,
                                                                                  monkeypatch):
    """The expiry commit requires main to be where it was planned; a rollback to an older
    snapshot landing in between makes it re-plan instead of removing main's new head and its offsets."""
    world = request.getfixturevalue(f"{world_kind}_world")
    _land_in_rounds(world, spark, rounds=2)
    [first_run, latest_run] = world.our_snapshots(world.table())
    real_protected = maintenance.protected_snapshot_ids
    raced: list = []

    def plan_then_roll_back(table, dead_letters=None):
        protected = real_protected(table, dead_letters)
        if not raced:  # another engine's commit, landing between the planning and the commit
            other = world.table()
            other.manage_snapshots().rollback_to_snapshot(first_run.snapshot_id).commit()
            raced.append(other.metadata.current_snapshot_id)
        return protected

    monkeypatch.setattr(maintenance, "protected_snapshot_ids", plan_then_roll_back)
    expired = expire_snapshots(world.table(), older_than=datetime.now(UTC) + timedelta(minutes=1), retain_last=1)

    assert raced == [first_run.snapshot_id]
    table = world.table()
    assert table.metadata.current_snapshot_id == first_run.snapshot_id, "main keeps the head the rollback set"
    assert first_run.snapshot_id not in expired and latest_run.snapshot_id in expired
    assert read_topic_offsets(table, world.topic) == {0: 40, 1: 40}
    assert table.scan().to_arrow().num_rows == 80


def test_orphan_removal_keeps_young_files_referenced_files_and_other_tables(embedded_world, spark):
    world = embedded_world
    _land_in_rounds(world, spark, rounds=2)
    catalog = load_catalog(catalog_settings(world.config()))
    backup_name = f"{world.table_name}_backup"
    catalog.rename_table(world.table_name, backup_name)
    backup_files = world.table_data_files(catalog.load_table(backup_name))
    for partition in (0, 1):
        world.write_segments(partition, 40, base_offset=80, records_per_segment=40)
    with pytest.raises(IngestFailedError, match="holds no offsets of topic"):
        ingest(world.config(), spark)  # the table again, at a location of its own; the store's offsets are the backup's
    with offset_store_from_config(world.config()) as store:
        reset_from_store(world.table(), world.topic, store)
    ingest(world.config(), spark)
    table = world.table()
    orphan = f"{table.location()}/data/kafscale-crashed-run/00000-orphan.parquet"
    with table.io.new_output(orphan).create() as out:
        out.write(b"left by a crash")
    referenced = world.referenced_data_files(table)
    rows = len(world.table_rows(table))

    assert remove_orphan_files(table, older_than=datetime.now(UTC) - timedelta(hours=1)) == []
    assert table.io.new_input(orphan).exists(), "a young file is kept (a writer may still commit it)"

    deleted = remove_orphan_files(table, older_than=datetime.now(UTC) + timedelta(minutes=1))

    assert deleted == [orphan]
    table = world.table()
    assert world.referenced_data_files(table) == referenced and len(world.table_rows(table)) == rows
    backup = catalog.load_table(backup_name)
    assert world.table_data_files(backup) == backup_files and backup.scan().to_arrow().num_rows == 160


def test_orphan_removal_keeps_the_files_of_a_commit_that_lands_while_it_lists(embedded_world, spark, monkeypatch):
    """The references are read after the listing, so a commit landing during it is kept."""
    world = embedded_world
    _land_in_rounds(world, spark, rounds=1)
    for partition in (0, 1):
        world.write_segments(partition, 40, base_offset=40, records_per_segment=40)
    real_list = maintenance._list_files
    raced: list = []

    def list_while_an_ingestion_commits(fs, root):
        if not raced:
            raced.append(ingest(world.config(), spark))  # the real commit path, before the listing completes
        return real_list(fs, root)

    monkeypatch.setattr(maintenance, "_list_files", list_while_an_ingestion_commits)
    remove_orphan_files(world.table(), older_than=datetime.now(UTC) + timedelta(minutes=1))

    assert raced and raced[0][0].records == 80
    table = world.table()
    for snapshot in table.metadata.snapshots:
        assert table.io.new_input(snapshot.manifest_list).exists()
        for manifest in snapshot.manifests(table.io):
            assert table.io.new_input(manifest.manifest_path).exists()
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                assert table.io.new_input(entry.data_file.file_path).exists(), entry.data_file.file_path
    assert table.scan().to_arrow().num_rows == 160
    world.assert_exactly_once(runs=2)


def test_orphan_removal_checks_every_unreferenced_metadata_file_for_another_table(embedded_world, spark,
                                                                                 monkeypatch):
    """The shared-location guard reads every unreferenced metadata file, not the first five."""
    world = embedded_world
    _land_in_rounds(world, spark, rounds=1)
    table = world.table()
    with table.io.new_input(table.metadata_location).open() as stream:
        own = json.loads(stream.read())
    metadata_dir = f"{table.location().rstrip('/')}/metadata"
    copies = [f"{metadata_dir}/0000{i}-copy.metadata.json" for i in range(5)]  # ours, unreferenced
    for path in copies:
        with table.io.new_output(path).create() as out:
            out.write(json.dumps(own).encode())
    foreign = f"{metadata_dir}/99999-foreign.metadata.json"  # the sixth, another table's
    with table.io.new_output(foreign).create() as out:
        out.write(json.dumps(dict(own, **{"table-uuid": str(uuid.uuid4())})).encode())
    real_list = maintenance._list_files
    monkeypatch.setattr(maintenance, "_list_files", lambda fs, root: sorted(real_list(fs, root), key=lambda i: i.path))

    with pytest.raises(MaintenanceError, match="also holds table"):
        remove_orphan_files(table, older_than=datetime.now(UTC) + timedelta(minutes=1))

    assert all(table.io.new_input(path).exists() for path in [*copies, foreign])
    assert world.table().scan().to_arrow().num_rows == 80


def test_maintain_mapping_sets_bounded_metadata_properties_and_reports(embedded_world, spark):
    world = embedded_world
    _land_in_rounds(world, spark, rounds=3)
    table = world.table()
    with table.transaction() as transaction:  # a table created before these were set at creation
        transaction.remove_properties("write.metadata.delete-after-commit.enabled",
                                      "write.metadata.previous-versions-max")
    config = world.config()
    summary = maintain_mapping(spark, table_maintenance(config, config.mappings[0]),
                               steps=["properties", "compact", "expire"])

    table = world.table()
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert summary.properties_set and summary.files_compacted == summary.before.data_files == 6
    assert summary.after.data_files == 1 and summary.after.data_bytes > 0
    world.assert_exactly_once(runs=3)


def test_dagster_maintenance_job_runs_the_same_code_and_records_what_it_did(embedded_world, spark):
    import dagster as dg

    from kafscale_lakehouse.orchestration.maintenance import build_maintenance
    from kafscale_lakehouse.orchestration.resources import SPARK_RESOURCE_KEY, SparkResource

    world = embedded_world
    _land_in_rounds(world, spark, rounds=3)
    config = world.config()
    [job], [schedule] = build_maintenance(config)
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == config.mappings[0].maintenance.cron_schedule

    result = job.execute_in_process(resources={SPARK_RESOURCE_KEY: SparkResource(master="local[1]")})

    assert result.success
    [observation] = [e.event_specific_data.asset_observation for e in result.all_events
                     if e.event_type_value == "ASSET_OBSERVATION"]
    metadata = {k: v.value for k, v in observation.metadata.items()}
    assert metadata["data_files_before"] == 6 and metadata["data_files_after"] == 1
    assert metadata["files_compacted"] == 6 and metadata["duration_seconds"] > 0
    world.assert_exactly_once(runs=3)


def test_expiry_keeps_unpublished_staged_dead_letters_of_the_default_dead_letter_table(embedded_world):
    """In lenient mode without `dead_letter_table`, invalid records go to `<table>_dead_letters`;
    maintenance protects the table snapshot naming its unpublished staged dead letters all the same."""
    world = embedded_world
    document = world.config_document()
    document["schema"] = {"mode": "lenient", "registry": {"base_url": "http://127.0.0.1:9"}}  # never contacted
    document["mappings"][0]["maintenance"] = {"max_snapshots": 1}
    config = world.config(document)
    catalog = load_catalog(catalog_settings(config))
    table = open_table(catalog, world.table_name, schema=table_schema([Column(name="order_id", type="string")]),
                       create_if_missing=True)
    # A run committed the table with staged dead letters and stopped before publishing (its staged snapshot is gone
    # too, so the next run can only report them: the report needs the table snapshot); a later run committed on.
    staged = StagedDeadLetters(f"{world.table_name}_dead_letters", 123456789, 4)
    stopped = commit_append(table, [], world.topic, {0: 0}, {0: 20}, "run-stopped",
                            snapshot_properties=staged.summary_properties())
    commit_append(table, [], world.topic, {0: 20}, {0: 30}, "run-later")

    target = table_maintenance(config, config.mappings[0])
    maintain_mapping(None, target, steps=["expire"])

    table = world.table()
    assert table.metadata.snapshot_by_id(stopped.snapshot_id) is not None, "kept: its dead letters are not settled"
    [message] = publish_pending_dead_letters(table, catalog).lost
    assert "run-stopped" in message and "4 invalid records" in message
