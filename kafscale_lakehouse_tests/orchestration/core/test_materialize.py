"""Materialization through Dagster's API against SeaweedFS (S3 segments + REST catalog) and etcd: table rows,
per-partition metadata, check results, an injected duplicate, a partition that cannot be read, the topic observation."""

from __future__ import annotations

import dagster as dg
from pyiceberg.expressions import And, EqualTo

from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.engine.tables.checks import (
    FRESHNESS,
    OFFSETS_CONTIGUOUS,
    RECORD_ID_UNIQUE,
    RETENTION_HEADROOM,
    SCHEMA_VALID,
)
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.orchestration.naming import topic_asset_key
from kafscale_lakehouse.storage.retention import topic_config_key
from kafscale_lakehouse_tests.orchestration.core.conftest import run_ingest_job
from kafscale_lakehouse_tests.storage.test_retention import topic_config


def materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, object]]:
    """Partition key -> metadata values of the run's materializations."""
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        found[materialization.partition] = {k: v.value for k, v in materialization.metadata.items()}
    return found


def check_results(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {evaluation.check_name: evaluation for evaluation in result.get_asset_check_evaluations()}


def test_partitions_materialize_in_one_run_and_one_commit_with_metadata_and_passing_checks(production_world, spark):
    world = production_world
    world.write_segments(0, 120, records_per_segment=40)
    world.write_segments(1, 60, records_per_segment=30)
    with EtcdClient([world.etcd_endpoint]) as etcd:  # the broker is 30 records ahead on partition 0
        etcd.put(broker_next_offset_key(world.topic, 0), "150")
    instance = dg.DagsterInstance.ephemeral()

    result = run_ingest_job(world.config(), instance, [0, 1])

    assert result.success
    assert world.lease_keys() == [], "the asset released every lease before it returned"
    table = world.assert_exactly_once(runs=1)
    snapshot_id = table.current_snapshot().snapshot_id
    by_partition = materializations(result)
    assert set(by_partition) == {"0", "1"}
    for key, records, files in (("0", 120, 3), ("1", 60, 2)):
        metadata = by_partition[key]
        assert metadata["kafka_partition"] == int(key)
        assert metadata["offset_range"] == f"[0, {records})"
        assert (metadata["start_offset"], metadata["end_offset"], metadata["records"]) == (0, records, records)
        assert metadata["segments"] == files and metadata["data_files"] >= 1 and metadata["value_bytes"] > 0
        assert metadata["snapshot_id"] == snapshot_id and metadata["invalid_records"] == 0
        rows = {r.data["partition"]: r.data for r in metadata["kafka_partitions"].records}
        assert {p: rows[p]["end_offset"] for p in rows} == {0: 120, 1: 60}
        assert metadata["committed_offset_ranges"] == {"0": [0, 120], "1": [0, 60]}
        # The Dagster table keys: the table's, and the rows of this Kafka partition.
        assert (metadata["dagster/table_name"], metadata["dagster/uri"]) == (world.table_name, table.location())
        assert metadata["dagster/row_count"] == 180 and metadata["dagster/partition_row_count"] == records
        assert "record_id" in [c.name for c in metadata["dagster/column_schema"].columns]
    assert by_partition["0"]["lag"] == 30
    checks = check_results(result)
    assert set(checks) == {SCHEMA_VALID, RECORD_ID_UNIQUE, OFFSETS_CONTIGUOUS, FRESHNESS, RETENTION_HEADROOM}
    assert all(evaluation.passed for evaluation in checks.values()), {n: e.description for n, e in checks.items()}
    unique = checks[RECORD_ID_UNIQUE].metadata
    assert unique["rows_scanned"].value == 180
    assert unique["offset_ranges_scanned"].value == {"0": [0, 120], "1": [0, 60]}
    lag_rows = {r.data["partition"]: r.data for r in checks[FRESHNESS].metadata["lag_by_partition"].value.records}
    assert (lag_rows[0]["lag"], lag_rows[0]["measured_against"]) == (30, "broker watermark")
    retention = checks[RETENTION_HEADROOM]
    assert "unlimited retention" in retention.description  # no topic config in etcd: KafScale's default
    windows = {r.data["partition"]: r.data for r in retention.metadata["retention_by_partition"].value.records}
    assert {p: (w["log_start_offset"], w["replay_window_records"]) for p, w in windows.items()} == {0: (0, 120),
                                                                                                   1: (0, 60)}


def test_record_id_unique_scans_only_the_run_ranges_and_catches_an_injected_duplicate(production_world, spark):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    config = world.config()
    instance = dg.DagsterInstance.ephemeral()
    assert run_ingest_job(config, instance, [0, 1]).success
    world.write_segments(0, 40, base_offset=80, records_per_segment=40)

    second = run_ingest_job(config, instance, [0])

    unique = check_results(second)[RECORD_ID_UNIQUE]
    assert unique.passed
    assert unique.metadata["offset_ranges_scanned"].value == {"0": [80, 120]}
    assert unique.metadata["rows_scanned"].value == 40
    # Pruned by the offset statistics: only the run's own data file is read.
    assert unique.metadata["data_files_scanned"].value < unique.metadata["data_files_in_table"].value

    table = world.table()
    duplicate = table.scan(row_filter=And(EqualTo("partition", 0), EqualTo("offset", 100))).to_arrow()
    table.append(duplicate)  # another writer, with plain pyiceberg: no kafscale offsets in its snapshot
    # Nothing new: the check looks at our latest commit's ranges. It is blocking, so the run fails on it.
    third = run_ingest_job(config, instance, [0], raise_on_error=False)
    assert not third.success

    unique = check_results(third)[RECORD_ID_UNIQUE]
    assert not unique.passed and unique.severity == dg.AssetCheckSeverity.ERROR
    assert unique.metadata["duplicate_record_ids"].value == 1
    samples = [r.data for r in unique.metadata["duplicate_samples"].value.records]
    assert samples == [{"record_id": f"{world.topic}:0:100", "occurrences": 2}]
    assert f"{world.topic}:0:100" in unique.description
    assert check_results(third)[OFFSETS_CONTIGUOUS].passed


def test_an_unreadable_segment_fails_the_run_naming_it_after_committing_the_other_partition(production_world, spark):
    world = production_world
    world.write_segments(0, 40, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    bad_key = world.corrupt_segment(1, 0)
    instance = dg.DagsterInstance.ephemeral()

    result = run_ingest_job(world.config(), instance, [0, 1], raise_on_error=False)

    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert bad_key in failure.step_failure_data.user_failure_data.description
    # The asset yielded the committed partition's materialization before it failed: in the run, and only that one.
    assert set(materializations(result)) == {"0"}, "the failed partition is not materialized"
    [committed] = instance.fetch_materializations(dg.AssetKey(world.table_name.split(".")), limit=10).records
    materialization = committed.asset_materialization
    assert materialization.partition == "0", "the committed partition is recorded as materialized"
    assert committed.run_id == result.run_id
    assert materialization.metadata["records"].value == 40
    assert materialization.metadata["snapshot_id"].value == world.table().current_snapshot().snapshot_id
    assert materialization.metadata["dagster/partition_row_count"].value == 40
    assert instance.get_materialized_partitions(dg.AssetKey(world.table_name.split("."))) == {"0"}
    assert world.lease_keys() == [], "the asset released every lease before it failed"
    world.assert_exactly_once(runs=1, expected={0: range(40)})


def test_the_topic_observation_reports_watermark_completed_segments_lag_and_retention(production_world, spark):
    world = production_world
    world.write_segments(0, 50, records_per_segment=25)
    with EtcdClient([world.etcd_endpoint]) as etcd:
        etcd.put(broker_next_offset_key(world.topic, 0), "70")
        etcd.put(topic_config_key(world.topic), topic_config(world.topic, retention_ms=7_200_000))
    definitions = build_definitions(world.config())
    observe_job = dg.define_asset_job("observe_topic", selection=dg.AssetSelection.assets(topic_asset_key(world.topic)))
    job = dg.Definitions.merge(definitions, dg.Definitions(jobs=[observe_job])).resolve_job_def("observe_topic")

    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral())

    [observation] = [e.event_specific_data.asset_observation for e in result.all_events
                     if e.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    metadata = {k: v.value for k, v in observation.metadata.items()}
    assert metadata["broker_next_offset"] == {"0": 70}
    assert metadata["completed_segments_end"] == {"0": 50}
    assert metadata["committed_next_offset"] == {"0": None}  # nothing committed
    assert metadata["lag"] == 70
    assert metadata["retention"] == "retention.ms 7200000"
    assert 6600 < metadata["min_retention_headroom_seconds"] <= 7200  # nothing landed: the oldest segment counts
    assert metadata["replay_window"]["0"]["log_start_offset"] == 0
