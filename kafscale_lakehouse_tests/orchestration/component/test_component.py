"""KafscaleLakehouseComponent in a dg defs folder (Dagster's own sandbox, as in a user's project): scaffolded by
`dg scaffold defs`, it builds the same assets, checks, jobs, sensors, schedules and resources as the lakehouse config
does through `build_definitions`, from a lakehouse.yaml beside its defs.yaml or from the config inline."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from kafscale_lakehouse.apps.workload import PIZZA_TOPIC, write_partition_segments
from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.demo_assets import DEMO_LANDED_TABLE
from kafscale_lakehouse.orchestration.component import (
    KafscaleLakehouseComponent,
    ScaffoldParams,
    build_definitions,
    scaffolded_config,
)
from kafscale_lakehouse.orchestration.naming import ingest_job_name, table_asset_key
from kafscale_lakehouse_tests.conftest import REPO_ROOT

COMPONENT_TYPE = "kafscale_lakehouse.orchestration.component.KafscaleLakehouseComponent"


def shape(definitions: dg.Definitions) -> dict[str, set]:
    """What a code location offers, by name."""
    graph = definitions.resolve_asset_graph()
    return {
        "assets": set(graph.get_all_asset_keys()),
        "checks": set(graph.asset_check_keys),
        "jobs": {job.name for job in definitions.resolve_all_job_defs()},
        "sensors": {sensor.name for sensor in definitions.sensors or []},
        "schedules": {schedule.name for schedule in definitions.schedules or []},
        "resources": set(definitions.resources or {}),
    }


def demo_config_in(directory: Path) -> Path:
    """The embedded example (examples/embedded.yaml) as `lakehouse.yaml` of `directory`, with one demo segment."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "lakehouse.yaml"
    shutil.copy(REPO_ROOT / "kafscale_lakehouse" / "examples" / "embedded.yaml", path)
    write_partition_segments(directory / "var" / "segments", record_count=10, records_per_segment=10)
    return path


def test_scaffolded_component_points_at_an_embedded_lakehouse_yaml_beside_it():
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(component_cls=KafscaleLakehouseComponent)
        declared = yaml.safe_load((defs_path / "defs.yaml").read_text())
        assert declared["type"] == COMPONENT_TYPE
        assert declared["attributes"] == {"config_path": "lakehouse.yaml"}
        written = (defs_path / "lakehouse.yaml").read_text()
        assert written == scaffolded_config(ScaffoldParams())
        config = load_config(defs_path / "lakehouse.yaml")
        assert [(m.topic, m.table) for m in config.mappings] == [(PIZZA_TOPIC, DEMO_LANDED_TABLE)]
        assert (config.iceberg.catalog.type, config.offsets.backend) == ("sql", "local")
        assert config.segments.local_root == defs_path / "var" / "segments"
        assert config.segments.local_root.is_dir()


def test_scaffold_parameters_choose_the_template_and_the_mapping():
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=KafscaleLakehouseComponent,
            scaffold_params={"template": "remote", "topic": "orders-eu", "table": "prod.orders_eu",
                             "bucket": "broker-segments", "catalog_uri": "https://rest.example:8181",
                             "etcd_endpoint": "http://etcd.example:2379"})
        document = yaml.safe_load((defs_path / "lakehouse.yaml").read_text())
    assert document["mappings"] == [{"topic": "orders-eu", "table": "prod.orders_eu",
                                     "create_table_if_missing": True}]
    assert document["s3"]["bucket"] == "broker-segments"
    assert document["s3"]["secret_access_key"] == "${AWS_SECRET_ACCESS_KEY}"
    assert document["iceberg"]["catalog"] == {"type": "rest", "uri": "https://rest.example:8181"}
    assert document["etcd"]["endpoints"] == ["http://etcd.example:2379"]


def test_an_inline_config_is_checked_against_the_config_schema_naming_the_key():
    with pytest.raises(Exception, match=r"iceberg\.catalog\.urii") as raised:
        KafscaleLakehouseComponent.resolve_from_yaml(
            "config:\n  iceberg:\n    catalog:\n      type: sql\n      urii: sqlite:///c.db\n")
    assert "Extra inputs are not permitted" in str(raised.value)
    schema = KafscaleLakehouseComponent.get_model_cls().model_json_schema()
    assert {"config", "config_path", "translation", "register_partitions_on_load"} <= set(schema["properties"])
    assert "MappingConfig" in schema["$defs"] and "mappings" in schema["$defs"]["LakehouseConfig"]["properties"]


