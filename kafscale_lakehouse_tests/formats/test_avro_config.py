"""`mappings[].value_format` and `mappings[].schema_registry`: typed, secrets from the environment, and every problem
names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale_lakehouse.config import ConfigError, load_config, parse_config

BASE = {"iceberg": {"catalog": {"type": "sql", "uri": "sqlite:///catalog.db"}, "warehouse": "warehouse"},
        "segments": {"local_root": "segments"}, "offsets": {"backend": "local", "local_path": "offsets.db"}}


def _parse(mapping: dict, **top: object):
    return parse_config({**BASE, **top, "mappings": [mapping]}, source="<test>", base_dir=Path("/etc/lakehouse"))


def test_an_avro_mapping_with_its_registry(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("REGISTRY_PASSWORD", "s3cret-value")
    path = tmp_path / "lakehouse.yaml"
    path.write_text("""
iceberg: {catalog: {type: sql, uri: "sqlite:///catalog.db"}, warehouse: warehouse}
segments: {local_root: segments}
offsets: {backend: local, local_path: offsets.db}
schema: {mode: lenient}
mappings:
  - topic: orders-avro
    table: shop.orders
    value_format: AVRO
    schema_registry:
      url: https://registry.example:8081
      username: lakehouse
      password: ${REGISTRY_PASSWORD}
      ca_file: certs/ca.pem
      subject_name_strategy: topic_record
      record_name: shop.Order
""")
    mapping = load_config(path).mappings[0]
    registry = mapping.schema_registry
    assert mapping.value_format == "avro" and mapping.schema_config.source == "none"
    assert registry.password.get_secret_value() == "s3cret-value"
    assert "s3cret-value" not in repr(registry) and "s3cret-value" not in str(mapping.model_dump())
    assert registry.ca_file == tmp_path / "certs" / "ca.pem"  # relative to the config file
    assert (registry.subject_name_strategy, registry.record_name, registry.latest) == ("topic_record", "shop.Order",
                                                                                     False)


@pytest.mark.parametrize(("mapping", "problem"), [
    ({"value_format": "avro"}, "mappings[0].schema_registry: is required for value_format avro"),
    ({"value_format": "thrift", "schema_registry": {"url": "http://r"}},
     "mappings[0].value_format: 'thrift' is not one of json, avro, protobuf, json_schema"),
    ({"value_format": "protobuf"}, "mappings[0].schema_registry: is required for value_format protobuf"),
    ({"schema_registry": {"url": "http://r"}},
     "mappings[0].schema_registry: is only used with value_format (or key_format) avro"),
    ({"key_format": "json"}, "mappings[0].key_columns: must declare the key's fields for key_format json"),
    ({"value_schema_file": "order.json"}, "mappings[0].value_schema_file: is only used with value_format json_schema"),
    ({"value_format": "json_schema", "value_schema_file": "missing.json"},
     "mappings[0].value_schema_file: '/etc/lakehouse/missing.json' is not a file"),
    ({"value_format": "json_schema"},
     "mappings[0].schema_registry: is required for value_format json_schema (or value_schema_file)"),
    ({"key_columns": [{"name": "id", "type": "long"}]}, "mappings[0].key_columns: is only used with key_format json"),
    ({"key_format": "avro"}, "mappings[0].schema_registry: is required for key_format avro"),
    ({"key_format": "protobuf", "schema_registry": {"url": "http://r", "subject_name_strategy": "record"}},
     "mappings[0].schema_registry.key_record_name: is required for key_format protobuf"),
    ({"value_format": "avro", "schema_registry": {"url": "registry:8081"}},
     "mappings[0].schema_registry.url: 'registry:8081' is not an http(s) URL"),
    ({"value_format": "avro", "schema_registry": {"url": "http://r", "subject_name_strategy": "record"}},
     "mappings[0].schema_registry.record_name: is required for subject_name_strategy record"),
    ({"value_format": "avro", "schema_registry": {"url": "http://r", "subject_name_strategy": "TopicNameStrategy"}},
     "mappings[0].schema_registry.subject_name_strategy"),
    ({"value_format": "avro", "schema_registry": {"url": "http://r", "username": "u", "bearer_token": "t"}},
     "mappings[0].schema_registry.bearer_token: set either bearer_token or username/password"),
    ({"value_format": "avro", "schema_registry": {"url": "http://r", "token": "t"}},
     "mappings[0].schema_registry.token"),
    ({"value_format": "avro", "schema_registry": {"url": "http://r"},
      "schema": {"columns": [{"name": "a", "type": "int"}]}}, "mappings[0].schema.columns"),
    ({"value_format": "avro", "schema_registry": {"url": "http://r"}, "lfs": {"mode": "resolve"}},
     "mappings[0].lfs.mode: must be off for value_format avro"),
])
def test_each_problem_names_its_key(mapping: dict, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        _parse({"topic": "orders", "table": "shop.orders", **mapping})
    assert problem in str(error.value)


def test_json_schema_validation_needs_its_registry_only_for_json_values() -> None:
    avro = {"topic": "orders", "table": "shop.orders", "value_format": "avro", "schema_registry": {"url": "http://r"}}
    assert _parse(avro, schema={"mode": "lenient"}).schema_config.mode == "lenient"
    with pytest.raises(ConfigError, match=r"schema\.registry\.base_url: is required when schema\.mode is lenient"):
        parse_config({**BASE, "schema": {"mode": "lenient"},
                      "mappings": [avro, {"topic": "pizzas", "table": "shop.pizzas"}]},
                     source="<test>", base_dir=Path("/etc/lakehouse"))


def test_a_json_schema_mapping_may_take_its_schema_from_a_file_relative_to_the_config(tmp_path) -> None:
    (tmp_path / "order.json").write_text('{"type": "object", "properties": {"id": {"type": "string"}}}')
    document = {**BASE, "mappings": [{"topic": "orders", "table": "shop.orders", "value_format": "json_schema",
                                      "value_schema_file": "order.json"}]}
    mapping = parse_config(document, source="<test>", base_dir=tmp_path).mappings[0]
    assert mapping.value_schema_file == tmp_path / "order.json" and mapping.schema_registry is None


def test_a_schema_file_for_values_and_registry_keys_under_the_record_strategy_need_only_the_key_record_name(
        tmp_path) -> None:
    """The values' schema is the file: the registry serves only the keys, so no value `record_name` is asked for."""
    (tmp_path / "order.json").write_text('{"type": "object", "properties": {"id": {"type": "string"}}}')
    registry = {"url": "http://r", "subject_name_strategy": "record", "key_record_name": "shop.OrderKey"}
    document = {**BASE, "mappings": [{"topic": "orders", "table": "shop.orders", "value_format": "json_schema",
                                      "value_schema_file": "order.json", "key_format": "avro",
                                      "schema_registry": registry}]}
    mapping = parse_config(document, source="<test>", base_dir=tmp_path).mappings[0]
    assert mapping.schema_registry.record_name is None and mapping.schema_registry.key_record_name == "shop.OrderKey"

