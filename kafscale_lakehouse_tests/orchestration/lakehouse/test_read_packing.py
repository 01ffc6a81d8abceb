"""`read_table` packs small data files into Spark input partitions (a landed table holds many until compaction)."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa

from kafscale_lakehouse.engine.spark.table_source import OPEN_COST_BYTES, pack_scan_tasks, read_table
from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, load_catalog

MB = 1024 * 1024


def task(size: int) -> SimpleNamespace:
    return SimpleNamespace(file=SimpleNamespace(file_size_in_bytes=size))


def sizes(groups) -> list[list[int]]:
    return [[t.file.file_size_in_bytes for t in group] for group in groups]


def test_small_files_share_a_partition_and_a_large_one_has_its_own():
    assert sizes(pack_scan_tasks([task(MB)] * 10, max_bytes=64 * MB)) == [[MB] * 10]
    assert sizes(pack_scan_tasks([task(10 * MB), task(200 * MB), task(60 * MB), task(60 * MB)],
                                 max_bytes=128 * MB)) == [[200 * MB], [60 * MB, 60 * MB], [10 * MB]]
    many_tiny = pack_scan_tasks([task(1)] * 100, max_bytes=10 * OPEN_COST_BYTES)
    assert sizes(many_tiny) == [[1] * 9] * 11 + [[1]]  # the open cost bounds files per task
    assert pack_scan_tasks([]) == []


def test_a_table_of_many_small_files_is_read_by_one_task_exactly(tmp_path, spark):
    catalog = load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))
    catalog.create_namespace("bench")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    table = catalog.create_table("bench.small_files", schema=schema)
    for start in range(0, 60, 10):  # six appends: six data files of a few KB
        table.append(pa.table({"id": list(range(start, start + 10)), "name": [f"n{i}" for i in range(10)]},
                              schema=schema))
    assert len(list(table.scan().plan_files())) == 6

    df = read_table(spark, table, columns=["id"])

    assert df.rdd.getNumPartitions() == 1  # one Spark task per data file before
    assert sorted(row["id"] for row in df.collect()) == list(range(60))
