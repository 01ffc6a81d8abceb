"""Downstream assets stored by the Iceberg IO manager (`dg.materialize`, sqlite and SeaweedFS REST catalogs):
append, overwrite, partition-scoped overwrite, two partitions at once, schema growth, an incompatible change, Arrow
tables; and `load_input` with projection, a time-window filter and snapshot pinning."""

# No `from __future__ import annotations`: Dagster reads the context parameter annotations at runtime.
from concurrent.futures import ThreadPoolExecutor
from datetime import date

import dagster as dg
import pyarrow as pa
from pyspark.sql import SparkSession

from kafscale_lakehouse.orchestration.io_manager import DAGSTER_PARTITIONS_PROPERTY, DAGSTER_RUN_PROPERTY

DAYS = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-05")


def _orders(day: str, stores: int, copies: int = 1):
    """Orders of `day`: `copies` orders per store 0..stores-1, with sauce and a quantity."""
    spark = SparkSession.builder.getOrCreate()  # the session fixture's (the active one is per thread)
    rows = [(f"{day}-{s}-{c}", s, "tomato" if s % 2 else "pesto", date.fromisoformat(day), c + 1)
            for s in range(stores) for c in range(copies)]
    return spark.createDataFrame(rows, "order_id string, store_id int, sauce string, order_date date, quantity int")


def _table(resources, identifier: str):
    """The table as the catalog has it, read outside a run (so the resource's secrets are resolved here)."""
    with dg.build_resources({"catalog": resources["iceberg_catalog"]}) as built:
        return built.catalog.load_table(identifier)


