"""Every config KafScale's Go processor (v1.6.0) loads, loads here with the same meaning: its
`addons/processors/iceberg-processor/config/config.yaml` verbatim, the config its Helm chart renders, and the
scalars Go's yaml.v3 accepts in its typed fields."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
import yaml

from kafscale_lakehouse.config import YAML11_FALSE, YAML11_TRUE, ConfigError, LakehouseConfig, load_config
from kafscale_lakehouse_tests.config.test_config import MINIMAL_GO

REPO_ROOT = Path(__file__).resolve().parents[2]
# `addons/processors/iceberg-processor/config/config.yaml` of github.com/KafScale/platform at v1.6.0 (the same bytes
# as at f7e23363 of main, 2026-04-17, when the repository was scalytics/kafscale), byte for byte.
GO_CONFIG = REPO_ROOT / "examples" / "go-processor-v1.6.0.yaml"
# The same release's Helm chart (`deploy/helm/iceberg-processor`): values.yaml and the ConfigMap template, verbatim.
CHART = Path(__file__).parent / "fixtures"

def write(directory: Path, text: str, name: str = "config.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def without_lfs(text: str) -> str:
    """The Go config without its `mappings[].lfs` block (LFS is configured by another part of this project)."""
    document = yaml.safe_load(text)
    for mapping in document["mappings"]:
        mapping.pop("lfs", None)
    return yaml.safe_dump(document, sort_keys=False)


def render_chart_config(values_path: Path, template_path: Path) -> str:
    """The `config.yaml` of the ConfigMap `helm template` renders from the chart's default values.

    The template is `config.yaml: |` + `toYaml .Values.config | indent 4`. Helm reads values.yaml as YAML 1.1
    (sigs.k8s.io/yaml over yaml.v2, so an unquoted `off` becomes false) and toYaml writes the keys sorted; PyYAML's
    safe_load and safe_dump(sort_keys=True) do the same.
    """
    template = template_path.read_text()
    assert "config.yaml: |\n{{ toYaml .Values.config | indent 4 }}" in template, "the chart's template changed"
    values = yaml.safe_load(values_path.read_text())
    assert not values["config"]["existingConfigMap"], "the chart renders no ConfigMap with existingConfigMap set"
    return yaml.safe_dump(values["config"], sort_keys=True, default_flow_style=False)


def assert_means_what_go_reads(config: LakehouseConfig) -> None:
    """The values Go's `config.Load` gives the example config (defaults applied, `schema.source` inferred)."""
    assert (config.s3.bucket, config.s3.namespace, config.s3.region) == ("kafscale-data", "production", "us-east-1")
    assert config.s3.path_style is False and config.s3.endpoint is None
    catalog = config.iceberg.catalog
    assert (catalog.type, catalog.uri, catalog.token, catalog.username) == (
        "rest", "https://iceberg-catalog.example.com", None, None)
    assert config.iceberg.warehouse == "s3://iceberg-warehouse/production"
    assert (config.offsets.backend, config.offsets.lease_ttl_seconds, config.offsets.key_prefix) == (
        "etcd", 30, "processors")
    assert config.processor.poll_interval_seconds == 5
    assert config.discovery.mode == "auto"
    assert config.etcd.endpoints == ["http://etcd.kafscale.svc.cluster.local:2379"]
    assert config.schema_config.mode == "off"
    registry = config.schema_config.registry
    assert (registry.base_url, registry.timeout_seconds, registry.cache_seconds) == (
        "https://schemas.example.com", 5, 300)
    (mapping,) = config.mappings
    assert (mapping.topic, mapping.table, mapping.mode, mapping.create_table_if_missing) == (
        "orders", "prod.orders", "append", True)
    assert mapping.schema_config.source == "mapping" and mapping.schema_config.allow_type_widening is True
    assert [(c.name, c.type, c.required) for c in mapping.columns] == [("order_id", "long", True),
                                                                         ("status", "string", False)]


def test_the_go_processors_config_yaml_loads_verbatim():
    # Needs `mappings[].lfs` (LFS support); everything else is checked by the test below.
    assert_means_what_go_reads(load_config(GO_CONFIG))


def test_the_go_processors_config_yaml_means_the_same_apart_from_lfs(tmp_path):
    text = GO_CONFIG.read_text()
    assert "    lfs:\n      mode: off\n" in text  # the verbatim copy, with the block LFS support reads
    assert_means_what_go_reads(load_config(write(tmp_path, without_lfs(text))))


def test_the_config_the_go_processors_helm_chart_renders(tmp_path, caplog):
    rendered = render_chart_config(CHART / "go-processor-chart-values.yaml",
                                   CHART / "go-processor-chart-configmap.yaml")
    # What the chart adds at the top and what YAML 1.1 made of `mode: off` are really in the rendered file.
    assert "existingConfigMap: ''\n" in rendered and "path: /config/config.yaml\n" in rendered
    assert "password: null" in rendered and "endpoint: ''" in rendered
    path = write(tmp_path, without_lfs(rendered))
    with caplog.at_level(logging.INFO, logger="kafscale_lakehouse.config"):
        config = load_config(path)
    assert_means_what_go_reads(config)
    assert config.etcd.password is None and config.iceberg.catalog.password is None
    ignored = [r.getMessage() for r in caplog.records if "ignoring top-level key" in r.getMessage()]
    assert ignored == [
        f"{path}: ignoring top-level key 'existingConfigMap' = '' (the Helm chart's choice of an existing ConfigMap; "
        "it carries nothing for kafscale-lakehouse)",
        f"{path}: ignoring top-level key 'path' = '/config/config.yaml' (the Helm chart's mount path of this file; "
        "it carries nothing for kafscale-lakehouse)",
    ]


