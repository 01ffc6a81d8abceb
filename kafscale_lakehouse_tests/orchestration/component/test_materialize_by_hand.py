"""A table asset's partition materialized by hand on a new instance, before any sensor tick: the component registers
the topics' partitions when its definitions load (in the instance of `$DAGSTER_HOME`), in process and through
`dagster asset materialize` (what `dg launch --assets` runs), on the embedded
default (examples/embedded.yaml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster.components.testing import create_defs_folder_sandbox

from kafscale_lakehouse.apps.workload import PIZZA_TOPIC, write_partition_segments
from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.demo_assets import DEMO_LANDED_TABLE
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.orchestration.component import KafscaleLakehouseComponent
from kafscale_lakehouse.orchestration.naming import ingest_job_name, partitions_def_name, table_asset_key
from kafscale_lakehouse_tests.orchestration.component.test_component import demo_config_in

SUBPROCESS_TIMEOUT_SECONDS = 300


def landed_rows(config_path: Path) -> int:
    catalog = load_catalog(catalog_settings(load_config(config_path)))
    return catalog.load_table(DEMO_LANDED_TABLE).scan().to_arrow().num_rows


def test_a_partition_materializes_by_hand_on_a_new_instance_before_any_sensor_tick(spark):
    with create_defs_folder_sandbox() as sandbox, dg.instance_for_test() as instance:
        defs_path = sandbox.scaffold_component(component_cls=KafscaleLakehouseComponent)
        config_path = demo_config_in(defs_path)  # 10 records in partition 0 of the demo topic
        assert instance.get_dynamic_partitions(partitions_def_name(PIZZA_TOPIC)) == []
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (_, definitions):
            assert instance.get_dynamic_partitions(partitions_def_name(PIZZA_TOPIC)) == ["0"]
            result = definitions.resolve_job_def(ingest_job_name(DEMO_LANDED_TABLE)).execute_in_process(
                instance=instance, partition_key="0")
        assert result.success
        [materialization] = [event.event_specific_data.materialization
                             for event in result.get_asset_materialization_events()]
        assert (materialization.asset_key, materialization.partition) == (table_asset_key(DEMO_LANDED_TABLE), "0")
        assert materialization.metadata["records"].value == 10
        assert landed_rows(config_path) == 10
        assert len(instance.get_runs()) == 1, "no sensor ran"


def test_a_run_without_a_partition_fails_naming_what_to_give(spark):
    with create_defs_folder_sandbox() as sandbox, dg.instance_for_test() as instance:
        defs_path = sandbox.scaffold_component(component_cls=KafscaleLakehouseComponent)
        demo_config_in(defs_path)
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (_, definitions):
            result = definitions.resolve_job_def(ingest_job_name(DEMO_LANDED_TABLE)).execute_in_process(
                instance=instance, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "launch it for a partition" in failure.step_failure_data.error.message


@pytest.mark.integration
def test_dagster_asset_materialize_lands_a_partition_on_a_new_dagster_home(tmp_path):
    config_path = demo_config_in(tmp_path / "lakehouse")
    write_partition_segments(tmp_path / "lakehouse" / "var" / "segments", record_count=10, records_per_segment=10,
                             partition=1)
    home = tmp_path / "dagster_home"
    home.mkdir()
    environment = {**os.environ, "DAGSTER_HOME": str(home), "KAFSCALE_LAKEHOUSE_CONFIG": str(config_path),
                   "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    command = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-m",
               "kafscale_lakehouse.definitions", "--select", "rpc/pizzas", "--partition", "1"]
    result = subprocess.run(command, env=environment, cwd=tmp_path, capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT_SECONDS, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "RUN_SUCCESS" in result.stderr
    assert landed_rows(config_path) == 10, "exactly the pending records of partition 1, none of partition 0"
