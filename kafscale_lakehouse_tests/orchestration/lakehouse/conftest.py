"""Fixtures for the lakehouse tests: the IO manager's resources on the sqlite catalog and the SeaweedFS REST catalog."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, SparkResource
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, TABLE_BUCKET


@pytest.fixture(params=["sql", "rest"])
def config_document(request, tmp_path) -> dict:
    """A lakehouse config of the sqlite catalog or of the SeaweedFS REST catalog (its one mapping is unused)."""
    if request.param == "sql":
        iceberg = {"catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}"},
                   "warehouse": str(tmp_path / "warehouse")}
        s3 = {"bucket": "unused"}
    else:
        seaweedfs = request.getfixturevalue("seaweedfs")
        iceberg = {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "username": ACCESS_KEY,
                               "password": SECRET_KEY},
                   "warehouse": f"s3://{TABLE_BUCKET}"}
        s3 = {"bucket": S3_BUCKET, "endpoint": seaweedfs.s3_endpoint, "region": REGION, "path_style": True,
              "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    return {
        "s3": s3,
        "iceberg": iceberg,
        "offsets": {"backend": "local", "local_path": str(tmp_path / "offsets.db")},
        "mappings": [{"topic": "unused", "table": "unused.table"}],
    }


@pytest.fixture
def catalog_resource(config_document, tmp_path) -> IcebergCatalogResource:
    """The resource as definitions build it, from `config_document`."""
    return IcebergCatalogResource.of(parse_config(config_document, base_dir=tmp_path))


@pytest.fixture
def namespace(unique_prefix) -> str:
    # S3 Tables names allow lowercase letters, digits and underscores only.
    return unique_prefix.replace("-", "_")


@pytest.fixture
def resources(catalog_resource, spark) -> dict[str, object]:
    spark_resource = SparkResource(master="local[2]")
    return {
        "iceberg_io_manager": KafscaleIcebergIOManager(
            iceberg_catalog=catalog_resource, spark=spark_resource, target_file_size_bytes=1 << 20
        ),
        "iceberg_catalog": catalog_resource,
        "spark": spark_resource,
    }
