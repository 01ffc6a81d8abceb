"""The integrity checks read only what was added since our previous commit, but do not forget a problem they saw once:
another writer appends a file of rows beyond our committed offsets of partition 1; the run that
lands only partition 0 sees it (offsets_contiguous fails), and the run that then lands partition 1 duplicates its
rows. That file is older than our previous commit by then, so an incremental scan would not read it: the checks must
scan the whole table after a failure, fail on the duplicates, and say what they scanned. In a `land_tables` batch and
in the asset's own runs, on the real servers (SeaweedFS S3 + Iceberg REST, etcd), Spark and a Dagster instance. And
how the scope follows the evaluations recorded in a Dagster instance, with the whole-table scan at least daily."""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table

from kafscale_lakehouse.engine.tables import OFFSETS_CONTIGUOUS, RECORD_ID_UNIQUE, WHOLE_TABLE
from kafscale_lakehouse.orchestration.checks import (
    LAST_WHOLE_TABLE_SCAN_KEY,
    WHOLE_TABLE_SCAN_INTERVAL_SECONDS,
    integrity_scope,
)
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.orchestration.core.conftest import production_world, run_ingest_job  # noqa: F401
from kafscale_lakehouse_tests.orchestration.namespace.test_namespace_sensor import batch_tables


def append_beyond(world: IngestWorld, partition: int, start: int, count: int) -> None:
    """Another writer (plain pyiceberg, no kafscale offsets in its snapshot) appends rows of `partition` at offsets
    `start`.., copies of the table's rows of that partition with their offsets moved."""
    table = world.table()
    rows = table.scan(row_filter=EqualTo("partition", partition)).to_arrow().sort_by("offset").slice(0, count)
    offsets = pa.array(range(start, start + rows.num_rows), type=rows.schema.field("offset").type)
    record_ids = pa.array([f"{world.topic}:{partition}:{o}" for o in offsets.to_pylist()],
                          type=rows.schema.field("record_id").type)
    for name, column in (("offset", offsets), ("record_id", record_ids)):  # fields kept as they are (required)
        rows = rows.set_column(rows.schema.get_field_index(name), rows.schema.field(name), column)
    table.append(rows)


def duplicated_offsets(table: Table, partition: int) -> list[int]:
    rows = table.scan(row_filter=EqualTo("partition", partition), selected_fields=("offset",)).to_arrow()
    counts = pc.value_counts(rows["offset"])
    return sorted(pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1)).to_pylist())


def evaluations(events: list[dg.AssetCheckEvaluation]) -> dict[str, dg.AssetCheckEvaluation]:
    return {evaluation.check_name: evaluation for evaluation in events}


def land_batch(world, cursor: str | None) -> tuple[dict[str, dg.AssetCheckEvaluation], str | None, str]:
    """One namespace tick and the `land_tables` run it requests: the checks of the orders table, the new cursor,
    the run's id."""
    tick = world.tick(world.sources(), cursor)  # fresh sources: no table offsets remembered from the last tick
    [request] = tick.run_requests
    assert set(batch_tables(request)) == {world.topics["orders"].table_name}
    result = world.land(request)
    return evaluations(result.get_asset_check_evaluations()), tick.cursor, result.run_id


def test_a_batch_that_duplicates_another_writers_rows_fails_record_id_unique(namespace_world, spark):
    world = namespace_world
    orders = world.topics["orders"]
    orders.write_segments(0, 100, records_per_segment=50)
    orders.write_segments(1, 100, records_per_segment=50)
    first, cursor, _ = land_batch(world, None)
    assert first[RECORD_ID_UNIQUE].passed and first[OFFSETS_CONTIGUOUS].passed
    assert first[RECORD_ID_UNIQUE].metadata["scope"].value.startswith(WHOLE_TABLE)  # nothing recorded before
    append_beyond(orders, 1, 100, 100)  # partition 1 offsets 100..199, while our next offset there is 100

    orders.write_segments(0, 50, base_offset=100, records_per_segment=50)  # only partition 0 has new data
    second, cursor, second_run = land_batch(world, cursor)
    assert second[RECORD_ID_UNIQUE].passed
    assert second[RECORD_ID_UNIQUE].metadata["scope"].value.startswith("files added since snapshot")
    assert not second[OFFSETS_CONTIGUOUS].passed  # the other writer's file is new: its rows lie beyond
    assert f"{orders.topic}:1:100" in second[OFFSETS_CONTIGUOUS].metadata["rows_beyond_committed_samples"].value

    orders.write_segments(1, 20, base_offset=100, records_per_segment=20)  # lands 100..119 again
    third, _, _ = land_batch(world, cursor)
    assert duplicated_offsets(orders.table(), 1) == list(range(100, 120))

    unique, contiguous = third[RECORD_ID_UNIQUE], third[OFFSETS_CONTIGUOUS]
    assert not unique.passed and unique.severity == dg.AssetCheckSeverity.ERROR, unique.description
    assert unique.metadata["duplicate_record_ids"].value == 20
    assert unique.metadata["scope"].value == f"{WHOLE_TABLE} ({OFFSETS_CONTIGUOUS} did not pass in run {second_run})"
    assert not contiguous.passed, "rows 120..199 still lie beyond the committed offsets"
    assert contiguous.metadata["scope"].value.startswith(WHOLE_TABLE)
    assert isinstance(unique.metadata[LAST_WHOLE_TABLE_SCAN_KEY], dg.TimestampMetadataValue)