def _materialization(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return event.materialization.metadata


def test_append_and_overwrite_with_dagster_table_metadata(resources, namespace):
    @dg.asset(key=[namespace, "orders"], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": dg.MetadataValue.text("append")})
    def appended():
        return _orders("2026-11-01", stores=3)

    @dg.asset(key=[namespace, "orders_latest"], io_manager_key="iceberg_io_manager")
    def overwritten():
        return _orders("2026-11-01", stores=4)

    for _ in range(2):
        result = dg.materialize([appended, overwritten], resources=resources)
        assert result.success
    assert _table(resources, f"{namespace}.orders").scan().to_arrow().num_rows == 6  # appended twice
    assert _table(resources, f"{namespace}.orders_latest").scan().to_arrow().num_rows == 4  # replaced
    metadata = _materialization(result, overwritten.key)
    assert metadata["dagster/row_count"].value == 4
    assert metadata["dagster/table_name"].value == f"{namespace}.orders_latest"
    assert metadata["dagster/uri"].value == _table(resources, f"{namespace}.orders_latest").location()
    assert [c.name for c in metadata["dagster/column_schema"].value.columns] == [
        "order_id", "store_id", "sauce", "order_date", "quantity"]
    snapshot = _table(resources, f"{namespace}.orders_latest").current_snapshot()
    assert metadata["snapshot_id"].value == snapshot.snapshot_id
    assert snapshot.summary[DAGSTER_RUN_PROPERTY] == result.run_id


def test_a_day_materialized_twice_holds_one_copy_and_two_days_land_at_once(resources, namespace):
    @dg.asset(key=[namespace, "daily"], partitions_def=DAYS, io_manager_key="iceberg_io_manager",
              metadata={"partition_expr": "order_date", "partition_spec": "day(order_date)"})
    def daily(context: dg.AssetExecutionContext):
        return _orders(context.partition_key, stores=5)

    def run(day: str) -> dg.ExecuteInProcessResult:
        return dg.materialize([daily], resources=resources, partition_key=day)

    assert run("2026-11-01").success
    assert run("2026-11-01").success  # again: replaces the day
    with ThreadPoolExecutor(2) as pool:  # two partitions of one table at once: both commits land
        results = list(pool.map(run, ["2026-11-02", "2026-11-03"]))
    assert all(r.success for r in results)

    table = _table(resources, f"{namespace}.daily")
    counts = pa.TableGroupBy(table.scan().to_arrow(), "order_date").aggregate([("order_id", "count")]).to_pylist()
    assert sorted((r["order_date"].isoformat(), r["order_id_count"]) for r in counts) == [
        ("2026-11-01", 5), ("2026-11-02", 5), ("2026-11-03", 5)]
    assert [f.name for f in table.spec().fields] == ["order_date_day"]
    summary = table.current_snapshot().summary
    assert summary[DAGSTER_PARTITIONS_PROPERTY] in ('["2026-11-02"]', '["2026-11-03"]')
    assert _materialization(results[0], daily.key)["dagster/partition_row_count"].value == 5


def test_schema_grows_by_name_and_an_incompatible_change_names_the_column(resources, namespace):
    shape = {"extra": False, "bad": False}

    @dg.asset(key=[namespace, "evolving"], io_manager_key="iceberg_io_manager")
    def evolving():
        df = _orders("2026-11-01", stores=2)
        if shape["extra"]:
            df = df.selectExpr("order_id", "'thin' AS crust", "store_id", "sauce", "order_date", "quantity")
        if shape["bad"]:
            df = df.selectExpr("order_id", "crust", "CAST(store_id AS STRING) AS store_id", "sauce", "order_date")
        return df

    assert dg.materialize([evolving], resources=resources).success
    shape["extra"] = True
    result = dg.materialize([evolving], resources=resources)
    assert result.success
    table = _table(resources, f"{namespace}.evolving")
    assert list(table.schema().column_names) == ["order_id", "store_id", "sauce", "order_date", "quantity", "crust"]
    assert _materialization(result, evolving.key)["columns_added"].value == ["crust"]
    assert set(table.scan().to_arrow()["crust"].to_pylist()) == {"thin"}

    shape["bad"] = True
    failed = dg.materialize([evolving], resources=resources, raise_on_error=False)
    assert not failed.success
    message = failed.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "column 'store_id' is int in the table but string in the data" in message
    assert _table(resources, f"{namespace}.evolving").scan().to_arrow().num_rows == 2  # nothing written


def test_an_arrow_table_is_stored_too(resources, namespace):
    @dg.asset(key=[namespace, "arrow"], io_manager_key="iceberg_io_manager")
    def arrow_asset() -> pa.Table:
        return pa.table({"store_id": pa.array([1, 2, 3], pa.int32()), "name": ["a", "b", "c"]})

    assert dg.materialize([arrow_asset], resources=resources).success
    assert _table(resources, f"{namespace}.arrow").scan().to_arrow().to_pydict() == {
        "store_id": [1, 2, 3], "name": ["a", "b", "c"]}


def test_load_input_projects_filters_the_window_and_pins_the_upstream_snapshot(resources, namespace):
    @dg.asset(key=[namespace, "daily_orders"], partitions_def=DAYS, io_manager_key="iceberg_io_manager",
              metadata={"partition_expr": "order_date"})
    def daily_orders(context: dg.AssetExecutionContext):
        return _orders(context.partition_key, stores=4, copies=2)

    seen = {}

    @dg.asset(key=[namespace, "per_store"], partitions_def=DAYS, io_manager_key="iceberg_io_manager",
              ins={"orders": dg.AssetIn(key=daily_orders.key, metadata={"columns": ["store_id", "quantity"]})},
              metadata={"partition_expr": "order_date"})
    def per_store(context: dg.AssetExecutionContext, orders):
        seen["columns"] = orders.columns
        seen["rows"] = orders.count()
        return orders.groupBy("store_id").sum("quantity").selectExpr(
            "store_id", "`sum(quantity)` AS quantity", f"DATE'{context.partition_key}' AS order_date")

    instance = dg.DagsterInstance.ephemeral()
    for day in ("2026-11-01", "2026-11-02"):
        assert dg.materialize([daily_orders], resources=resources, partition_key=day, instance=instance).success
    # Rows committed to the upstream table outside Dagster, after its latest materialization: not read.
    table = _table(resources, f"{namespace}.daily_orders")
    table.append(pa.table({"order_id": ["late"], "store_id": pa.array([9], pa.int32()), "sauce": ["x"],
                           "order_date": [date(2026, 11, 2)], "quantity": pa.array([100], pa.int32())},
                          schema=table.schema().as_arrow()))

    result = dg.materialize([daily_orders, per_store], resources=resources, partition_key="2026-11-02",
                            instance=instance, selection=[per_store])
    assert result.success
    assert seen == {"columns": ["store_id", "quantity"], "rows": 8}  # one day of the pinned snapshot, 2 columns
    out = _table(resources, f"{namespace}.per_store").scan().to_arrow().to_pylist()
    assert sorted((r["store_id"], r["quantity"]) for r in out) == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_a_downstream_asset_is_held_back_by_a_failed_blocking_check(resources, namespace):
    @dg.asset(key=[namespace, "landed"], io_manager_key="iceberg_io_manager")
    def landed() -> pa.Table:
        return pa.table({"record_id": ["t:0:1", "t:0:1"], "offset": [1, 1]})

    @dg.asset_check(asset=landed, blocking=True)
    def record_id_unique(iceberg_catalog) -> dg.AssetCheckResult:
        ids = iceberg_catalog.load_table(f"{namespace}.landed").scan().to_arrow()["record_id"].to_pylist()
        return dg.AssetCheckResult(passed=len(ids) == len(set(ids)), severity=dg.AssetCheckSeverity.ERROR)

    @dg.asset(key=[namespace, "downstream"], io_manager_key="iceberg_io_manager",
              ins={"rows": dg.AssetIn(key=landed.key)})
    def downstream(rows):
        return rows

    result = dg.materialize([landed, downstream, record_id_unique], resources=resources, raise_on_error=False)

    assert not result.success
    assert [e.asset_key for e in result.get_asset_materialization_events()] == [landed.key]
    assert not _table(resources, f"{namespace}.landed").catalog.table_exists(
        f"{namespace}.downstream")


def test_a_failed_write_keeps_what_another_write_of_the_run_committed_to_the_table(resources, namespace):
    """Two assets of one run append to one table; the second one's Spark job fails. Its clean-up deletes only the
    files of its own write, never those the first write committed (the table still scans, with its rows)."""
    from pyspark.sql import functions

    @dg.asset(key=[namespace, "orders"], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": dg.MetadataValue.text("append")})
    def first():
        return _orders("2026-11-01", stores=3)

    @dg.asset(key=[namespace, "late_orders"], deps=[first], io_manager_key="iceberg_io_manager",
              metadata={"write_mode": dg.MetadataValue.text("append"), "dagster/table_name": f"{namespace}.orders"})
    def failing():
        fails_in_a_task = functions.udf(lambda store: 1 // (store - store), "int")
        return _orders("2026-11-02", stores=3).withColumn("quantity", fails_in_a_task("store_id"))

    result = dg.materialize([first, failing], resources=resources, raise_on_error=False)

    assert not result.success
    assert _table(resources, f"{namespace}.orders").scan().to_arrow().num_rows == 3
