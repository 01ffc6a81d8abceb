"""Every writer of a batch owns its directory: two topics of one run sharing a dead-letter table, and the attempts
of a retried step, never delete each other's committed files (the crash clean-up of an ended run, a failed Spark
job), on the real servers (SeaweedFS S3 and Iceberg REST, etcd) and local Spark."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pyarrow.compute as pc
import pytest

from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.engine.ingestion import IngestContext, prepare_ingest
from kafscale_lakehouse.engine.ingestion import run as ingest_run
from kafscale_lakehouse.engine.ingestion.run import commit_ingest, commit_ingests
from kafscale_lakehouse.engine.ingestion.spark_job import BatchTableJob, ingestion_task_spec, run_batch_spark_job
from kafscale_lakehouse.engine.tables.data_files import IcebergSinkError
from kafscale_lakehouse_tests.validation_modes.faults import records_with_faults

pytestmark = pytest.mark.integration


def shared_dead_letters(world) -> tuple[LakehouseConfig, str]:
    """The namespace's mappings, all sending their invalid records to one dead-letter table."""
    first = next(iter(world.topics.values()))
    dead_letters = f"{first.name.replace('-', '_')}.rejects"
    document = first.config_document()
    document["mappings"] = [dict(w.config_document()["mappings"][0], dead_letter_table=dead_letters)
                            for w in world.topics.values()]
    return parse_config(document, source="<shared dead letters>", base_dir=first.root), dead_letters


def dead_letter_offsets(context: IngestContext, name: str, topic: str) -> list[int]:
    """The dead letters of `topic` in the table (scanning it reads every data file main references)."""
    rows = context.catalog().load_table(name).scan().to_arrow()
    return sorted(rows.filter(pc.equal(rows["topic"], topic))["offset"].to_pylist())


def test_a_topic_settling_its_ended_run_keeps_another_topics_dead_letters(namespace_world, spark):
    """One batch run lands orders and payments, whose invalid records share a dead-letter table; payments' run ends
    before writing anything (its record names no commit). Later runs of refunds add dead letters and the table's
    older snapshots are expired (its data files stay: main references them). The next run of payments settles the
    ended record and deletes what the record's directories hold: never orders' committed dead letters."""
    orders, payments, refunds = (namespace_world.topics[word] for word in ("orders", "payments", "refunds"))
    for topic in (orders, payments, refunds):
        topic.write_records(0, 0, records_with_faults(0))
    config, rejects = shared_dead_letters(namespace_world)
    mappings = {m.topic: m for m in config.mappings}
    run_id = uuid.uuid4().hex
    with IngestContext.from_config(config, spark) as context:
        landing = prepare_ingest(context, mappings[orders.topic], partitions=[0], run_id=run_id)
        ended = prepare_ingest(context, mappings[payments.topic], partitions=[0], run_id=run_id)
        [landed] = commit_ingests([landing])
        ended.release_leases()  # its leases expire; its record stays for the next run of payments
        assert not isinstance(landed, Exception) and landed.invalid_count > 0
        orders_dead = dead_letter_offsets(context, rejects, orders.topic)
        assert len(orders_dead) == landed.invalid_count
        commit_ingest(prepare_ingest(context, mappings[refunds.topic], partitions=[0]))
        table = context.catalog().load_table(rejects)
        older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != table.metadata.current_snapshot_id]
        table.maintenance.expire_snapshots().by_ids(older).commit()

        again = commit_ingest(prepare_ingest(context, mappings[payments.topic], partitions=[0]))

        assert dead_letter_offsets(context, rejects, orders.topic) == orders_dead
        assert len(dead_letter_offsets(context, rejects, payments.topic)) == again.invalid_count > 0


def test_a_retried_steps_failed_spark_job_keeps_what_its_first_attempt_committed(namespace_world, spark):
    """A retried step runs under the same Dagster run id: when the second attempt's Spark job fails, its clean-up
    deletes only its own writers' directories, not the data and dead-letter files the first attempt committed."""
    orders = namespace_world.topics["orders"]
    orders.write_records(0, 0, records_with_faults(0))
    config, rejects = shared_dead_letters(namespace_world)
    mapping = next(m for m in config.mappings if m.topic == orders.topic)
    run_id = uuid.uuid4().hex
    with IngestContext.from_config(config, spark) as context:
        first = commit_ingest(prepare_ingest(context, mapping, partitions=[0], run_id=run_id))
        committed_rows = context.catalog().load_table(mapping.table).scan().to_arrow().num_rows
        assert committed_rows == first.records > 0 and first.invalid_count > 0

        orders.write_records(0, 20, records_with_faults(20))
        retry = prepare_ingest(context, mapping, partitions=[0], run_id=run_id)
        try:
            tasks = ingestion_task_spec(**ingest_run._job_arguments(retry))
            broken = replace(tasks, sink=replace(tasks.sink, table_metadata_json="{}"))  # its tasks cannot write
            with pytest.raises(IcebergSinkError, match=run_id):
                run_batch_spark_job(spark, run_id, [BatchTableJob(retry.table, broken, retry.dead_letters)])
        finally:
            retry.release_leases()
            retry.forget_run()

        assert context.catalog().load_table(mapping.table).scan().to_arrow().num_rows == committed_rows
        assert len(dead_letter_offsets(context, rejects, orders.topic)) == first.invalid_count
