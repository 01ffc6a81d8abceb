"""Dead-letter files written by a task, and the stage → table commit → publish protocol, on both catalogs."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType

from kafscale_lakehouse.engine.ingestion.rows import SourceRowSplitter, SourceTaskStats
from kafscale_lakehouse.engine.ingestion.segment_reader import (
    INVALID_REASON_COLUMN,
    INVALID_SCHEMA_PATH_COLUMN,
    SegmentRunPartition,
    read_input_partition,
)
from kafscale_lakehouse.engine.ingestion.spark_job import IngestionTaskOutput, split_dead_letter_files
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, load_catalog, open_table
from kafscale_lakehouse.engine.tables.dead_letters import (
    DeadLetterTableError,
    DeadLetterTarget,
    StagedDeadLetters,
    dead_letter_target,
    open_dead_letter_table,
    publish_dead_letters,
    publish_pending_dead_letters,
    stage_dead_letters,
)
from kafscale_lakehouse.engine.tables.summary import LOST_RECORDS_PROPERTY, RUN_ID_PROPERTY
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.schema.validation import compile_json_schema
from kafscale_lakehouse.storage import LocalSegmentStore
from kafscale_lakehouse_tests.engine.tables.helpers import rest_settings
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, PIZZA_SCHEMA, SEGMENT_RECORDS, records_with_faults

TOPIC = "dead-letter-pizzas"
COLUMNS = (Column(name="order_id", type="string", required=True),)


@pytest.fixture(params=["sql", "rest"])
def catalog(request, tmp_path):
    if request.param == "sql":
        return load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))
    return load_catalog(rest_settings(request.getfixturevalue("seaweedfs")))


@pytest.fixture
def namespace(unique_prefix) -> str:
    return unique_prefix.replace("-", "_")  # S3 Tables names: lowercase letters, digits, underscores


@pytest.fixture
def source_batches(tmp_path) -> list[pa.RecordBatch]:
    return read_source_batches(tmp_path)


def read_source_batches(tmp_path, partition: int = 0) -> list[pa.RecordBatch]:
    """The validated source rows of one segment of `partition` (offsets 0..19, FAULTS invalid), as a Spark task
    receives them."""
    (tmp_path / "segments").mkdir(exist_ok=True)
    store = LocalSegmentStore(tmp_path / "segments", namespace="ns")
    segment = encode_segment(records_with_faults(partition=partition), base_offset=0, codec="lz4",
                             records_per_batch=6)
    store.write_segment(TOPIC, partition, 0, segment.kfs, segment.index)
    [ref] = store.list_segments(TOPIC, partition).segments
    task = SegmentRunPartition(TOPIC, OffsetRange(partition, 0, SEGMENT_RECORDS), (ref,))
    return list(read_input_partition(store, task, COLUMNS, json_schema=compile_json_schema(PIZZA_SCHEMA, "test")))


def split(batches: list[pa.RecordBatch], target: DeadLetterTarget | None) -> tuple[SourceRowSplitter, pa.Table]:
    splitter = SourceRowSplitter(target, task_id=3)
    valid = pa.Table.from_batches(list(splitter.rows_to_write(batches)))
    return splitter, valid


def dead_letter_rows(table) -> list[dict]:
    table.refresh()
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda row: row["offset"])


def test_a_task_writes_invalid_records_to_dead_letter_files_and_the_rest_to_the_table(catalog, namespace,
                                                                                      source_batches):
    dead_letters = open_dead_letter_table(catalog, f"{namespace}.pizzas_dead_letters")
    target = dead_letter_target(dead_letters, "run-a", target_file_size_bytes=1 << 20)

    splitter, valid = split(source_batches, target)

    assert sorted(valid.column("offset").to_pylist()) == [o for o in range(SEGMENT_RECORDS) if o not in FAULTS]
    assert INVALID_REASON_COLUMN not in valid.schema.names and INVALID_SCHEMA_PATH_COLUMN not in valid.schema.names
    stats = splitter.stats
    assert stats.invalid_count == len(FAULTS) and stats.invalid_by_partition == {0: len(FAULTS)}
    assert stats.invalid_first_offset == {0: min(FAULTS)}
    assert [(s.record_id, s.schema_path) for s in stats.invalid_samples] == [
        (f"{TOPIC}:0:{o}", FAULTS[o].schema_path) for o in sorted(FAULTS)]
    assert len(stats.dead_letter_files) == 1 and stats.dead_letter_files[0].record_count == len(FAULTS)
    assert "kafscale-run-a-00003-" in stats.dead_letter_files[0].file_path  # found by orphan cleanup


def test_staged_dead_letters_are_invisible_until_published_and_published_once(catalog, namespace, source_batches):
    dead_letters = open_dead_letter_table(catalog, f"{namespace}.pizzas_dead_letters")
    splitter, _ = split(source_batches, dead_letter_target(dead_letters, "run-b", target_file_size_bytes=1 << 20))

    staged = stage_dead_letters(dead_letters, splitter.stats.dead_letter_files, run_id="run-b",
                                source_table=f"{namespace}.pizzas", topic=TOPIC, offset_ranges={0: (0, 20)})

    assert staged.records == len(FAULTS)
    assert dead_letter_rows(dead_letters) == []
    published = publish_dead_letters(dead_letters, staged, source_snapshot_id=42)
    again = publish_dead_letters(dead_letters, staged, source_snapshot_id=42)

    assert again == published
    rows = dead_letter_rows(dead_letters)
    assert [row["offset"] for row in rows] == sorted(FAULTS)
    for row in rows:
        fault = FAULTS[row["offset"]]
        assert row["value"] == fault.value  # the raw value, byte for byte
        assert fault.schema_reason in row["error"] and row["schema_path"] == fault.schema_path
        assert row["record_id"] == f"{TOPIC}:0:{row['offset']}" and row["topic"] == TOPIC and row["partition"] == 0
        assert row["run_id"] == "run-b" and row["ingested_at"].tzinfo is not None
    summary = dead_letters.current_snapshot().summary
    assert summary[RUN_ID_PROPERTY] == "run-b"
    assert summary["kafscale.dead-letter.offsets." + TOPIC] == '{"0":[0,20]}'
    assert summary["kafscale.dead-letter.source-snapshot-id"] == "42"
    assert len([s for s in dead_letters.metadata.snapshots if s.summary.get(RUN_ID_PROPERTY) == "run-b"]) == 2


def test_a_run_that_stopped_after_its_table_commit_gets_its_dead_letters_published_by_the_next(catalog, namespace,
                                                                                               source_batches):
    table = open_table(catalog, f"{namespace}.pizzas", schema=table_schema(COLUMNS), create_if_missing=True)
    dead_letters = open_dead_letter_table(catalog, f"{namespace}.pizzas_dead_letters")
    splitter, _ = split(source_batches, dead_letter_target(dead_letters, "run-c", target_file_size_bytes=1 << 20))
    staged = stage_dead_letters(dead_letters, splitter.stats.dead_letter_files, run_id="run-c",
                                source_table=f"{namespace}.pizzas", topic=TOPIC, offset_ranges={0: (0, 20)})
    # The run commits the table (no valid data files needed for this) and stops before publishing.
    commit = commit_append(table, [], TOPIC, {0: 0}, {0: 20}, "run-c", snapshot_properties=staged.summary_properties())

    pending = publish_pending_dead_letters(table, catalog)

    assert len(pending.published) == 1 and pending.lost == []
    assert [row["offset"] for row in dead_letter_rows(dead_letters)] == sorted(FAULTS)
    assert dead_letters.current_snapshot().summary["kafscale.dead-letter.source-snapshot-id"] == str(commit.snapshot_id)
    # A later run finds nothing pending; a later table commit without dead letters changes nothing either.
    commit_append(table, [], TOPIC, {0: 20}, {0: 25}, "run-d")
    assert publish_pending_dead_letters(table, catalog).published == []
    assert len(dead_letter_rows(dead_letters)) == len(FAULTS)


def test_a_run_that_died_before_publishing_is_found_behind_a_later_run_that_published(catalog, namespace,
                                                                                      source_batches, tmp_path):
    """Runs A and B on disjoint partitions; B settled the table before A committed, A commits
    and dies before publishing, B commits and publishes. The next walk must reach A's staged snapshot behind B's
    published one (B's `published-through` names the snapshot before A's commit)."""
    table = open_table(catalog, f"{namespace}.pizzas", schema=table_schema(COLUMNS), create_if_missing=True)
    dead_letters = open_dead_letter_table(catalog, f"{namespace}.pizzas_dead_letters")
    commit_append(table, [], TOPIC, {0: 0, 1: 0}, {0: 5, 1: 5}, "run-before")
    b_settled = publish_pending_dead_letters(table, catalog)  # run B starts: nothing pending yet
    staged_by = {}
    for run_id, partition in (("run-a", 0), ("run-b", 1)):
        batches = source_batches if partition == 0 else read_source_batches(tmp_path, partition)
        splitter, _ = split(batches, dead_letter_target(dead_letters, run_id, target_file_size_bytes=1 << 20))
        staged_by[run_id] = stage_dead_letters(dead_letters, splitter.stats.dead_letter_files, run_id=run_id,
                                               source_table=f"{namespace}.pizzas", topic=TOPIC,
                                               offset_ranges={partition: (5, 25)})
    commit_append(table, [], TOPIC, {0: 5}, {0: 25}, "run-a",
                  snapshot_properties=staged_by["run-a"].summary_properties())  # A dies before publishing
    b_commit = commit_append(table, [], TOPIC, {1: 5}, {1: 25}, "run-b",
                             snapshot_properties={**staged_by["run-b"].summary_properties(),
                                                  **b_settled.published_through_properties()})
    publish_dead_letters(dead_letters, staged_by["run-b"], source_snapshot_id=b_commit.snapshot_id)

    pending = publish_pending_dead_letters(table, catalog)

    assert len(pending.published) == 1 and pending.lost == [], "run A's staged dead letters are published"
    dead_letters.refresh()
    run_ids = [row["run_id"] for row in dead_letter_rows(dead_letters)]
    assert sorted(run_ids) == ["run-a"] * len(FAULTS) + ["run-b"] * len(FAULTS)
    assert publish_pending_dead_letters(table, catalog).published == [], "published once"


def test_dead_letters_whose_staged_snapshot_is_gone_are_reported_once_and_never_wedge_later_runs(catalog, namespace):
    table = open_table(catalog, f"{namespace}.pizzas", schema=table_schema(COLUMNS), create_if_missing=True)
    dead_letters = open_dead_letter_table(catalog, f"{namespace}.pizzas_dead_letters")
    commit_append(table, [], TOPIC, {0: 0}, {0: 5}, "run-before")
    lost = StagedDeadLetters(f"{namespace}.pizzas_dead_letters", 123456789, 4)
    commit_append(table, [], TOPIC, {0: 5}, {0: 20}, "run-e", snapshot_properties=lost.summary_properties())

    pending = publish_pending_dead_letters(table, catalog)

    [message] = pending.lost
    assert "staged snapshot 123456789 holding 4 invalid records" in message and "run-e" in message
    assert "'dead-letter-pizzas': {0: [5, 20]}" in message, "names the offsets at stake"
    dead_letters.refresh()
    assert dead_letters.current_snapshot().summary[LOST_RECORDS_PROPERTY] == "4"
    again = publish_pending_dead_letters(table, catalog)
    assert again.lost == [] and again.published == [], "reported once; the next run goes on"


def test_a_dropped_dead_letter_table_does_not_wedge_ingestion(catalog, namespace, source_batches):
    table = open_table(catalog, f"{namespace}.pizzas", schema=table_schema(COLUMNS), create_if_missing=True)
    dead_letter_name = f"{namespace}.pizzas_dead_letters"
    dead_letters = open_dead_letter_table(catalog, dead_letter_name)
    splitter, _ = split(source_batches, dead_letter_target(dead_letters, "run-f", target_file_size_bytes=1 << 20))
    staged = stage_dead_letters(dead_letters, splitter.stats.dead_letter_files, run_id="run-f",
                                source_table=f"{namespace}.pizzas", topic=TOPIC, offset_ranges={0: (0, 20)})
    # The run commits and stops before publishing; then an operator drops the dead-letter table.
    commit_append(table, [], TOPIC, {0: 0}, {0: 20}, "run-f", snapshot_properties=staged.summary_properties())
    catalog.drop_table(dead_letter_name)

    first = publish_pending_dead_letters(table, catalog)
    commit_append(table, [], TOPIC, {0: 20}, {0: 30}, "run-g", snapshot_properties=first.published_through_properties())
    second = publish_pending_dead_letters(table, catalog)

    assert len(first.lost) == 1 and f"{len(FAULTS)} invalid records" in first.lost[0]
    assert second.lost == [] and second.published == []
    assert catalog.table_exists(dead_letter_name), "recreated for the next invalid records"


def test_files_roll_over_at_the_target_size_and_a_failed_task_deletes_its_own(tmp_path, source_batches):
    catalog = load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))
    dead_letters = open_dead_letter_table(catalog, "ns.rolling_dead_letters")
    target = dead_letter_target(dead_letters, "run-f", target_file_size_bytes=1)  # every batch is a file
    small_batches = [b.slice(start, 5) for b in source_batches for start in range(0, b.num_rows, 5)]

    splitter, _ = split(small_batches, target)
    files = splitter.stats.dead_letter_files

    assert len(files) > 1 and sum(f.record_count for f in files) == len(FAULTS)
    io = target.file_io()
    assert all(io.new_input(f.file_path).exists() for f in files)
    splitter.discard_dead_letters()
    assert not any(io.new_input(f.file_path).exists() for f in files)
    assert splitter.stats.dead_letter_files == []


def test_a_dead_letter_table_with_other_columns_is_refused_naming_it(tmp_path):
    catalog = load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))
    open_table(catalog, "ns.taken", schema=Schema(NestedField(1, "record_id", StringType(), required=True)),
               create_if_missing=True)

    with pytest.raises(DeadLetterTableError, match=r"dead-letter table ns.taken: column 'topic' \(string\) is missing"):
        open_dead_letter_table(catalog, "ns.taken")


def _message(partition: int, first_invalid: int, files: list) -> IngestionTaskOutput:
    stats = SourceTaskStats(invalid_count=2, invalid_by_partition={partition: 2},
                            invalid_first_offset={partition: first_invalid}, dead_letter_files=files)
    return IngestionTaskOutput(task_id=0, data_files=(), source_stats=stats)


def test_dead_letter_files_are_kept_only_for_offsets_the_run_commits():
    below, beyond, fenced = object(), object(), object()
    messages = [_message(0, 10, [below]), _message(0, 60, [beyond]), _message(1, 5, [fenced]),
                _message(2, 0, [])]

    split_files = split_dead_letter_files(messages, {0: 50})  # partition 0 commits up to 50, partition 1 not at all

    assert split_files.keep == [below] and split_files.drop == [beyond, fenced] and split_files.records == {0: 2}