def test_the_helm_rendered_config_verbatim(tmp_path):
    # Needs `mappings[].lfs` with `mode: false` (Helm's YAML 1.1 reading of `off`).
    rendered = render_chart_config(CHART / "go-processor-chart-values.yaml",
                                   CHART / "go-processor-chart-configmap.yaml")
    assert "    mode: false\n" in rendered
    assert_means_what_go_reads(load_config(write(tmp_path, rendered)))


# yaml.v3 decodes these into a Go bool field (decode.go), quoted or not; `true`/`false` as usual.
def test_yaml_1_1_booleans_exactly_as_go_yaml_v3_accepts_them():
    assert {"y", "Y", "yes", "Yes", "YES", "on", "On", "ON"} == YAML11_TRUE
    assert {"n", "N", "no", "No", "NO", "off", "Off", "OFF"} == YAML11_FALSE


@pytest.mark.parametrize("word, expected", [*((w, True) for w in sorted(YAML11_TRUE)),
                                            *((w, False) for w in sorted(YAML11_FALSE)),
                                            ("'yes'", True), ('"off"', False), ("true", True), ("FALSE", False)])
def test_yaml_1_1_booleans_in_every_go_bool_key(tmp_path, word, expected):
    text = MINIMAL_GO.replace("  bucket: kafscale-data", f"  bucket: kafscale-data\n  path_style: {word}") + (
        f"    create_table_if_missing: {word}\n"
        "    schema:\n"
        f"      allow_type_widening: {word}\n"
        f"      columns: [{{name: id, type: long, required: {word}}}]\n"
        f"processor:\n  allow_gaps: {word}\n"  # an extension, read the same way
    )
    config = load_config(write(tmp_path, text))
    mapping = config.mappings[0]
    assert config.s3.path_style is expected
    assert mapping.create_table_if_missing is expected
    assert mapping.schema_config.allow_type_widening is expected
    assert mapping.columns[0].required is expected
    assert config.processor.allow_gaps is expected


def test_yaml_1_1_words_stay_strings_in_string_keys(tmp_path):
    text = MINIMAL_GO + "schema:\n  mode: off\n  registry:\n    base_url: yes\ndiscovery:\n  mode: On\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    # `On` is the string "On", lower-cased like Go does, and no discovery mode; `off` is schema mode "off".
    assert caught.value.problems == ["discovery.mode: 'on' is not one of auto, etcd, s3"]
    config = load_config(write(tmp_path, text.replace("mode: On", "mode: S3")))
    assert config.schema_config.mode == "off" and config.schema_config.registry.base_url == "yes"


def test_scalars_where_go_expects_a_string_keep_their_text(tmp_path):
    text = textwrap.dedent("""
        s3:
          bucket: 2024
          namespace: 0x10
          region: 1.50
          endpoint: true
        iceberg:
          catalog:
            type: rest
            uri: http://catalog:8181
            token: 12e3
        etcd:
          endpoints: [2379, http://etcd:2379]
          username: 007
        offsets:
          key_prefix: 1_000
        mappings:
          - topic: 2024
            table: prod.t2024
            schema:
              columns:
                - {name: 2024-01-31, type: long}
                - {name: 1.0, type: string}
    """)
    config = load_config(write(tmp_path, text))
    assert (config.s3.bucket, config.s3.namespace, config.s3.region, config.s3.endpoint) == (
        "2024", "0x10", "1.50", "true")
    assert config.iceberg.catalog.token.get_secret_value() == "12e3"
    assert config.etcd.endpoints == ["2379", "http://etcd:2379"] and config.etcd.username == "007"
    assert config.offsets.key_prefix == "1_000"
    (mapping,) = config.mappings
    assert mapping.topic == "2024"
    assert [c.name for c in mapping.columns] == ["2024-01-31", "1.0"]


def test_numbers_where_go_expects_an_integer(tmp_path):
    text = MINIMAL_GO + "offsets:\n  lease_ttl_seconds: 45.0\nprocessor:\n  poll_interval_seconds: 0x0A\n"
    config = load_config(write(tmp_path, text))
    assert config.offsets.lease_ttl_seconds == 45 and config.processor.poll_interval_seconds == 10
    # Go's yaml.v3 refuses a string or a boolean in an integer field; so do we.
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, MINIMAL_GO + "offsets:\n  lease_ttl_seconds: '30'\nprocessor:\n"
                                                 "  poll_interval_seconds: yes\n"))
    assert caught.value.problems == ["offsets.lease_ttl_seconds: expected an integer, got a string '30'",
                                     "processor.poll_interval_seconds: expected an integer, got a string 'yes'"]


def test_keys_neither_go_nor_we_know_are_errors_naming_the_key(tmp_path):
    text = MINIMAL_GO + "    create_table_if_misssing: yes\nexistingConfigMapp: x\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert sorted(caught.value.problems) == [
        "existingConfigMapp: unknown key (expected one of discovery, etcd, iceberg, mappings, offsets, processor, "
        "s3, schema, segments, spark)",
        "mappings[0].create_table_if_misssing: unknown key (did you mean 'create_table_if_missing'?)",
    ]
