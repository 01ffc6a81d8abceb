"""Where a landed table's next row counts start (`metadata.row_counts_from`): the asset's latest materialization's
counts of every Kafka partition (`kafscale/partition_row_counts`), else each partition's latest
`dagster/partition_row_count` (materializations recorded before that key existed), else the table itself. On a local
sqlite catalog and an ephemeral Dagster instance, no servers needed."""

from __future__ import annotations

import dagster as dg
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from kafscale_lakehouse.engine.tables import RowCount
from kafscale_lakehouse.orchestration.metadata import (
    PARTITION_ROW_COUNT_KEY,
    PARTITION_ROW_COUNTS_KEY,
    ROW_COUNT_SNAPSHOT_KEY,
    row_counts_from,
    row_counts_metadata,
)
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse_tests.orchestration.core.test_check_logic import append

KEY = dg.AssetKey(["shop", "orders"])


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("counts", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("shop")
    return catalog.create_table("shop.orders", table_schema([]))


def materialize(instance: dg.DagsterInstance, partition: str, metadata: dict) -> dg.EventLogEntry:
    instance.report_runless_asset_event(dg.AssetMaterialization(KEY, partition=partition, metadata=metadata))
    return instance.get_latest_materialization_event(KEY)


def test_counts_start_from_the_latest_materialization_of_every_partition(table):
    append(table, 0, range(10), next_offsets={0: 10})
    append(table, 1, range(4), next_offsets={0: 10, 1: 4})
    counted = table.current_snapshot().snapshot_id
    append(table, 0, range(10, 13), next_offsets={0: 13, 1: 4})
    with dg.DagsterInstance.ephemeral() as instance:
        # Deliberately not the table's true counts (11 and 5 at `counted`): they must be carried, not recounted.
        latest = materialize(instance, "0", row_counts_metadata({0: RowCount(11, counted), 1: RowCount(5, counted)}))

        counts = row_counts_from(instance, KEY, table, [0], latest)

    now = table.current_snapshot().snapshot_id
    assert counts == {0: RowCount(14, now), 1: RowCount(5, now)}  # partition 1 too: the next latest holds both
    assert row_counts_metadata(counts) == {PARTITION_ROW_COUNTS_KEY: dg.MetadataValue.json(
        {"snapshot_id": str(now), "rows": {"0": 14, "1": 5}})}  # a string: the UI would round a 64-bit number


def test_an_older_materialization_without_them_falls_back_to_each_partitions_count(table):
    append(table, 0, range(10), next_offsets={0: 10})
    counted = table.current_snapshot().snapshot_id
    append(table, 0, range(10, 13), next_offsets={0: 13})
    with dg.DagsterInstance.ephemeral() as instance:
        old = {PARTITION_ROW_COUNT_KEY: 100, ROW_COUNT_SNAPSHOT_KEY: counted}  # recorded before the key existed
        latest = materialize(instance, "0", old)
        assert row_counts_from(instance, KEY, table, [0], latest)[0].rows == 103

        # Not ours to trust (a partition that is no number): each partition's latest count again.
        for bad in ({"snapshot_id": str(counted), "rows": {"x": 1}}, {"snapshot_id": "x", "rows": {"0": 1}}):
            latest = materialize(instance, "0", {**old, PARTITION_ROW_COUNTS_KEY: dg.MetadataValue.json(bad)})
            assert row_counts_from(instance, KEY, table, [0], latest)[0].rows == 103

    with dg.DagsterInstance.ephemeral() as empty:  # no materialization at all: counted from the table
        assert row_counts_from(empty, KEY, table, [0], None)[0].rows == 13
