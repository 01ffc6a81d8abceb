"""An ingesting process SIGKILLed at each step of the commit protocol; the next run ends exactly-once.

The killed runs are real `kafscale-lakehouse ingest --once` processes (see crash_run); the runs after them use the
shared Spark session in this process.
"""

from __future__ import annotations

import re

import pytest

from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS


def test_killed_after_writing_data_files_before_the_iceberg_commit(production_world, spark):
    world = production_world
    world.write_segments(0, 100, records_per_segment=50)
    world.write_segments(1, 60, records_per_segment=30)
    config_path = world.write_config_file()

    world.run_killed(config_path, "before-iceberg-commit")

    leftovers = world.table_data_files()
    assert leftovers, "the killed run had written its data files"
    assert world.our_snapshots() == [] and world.store_next_offsets() == {}

    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
    [result] = ingest(world.config(), spark)
    assert result.records == 160
    table = world.assert_exactly_once(runs=1)
    assert not leftovers & world.referenced_data_files(table), "a crashed run's data file is referenced"
    # The next run removed the crashed run's files (its leases are gone and it never committed): nothing else is left.
    assert not leftovers & world.table_data_files()
    assert world.table_data_files() == world.referenced_data_files(table)
    assert world.recorded_runs() == []
    world.assert_exactly_once(runs=1)


def test_killed_after_the_iceberg_commit_before_etcd(production_world, spark):
    world = production_world
    world.write_segments(0, 60, records_per_segment=30)
    world.write_segments(1, 60, records_per_segment=30)
    ingest(world.config(), spark)
    world.write_segments(0, 40, base_offset=60, records_per_segment=20)
    config_path = world.write_config_file()

    world.run_killed(config_path, "after-iceberg-commit")

    assert read_topic_offsets(world.table(), world.topic) == {0: 100, 1: 60}
    assert world.store_next_offsets() == {0: 60, 1: 60}, "etcd lags the table after the kill"

    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 3)
    [result] = ingest(world.config(), spark)
    assert result.records == 0 and result.snapshot_id is None, "the table's offsets say there is nothing to read"
    table = world.assert_exactly_once(runs=2)  # etcd repaired from the table
    # The killed run's record is settled by finding its commit in the table: its files are kept, nothing is left.
    assert world.recorded_runs() == []
    assert world.table_data_files() == world.referenced_data_files(table)


def test_killed_while_renewing_its_lease(production_world, spark):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)
    ttl = 8  # long enough that the dead run's lease certainly outlives the next step
    config_path = world.write_config_file(world.config_document(lease_ttl_seconds=ttl))

    killed = world.run_killed(config_path, "renewing-lease")
    dead_owner = re.search(r"acquired lease \S+ for (\S+) on", killed.stderr).group(1)

    # Until its TTL runs out, the dead run's lease keeps others off the partition, and the refusal names it.
    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(lease_ttl_seconds=ttl), spark)
    assert f"is held by {dead_owner!r}" in failed.value.result.partitions[0].error
    assert dead_owner in str(failed.value)
    assert world.our_snapshots() == [] and world.store_next_offsets() == {}

    world.wait_for_leases_to_expire(ttl * 2)
    [result] = ingest(world.config(lease_ttl_seconds=ttl), spark)
    assert result.records == 80
    world.assert_exactly_once(runs=1)
