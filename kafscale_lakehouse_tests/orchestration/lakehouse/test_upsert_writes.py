"""`write_mode: upsert` of the Iceberg IO manager with dagster-iceberg's `upsert_options` (sqlite and SeaweedFS REST
catalogs): Spark DataFrames and Arrow tables, matched rows replaced and the others inserted, the result equal to
pyiceberg's own `Table.upsert` on the same data; only the files holding matched keys are rewritten."""

# No `from __future__ import annotations`: Dagster reads the context parameter annotations at runtime.
import dagster as dg
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from kafscale_lakehouse.engine.tables.upserts import REWRITTEN_FILES_PROPERTY
from kafscale_lakehouse_tests.orchestration.lakehouse.test_table_assets import _table

SCHEMA = pa.schema([pa.field("store_id", pa.int64()), pa.field("status", pa.string()),
                    pa.field("seats", pa.int32())])


def _stores(ids, status: str) -> pa.Table:
    return pa.table({"store_id": pa.array(list(ids), pa.int64()), "status": [f"{status}-{i}" for i in ids],
                     "seats": pa.array([i * 10 for i in ids], pa.int32())}, schema=SCHEMA)


def _rows(table) -> list[tuple]:
    return sorted((r["store_id"], r["status"], r["seats"]) for r in table.scan().to_arrow().to_pylist())


@pytest.mark.parametrize("as_spark", [True, False], ids=["spark", "arrow"])
def test_upsert_replaces_matched_rows_and_inserts_the_others(resources, namespace, as_spark):
    batches = iter([_stores(range(60), "v1"), _stores(range(50, 70), "v2"), _stores([3], "v3")])

    @dg.asset(key=[namespace, "stores"], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": "upsert", "upsert_options": {"join_cols": ["store_id"]},
                        "partition_spec": "bucket[4](store_id)"})
    def stores():
        data = next(batches)
        return SparkSession.builder.getOrCreate().createDataFrame(data.to_pandas()) if as_spark else data

    for _ in range(3):
        result = dg.materialize([stores], resources=resources)
        assert result.success
    table = _table(resources, f"{namespace}.stores")
    expected = {i: (i, f"v1-{i}", i * 10) for i in range(60)}
    expected.update({i: (i, f"v2-{i}", i * 10) for i in range(50, 70)})
    expected[3] = (3, "v3-3", 30)
    assert _rows(table) == sorted(expected.values())
    # The last upsert changed one key: one file of its bucket rewritten, not the table.
    assert table.current_snapshot().summary[REWRITTEN_FILES_PROPERTY] == "1"
    # pyiceberg's own upsert of the same data gives the same rows.
    reference_table = table.catalog.create_table(f"{namespace}.stores_reference", schema=table.schema())
    for data in (_stores(range(60), "v1"), _stores(range(50, 70), "v2"), _stores([3], "v3")):
        reference_table.upsert(data.cast(reference_table.schema().as_arrow()), join_cols=["store_id"])
    assert _rows(reference_table) == _rows(table)


def test_update_only_and_insert_only(resources, namespace):
    writes = iter([
        (_stores(range(5), "v1"), {"join_cols": ["store_id"]}),
        (_stores(range(3, 8), "v2"), {"join_cols": ["store_id"], "when_not_matched_insert_all": False}),
        (_stores(range(10), "v3"), {"join_cols": ["store_id"], "when_matched_update_all": False}),
    ])
    for data, options in writes:
        assert dg.materialize([_stores_asset(namespace, data, options)], resources=resources).success
    rows = _rows(_table(resources, f"{namespace}.stores"))
    assert rows == [(0, "v1-0", 0), (1, "v1-1", 10), (2, "v1-2", 20), (3, "v2-3", 30), (4, "v2-4", 40),
                    (5, "v3-5", 50), (6, "v3-6", 60), (7, "v3-7", 70), (8, "v3-8", 80), (9, "v3-9", 90)]


def _stores_asset(namespace: str, data: pa.Table, options: dict) -> dg.AssetsDefinition:
    @dg.asset(key=[namespace, "stores"], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": "upsert", "upsert_options": options})
    def stores():
        return data

    return stores


def test_upsert_options_errors_name_the_key(resources, namespace):
    @dg.asset(key=[namespace, "stores"], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": "upsert", "upsert_options": {"join_cols": "store_id"}})
    def stores():
        return _stores(range(3), "v1")

    with pytest.raises(ValueError, match=r"upsert_options.join_cols must be a non-empty list"):
        dg.materialize([stores], resources=resources)

    @dg.asset(key=[namespace, "stores2"], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": "upsert", "upsert_options": {"join_cols": ["store_id"]}})
    def stores2():
        return pa.concat_tables([_stores(range(3), "a"), _stores([1], "b")])

    with pytest.raises(Exception, match=r"repeat 1 keys"):
        dg.materialize([stores2], resources=resources)
