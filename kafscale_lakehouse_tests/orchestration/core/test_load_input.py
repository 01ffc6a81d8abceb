"""The IO manager loads a table asset for downstream assets as a Spark DataFrame (all or some Kafka partitions)."""

from __future__ import annotations

import dagster as dg

from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.orchestration.naming import table_asset_key, topic_partitions_def
from kafscale_lakehouse_tests.orchestration.core.conftest import run_ingest_job


def test_downstream_assets_read_the_table_as_a_spark_dataframe(embedded_world, spark):
    world = embedded_world
    world.write_segments(0, 30, records_per_segment=30)
    world.write_segments(1, 20, records_per_segment=20)
    config = world.config()
    instance = dg.DagsterInstance.ephemeral()
    assert run_ingest_job(config, instance, [0, 1]).success
    table_key = table_asset_key(world.table_name)

    @dg.asset(ins={"orders": dg.AssetIn(key=table_key)})
    def orders_per_partition(orders) -> dict[int, int]:
        return {row["partition"]: row["count"] for row in orders.groupBy("partition").count().collect()}

    @dg.asset(ins={"orders": dg.AssetIn(key=table_key)}, partitions_def=topic_partitions_def(world.topic))
    def order_ids_of_partition(orders) -> list[str]:
        return sorted({row["record_id"].rsplit(":", 2)[1] for row in orders.select("record_id").collect()})

    definitions = dg.Definitions.merge(build_definitions(config), dg.Definitions(
        assets=[orders_per_partition, order_ids_of_partition],
        jobs=[dg.define_asset_job("all_partitions", selection=[orders_per_partition.key]),
              dg.define_asset_job("one_partition", selection=[order_ids_of_partition.key])]))

    counted = definitions.resolve_job_def("all_partitions").execute_in_process(instance=instance)
    one = definitions.resolve_job_def("one_partition").execute_in_process(instance=instance, partition_key="1")

    assert counted.output_for_node("orders_per_partition") == {0: 30, 1: 20}
    assert one.output_for_node("order_ids_of_partition") == ["1"]