def test_the_assets_own_run_that_duplicates_another_writers_rows_fails_record_id_unique(production_world, spark):  # noqa: F811
    world = production_world
    world.write_segments(0, 100, records_per_segment=50)
    world.write_segments(1, 100, records_per_segment=50)
    config = world.config()
    instance = dg.DagsterInstance.ephemeral()
    assert run_ingest_job(config, instance, [0, 1]).success
    append_beyond(world, 1, 100, 100)

    world.write_segments(0, 50, base_offset=100, records_per_segment=50)
    second = evaluations(run_ingest_job(config, instance, [0], raise_on_error=False).get_asset_check_evaluations())
    assert not second[OFFSETS_CONTIGUOUS].passed  # (record_id_unique reads the whole table when it runs after it)

    world.write_segments(1, 20, base_offset=100, records_per_segment=20)
    third_run = run_ingest_job(config, instance, [1], raise_on_error=False)
    third = evaluations(third_run.get_asset_check_evaluations())
    assert duplicated_offsets(world.table(), 1) == list(range(100, 120))

    unique = third[RECORD_ID_UNIQUE]
    assert not unique.passed and unique.metadata["duplicate_record_ids"].value == 20, unique.description
    assert unique.metadata["scope"].value.startswith(f"{WHOLE_TABLE} ({OFFSETS_CONTIGUOUS} did not pass in run")
    assert not third[OFFSETS_CONTIGUOUS].passed


def record(instance: dg.DagsterInstance, key: dg.AssetKey, check: str, passed: bool,
           last_whole_table_scan: float | None) -> None:
    metadata = {} if last_whole_table_scan is None else {
        LAST_WHOLE_TABLE_SCAN_KEY: dg.MetadataValue.timestamp(last_whole_table_scan)}
    instance.report_runless_asset_event(dg.AssetCheckEvaluation(asset_key=key, check_name=check, passed=passed,
                                                                metadata=metadata))


def test_the_scope_follows_the_latest_evaluations_and_reads_the_whole_table_at_least_daily():
    key, now = dg.AssetKey(["shop", "orders"]), 1_800_000_000.0
    with dg.instance_for_test() as instance:
        assert integrity_scope(instance, key, now).whole_table  # nothing recorded yet
        record(instance, key, RECORD_ID_UNIQUE, True, None)
        record(instance, key, OFFSETS_CONTIGUOUS, True, None)
        assert integrity_scope(instance, key, now).reason == "no whole-table scan recorded"  # older evaluations

        record(instance, key, RECORD_ID_UNIQUE, True, now - 3600)
        record(instance, key, OFFSETS_CONTIGUOUS, True, now - 3600)
        assert not integrity_scope(instance, key, now).whole_table  # the normal case: what was added
        daily = integrity_scope(instance, key, now - 3600 + WHOLE_TABLE_SCAN_INTERVAL_SECONDS)
        assert daily.whole_table and daily.reason == "last whole-table scan 24 h ago"

        record(instance, key, OFFSETS_CONTIGUOUS, False, now - 3600)  # an incremental scan saw a problem
        failed = integrity_scope(instance, key, now)
        assert failed.whole_table and failed.reason.startswith(f"{OFFSETS_CONTIGUOUS} did not pass")
        record(instance, key, RECORD_ID_UNIQUE, True, now)
        assert integrity_scope(instance, key, now).whole_table, "until the check that failed passes"
        record(instance, key, OFFSETS_CONTIGUOUS, True, now)  # the whole-table scan passes: back to what was added
        assert not integrity_scope(instance, key, now + 60).whole_table
