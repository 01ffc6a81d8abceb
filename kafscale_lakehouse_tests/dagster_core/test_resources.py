"""Resources built from a config: secrets reach them as EnvVar references, never as plain resource config."""

from __future__ import annotations

import dagster as dg
import pytest
from pydantic import SecretStr

from kafscale_lakehouse.orchestration.resources import SecretConflictError, secret_env_var_name, secret_reference


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
