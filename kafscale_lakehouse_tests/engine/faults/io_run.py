"""A downstream asset materialized by the Iceberg IO manager, in a process of its own for the fault matrix: the run
(`execute_job`, in-process executor, a Dagster instance shared with the test through its directory) writes one
partition of the asset `<namespace>/<name>` to the catalog of a lakehouse config, in the spec's write mode.

    python -m kafscale_lakehouse_tests.engine.faults.actor io <point> <action> <dir> -- materialize <spec> <partition>

holds or kills it at a point (actor.py); `materialize(spec, partition, parent_run_id=...)` runs it (or re-executes a
failed run from its failure, a retry) in the calling process.

The asset's rows (`ROWS` per write): `id` (partitions `a` and `b` hold ids of their own, except with write mode upsert,
where both partitions write the same keys), `part` (the partition key: the overwrite's `partition_expr`) and
`written_by` (the id of the run that computed them, so a table shows which write each row comes from). With
`"fail": true` the DataFrame's write raises in a Spark task (`raise_error` for the upper ids, so the task of the
lower ids may have written its files). The step has a retry policy (one retry): a step that fails is attempted again
in the same run."""

# No `from __future__ import annotations`: Dagster reads the context parameter annotation at runtime.
import json
import logging
import sys
from pathlib import Path

import dagster as dg
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, SparkResource

log = logging.getLogger("kafscale_lakehouse_tests.engine.faults.io_run")

PARTITIONS = ("a", "b")
ROWS = 40
FAILING_FROM_ID = 30  # with "fail": rows from this id raise in their Spark task
JOB_NAME = "io_write"
# Dagster's console logger at WARNING: its event lines would fill the pipes of a held process.
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def spec_document(*, config: dict, namespace: str, name: str, mode: str, dagster_home: Path,
                  fail: bool = False) -> dict:
    """What `io_job` builds a job from (written as JSON for the actor's process)."""
    return {"config": config, "namespace": namespace, "name": name, "mode": mode, "dagster_home": str(dagster_home),
            "fail": fail}


def ids_of(mode: str, partition: str) -> list[int]:
    """The ids a write of `partition` holds (with upsert both partitions write the same keys)."""
    base = 0 if mode == "upsert" else 1000 * PARTITIONS.index(partition)
    return list(range(base, base + ROWS))


def io_job(spec_path: str) -> dg.JobDefinition:
    spec = json.loads(Path(spec_path).read_text())
    mode = spec["mode"]
    metadata: dict = {"write_mode": mode, "partition_expr": "part"}
    if mode == "upsert":
        metadata["upsert_options"] = {"join_cols": ["id"]}

    @dg.asset(key=[spec["namespace"], spec["name"]], io_manager_key="iceberg_io_manager", metadata=metadata,
              partitions_def=dg.StaticPartitionsDefinition(list(PARTITIONS)),
              retry_policy=dg.RetryPolicy(max_retries=1), required_resource_keys={"spark"})
    def written(context: dg.AssetExecutionContext) -> DataFrame:
        spark = context.resources.spark.spark_session
        ids = ids_of(mode, context.partition_key)
        df = spark.createDataFrame([(i, context.partition_key, context.run.run_id) for i in ids],
                                   "id long, part string, written_by string")
        if spec["fail"]:
            failing = sf.when(sf.col("id") % ROWS >= FAILING_FROM_ID, sf.raise_error(sf.lit("the asset's data is bad")))
            df = df.repartitionByRange(2, "id").withColumn("id", failing.otherwise(sf.col("id")).cast("long"))
        return df

    catalog = IcebergCatalogResource.of(parse_config(spec["config"], base_dir=Path(spec_path).parent))
    # The Spark engine of `$SPARK_REMOTE` in the actor's process; in the test's, its local session (a Spark Connect
    # session there would stay the process's session for the tests after it).
    spark = SparkResource(master="local[2]")
    definitions = dg.Definitions(
        assets=[written],
        jobs=[dg.define_asset_job(JOB_NAME, selection=[written.key], executor_def=dg.in_process_executor)],
        resources={"iceberg_io_manager": KafscaleIcebergIOManager(iceberg_catalog=catalog, spark=spark,
                                                                  target_file_size_bytes=1 << 20),
                   "spark": spark})
    return definitions.resolve_job_def(JOB_NAME)


def instance_of(spec_path: str) -> dg.DagsterInstance:
    return dg.DagsterInstance.local_temp(json.loads(Path(spec_path).read_text())["dagster_home"])


def materialize(spec_path: str, partition: str, *, parent_run_id: str | None = None,
                instance: dg.DagsterInstance | None = None) -> dg.JobExecutionResult:
    """Materialize `partition`, or (with `parent_run_id`, a failed run) re-execute that run from its failure."""
    instance = instance or instance_of(spec_path)
    job = dg.build_reconstructable_job(__name__, io_job.__name__, reconstructable_args=(spec_path,))
    if parent_run_id is not None:
        return dg.execute_job(job, instance, run_config=RUN_CONFIG, tags={"dagster/partition": partition},
                              reexecution_options=dg.ReexecutionOptions.from_failure(parent_run_id, instance))
    return dg.execute_job(job, instance, run_config=RUN_CONFIG, tags={"dagster/partition": partition})


def main(spec_path: str, partition: str) -> int:
    """Exit status 0 when the run succeeded."""
    logging.basicConfig(level=logging.INFO)
    result = materialize(spec_path, partition)
    log.info("run %s of partition %s: %s", result.run_id, partition, "success" if result.success else "failure")
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
