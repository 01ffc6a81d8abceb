"""`mappings[].lfs`: Go's keys, defaults and validation rules, and the KAFSCALE_ICEBERG_LFS_* overrides."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.config import ConfigError, load_config, parse_config

BASE = {
    "s3": {"bucket": "kafscale-data"},
    "iceberg": {"catalog": {"type": "rest", "uri": "http://catalog:8181"}},
    "etcd": {"endpoints": ["http://etcd:2379"]},
}


def config_with(*lfs_blocks, environ=None, monkeypatch=None):
    if monkeypatch is not None:
        for name, value in (environ or {}).items():
            monkeypatch.setenv(name, value)
    mappings = [{"topic": f"t{i}", "table": f"prod.t{i}", **({"lfs": block} if block is not None else {})}
                for i, block in enumerate(lfs_blocks)]
    return parse_config({**BASE, "mappings": mappings})


def problems(*lfs_blocks, **kwargs) -> str:
    with pytest.raises(ConfigError) as caught:
        config_with(*lfs_blocks, **kwargs)
    return str(caught.value)


@pytest.fixture(autouse=True)
def no_lfs_env(monkeypatch):
    for suffix in ("MODE", "MAX_INLINE_SIZE", "STORE_METADATA", "VALIDATE_CHECKSUM", "RESOLVE_CONCURRENCY"):
        monkeypatch.delenv(f"KAFSCALE_ICEBERG_LFS_{suffix}", raising=False)


def test_go_defaults_without_a_block_and_zero_values():
    config = config_with(None, {"resolve_concurrency": 0, "max_inline_size": 0, "mode": ""})
    for mapping in config.mappings:
        lfs = mapping.lfs
        assert (lfs.mode, lfs.max_inline_size, lfs.store_metadata, lfs.validate_checksum,
                lfs.resolve_concurrency) == ("off", 0, False, True, 4)


def test_the_go_example_block_loads():
    # addons/processors/iceberg-processor/config/config.yaml (KafScale main)
    lfs = config_with({"mode": "resolve", "max_inline_size": 1048576, "store_metadata": True,
                       "validate_checksum": True, "resolve_concurrency": 4}).mappings[0].lfs
    assert (lfs.mode, lfs.max_inline_size, lfs.store_metadata) == ("resolve", 1048576, True)


@pytest.mark.parametrize(("block", "problem"), [
    ({"mode": "inline"}, "mappings[0].lfs.mode"),
    ({"mode": "hybrid"}, "mappings[0].lfs.max_inline_size: must be > 0 for lfs.mode hybrid"),
    ({"resolve_concurrency": -1}, "mappings[0].lfs.resolve_concurrency"),
    ({"max_inline_size": -5}, "mappings[0].lfs.max_inline_size"),
    ({"validate_checksum": "yes please"}, "mappings[0].lfs.validate_checksum"),
    ({"inline": True}, "mappings[0].lfs.inline"),
])
def test_go_validation_rules_name_the_key(block, problem):
    assert problem in problems(block)


def test_environment_overrides_every_mapping_like_go(monkeypatch):
    config = config_with({"mode": "reference"}, None, monkeypatch=monkeypatch, environ={
        "KAFSCALE_ICEBERG_LFS_MODE": "hybrid", "KAFSCALE_ICEBERG_LFS_MAX_INLINE_SIZE": " 2048 ",
        "KAFSCALE_ICEBERG_LFS_STORE_METADATA": "T", "KAFSCALE_ICEBERG_LFS_VALIDATE_CHECKSUM": "0",
        "KAFSCALE_ICEBERG_LFS_RESOLVE_CONCURRENCY": "9"})
    for mapping in config.mappings:
        lfs = mapping.lfs
        assert (lfs.mode, lfs.max_inline_size, lfs.store_metadata, lfs.validate_checksum,
                lfs.resolve_concurrency) == ("hybrid", 2048, True, False, 9)


def test_an_override_is_validated_like_the_file(monkeypatch):
    message = problems({"mode": "resolve"}, monkeypatch=monkeypatch,
                       environ={"KAFSCALE_ICEBERG_LFS_MODE": "hybrid"})
    assert "mappings[0].lfs.max_inline_size: must be > 0 for lfs.mode hybrid" in message


@pytest.mark.parametrize(("name", "value"), [("KAFSCALE_ICEBERG_LFS_STORE_METADATA", "yes"),
                                             ("KAFSCALE_ICEBERG_LFS_RESOLVE_CONCURRENCY", "four"),
                                             ("KAFSCALE_ICEBERG_LFS_MAX_INLINE_SIZE", "1MB")])
def test_an_unparsable_override_is_an_error_naming_the_variable(monkeypatch, name, value):
    # Go ignores it silently; a typo in a deployment should not silently change nothing.
    assert f"environment variable {name}: {value!r} is not" in problems(None, monkeypatch=monkeypatch,
                                                                        environ={name: value})


def test_blank_overrides_are_unset(monkeypatch):
    lfs = config_with({"mode": "skip"}, monkeypatch=monkeypatch,
                      environ={"KAFSCALE_ICEBERG_LFS_MODE": "  "}).mappings[0].lfs
    assert lfs.mode == "skip"


def test_a_mapped_column_may_not_take_the_name_of_a_metadata_column():
    document = {**BASE, "mappings": [{"topic": "t", "table": "prod.t", "lfs": {"store_metadata": True},
                                      "schema": {"columns": [{"name": "lfs_key", "type": "string"}]}}]}
    with pytest.raises(ConfigError, match=r"mappings\[0\]\.schema\.columns\[0\]\.name: 'lfs_key' is a column "
                                          "lfs.store_metadata adds"):
        parse_config(document)


def test_the_go_config_yaml_block_loads_verbatim(tmp_path):
    # KafScale main, addons/processors/iceberg-processor/config/config.yaml (and the Helm chart's copy)
    path = tmp_path / "config.yaml"
    path.write_text("""
s3:
  bucket: kafscale-data
iceberg:
  catalog: {type: rest, uri: "http://catalog:8181"}
etcd:
  endpoints: ["http://etcd:2379"]
mappings:
  - topic: orders
    table: prod.orders
    lfs:
      mode: off
      max_inline_size: 1048576
      store_metadata: false
      validate_checksum: true
      resolve_concurrency: 4
""")
    lfs = load_config(path).mappings[0].lfs
    assert (lfs.mode, lfs.max_inline_size, lfs.resolve_concurrency) == ("off", 1048576, 4)
    # The same block after a YAML 1.1 reader turned `off` into a boolean.
    assert config_with({"mode": False}).mappings[0].lfs.mode == "off"
