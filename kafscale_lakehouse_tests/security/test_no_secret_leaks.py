"""No secret ever shows: not in logs (DEBUG included) or process output, not in materialization or check metadata
or any other event of a Dagster run, not in the messages of failures caused by wrong credentials or a broken
config, not in the HTML report, not in the repr/str of the config, the Dagster resources or the engine's clients.

Everything runs the real paths against the package's secured servers (see conftest.py): one Dagster run shared by
the tests, then each failure provoked on its own.
"""

from __future__ import annotations

import base64
import copy
import logging
import traceback
from collections.abc import Callable
from typing import Any

import dagster as dg
import pytest
import yaml

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.config import ConfigError, load_config, parse_config
from kafscale_lakehouse.connections import (
    catalog_settings,
    etcd_client_from_config,
    offset_store_from_config,
    schema_registry_client,
    segment_store_from_config,
)
from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.engine.tables.catalogs import CatalogError, load_catalog, open_table
from kafscale_lakehouse.engine.tables.checks import CHECK_NAMES
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.etcd import EtcdAuthError, EtcdClient
from kafscale_lakehouse.orchestration.resources import SECRET_ENV_PREFIX, lakehouse_resources
from kafscale_lakehouse.storage import StorageAuthError
from kafscale_lakehouse.value_formats.registry import SchemaRegistryError
from kafscale_lakehouse_tests.orchestration.core.conftest import run_ingest_job
from kafscale_lakehouse_tests.schema_registry.conftest import REGISTRY_PATH, Answer
from kafscale_lakehouse_tests.security.conftest import (
    ETCD_USER,
    EXPECTED_INVALID_RECORDS,
    EXPECTED_VALID_RECORDS,
    REGISTRY_USER,
    Credentials,
    SecuredRun,
    assert_no_secret,
    registry_url,
)

pytestmark = pytest.mark.integration


