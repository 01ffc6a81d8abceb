"""Catalogs (rest on SeaweedFS, embedded sql on sqlite) and table creation."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from pyiceberg.transforms import BucketTransform, IdentityTransform

from kafscale_lakehouse.engine.tables.catalogs import (
    CatalogAuthenticationError,
    CatalogSettings,
    CatalogUnavailableError,
    PartitionFieldSpec,
    TableDefinitionError,
    TableNotFoundError,
    catalog_endpoint,
    load_catalog,
    open_table,
)
from kafscale_lakehouse.redaction import redact_url
from kafscale_lakehouse_tests.engine.tables.helpers import BASE_COLUMNS, MAPPED_COLUMNS, lakehouse_schema, rest_settings
from kafscale_lakehouse_tests.support.servers import free_ports

pytestmark = pytest.mark.integration


def test_created_table_has_base_then_mapped_ids_parquet_spec_and_properties(catalog, namespace):
    identifier = f"{namespace}.orders"
    table = open_table(
        catalog, identifier, schema=lakehouse_schema(), create_if_missing=True,
        partition_fields=(PartitionFieldSpec("partition"), PartitionFieldSpec("customer", "bucket[4]")),
        properties={"write.parquet.compression-codec": "zstd", "owner": "data-platform"},
    )

    ids = {field.name: field.field_id for field in table.schema().fields}
    assert ids == {name: i for i, name in enumerate(BASE_COLUMNS + MAPPED_COLUMNS, start=1)}
    assert [f.name for f in table.schema().fields if f.required] == BASE_COLUMNS[:5]
    assert table.properties["write.format.default"] == "parquet"
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    assert table.properties["owner"] == "data-platform"
    spec = table.spec()
    assert [(f.source_id, f.transform, f.name) for f in spec.fields] == [
        (3, IdentityTransform(), "partition"), (10, BucketTransform(4), "customer_bucket_4"),
    ]
    # Opening again loads the same table (no re-creation) even without create_if_missing.
    again = open_table(catalog, identifier)
    assert again.metadata.table_uuid == table.metadata.table_uuid


def test_missing_table_without_create_names_table_and_catalog(catalog, namespace):
    catalog.create_namespace_if_not_exists(namespace)
    for identifier in (f"{namespace}.absent", f"{namespace}_nons.absent"):
        with pytest.raises(TableNotFoundError) as raised:
            open_table(catalog, identifier, schema=lakehouse_schema())
        assert identifier in str(raised.value)
        assert catalog_endpoint(catalog) in str(raised.value)
        assert "create_table_if_missing" in str(raised.value)
    assert catalog.list_tables(namespace) == []


def test_table_definition_errors_name_the_column(sql_catalog):
    with pytest.raises(TableDefinitionError, match="'amount' of type double"):
        open_table(sql_catalog, "ns.bad_transform", schema=lakehouse_schema(), create_if_missing=True,
                   partition_fields=(PartitionFieldSpec("amount", "day"),))
    with pytest.raises(TableDefinitionError, match="'nope' is not in the schema"):
        open_table(sql_catalog, "ns.bad_column", schema=lakehouse_schema(), create_if_missing=True,
                   partition_fields=(PartitionFieldSpec("nope"),))
    with pytest.raises(TableDefinitionError, match=r"write\.format\.default='orc'"):
        open_table(sql_catalog, "ns.orc", schema=lakehouse_schema(), create_if_missing=True,
                   properties={"write.format.default": "orc"})
    with pytest.raises(TableDefinitionError, match="needs a namespace"):
        open_table(sql_catalog, "no_namespace", schema=lakehouse_schema(), create_if_missing=True)
    assert sql_catalog.list_namespaces() == []


def test_sql_catalog_defaults_to_sqlite_inside_a_local_warehouse(tmp_path):
    warehouse = tmp_path / "lake"
    catalog = load_catalog(CatalogSettings(type="sql", warehouse=str(warehouse)))
    table = open_table(catalog, "demo.pizzas", schema=lakehouse_schema(), create_if_missing=True)
    assert (warehouse / "catalog.db").is_file()
    assert table.location() == f"{warehouse.as_uri()}/demo/pizzas"


def test_rest_catalog_with_credential_lists_created_namespace(rest_catalog, namespace):
    rest_catalog.create_namespace_if_not_exists(namespace)
    assert (namespace,) in rest_catalog.list_namespaces()


def test_rest_wrong_credential_is_a_clear_error_without_the_secret(seaweedfs):
    wrong_secret = "not-the-secret-4711"
    with pytest.raises(CatalogAuthenticationError) as raised:
        load_catalog(rest_settings(seaweedfs, password=wrong_secret))
    message = str(raised.value)
    assert seaweedfs.rest_uri in message
    assert "the configured credential (username/password)" in message
    assert wrong_secret not in message and wrong_secret not in repr(raised.value.__cause__)


def test_rest_without_credentials_is_refused(seaweedfs):
    catalog = load_catalog(rest_settings(seaweedfs, username=None, password=None))
    with pytest.raises(CatalogAuthenticationError, match=f"catalog at {seaweedfs.rest_uri} rejected"):
        open_table(catalog, "anyns.anytable")


def test_unreachable_rest_catalog_names_the_uri():
    (port,) = free_ports(1)
    uri = f"http://127.0.0.1:{port}"
    with pytest.raises(CatalogUnavailableError, match=f"catalog at {uri} is unreachable"):
        load_catalog(CatalogSettings(type="rest", uri=uri, username="u", password="p"))


def test_settings_repr_and_uri_redaction_hide_secrets():
    settings = CatalogSettings(type="rest", uri="http://h", username="u", password="pw-secret", token="tok-secret",
                               s3_secret_access_key="s3-secret")
    assert "secret" not in repr(settings)
    assert settings.catalog_properties()["credential"] == "u:pw-secret"
    assert redact_url("postgresql://user:pw-secret@db:5432/iceberg") == "postgresql://***@db:5432/iceberg"
    assert redact_url("https://api-token@registry.example/schemas") == "https://***@registry.example/schemas"
    with pytest.raises(ValueError, match="type: must be one of"):  # pyiceberg's types only (hive is one)
        load_catalog(CatalogSettings(type="nessie", uri="http://h"))


def test_a_rest_catalog_used_by_many_threads_keeps_its_connections(seaweedfs, namespace, caplog):
    """The namespace watch loads tables on 32 threads: with requests' default pool of 10 connections each load over it
    opened a connection and threw it away, with a warning per connection ("Connection pool is full")."""
    catalog = load_catalog(rest_settings(seaweedfs))
    catalog.create_namespace_if_not_exists(namespace)
    identifiers = [f"{namespace}.t{number}" for number in range(4)]
    for identifier in identifiers:
        open_table(catalog, identifier, schema=lakehouse_schema(), create_if_missing=True)
    start = threading.Barrier(32)

    def load(number: int) -> str:
        start.wait()
        return ".".join(catalog.load_table(identifiers[number % len(identifiers)]).name())

    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"), ThreadPoolExecutor(32) as pool:
        for _ in range(3):
            assert sorted(set(pool.map(load, range(32)))) == identifiers
            start.reset()
    assert not [r.getMessage() for r in caplog.records if "Connection pool is full" in r.getMessage()]


def test_a_created_table_is_laid_out_where_the_go_processor_creates_it(catalog, namespace):
    """`<warehouse>/<namespace>/<table>`, with `write.data.path` and `write.metadata.path` set to its `data` and
    `metadata` directories, as the Go processor creates a table (sink/iceberg.go createTable), so a table created
    by either engine is laid out the same."""
    table = open_table(catalog, f"{namespace}.orders", schema=lakehouse_schema(), create_if_missing=True)

    location = f"{catalog.properties['warehouse'].rstrip('/')}/{namespace}/orders"
    assert table.location() == location
    assert (table.properties["write.data.path"], table.properties["write.metadata.path"]) == (
        f"{location}/data", f"{location}/metadata")
    assert table.metadata_location.startswith(f"{location}/metadata/")
