"""A batch of tables landed as the `land_tables` job lands them, in a process of its own for the fault matrix: every
mapping of the config prepared under one run id, one Spark job for all, each table committed on its own
(`commit_ingests`). `python -m kafscale_lakehouse_tests.engine.faults.actor batch <point> <action> <dir> -- land-batch
<config>` holds or kills it at a point."""

from __future__ import annotations

import logging
import uuid

from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.engine.ingestion import IngestContext, commit_ingests, prepare_ingest
from kafscale_lakehouse.engine.spark import get_spark_session

log = logging.getLogger("kafscale_lakehouse_tests.engine.faults.batch_run")


def main(config_path: str) -> int:
    """Exit status 0 when every table landed, 1 when one did not (each table's error logged)."""
    logging.basicConfig(level=logging.INFO)
    config = load_config(config_path)
    spark = get_spark_session(config.spark.master, dict(config.spark.conf), remote=config.spark.remote)
    run_id = uuid.uuid4().hex
    with IngestContext.from_config(config, spark) as context:
        prepared = [prepare_ingest(context, mapping, run_id=run_id) for mapping in config.mappings]
        outcomes = commit_ingests(prepared)
    failed = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    for error in failed:
        log.error("batch %s: %s", run_id, error)
    for outcome in outcomes:
        if not isinstance(outcome, Exception):
            log.info("batch %s: topic %s → %s: %d records, snapshot %s", run_id, outcome.topic, outcome.table,
                     outcome.records, outcome.snapshot_id)
    return 1 if failed else 0
