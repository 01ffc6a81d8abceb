"""Fixtures for the lakehouse tests: the IO manager's resources on the sqlite catalog and the SeaweedFS REST catalog."""

from __future__ import annotations

import dataclasses

import pytest

from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, SparkResource
from kafscale_lakehouse_tests.engine_sink.helpers import rest_settings


@pytest.fixture(params=["sql", "rest"])
def catalog_resource(request, tmp_path) -> IcebergCatalogResource:
    if request.param == "sql":
        return IcebergCatalogResource(type="sql", warehouse=str(tmp_path / "warehouse"),
                                      uri=f"sqlite:///{tmp_path / 'catalog.db'}")
    settings = rest_settings(request.getfixturevalue("seaweedfs"))
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
              if f.name in IcebergCatalogResource.model_fields and getattr(settings, f.name) is not None}
    return IcebergCatalogResource(**fields)


@pytest.fixture
def namespace(unique_prefix) -> str:
    # S3 Tables names allow lowercase letters, digits and underscores only.
    return unique_prefix.replace("-", "_")


@pytest.fixture
def resources(catalog_resource, spark) -> dict[str, object]:
    spark_resource = SparkResource(master="local[2]")
    return {"iceberg_io_manager": KafscaleIcebergIOManager(iceberg_catalog=catalog_resource, spark=spark_resource,
                                                           target_file_size_bytes=1 << 20),
            "iceberg_catalog": catalog_resource, "spark": spark_resource}
