"""`iceberg.catalog.type`: every catalog pyiceberg ships, its properties passed through, secrets masked.

rest and sql run against real servers in engine/tables/test_catalogs.py; `in-memory` runs here; glue, hive, dynamodb
and bigquery have no server on this machine, so their construction is checked against pyiceberg's own validation
(region, extras, credentials), which must fail fast, naming the catalog type, without network.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog import CatalogType
from pyiceberg.catalog.glue import GlueCatalog
from pyiceberg.catalog.hive import HiveCatalog
from pyiceberg.catalog.memory import InMemoryCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.tables.catalogs import CatalogError, CatalogSettings, load_catalog, open_table

AWS_ENVIRONMENT = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                   "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def document(catalog: dict) -> dict:
    return {"s3": {"bucket": "kafscale-data"}, "iceberg": {"catalog": catalog, "warehouse": "s3://warehouse/"},
            "etcd": {"endpoints": ["http://etcd:2379"]}, "mappings": [{"topic": "orders", "table": "prod.orders"}]}


@pytest.fixture
def no_aws_environment(monkeypatch, tmp_path):
    """No ambient AWS region or credentials: what a construction needs comes from the catalog's properties."""
    for name in AWS_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


@pytest.mark.parametrize("catalog_type", [t.value for t in CatalogType])
def test_every_catalog_type_pyiceberg_ships_is_accepted(catalog_type):
    catalog = {"type": catalog_type, "properties": {"some.property": "value"}}
    if catalog_type in ("rest", "hive", "sql"):
        catalog["uri"] = {"rest": "http://catalog:8181", "hive": "thrift://metastore:9083",
                          "sql": "postgresql+psycopg2://catalog-db/iceberg"}[catalog_type]
    config = parse_config(document(catalog))
    settings = catalog_settings(config)
    assert settings.type == catalog_type
    assert settings.catalog_properties()["some.property"] == "value"


@pytest.mark.parametrize("catalog_type", ["rest", "hive", "sql"])
def test_a_catalog_that_needs_a_uri_names_the_key_and_shows_no_secret(catalog_type):
    catalog = {"type": catalog_type, "password": "hunter2", "properties": {"client.secret": "s3cr3t"}}
    with pytest.raises(ConfigError) as caught:
        parse_config(document(catalog))
    message = str(caught.value)
    assert message.splitlines() == ["<config>: iceberg.catalog.uri: is required"]
    assert "hunter2" not in message and "s3cr3t" not in message


def test_an_unknown_catalog_type_lists_the_types():
    with pytest.raises(ConfigError) as caught:
        parse_config(document({"type": "nessie", "uri": "http://nessie:19120"}))
    assert "iceberg.catalog.type: 'nessie' is not one of rest, sql, glue, hive, dynamodb, bigquery, in-memory" in str(
        caught.value)


def test_secret_catalog_properties_are_masked_but_reach_the_catalog(monkeypatch):
    monkeypatch.setenv("GLUE_SECRET", "s3cr3t-from-env")
    catalog = {"type": "glue", "properties": {"glue.region": "eu-west-1", "glue.access-key-id": "AKIAEXAMPLE",
                                              "glue.secret-access-key": "${GLUE_SECRET}",
                                              "glue.session-token": "t0ken"}}
    config = parse_config(document(catalog))
    for shown in (repr(config), str(config), str(config.model_dump())):
        assert "s3cr3t-from-env" not in shown and "t0ken" not in shown
        assert "eu-west-1" in shown  # not a secret
    properties = catalog_settings(config).catalog_properties()
    assert properties["glue.secret-access-key"] == "s3cr3t-from-env"
    assert properties["glue.session-token"] == "t0ken"


def test_glue_catalog_is_constructed_from_its_properties(no_aws_environment):
    catalog = load_catalog(CatalogSettings(type="glue", extra_properties={
        "glue.region": "eu-west-1", "glue.access-key-id": "AKIAEXAMPLE", "glue.secret-access-key": "secret"}))
    assert isinstance(catalog, GlueCatalog)
    assert catalog.glue.meta.region_name == "eu-west-1"


def test_glue_catalog_without_a_region_fails_naming_the_catalog_type(no_aws_environment):
    with pytest.raises(CatalogError, match=r"Iceberg glue catalog at .* cannot be constructed: NoRegionError"):
        load_catalog(CatalogSettings(type="glue"))


def test_hive_catalog_is_constructed_for_its_thrift_uri():
    catalog = load_catalog(CatalogSettings(type="hive", uri="thrift://127.0.0.1:9083"))
    assert isinstance(catalog, HiveCatalog)
    assert catalog.properties["uri"] == "thrift://127.0.0.1:9083"


def test_dynamodb_catalog_names_the_endpoint_it_cannot_reach(no_aws_environment, monkeypatch):
    # Construction creates the catalog's DynamoDB table: an unreachable endpoint fails at once.
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:9")
    with pytest.raises(CatalogError, match=r"Iceberg dynamodb catalog .* cannot be constructed: "
                                           r"EndpointConnectionError: .*127\.0\.0\.1:9"):
        load_catalog(CatalogSettings(type="dynamodb", extra_properties={
            "dynamodb.region": "eu-west-1", "dynamodb.access-key-id": "a", "dynamodb.secret-access-key": "b"}))


def test_bigquery_catalog_checks_pyicebergs_settings_and_its_credentials(monkeypatch):
    properties = {"gcp.bigquery.project-id": "kafscale", "gcp.bigquery.credentials-info": '{"type": "x"}'}
    with pytest.raises(CatalogError, match=r"Iceberg bigquery catalog .* legacy-current-snapshot-id must be enabled"):
        load_catalog(CatalogSettings(type="bigquery", extra_properties=properties))
    monkeypatch.setenv("PYICEBERG_LEGACY_CURRENT_SNAPSHOT_ID", "True")
    with pytest.raises(CatalogError, match=r"Iceberg bigquery catalog .* cannot be constructed: MalformedError"):
        load_catalog(CatalogSettings(type="bigquery", extra_properties=properties))


def test_in_memory_catalog_creates_and_appends_to_a_table(tmp_path):
    catalog = load_catalog(CatalogSettings(type="in-memory", warehouse=str(tmp_path / "warehouse")))
    assert isinstance(catalog, InMemoryCatalog)
    schema = Schema(NestedField(1, "key", StringType(), required=False), NestedField(2, "offset", LongType(),
                                                                                     required=False))
    table = open_table(catalog, "demo.orders", schema=schema, create_if_missing=True)
    table.append(pa.table({"key": ["a", "b"], "offset": [0, 1]}))
    assert table.location().startswith((tmp_path / "warehouse").as_uri())
    assert sorted(open_table(catalog, "demo.orders").scan().to_arrow()["offset"].to_pylist()) == [0, 1]