def with_changes(document: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    change(changed)
    return changed


def failure_text(exc: BaseException) -> str:
    """The message and the whole formatted chain (what a traceback on a console or in Dagster's UI shows)."""
    return str(exc) + "\n" + "".join(traceback.format_exception(exc))


def test_the_run_used_every_secured_component(secured_run: SecuredRun, secured_registry, credentials: Credentials):
    # The leak checks below mean something only if every credential was really used.
    assert secured_run.result.success
    catalog = load_catalog(catalog_settings(secured_run.config))
    table = open_table(catalog, secured_run.world.table_name)
    assert len(table.scan().to_arrow()) == EXPECTED_VALID_RECORDS
    assert read_topic_offsets(table, secured_run.world.topic) == {0: 20, 1: 20}
    assert len(open_table(catalog, secured_run.dead_letter_table).scan().to_arrow()) == EXPECTED_INVALID_RECORDS
    basic = "Basic " + base64.b64encode(f"{REGISTRY_USER}:{credentials.registry_password}".encode()).decode()
    assert secured_registry.requests and {r.authorization for r in secured_registry.requests} == {basic}
    with EtcdClient([secured_run.world.etcd_endpoint], username=ETCD_USER,
                    password=credentials.etcd_password) as etcd:
        assert len(etcd.get_prefix(f"{secured_run.world.name}/offsets/")) == 2


def test_logs_at_debug_and_process_output_hold_no_secret(secured_run: SecuredRun, credentials: Credentials):
    # Dagster's run logs are not Python log records: they are the run's events, checked in the next test.
    loggers = {record.split(" ", 2)[1].split(".")[0] for record in secured_run.output.records}
    assert {"kafscale_lakehouse", "pyiceberg"} <= loggers, loggers
    assert any(record.startswith("DEBUG kafscale_lakehouse") for record in secured_run.output.records)
    assert "RUN_SUCCESS" in secured_run.output.fd_output, "Dagster's console log was captured"
    assert_no_secret(secured_run.output.text, credentials, "the run's log records and fd 1/2 output")


def test_run_events_with_materialization_and_check_metadata_hold_no_secret(secured_run: SecuredRun,
                                                                           credentials: Credentials):
    materializations = secured_run.result.get_asset_materialization_events()
    checks = secured_run.result.get_asset_check_evaluations()
    assert {m.event_specific_data.materialization.partition for m in materializations} == {"0", "1"}
    assert {c.check_name for c in checks} == set(CHECK_NAMES)
    for materialization in materializations:
        assert_no_secret(dg.serialize_value(materialization.event_specific_data.materialization), credentials,
                         "materialization metadata")
    for check in checks:
        assert_no_secret(dg.serialize_value(check), credentials, f"check {check.check_name}")
    # Every event of the run as the instance stored it (DEBUG included): step logs, resource init, engine events.
    assert any(entry.level == logging.DEBUG for entry in secured_run.run_events)
    assert_no_secret("\n".join(dg.serialize_value(entry) for entry in secured_run.run_events), credentials,
                     "the run's event log")
    instance_run = dg.serialize_value(secured_run.result.dagster_run)
    assert_no_secret(instance_run, credentials, "the stored run (config and tags)")


def test_the_report_holds_no_secret(secured_run: SecuredRun, credentials: Credentials, tmp_path, monkeypatch,
                                    capfd, caplog):
    monkeypatch.setenv("DAGSTER_HOME", str(secured_run.dagster_home))
    output = tmp_path / "report.html"

    status = cli.main(["--log-level", "debug", "report", "--config", str(secured_run.config_path),
                       "--table", secured_run.world.table_name, "--output", str(output)])

    assert status == 0
    page = output.read_text(encoding="utf-8")
    assert secured_run.world.table_name in page and secured_run.dead_letter_table in page
    assert "record_id_unique" in page, "the check history was read"
    assert_no_secret(page, credentials, "the HTML report")
    assert_no_secret(caplog.text + "".join(capfd.readouterr()), credentials, "the report command's output")


def test_repr_and_str_of_the_config_resources_and_clients_hold_no_secret(secured_run: SecuredRun,
                                                                         credentials: Credentials):
    config = secured_run.config
    texts = {
        "repr(config)": repr(config),
        "str(config)": str(config),
        "config.model_dump()": str(config.model_dump()),
        "config.model_dump_json()": config.model_dump_json(),
        "load_config()": repr(load_config(secured_run.config_path)),
        "catalog settings": repr(catalog_settings(config)),
        "segment store": repr(segment_store_from_config(config)),
        "registry client": repr(schema_registry_client(config)),
    }
    etcd = etcd_client_from_config(config)
    texts["etcd client"] = repr(etcd)
    texts["offset store"] = repr(offset_store_from_config(config, etcd))
    etcd.close()
    resources = lakehouse_resources(config)
    texts.update({f"resource {key}": f"{resource!r} {resource}" for key, resource in resources.items()})
    # Resolved as a run sees them (EnvVar references replaced by the values).
    with dg.build_resources({k: v for k, v in resources.items() if k != "spark"}) as resolved:
        for key in resources:
            if key != "spark":
                texts[f"resolved resource {key}"] = repr(getattr(resolved, key))
    definitions = build_definitions(config)
    texts["definitions' resource config"] = repr(dict(definitions.resources.items()))
    for where, text in texts.items():
        assert_no_secret(text, credentials, where)


# ------------------------------------------------------------------------------------------ failures


def _wrong_s3_key(run: SecuredRun, credentials: Credentials) -> BaseException:
    document = with_changes(run.document, lambda d: d["s3"].update(secret_access_key=credentials.wrong["s3"]))
    with pytest.raises(StorageAuthError) as raised:
        segment_store_from_config(parse_config(document, base_dir=run.config_path.parent)).list_topics()
    return raised.value


def _wrong_warehouse_key(run: SecuredRun, credentials: Credentials) -> BaseException:
    document = with_changes(run.document,
                            lambda d: d["iceberg"]["s3"].update(secret_access_key=credentials.wrong["warehouse-s3"]))
    table = open_table(load_catalog(catalog_settings(parse_config(document, base_dir=run.config_path.parent))),
                       run.world.table_name)
    with pytest.raises(PermissionError) as raised:  # s3fs's, as pyiceberg lets it through
        table.scan().to_arrow()
    return raised.value


def _wrong_catalog_password(run: SecuredRun, credentials: Credentials) -> BaseException:
    document = with_changes(run.document,
                            lambda d: d["iceberg"]["catalog"].update(password=credentials.wrong["catalog"]))
    with pytest.raises(CatalogError, match="rejected") as raised:
        load_catalog(catalog_settings(parse_config(document, base_dir=run.config_path.parent)))
    return raised.value


def _wrong_catalog_token(run: SecuredRun, credentials: Credentials) -> BaseException:
    def change(document: dict[str, Any]) -> None:
        catalog = document["iceberg"]["catalog"]
        del catalog["username"], catalog["password"]
        catalog["token"] = credentials.wrong["token"]

    settings = catalog_settings(parse_config(with_changes(run.document, change), base_dir=run.config_path.parent))
    with pytest.raises(CatalogError) as raised:
        open_table(load_catalog(settings), run.world.table_name)
    return raised.value


def _wrong_etcd_password(run: SecuredRun, credentials: Credentials) -> BaseException:
    with pytest.raises(EtcdAuthError) as raised:
        EtcdClient([run.world.etcd_endpoint], username=ETCD_USER, password=credentials.wrong["etcd"],
                   retry_seconds=1).get(f"{run.world.name}/offsets/x")
    return raised.value


def _wrong_registry_credentials(run: SecuredRun, credentials: Credentials) -> BaseException:
    base_url = registry_url(run.registry, credentials.wrong["registry"])
    config = parse_config(with_changes(run.document, lambda d: d["schema"]["registry"].update(base_url=base_url)),
                          base_dir=run.config_path.parent)
    # The test registry does not check credentials: it answers 401 as a registry refusing them does.
    topic = "refused-topic"
    run.registry.answer(f"{REGISTRY_PATH}/{topic}.json", Answer(status=401, body=b"bad credentials"))
    with pytest.raises(SchemaRegistryError) as raised:
        schema_registry_client(config).get_schema(topic)
    return raised.value


def _broken_yaml(run: SecuredRun, credentials: Credentials) -> BaseException:
    # A YAML syntax error on the line of a secret: parsers quote that line in their messages.
    text = run.config_path.read_text().replace(credentials.etcd_password, f'"{credentials.etcd_password}')
    path = run.config_path.with_name("broken.yaml")
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    return raised.value


def _invalid_config(run: SecuredRun, credentials: Credentials) -> BaseException:
    def change(document: dict[str, Any]) -> None:
        document["etcd"]["pasword"] = document["etcd"].pop("password")  # a misspelled secret key
        document["iceberg"]["catalog"]["token"] = [credentials.wrong["token"]]  # a secret of the wrong type
        document["s3"]["secret_access_key"] = {"value": credentials.segments_secret}
        document["iceberg"]["catalog"]["credential"] = credentials.catalog_secret  # a conflicting second credential

    path = run.config_path.with_name("invalid.yaml")
    path.write_text(yaml.safe_dump(with_changes(run.document, change)))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert len(raised.value.problems) >= 3, raised.value.problems
    return raised.value


FAILURES = {
    "wrong segment-store S3 secret": _wrong_s3_key,
    "wrong warehouse S3 secret": _wrong_warehouse_key,
    "wrong catalog password": _wrong_catalog_password,
    "wrong catalog token": _wrong_catalog_token,
    "wrong etcd password": _wrong_etcd_password,
    "wrong registry credentials": _wrong_registry_credentials,
    "config file that is not YAML": _broken_yaml,
    "config with invalid keys": _invalid_config,
}


@pytest.mark.parametrize("failure", FAILURES)
def test_failure_messages_hold_no_secret(failure, secured_run: SecuredRun, credentials: Credentials, capfd, caplog):
    caplog.set_level("DEBUG", logger="kafscale_lakehouse")
    caplog.set_level("DEBUG", logger="pyiceberg")

    error = FAILURES[failure](secured_run, credentials)

    assert_no_secret(failure_text(error), credentials, f"the error of a {failure}")
    assert_no_secret(caplog.text + "".join(capfd.readouterr()), credentials, f"the output of a {failure}")


def test_a_failed_dagster_run_holds_no_secret(secured_run: SecuredRun, credentials: Credentials, monkeypatch,
                                              capfd, caplog):
    # The wrong password is exported as this config's secret for the run: drop the right one for this test.
    monkeypatch.setenv(f"{SECRET_ENV_PREFIX}ETCD_PASSWORD", "placeholder")
    monkeypatch.delenv(f"{SECRET_ENV_PREFIX}ETCD_PASSWORD")
    caplog.set_level("DEBUG", logger="kafscale_lakehouse")
    caplog.set_level("DEBUG", logger="dagster")
    document = with_changes(secured_run.document, lambda d: d["etcd"].update(password=credentials.wrong["etcd"]))
    config = parse_config(document, base_dir=secured_run.config_path.parent)
    instance = dg.DagsterInstance.ephemeral()

    result = run_ingest_job(config, instance, [0], raise_on_error=False)

    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "authentication failed" in failure.step_failure_data.error.to_string()
    events = "\n".join(dg.serialize_value(entry) for entry in instance.all_logs(result.run_id))
    assert_no_secret(events, credentials, "the failed run's event log")
    assert_no_secret(caplog.text + "".join(capfd.readouterr()), credentials, "the failed run's output")
