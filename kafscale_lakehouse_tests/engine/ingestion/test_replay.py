"""`kafscale-lakehouse offsets replay`: a partition's offset range replaced by the records read again, in one commit
(engine/ingestion/replay.py), on the real servers: every record once, the offsets unchanged, other rows untouched."""

from __future__ import annotations

import pytest

import kafscale_lakehouse.engine.ingestion.replay as replay_module
from kafscale_lakehouse.connections import offset_store_from_config
from kafscale_lakehouse.engine.ingestion.replay import REPLAY_PROPERTY, ReplayError, move_position, replay_range
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest
from kafscale_lakehouse.engine.tables.summary import read_committed_offsets
from kafscale_lakehouse.offsets.ranges import OffsetRange

pytestmark = pytest.mark.integration


def _document_without_store_id(world) -> dict:
    document = world.config_document()
    document["mappings"][0]["schema"]["columns"] = [c for c in document["mappings"][0]["schema"]["columns"]
                                                    if c["name"] != "store_id"]
    return document


def _store_ids(world) -> dict[tuple[int, int], int | None]:
    rows = world.table().scan(selected_fields=("partition", "offset", "store_id")).to_arrow().to_pylist()
    return {(r["partition"], r["offset"]): r["store_id"] for r in rows}


def test_replay_replaces_a_range_in_one_commit_and_keeps_everything_else(production_world, spark, cli_main,
                                                                         capsys):
    world = production_world
    world.write_segments(0, 120, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    ingest(world.config(_document_without_store_id(world)), spark)  # landed before store_id was mapped
    before = world.table()
    offsets_before = read_committed_offsets(before)
    partition_1_files = {t.file.file_path for t in before.scan(row_filter="partition == 1").plan_files()}
    assert "store_id" not in before.schema().column_names

    # The mapping now maps store_id: replay offsets 40..79 of partition 0, which share a data file with 0..39 and
    # 80..119 (one Spark task wrote the partition's three segments into one file).
    config_path = world.write_config_file()
    capsys.readouterr()
    assert cli_main("offsets", "replay", "--config", str(config_path), "--topic", world.topic, "--partition", "0",
                    "--from", "40", "--to", "80") == 1
    dry_run = capsys.readouterr().out
    assert f"topic {world.topic} partition 0 offsets 40..79" in dry_run and "add --yes" in dry_run
    assert world.table().metadata.current_snapshot_id == before.metadata.current_snapshot_id, "dry run: no commit"

    assert cli_main("offsets", "replay", "--config", str(config_path), "--topic", world.topic, "--partition", "0",
                    "--from", "40", "--to", "80", "--yes") == 0
    assert "40 rows removed, 40 rows added" in capsys.readouterr().out

    table = world.assert_exactly_once(runs=2)  # the ingest run and the replay: every record once
    current = table.current_snapshot()
    assert current.parent_snapshot_id == before.metadata.current_snapshot_id, "one commit"
    assert current.summary.operation.value == "overwrite"
    assert current.summary[REPLAY_PROPERTY].startswith(f"{world.topic}/0/40-80-")
    assert read_committed_offsets(table) == offsets_before, "a replay never moves the offsets"
    store_ids = _store_ids(world)
    replayed = {k for k, v in store_ids.items() if v is not None}
    assert replayed == {(0, offset) for offset in range(40, 80)}, "only the range was read again"
    assert partition_1_files <= world.referenced_data_files(table), "files of other partitions are not touched"

    # Ingestion goes on after it, from the table's offsets.
    world.write_segments(0, 40, base_offset=120, records_per_segment=40)
    [result] = ingest(world.config(), spark)
    assert result.records == 40
    world.assert_exactly_once(runs=3)


def test_replay_refuses_what_it_cannot_replace_and_changes_nothing(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 80, records_per_segment=40)
    ingest(world.config(), spark)
    config = world.config()
    snapshot_before = world.table().metadata.current_snapshot_id
    with IngestContext.from_config(config, spark) as context:
        mapping = config.mappings[0]
        with pytest.raises(ReplayError, match=r"the table holds offsets up to 79 of the partition"):
            replay_range(context, mapping, OffsetRange(0, 60, 100))  # not landed yet: ingestion's job
        with pytest.raises(ReplayError, match=r"holds nothing of the partition"):
            replay_range(context, mapping, OffsetRange(3, 0, 10))
        world.delete_segment(0, 0)  # retention deleted offsets 0..39
        missing = r"offsets 20\.\.39 are missing before .*segment-0+40\.kfs .*the rows in the table are kept"
        with pytest.raises(ReplayError, match=missing):
            replay_range(context, mapping, OffsetRange(0, 20, 60))
        with offset_store_from_config(config) as store:
            lease = store.acquire_lease(world.topic, 0, "another-run")
            try:
                with pytest.raises(ReplayError, match=r"while a run holds the partition"):
                    replay_range(context, mapping, OffsetRange(0, 40, 80))
            finally:
                lease.release()
    assert world.table().metadata.current_snapshot_id == snapshot_before
    world.assert_exactly_once(runs=1, expected={0: range(80)})


def test_an_explicit_position_moves_back_removing_the_rows_to_land_again_and_forward_recording_the_skip(
        production_world, spark, cli_main, capsys):
    world = production_world
    world.write_segments(0, 120, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    ingest(world.config(), spark)
    config_path = world.write_config_file()

    def reset(*args: str) -> int:
        return cli_main("offsets", "reset", "--config", str(config_path), "--topic", world.topic, *args)

    assert reset("--to-offset", "70", "--partition", "0") == 1, "without --yes nothing changes"
    assert "from 120 to 70" in capsys.readouterr().out
    assert reset("--to-offset", "70") == 2, "--to-offset needs --partition"
    assert reset("--to-offset", "70", "--partition", "0", "--yes") == 0
    assert "50 rows of offsets 70.. removed" in capsys.readouterr().out
    table = world.table()
    assert read_committed_offsets(table) == {world.topic: {0: 70, 1: 40}}
    assert world.store_next_offsets() == {0: 70, 1: 40}
    assert {o for _, p, o in world.table_rows(table) if p == 0} == set(range(70))  # 40..69 kept from a shared file

    [result] = ingest(world.config(), spark)
    assert result.records == 50, "the removed rows land again"
    world.assert_exactly_once(runs=3)

    world.write_segments(0, 80, base_offset=120, records_per_segment=40)
    assert reset("--to-offset", "200", "--partition", "0", "--yes") == 0
    assert "offsets 120..199 are skipped" in capsys.readouterr().out
    assert world.skipped_ranges()[-1] == {"0": [120, 200]}
    [result] = ingest(world.config(), spark)
    assert result.records == 0
    table = world.table()
    assert read_committed_offsets(table) == {world.topic: {0: 200, 1: 40}} and world.store_next_offsets() == {
        0: 200, 1: 40}
    assert sorted(o for _, p, o in world.table_rows(table) if p == 0) == list(range(120)), "once each, none skipped"


def test_a_position_moved_back_while_a_run_commits_the_partition_lands_every_record_once(embedded_world, spark,
                                                                                        monkeypatch):
    """The move read the partition's position before holding its lease, and its rewrite did not
    re-check it at commit; a run that committed 200..299 in between left those rows behind position 100, and the
    next run landed them again."""
    world = embedded_world
    world.write_segments(0, 200, records_per_segment=50)
    ingest(world.config(), spark)
    world.write_segments(0, 100, base_offset=200, records_per_segment=50)
    real_lease = replay_module._lease

    def a_run_commits_first(*args, **kwargs):
        [landed] = ingest(world.config(), spark)  # after the move loaded the table, before it holds the lease
        assert landed.records == 100
        return real_lease(*args, **kwargs)

    monkeypatch.setattr(replay_module, "_lease", a_run_commits_first)
    config = world.config()
    with IngestContext.from_config(config, spark) as context:
        moved = move_position(context, config.mappings[0], 0, 100)
    assert (moved.before, moved.after) == (300, 100)
    table = world.table()
    assert read_committed_offsets(table)[world.topic] == {0: 100}
    assert sorted(o for _, _, o in world.table_rows(table)) == list(range(100))
    assert world.table_data_files() >= world.referenced_data_files(table)

    [result] = ingest(world.config(), spark)
    assert result.records == 200, "the removed rows land again, once"
    world.assert_exactly_once(runs=4)


def test_the_dagster_replay_job_replays_from_the_launchpads_run_config(embedded_world, spark):
    from kafscale_lakehouse.orchestration.replay import build_replay_job, replay_job_name
    from kafscale_lakehouse.orchestration.resources import SPARK_RESOURCE_KEY, SparkResource, lakehouse_resources

    world = embedded_world
    world.write_segments(0, 80, records_per_segment=40)
    ingest(world.config(_document_without_store_id(world)), spark)
    config = world.config()
    job = build_replay_job(config, config.mappings[0])
    resources = {**lakehouse_resources(config), SPARK_RESOURCE_KEY: SparkResource(master="local[1]")}
    op_name = f"{replay_job_name(world.table_name)}_op"

    result = job.execute_in_process(resources=resources, run_config={
        "ops": {op_name: {"config": {"partition": 0, "from_offset": 40}}}})  # to the table's next offset

    assert result.success
    [observation] = [e.event_specific_data.asset_observation for e in result.all_events
                     if e.event_type_value == "ASSET_OBSERVATION"]
    assert observation.metadata["kafscale/replay"].value == "partition 0 offsets 40..79"
    assert observation.metadata["rows_added"].value == 40
    assert {k for k, v in _store_ids(world).items() if v is not None} == {(0, o) for o in range(40, 80)}
    world.assert_exactly_once(runs=2)

    failed = job.execute_in_process(resources=resources, raise_on_error=False, run_config={
        "ops": {op_name: {"config": {"partition": 0, "from_offset": 60, "to_offset": 120}}}})
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "the table holds offsets up to 79 of the partition" in failure.event_specific_data.error.message
