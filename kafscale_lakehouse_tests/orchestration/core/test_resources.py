"""Resources built from a config: they hold the config and open clients through `connections`; secrets reach them
as EnvVar references, never as plain resource config."""

from __future__ import annotations

import dagster as dg
import pytest
from pydantic import SecretStr

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings, segment_store_from_config
from kafscale_lakehouse.orchestration.resources import (
    SPARK_RESOURCE_KEY,
    SecretConflictError,
    lakehouse_resources,
    secret_env_var_name,
    secret_reference,
)


def unset_until_the_test_ends(monkeypatch, name: str) -> None:
    monkeypatch.setenv(name, "placeholder")  # so that monkeypatch removes what the test exports
    monkeypatch.delenv(name)


def test_a_secret_becomes_an_env_var_reference_exported_in_this_process(monkeypatch):
    name = secret_env_var_name("etcd.password")
    unset_until_the_test_ends(monkeypatch, name)

    reference = secret_reference("etcd.password", SecretStr("s3cr3t"))

    assert isinstance(reference, dg.EnvVar) and reference == dg.EnvVar(name)
    assert reference.get_value() == "s3cr3t"
    assert secret_reference("etcd.password", None) is None


def test_two_configs_with_different_values_for_one_secret_are_refused(monkeypatch):
    unset_until_the_test_ends(monkeypatch, secret_env_var_name("iceberg.catalog.token"))
    secret_reference("iceberg.catalog.token", "first")
    assert secret_reference("iceberg.catalog.token", "first") is not None  # the same config loaded again

    with pytest.raises(SecretConflictError, match=r"iceberg\.catalog\.token: a config loaded earlier"):
        secret_reference("iceberg.catalog.token", "second")


def test_resources_hold_the_config_without_secrets_and_open_what_the_factory_opens(monkeypatch, tmp_path):
    for key in ("s3.secret_access_key", "iceberg.catalog.password", "etcd.password"):
        unset_until_the_test_ends(monkeypatch, secret_env_var_name(key))
    config = parse_config({
        "s3": {"bucket": "lake", "namespace": "ns", "endpoint": "http://127.0.0.1:1", "region": "eu-west-1",
               "path_style": True, "access_key_id": "AKID", "secret_access_key": "s3-secret-value",
               "sse": {"type": "AES256"}},
        "iceberg": {"catalog": {"type": "rest", "uri": "http://127.0.0.1:2", "username": "client",
                                "password": "catalog-secret-value"}, "warehouse": "s3://warehouse"},
        "etcd": {"endpoints": ["http://127.0.0.1:3"], "username": "root", "password": "etcd-secret-value"},
        "offsets": {"backend": "etcd", "lease_ttl_seconds": 7, "key_prefix": "procs"},
    }, base_dir=tmp_path)
    resources = lakehouse_resources(config)
    definitions_view = {key: dict(resource._convert_to_config_dictionary())
                        for key, resource in resources.items() if key != SPARK_RESOURCE_KEY}
    assert not any(secret in repr(definitions_view) for secret in ("s3-secret-value", "catalog-secret-value",
                                                                     "etcd-secret-value"))

    with dg.build_resources({k: v for k, v in resources.items() if k != SPARK_RESOURCE_KEY}) as resolved:
        store = resolved.segment_store.open_store()
        settings = resolved.iceberg_catalog.settings()
        offsets_config = resolved.offset_store.lakehouse_config()

    expected = segment_store_from_config(config)
    assert (store.bucket, store.namespace, store.endpoint, store.region, store.path_style, store.sse_type) == (
        expected.bucket, expected.namespace, expected.endpoint, expected.region, expected.path_style, "AES256")
    assert store.static_credentials == ("AKID", "s3-secret-value", None)
    assert settings == catalog_settings(config)
    assert settings.catalog_properties()["credential"] == "client:catalog-secret-value"
    assert offsets_config.etcd.password.get_secret_value() == "etcd-secret-value"
    assert (offsets_config.offsets.lease_ttl_seconds, offsets_config.offsets.key_prefix) == (7, "procs")


def test_catalog_properties_travel_as_a_secret_not_as_resource_config(monkeypatch, tmp_path):
    # Any catalog property may carry a secret (here a bearer token in an extra header): the UI shows resource config.
    unset_until_the_test_ends(monkeypatch, secret_env_var_name("iceberg.catalog.properties"))
    properties = {"header.Authorization": "Bearer header-secret-value", "scope": "PRINCIPAL_ROLE:ALL"}
    config = parse_config({
        "s3": {"bucket": "lake"},
        "iceberg": {"catalog": {"type": "rest", "uri": "http://127.0.0.1:2", "properties": properties},
                    "warehouse": "s3://warehouse"},
        "offsets": {"backend": "local", "local_path": str(tmp_path / "offsets.db")},
    }, base_dir=tmp_path)
    resources = lakehouse_resources(config)
    definitions_view = {key: dict(resource._convert_to_config_dictionary())
                        for key, resource in resources.items() if key != SPARK_RESOURCE_KEY}
    assert "header-secret-value" not in repr(definitions_view) + repr(resources)
    assert "PRINCIPAL_ROLE" not in repr(definitions_view)

    with dg.build_resources({k: v for k, v in resources.items() if k != SPARK_RESOURCE_KEY}) as resolved:
        settings = resolved.iceberg_catalog.settings()
    assert settings == catalog_settings(config)
    passed = settings.catalog_properties()
    assert passed["header.Authorization"] == "Bearer header-secret-value" and passed["scope"] == "PRINCIPAL_ROLE:ALL"
