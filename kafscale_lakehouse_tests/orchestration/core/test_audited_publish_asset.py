"""A `publish: audited` table asset in a real Dagster instance (SeaweedFS S3 + REST catalog, etcd, Spark): the
body runs the blocking checks on the audited snapshot and reports them as the asset's checks; main moves only when
they pass, and the materialization says whether it published and the audit snapshot id."""

from __future__ import annotations

import dagster as dg
import pytest

import kafscale_lakehouse.engine.ingestion.run as run_module
from kafscale_lakehouse.engine.tables.checks import (
    FRESHNESS,
    OFFSETS_CONTIGUOUS,
    RECORD_ID_UNIQUE,
    RETENTION_HEADROOM,
    SCHEMA_VALID,
)
from kafscale_lakehouse_tests.orchestration.core.conftest import run_ingest_job
from kafscale_lakehouse_tests.orchestration.core.test_materialize import check_results, materializations


def test_the_audited_asset_publishes_a_clean_run_and_reports_a_failed_check_without_moving_main(
        production_world, spark, monkeypatch: pytest.MonkeyPatch):
    world = production_world
    world.write_segments(0, 40, records_per_segment=20)
    world.write_segments(1, 20, records_per_segment=20)
    document = world.config_document()
    document["mappings"][0]["publish"] = "audited"
    config = world.config(document)
    instance = dg.DagsterInstance.ephemeral()

    clean = run_ingest_job(config, instance, [0, 1])

    assert clean.success
    table = world.assert_exactly_once(runs=1)
    metadata = materializations(clean)["0"]
    assert metadata["published"] is True
    assert metadata["audit_snapshot_id"] == metadata["snapshot_id"] == table.current_snapshot().snapshot_id
    checks = check_results(clean)
    assert set(checks) == {SCHEMA_VALID, RECORD_ID_UNIQUE, OFFSETS_CONTIGUOUS, FRESHNESS, RETENTION_HEADROOM}
    assert all(e.passed for e in checks.values()), {n: e.description for n, e in checks.items()}
    assert checks[RECORD_ID_UNIQUE].metadata["rows_scanned"].value == 60
    assert checks[RECORD_ID_UNIQUE].metadata["published"].value is True

    world.write_segments(0, 20, base_offset=40, records_per_segment=20)
    real_commit_append = run_module.commit_append
    monkeypatch.setattr(run_module, "commit_append",
                        lambda table, files, *a, **k: real_commit_append(table, [*files, files[0]], *a, **k))
    main_before = world.table().current_snapshot().snapshot_id

    failed = run_ingest_job(config, instance, [0], raise_on_error=False)

    assert not failed.success
    assert materializations(failed) == {}, "an audited snapshot that was not published materializes nothing"
    unique = check_results(failed)[RECORD_ID_UNIQUE]
    assert not unique.passed and unique.severity == dg.AssetCheckSeverity.ERROR
    assert unique.metadata["published"].value is False
    assert "main was not moved" in unique.description
    [failure] = [e for e in failed.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "audit drop --table" in failure.step_failure_data.user_failure_data.description
    assert world.table().current_snapshot().snapshot_id == main_before
    assert world.store_next_offsets() == {0: 40, 1: 20}
    monkeypatch.undo()

    # The next run refuses while the failed audit is pending, naming the check and the operator commands.
    refused = run_ingest_job(config, instance, [0], raise_on_error=False)
    assert not refused.success and materializations(refused) == {}
    [failure] = [e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    data = failure.step_failure_data  # an IngestFailedError raised before the commit: an error, not a dg.Failure
    description = data.user_failure_data.description if data.user_failure_data else data.error.to_string()
    assert RECORD_ID_UNIQUE in description and f"audit publish --table {world.table_name}" in description
    assert world.table().current_snapshot().snapshot_id == main_before