def test_secrets_come_from_dg_env_templates_and_from_dollar_references(tmp_path, monkeypatch):
    monkeypatch.setenv("CATALOG_TOKEN", "t0ken")
    monkeypatch.setenv("ETCD_PASSWORD", "pa55")
    component = KafscaleLakehouseComponent.resolve_from_yaml("""
config:
  s3: {bucket: segments}
  iceberg: {catalog: {type: rest, uri: "http://rest:8181", token: "{{ env.CATALOG_TOKEN }}"}}
  etcd: {endpoints: ["http://etcd:2379"], username: lake, password: "${ETCD_PASSWORD}"}
  mappings: [{topic: orders, table: prod.orders}]
""")
    config, _ = component.lakehouse_config(tmp_path)
    assert config.iceberg.catalog.token.get_secret_value() == "t0ken"
    assert config.etcd.password.get_secret_value() == "pa55"


def test_translation_names_groups_describes_and_kinds_assets_by_default_and_per_mapping(tmp_path):
    (tmp_path / "segments").mkdir()
    component = KafscaleLakehouseComponent.resolve_from_yaml(f"""
config:
  segments: {{local_root: {tmp_path / "segments"}}}
  iceberg: {{catalog: {{type: sql, uri: "sqlite:///{tmp_path / "c.db"}"}}, warehouse: {tmp_path / "wh"}}}
  offsets: {{backend: local, local_path: {tmp_path / "o.db"}}}
  mappings:
    - {{topic: orders, table: prod.orders}}
    - topic: payments
      table: prod.payments
      asset: {{key: [finance, payments_raw], group: finance, kinds: [iceberg, kafka], topic_key: [broker, payments]}}
translation:
  key_prefix: [lake]
  group: ingestion
  description: "{{table}} from {{topic}}"
register_partitions_on_load: false
""")
    config, source = component.lakehouse_config(tmp_path)
    graph = build_definitions(config, source=source).resolve_asset_graph()
    orders, payments = dg.AssetKey(["lake", "prod", "orders"]), dg.AssetKey(["lake", "finance", "payments_raw"])
    assert {orders, payments, dg.AssetKey(["kafscale", "orders"]), dg.AssetKey(["broker", "payments"])} == \
        set(graph.get_all_asset_keys())
    assert (graph.get(orders).group_name, graph.get(payments).group_name) == ("ingestion", "finance")
    assert graph.get(orders).description == "prod.orders from orders"
    assert graph.get(orders).kinds == {"iceberg", "pyspark"} and graph.get(payments).kinds == {"iceberg", "kafka"}
    assert graph.get(payments).parent_keys == {dg.AssetKey(["broker", "payments"])}
    assert {key.asset_key for key in graph.asset_check_keys} == {orders, payments}


def test_component_on_a_config_file_builds_what_build_definitions_builds():
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(component_cls=KafscaleLakehouseComponent)
        config_path = demo_config_in(defs_path)
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (component, definitions):
            assert isinstance(component, KafscaleLakehouseComponent)
            built = shape(definitions)
        expected = shape(build_definitions(load_config(config_path)))
    assert built == expected
    assert table_asset_key(DEMO_LANDED_TABLE) in built["assets"]
    # Landing a table named rpc.pizzas brings none of the demo's downstream assets or its automation sensor.
    assert not {dg.AssetKey(["rpc", "pizzas_clean"]), dg.AssetKey(["rpc", "sauce_daily"])} & built["assets"]
    assert "pizza_lakehouse_automation" not in built["sensors"]
    assert ingest_job_name(DEMO_LANDED_TABLE) in built["jobs"]
    assert any(name.startswith("kafscale_") for name in built["sensors"])
    assert {"iceberg_catalog", "iceberg_io_manager"} <= built["resources"]


def test_component_with_the_config_inline_builds_the_same_definitions(tmp_path):
    config_path = demo_config_in(tmp_path / "file")
    document = yaml.safe_load(config_path.read_text())
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(component_cls=KafscaleLakehouseComponent,
                                               defs_yaml_contents={"type": COMPONENT_TYPE,
                                                                   "attributes": {"config": document}})
        # Relative paths of an inline config resolve against the directory of its defs.yaml.
        write_partition_segments(defs_path / "var" / "segments", record_count=10, records_per_segment=10)
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (_, definitions):
            built = shape(definitions)
            topic = definitions.resolve_asset_graph().get(dg.AssetKey(["kafscale", PIZZA_TOPIC]))
            assert topic.is_observable
    assert built == shape(build_definitions(load_config(config_path)))


def test_component_takes_a_config_file_or_an_inline_config_not_both():
    with pytest.raises(ValueError, match="give config_path or config, not both"):
        KafscaleLakehouseComponent(config_path="lakehouse.yaml", config={"mappings": []})
