"""Leases and etcd under stress: a second ingester, a lease lost mid-run, etcd restarted mid-run."""

from __future__ import annotations

import logging
import threading

import pytest

import kafscale_lakehouse.engine.ingestion.run as ingest_module
from kafscale_lakehouse.engine.ingestion.run import IngestContext, IngestFailedError, ingest, ingest_mapping
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld
from kafscale_lakehouse_tests.support.servers import Etcd


def test_second_ingester_on_the_same_partitions_aborts_cleanly(production_world, spark, cli_main, monkeypatch,
                                                               caplog):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    config_path = world.write_config_file()
    second = {}
    real_write = ingest_module.run_ingestion_spark_job

    def write_while_a_second_ingester_starts(*args, **kwargs):
        # Another ingester (own context, etcd client and owner id) starts while the first holds its leases.
        with pytest.raises(IngestFailedError) as failed:
            ingest(world.config(), spark)
        second["result"] = failed.value.result
        with caplog.at_level(logging.ERROR, logger="kafscale_lakehouse.apps.cli"):
            second["exit"] = cli_main("ingest", "--config", str(config_path), "--once")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "run_ingestion_spark_job", write_while_a_second_ingester_starts)
    [first] = ingest(world.config(), spark)

    assert first.records == 120
    holder = f"-{first.run_id[:8]}'"  # the first run's owner id ends with its run id
    for partition in (0, 1):
        outcome = second["result"].partitions[partition]
        assert "is held by" in outcome.error and holder in outcome.error, outcome.error
        assert outcome.records == 0
    assert second["result"].snapshot_id is None
    assert second["exit"] == 1
    assert any("is held by" in r.getMessage() and holder in r.getMessage() for r in caplog.records
               if r.name == "kafscale_lakehouse.apps.cli")
    world.assert_exactly_once(runs=1)


def test_lease_lost_before_the_commit_commits_nothing_for_that_partition(production_world, spark, monkeypatch):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 80, records_per_segment=40)
    config = world.config()
    context = IngestContext.from_config(config, spark)
    leases = {}
    real_acquire = context.offsets.acquire_lease
    real_write = ingest_module.run_ingestion_spark_job

    def acquire_and_remember(topic, partition, owner_id):
        leases[partition] = real_acquire(topic, partition, owner_id)
        return leases[partition]

    def write_then_lose_the_lease_of_partition_0(*args, **kwargs):
        messages = real_write(*args, **kwargs)
        with EtcdClient([world.etcd_endpoint]) as client:
            assert client.delete(leases[0].key)  # as if it had expired and been taken
        assert leases[0].lost_event.wait(LEASE_TTL_SECONDS * 2), "the lease keeper notices at its next renewal"
        return messages

    monkeypatch.setattr(context.offsets, "acquire_lease", acquire_and_remember)
    monkeypatch.setattr(ingest_module, "run_ingestion_spark_job", write_then_lose_the_lease_of_partition_0)
    with pytest.raises(IngestFailedError) as failed:
        ingest_mapping(context, config.mappings[0])

    result = failed.value.result
    assert "lease lost before commit" in result.partitions[0].error
    assert result.partitions[0].records == 0
    assert result.partitions[1].error is None and result.partitions[1].records == 80
    table = world.assert_exactly_once(runs=1, expected={1: range(80)})
    assert world.table_data_files() == world.referenced_data_files(table), "partition 0's files were deleted"

    monkeypatch.undo()
    [result] = ingest(world.config(), spark)
    assert result.records == 80
    world.assert_exactly_once(runs=2)


@pytest.fixture
def restartable_etcd(tmp_path):
    server = Etcd(tmp_path / "etcd").start()
    yield server
    server.stop()


def test_etcd_restarted_between_the_iceberg_commit_and_the_offsets(tmp_path, seaweedfs, restartable_etcd,
                                                                   unique_prefix, spark, monkeypatch):
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=restartable_etcd.endpoint)
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    real_commit_append = ingest_module.commit_append
    restart = threading.Timer(2.0, restartable_etcd.start)

    def commit_then_crash_etcd(*args, **kwargs):
        committed = real_commit_append(*args, **kwargs)
        restartable_etcd.kill()  # SIGKILL; it comes back on the same data dir and port 2 s later
        restart.start()
        return committed

    monkeypatch.setattr(ingest_module, "commit_append", commit_then_crash_etcd)
    try:
        [result] = ingest(world.config(), spark)
    finally:
        restart.join()

    # The offsets write waited for etcd (bounded retries) and the leases survived the restart.
    assert result.records == 120 and not result.failed
    assert world.store_next_offsets() == {0: 80, 1: 40}
    assert world.lease_keys() == []
    monkeypatch.undo()
    [result] = ingest(world.config(), spark)
    assert result.records == 0
    world.assert_exactly_once(runs=1)
