"""Definitions load from the demo config and from a production-style config; a bad config fails at load time with
an error naming the key, before any run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from kafscale_lakehouse.apps.workload import PIZZA_TOPIC, write_partition_segments
from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, ConfigError
from kafscale_lakehouse.definitions import build_definitions, defs
from kafscale_lakehouse.engine.tables.checks import CHECK_NAMES
from kafscale_lakehouse.orchestration.audited_publish import AUDITED_PUBLISH_SENSOR
from kafscale_lakehouse.orchestration.naming import ingest_job_name, partitions_def_name, pool_name
from kafscale_lakehouse.orchestration.resources import SECRET_ENV_PREFIX
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.support.servers import SECRET_KEY

DEMO_TABLE_KEY = dg.AssetKey(["rpc", "pizzas"])
DEMO_TOPIC_KEY = dg.AssetKey(["kafscale", PIZZA_TOPIC])


@pytest.fixture
def demo_config_path(tmp_path, monkeypatch) -> Path:
    """examples/embedded.yaml as `lakehouse.yaml` of a fresh directory (its var/ lands there), with one segment."""
    path = tmp_path / "lakehouse.yaml"
    shutil.copy(REPO_ROOT / "kafscale_lakehouse" / "examples" / "embedded.yaml", path)
    write_partition_segments(tmp_path / "var" / "segments", record_count=10, records_per_segment=10)
    monkeypatch.setenv(CONFIG_PATH_ENV_VAR, str(path))
    return path


def edited_demo_config(path: Path, edit) -> None:
    document = yaml.safe_load(path.read_text())
    edit(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def test_demo_config_loads_one_asset_per_mapping_with_its_checks_job_and_sensor(demo_config_path):
    definitions = defs()

    dg.Definitions.validate_loadable(definitions)
    graph = definitions.resolve_asset_graph()
    assert {DEMO_TABLE_KEY, DEMO_TOPIC_KEY} <= set(graph.get_all_asset_keys())
    table = graph.get(DEMO_TABLE_KEY)
    assert table.parent_keys == {DEMO_TOPIC_KEY}
    assert isinstance(table.partitions_def, dg.DynamicPartitionsDefinition)
    assert table.partitions_def.name == partitions_def_name(PIZZA_TOPIC)
    assert table.backfill_policy == dg.BackfillPolicy.single_run()
    assert graph.get(DEMO_TOPIC_KEY).is_observable
    assert {key.name for key in graph.asset_check_keys if key.asset_key == DEMO_TABLE_KEY} == set(CHECK_NAMES)
    assets_def = definitions.resolve_assets_def(DEMO_TABLE_KEY)
    assert {op.pool for op in assets_def.node_def.iterate_op_defs()} == {pool_name("rpc.pizzas")}
    job = definitions.resolve_job_def(ingest_job_name("rpc.pizzas"))
    assert job.executor_def is dg.in_process_executor
    ingest_sensors = [s for s in definitions.sensors
                      if s.name.startswith("kafscale_") and s.name != AUDITED_PUBLISH_SENSOR]
    assert [sensor.job_name for sensor in ingest_sensors] == [job.name]
    # The IO manager's audited writes are published by its run status sensor, which the code location carries.
    assert AUDITED_PUBLISH_SENSOR in {sensor.name for sensor in definitions.sensors}


def test_the_freshness_threshold_comes_from_the_mapping(demo_config_path):
    edited_demo_config(demo_config_path, lambda d: d["mappings"][0].update(freshness_max_lag_records=250))

    freshness = dg.AssetCheckKey(DEMO_TABLE_KEY, "freshness")
    descriptions = [s.description for d in defs().asset_checks or [] for s in d.check_specs if s.key == freshness]
    assert descriptions == ["Lag behind the broker watermark; warns above 250 records."]


def test_production_config_loads_against_the_servers_and_keeps_secrets_out_of_resource_config(production_world):
    world = production_world
    world.write_segments(0, 10, records_per_segment=10)
    config = world.config()

    definitions = build_definitions(config)

    dg.Definitions.validate_loadable(definitions)
    assert definitions.resolve_assets_def(dg.AssetKey(world.table_name.split("."))).partitions_def.name == \
        partitions_def_name(world.topic)
    resource_config = repr(definitions.resources)
    assert SECRET_KEY not in resource_config
    assert f"{SECRET_ENV_PREFIX}S3_SECRET_ACCESS_KEY" in resource_config  # an EnvVar reference instead


@pytest.mark.parametrize(("edit", "named"), [
    (lambda d: d.update(procesor={"poll_interval_seconds": 5}), "procesor: unknown key (did you mean 'processor'?)"),
    (lambda d: d.update(processor={"poll_interval_seconds": "often"}), "processor.poll_interval_seconds: expected an "
                                                                       "integer"),
    (lambda d: d["mappings"][0].update(table="rpc.pizza orders"), "mappings[0].table: 'rpc.pizza orders' is not a "
                                                                  "table identifier"),
], ids=["unknown-key", "wrong-type", "invalid-table"])
def test_a_bad_config_fails_when_definitions_load_naming_the_key(demo_config_path, edit, named):
    edited_demo_config(demo_config_path, edit)

    with pytest.raises(ConfigError) as raised:
        defs()

    assert named in str(raised.value)
    assert str(demo_config_path) in str(raised.value)


def test_dagster_reports_a_bad_config_when_it_loads_the_code_location(demo_config_path):
    edited_demo_config(demo_config_path, lambda d: d["mappings"][0].update(table="pizzas"))
    dagster = Path(sys.executable).parent / "dagster"

    done = subprocess.run([str(dagster), "definitions", "validate", "-m", "kafscale_lakehouse.definitions"],
                          cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120)

    assert done.returncode != 0
    assert (f"ConfigError: {demo_config_path}: mappings[0].table: 'pizzas' has no namespace"
            in done.stdout + done.stderr)


def test_definitions_load_with_every_server_down_and_the_sensor_names_a_missing_topic(tmp_path, demo_config_path):
    """Closed ports for S3, etcd, the REST catalog and the registry: loading contacts none of them. A topic that
    does not exist yet is reported by its sensor's tick, naming it, instead of failing the code location."""
    from kafscale_lakehouse.config import parse_config
    from kafscale_lakehouse.orchestration.sensors import sensor_name
    from kafscale_lakehouse_tests.support.servers import free_ports

    s3, etcd, rest, registry = (f"http://127.0.0.1:{port}" for port in free_ports(4))
    down = parse_config({
        "s3": {"bucket": "lake", "endpoint": s3, "region": "us-east-1", "path_style": True},
        "iceberg": {"catalog": {"type": "rest", "uri": rest, "properties": {"scope": "catalog"}},
                    "warehouse": "s3://warehouse"},
        "etcd": {"endpoints": [etcd.removeprefix("http://")]},
        "schema": {"mode": "lenient", "registry": {"base_url": registry}},
        "mappings": [{"topic": "orders", "table": "prod.orders", "owners": ["team:data"], "tags": {"tier": "1"},
                      "freshness_fail_window_seconds": 600}],
    }, base_dir=tmp_path)
    definitions = build_definitions(down)
    dg.Definitions.validate_loadable(definitions)
    table = definitions.resolve_assets_def(dg.AssetKey(["prod", "orders"])).specs_by_key[dg.AssetKey(["prod",
    "orders"])]
    assert table.owners == ["team:data"] and table.tags["tier"] == "1"
    assert table.freshness_policy.fail_window.to_timedelta().total_seconds() == 600
    assert definitions.resources["iceberg_catalog"].settings().catalog_properties()["scope"] == "catalog"

    edited_demo_config(demo_config_path, lambda d: d["mappings"][0].update(topic="not-yet"))
    demo = defs()  # the demo config with a topic that has no segments yet: loads
    sensor = next(s for s in demo.sensors if s.name == sensor_name("rpc.pizzas"))
    with dg.instance_for_test() as instance:
        result = sensor(dg.build_sensor_context(instance=instance))
    assert "no partitions of topic 'not-yet'" in result.skip_reason.skip_message


def test_landed_tables_gate_downstream_assets_on_their_blocking_checks(demo_config_path):
    checks = {
        s.key.name: s.blocking for d in defs().asset_checks for s in d.check_specs if s.key.asset_key == DEMO_TABLE_KEY
    }
    assert checks == {"schema_valid": True, "record_id_unique": True, "offsets_contiguous": True, "freshness": False,
                      "retention_headroom": False}
