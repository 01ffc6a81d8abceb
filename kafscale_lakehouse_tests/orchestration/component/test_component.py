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
from kafscale_lakehouse.orchestration.component import SCAFFOLDED_CONFIG, KafscaleLakehouseComponent, build_definitions
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
    """examples/embedded.yaml as `lakehouse.yaml` of `directory`, with one segment of the demo topic."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "lakehouse.yaml"
    shutil.copy(REPO_ROOT / "examples" / "embedded.yaml", path)
    write_partition_segments(directory / "var" / "segments", record_count=10, records_per_segment=10)
    return path


def test_scaffolded_component_points_at_a_lakehouse_yaml_beside_it():
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(component_cls=KafscaleLakehouseComponent)
        declared = yaml.safe_load((defs_path / "defs.yaml").read_text())
        assert declared["type"] == COMPONENT_TYPE
        assert declared["attributes"] == {"config_path": "lakehouse.yaml"}
        assert (defs_path / "lakehouse.yaml").read_text() == SCAFFOLDED_CONFIG
        assert [m["table"] for m in yaml.safe_load(SCAFFOLDED_CONFIG)["mappings"]] == ["prod.orders"]


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
