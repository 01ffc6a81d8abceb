"""The demo lakehouse on the landed `rpc/pizzas`: two downstream Spark assets stored by the Iceberg IO manager, kept
current by declarative automation, with their own checks. They are also the example of adding an asset (README).

    rpc/pizzas (landed, Kafka partitions)
      -> rpc/pizzas_clean  one row per order: order_id, store_id, sauce, ordered_at, order_date (UTC)
        -> rpc/sauce_daily  orders per store and sauce per day, one Dagster partition per day
"""

# No `from __future__ import annotations`: Dagster reads the context and resource parameter annotations at runtime.
import dagster as dg
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812 - pyspark's conventional alias

from kafscale_lakehouse.orchestration.assets import ICEBERG_IO_MANAGER_KEY
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource

DEMO_LANDED_TABLE = "rpc.pizzas"
DEMO_GROUP = "pizza_lakehouse"
PIZZAS = dg.AssetKey(["rpc", "pizzas"])
DAYS = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_offset=1)  # up to today, still filling
# Materialize when upstream data lands, never over an upstream failing a blocking check (duplicates, offset gaps).
KEEP_CURRENT = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()


@dg.asset(
    key=["rpc", "pizzas_clean"],
    ins={"pizzas": dg.AssetIn(key=PIZZAS, metadata={"columns": ["order_id", "store_id", "sauce", "date_ordered"]})},
    io_manager_key=ICEBERG_IO_MANAGER_KEY,
    automation_condition=KEEP_CURRENT,
    group_name=DEMO_GROUP,
    kinds={"iceberg", "pyspark"},
    metadata={"partition_spec": "day(order_date)"},  # the table is created on first write with this spec
    description="Pizza orders, one row per order_id, with the UTC order date.",
)
def pizzas_clean(pizzas: DataFrame) -> DataFrame:
    return (pizzas.where(F.col("order_id").isNotNull() & F.col("date_ordered").isNotNull())
            .dropDuplicates(["order_id"])
            .select("order_id", "store_id", "sauce", F.col("date_ordered").alias("ordered_at"),
                    # The UTC day whatever the session time zone (unix seconds have none).
                    F.expr("date_from_unix_date(CAST(floor(unix_seconds(date_ordered) / 86400) AS INT))")
                    .alias("order_date")))


@dg.asset(
    key=["rpc", "sauce_daily"],
    ins={"orders": dg.AssetIn(key=pizzas_clean.key, metadata={"columns": ["store_id", "sauce", "order_date"],
                                                               "partition_expr": "order_date"})},
    partitions_def=DAYS,
    io_manager_key=ICEBERG_IO_MANAGER_KEY,
    automation_condition=KEEP_CURRENT,
    group_name=DEMO_GROUP,
    kinds={"iceberg", "pyspark"},
    # Re-materializing a day replaces that day's rows (delete + append in one commit).
    metadata={"partition_expr": "order_date", "partition_spec": "order_date"},
    description="Orders per store and sauce per day.",
)
def sauce_daily(orders: DataFrame) -> DataFrame:
    return orders.groupBy("order_date", "store_id", "sauce").agg(F.count(F.lit(1)).alias("orders"))


@dg.asset_check(asset=pizzas_clean, blocking=True, description="No order_id twice.")
def order_id_unique(iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
    ids = iceberg_catalog.load_table("rpc.pizzas_clean").scan(selected_fields=("order_id",)).to_arrow()["order_id"]
    counts = pc.value_counts(ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1)).field("values").to_pylist()
    return dg.AssetCheckResult(passed=not repeated, severity=dg.AssetCheckSeverity.ERROR,
                               metadata={"rows": len(ids), "duplicate_order_ids": dg.MetadataValue.json(repeated[:20])})


@dg.asset_check(asset=sauce_daily, description="Every (day, store, sauce) has at least one order and a store id.")
def orders_counted(iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
    rows = iceberg_catalog.load_table("rpc.sauce_daily").scan(selected_fields=("store_id", "orders")).to_arrow()
    bad = rows.filter(pc.or_kleene(pc.is_null(rows["store_id"]), pc.less(rows["orders"], 1))).num_rows
    return dg.AssetCheckResult(passed=bad == 0, metadata={"rows": rows.num_rows, "bad_rows": bad})


def demo_definitions() -> dg.Definitions:
    """The demo lakehouse's assets and checks (they use the resources of `definitions.build_definitions`)."""
    automation = dg.AutomationConditionSensorDefinition(
        "pizza_lakehouse_automation", target=dg.AssetSelection.groups(DEMO_GROUP),
        default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=30)
    return dg.Definitions(assets=[pizzas_clean, sauce_daily], asset_checks=[order_id_unique, orders_counted],
                          sensors=[automation])
