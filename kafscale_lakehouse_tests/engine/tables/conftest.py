"""Fixtures for the Iceberg side of the engine: both catalogs and fresh tables with the base columns."""

from __future__ import annotations

import pytest
from pyiceberg.table import Table

from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, PartitionFieldSpec, load_catalog, open_table
from kafscale_lakehouse_tests.engine.tables.helpers import lakehouse_schema, rest_settings


@pytest.fixture(scope="session")
def rest_catalog(seaweedfs):
    return load_catalog(rest_settings(seaweedfs))


@pytest.fixture
def sql_catalog(tmp_path):
    return load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))


@pytest.fixture(params=["sql", "rest"])
def catalog(request):
    return request.getfixturevalue(f"{request.param}_catalog")


@pytest.fixture
def namespace(unique_prefix) -> str:
    # S3 Tables names allow lowercase letters, digits and underscores only.
    return unique_prefix.replace("-", "_")


@pytest.fixture
def make_table(catalog, namespace):
    """Create a fresh table in the parametrized catalog."""
    counter = iter(range(1000))

    def make(partition_fields: tuple[PartitionFieldSpec, ...] = (), properties: dict | None = None) -> Table:
        return open_table(
            catalog, f"{namespace}.events_{next(counter)}", schema=lakehouse_schema(), create_if_missing=True,
            partition_fields=partition_fields, properties=properties,
        )

    return make
