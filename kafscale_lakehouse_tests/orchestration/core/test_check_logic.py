"""The asset checks' evaluations on a local sqlite Iceberg table and on hand-made inputs (no servers, no Spark)."""

from __future__ import annotations

import json

import dagster as dg
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from kafscale_lakehouse.engine.ingestion.rows import InvalidRecord
from kafscale_lakehouse.engine.ingestion.run import IngestResult, PartitionOutcome
from kafscale_lakehouse.engine.ingestion.topic_scan import PartitionState
from kafscale_lakehouse.engine.tables.checks import latest_committed_ranges, offset_history
from kafscale_lakehouse.engine.tables.summary import OFFSETS_PROPERTY_PREFIX, RUN_ID_PROPERTY, SKIPPED_PROPERTY_PREFIX
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.orchestration.checks import (
    evaluate_freshness,
    evaluate_offsets_contiguous,
    evaluate_record_id_unique,
    evaluate_retention_headroom,
    evaluate_schema_valid,
    run_committed_ranges,
)
from kafscale_lakehouse.orchestration.metadata import run_metadata
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.storage import PartitionRetention, RetentionPolicy, TopicRetention

TOPIC = "orders.v1"


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("checks", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("shop")
    return catalog.create_table("shop.orders", table_schema([]))


def append(table, partition: int, offsets: range, *, next_offsets: dict[int, int] | None = None,
           run_id: str | None = None, skipped: dict[int, tuple[int, int]] | None = None) -> None:
    """Rows of `offsets` in one snapshot; with `next_offsets` it looks like one of our commits."""
    arrow_schema = table.schema().as_arrow()
    rows = pa.Table.from_pylist([{
        "record_id": f"{TOPIC}:{partition}:{o}", "topic": TOPIC, "partition": partition, "offset": o,
        "timestamp_ms": 0, "key": None, "value": b"{}", "headers": "",
    } for o in offsets], schema=arrow_schema)
    properties = {}
    if next_offsets is not None:
        properties[OFFSETS_PROPERTY_PREFIX + TOPIC] = json.dumps({str(p): o for p, o in next_offsets.items()})
        properties[RUN_ID_PROPERTY] = run_id or "run"
    if skipped:
        properties[SKIPPED_PROPERTY_PREFIX + TOPIC] = json.dumps({str(p): list(r) for p, r in skipped.items()})
    table.append(rows, snapshot_properties=properties)


def committed_run(table, run_id: str, ranges: list[OffsetRange]) -> dict:
    """The materialization metadata of a run that committed `ranges` in the table's current snapshot."""
    outcomes = {r.partition: PartitionOutcome(r.partition, r.start, r.end, committed=r) for r in ranges}
    return run_metadata(IngestResult(topic=TOPIC, table="shop.orders", run_id=run_id, partitions=outcomes,
                                     snapshot_id=table.current_snapshot().snapshot_id))


def test_committed_ranges_are_those_the_run_recorded_else_of_the_latest_commit(table):
    append(table, 0, range(10), next_offsets={0: 10}, run_id="first")
    append(table, 1, range(5), next_offsets={0: 10, 1: 5}, run_id="second")
    second = committed_run(table, "second", [OffsetRange(1, 0, 5)])
    append(table, 0, range(10, 30), next_offsets={0: 30, 1: 5}, run_id="third")

    assert [c.run_id for c in offset_history(table, TOPIC)] == ["first", "second", "third"]
    snapshot_id, ranges = run_committed_ranges(table, TOPIC, second)
    assert ranges == {1: OffsetRange(1, 0, 5)} and snapshot_id == second["snapshot_id"].value
    # A check run on its own (no materialization of ours): the latest commit, from its predecessor's offsets.
    latest = table.current_snapshot().snapshot_id
    assert run_committed_ranges(table, TOPIC, None) == (latest, {0: OffsetRange(0, 10, 30)})
    assert latest_committed_ranges(table, TOPIC)[1] == {0: OffsetRange(0, 10, 30)}
    # A run that committed nothing (no new segments): the latest commit too.
    assert run_committed_ranges(table, TOPIC, committed_run(table, "fourth", [])) == (
        latest,
        {0: OffsetRange(0, 10, 30)},
    )


def test_committed_ranges_of_an_empty_table(table):
    assert latest_committed_ranges(table, TOPIC) == (None, {})
    assert run_committed_ranges(table, TOPIC, {}) == (None, {})


def test_record_id_unique_finds_a_duplicate_in_the_run_range_only(table):
    append(table, 0, range(10), next_offsets={0: 10}, run_id="first")
    first = committed_run(table, "first", [OffsetRange(0, 0, 10)])
    append(table, 0, range(3, 4))  # another writer duplicates offset 3, outside the next run's range
    append(table, 0, range(10, 20), next_offsets={0: 20}, run_id="second")
    second = committed_run(table, "second", [OffsetRange(0, 10, 20)])

    assert evaluate_record_id_unique(table, TOPIC, second).passed
    assert evaluate_record_id_unique(table, TOPIC, None).passed  # alone: the latest commit, 10..19
    failed = evaluate_record_id_unique(table, TOPIC, first)
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
    assert failed.metadata["offset_ranges_scanned"].value == {"0": [0, 10]}
    assert [r.data for r in failed.metadata["duplicate_samples"].value.records] == [
        {"record_id": f"{TOPIC}:0:3", "occurrences": 2}
    ]


def test_offsets_contiguous_passes_for_commits_that_only_move_forward(table):
    append(table, 0, range(10), next_offsets={0: 10})
    append(table, 0, range(10, 20), next_offsets={0: 20})

    result = evaluate_offsets_contiguous(table, TOPIC)

    assert result.passed, result.description
    assert result.metadata["next_offsets"].value == {"0": 20}


def test_offsets_contiguous_fails_when_a_commit_moves_offsets_back(table):
    append(table, 0, range(20), next_offsets={0: 20})
    append(table, 1, range(5), next_offsets={0: 12, 1: 5})
    snapshot_back = table.current_snapshot().snapshot_id

    result = evaluate_offsets_contiguous(table, TOPIC)

    assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR
    assert f"snapshot {snapshot_back} moved partition 0 back from 20 to 12" in result.description


def test_offsets_contiguous_fails_for_rows_beyond_the_committed_offsets(table):
    append(table, 0, range(10), next_offsets={0: 10})
    append(table, 0, range(10, 12))  # rows nobody committed offsets for: the next run ingests them again
    append(table, 2, range(1))  # a partition without committed offsets at all

    result = evaluate_offsets_contiguous(table, TOPIC)

    assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR
    assert result.metadata["rows_beyond_committed_samples"].value == [f"{TOPIC}:0:10", f"{TOPIC}:0:11", f"{TOPIC}:2:0"]


def test_offsets_contiguous_warns_about_a_gap_the_latest_commit_skipped(table):
    append(table, 0, range(10), next_offsets={0: 10})
    append(table, 0, range(40, 50), next_offsets={0: 50}, skipped={0: (10, 40)})

    result = evaluate_offsets_contiguous(table, TOPIC)

    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    assert "partition 0 offsets 10..39" in result.description
    append(table, 0, range(50, 60), next_offsets={0: 60})
    later = evaluate_offsets_contiguous(table, TOPIC)
    assert later.passed, "an earlier, reported gap does not fail later runs"
    assert later.metadata["skipped_gaps"].value[0]["offsets"] == [10, 39]


def test_freshness_warns_above_the_threshold_naming_partitions_and_what_lag_is_measured_against():
    states = {
        0: PartitionState(0, next_offset=100, segments_end=100, log_end=5_100),
        1: PartitionState(1, next_offset=50, segments_end=80, log_end=None),
        2: PartitionState(2, next_offset=None, segments_end=None, log_end=None),  # nothing seen yet
    }

    assert evaluate_freshness(states, max_lag_records=5_000).passed
    result = evaluate_freshness(states, max_lag_records=20)

    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    assert "partitions [0, 1]" in result.description
    rows = {r.data["partition"]: r.data for r in result.metadata["lag_by_partition"].value.records}
    assert (rows[0]["lag"], rows[0]["measured_against"]) == (5_000, "broker watermark")
    assert (rows[1]["lag"], rows[1]["measured_against"]) == (30, "completed segments")
    assert (rows[2]["lag"], rows[2]["measured_against"]) == (0, "completed segments")


def test_schema_valid_reads_the_run_invalid_records_from_its_materialization_metadata():
    # Lenient mode's default dead-letter table: the mapping names none, the run reports where the records went.
    result = IngestResult(
        topic=TOPIC,
        table="shop.orders",
        run_id="r",
        snapshot_id=7,
        dead_letter_table="shop.orders_dead_letters",
        partitions={0: PartitionOutcome(0, 0, 10, records=8)},
        invalid_count=2,
        invalid_samples=[
            InvalidRecord(f"{TOPIC}:0:3", "order_id: missing", None),
            InvalidRecord(f"{TOPIC}:0:7", "not valid", "properties.store_id.type"),
        ],
    )

    check = evaluate_schema_valid(run_metadata(result), "lenient")

    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert "2 invalid records (in dead-letter table shop.orders_dead_letters)" in check.description
    assert f"{TOPIC}:0:7: not valid (schema properties.store_id.type)" in check.description
    assert [r.data["record_id"] for r in check.metadata["invalid_samples"].value.records] == [
        f"{TOPIC}:0:3",
        f"{TOPIC}:0:7",
    ]
    result.dead_letter_table = None
    assert "2 invalid records (not committed)" in evaluate_schema_valid(run_metadata(result), "strict").description
    result.invalid_count, result.invalid_samples = 0, []
    assert evaluate_schema_valid(run_metadata(result), "lenient").passed
    assert evaluate_schema_valid(None, "strict").passed


def retention_of(policy: RetentionPolicy, **partitions: PartitionRetention) -> TopicRetention:
    return TopicRetention("orders", policy, {int(p[1:]): r for p, r in partitions.items()})


def at_risk(partition: int, headroom_seconds: float | None, gap: str | None = None) -> PartitionRetention:
    return PartitionRetention(partition, headroom_seconds, None, 0, 7200.0, 100, "ns/orders/0/segment-0.kfs", gap)


def test_retention_headroom_passes_warns_below_the_threshold_and_fails_on_a_certain_gap():
    day = RetentionPolicy(retention_ms=86_400_000)
    fine = evaluate_retention_headroom(retention_of(day, p0=at_risk(0, 80_000), p1=at_risk(1, None)),
                                       warn_seconds=3600)
    assert fine.passed and fine.metadata["min_headroom_seconds"].value == 80_000
    rows = {r.data["partition"]: r.data for r in fine.metadata["retention_by_partition"].value.records}
    assert rows[1]["headroom_seconds"] is None and rows[0]["replay_window_records"] == 100
    short = evaluate_retention_headroom(retention_of(day, p0=at_risk(0, 1800), p1=at_risk(1, 80_000)),
                                        warn_seconds=3600)
    assert not short.passed and short.severity == dg.AssetCheckSeverity.WARN
    assert "partitions [0] have less than 3600 s" in short.description
    gone = evaluate_retention_headroom(retention_of(day, p0=at_risk(0, -5, gap="offsets 3..9 are gone")),
                                       warn_seconds=3600)
    assert not gone.passed and gone.severity == dg.AssetCheckSeverity.ERROR
    assert "partition 0: offsets 3..9 are gone" in gone.description


def test_retention_headroom_unreadable_warns_naming_why():
    result = evaluate_retention_headroom(None, "cannot read the retention of topic orders: etcd down", warn_seconds=1)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    assert "etcd down" in result.description
