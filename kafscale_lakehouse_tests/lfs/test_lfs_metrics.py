"""serve-metrics' LFS series from the `kafscale.lfs.*` snapshot summary keys (embedded sqlite catalog, no server)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.summary import LfsStats, lfs_summary_properties
from kafscale_lakehouse_tests.apps.metrics.test_table_totals import append, ours
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld


@pytest.fixture
def world(tmp_path, unique_prefix) -> IngestWorld:
    return IngestWorld("embedded", tmp_path, unique_prefix, f"orders-{unique_prefix}")


def stats(resolved: int, resolved_bytes: int, skipped: int, errors: dict[str, int], durations: list[float]) -> LfsStats:
    result = LfsStats(resolved=resolved, resolved_bytes=resolved_bytes, skipped=skipped)
    result.errors.update(errors)
    for seconds in durations:
        result.observe(seconds)
    return result


def test_lfs_series_sum_our_commits_summary_keys(world):
    config = world.config()
    catalog = load_catalog(catalog_settings(config))
    catalog.create_namespace_if_not_exists(world.table_name.split(".")[0])
    table = catalog.create_table(world.table_name, schema=pa.schema([("order_id", pa.string())]))
    topic = world.topic
    append(table, 3, **ours(topic, 10, **lfs_summary_properties(stats(2, 2048, 1, {"resolve": 1}, [0.003, 0.2]))))
    append(table, 3, **ours(topic, 20, **lfs_summary_properties(stats(1, 100, 4, {"decode": 2}, [12.0]))))
    append(table, 1, **ours(topic, 30, **{"kafscale.lfs.resolved": "many"}))  # malformed: not counted
    append(table, 1, **lfs_summary_properties(stats(9, 9, 9, {}, [])))  # not one of our commits

    collector = LakehouseStateCollector(config)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(f"kafscale_processor_{name}", {"topic": topic, **labels})

        assert sample("lfs_resolved_total") == 3 and sample("lfs_resolved_bytes_total") == 2148
        assert sample("records_total", result="skipped_lfs") == 5
        assert sample("lfs_resolution_errors_total", reason="resolve") == 1
        assert sample("lfs_resolution_errors_total", reason="decode") == 2
        assert sample("lfs_resolution_duration_seconds_count") == 3
        assert sample("lfs_resolution_duration_seconds_bucket", le="0.005") == 1
        assert sample("lfs_resolution_duration_seconds_bucket", le="0.25") == 2
        assert sample("lfs_resolution_duration_seconds_bucket", le="10.0") == 2
        assert sample("lfs_resolution_duration_seconds_sum") == pytest.approx(12.203)
    finally:
        collector.close()
