"""`s3.sse` / `iceberg.s3.sse` reach every object we write: segments (our S3 store), the table's and the dead-letter
table's data files and manifests (pyiceberg's FileIO, on the driver and in Spark tasks), and the metadata files an
embedded `sql` catalog writes. SeaweedFS honours SSE-S3, so AES256 is checked on the stored objects (`head_object`);
SSE-KMS needs a KMS SeaweedFS does not have here, so `aws:kms` is checked on what is sent.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pytest
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings, segment_store_from_config
from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, load_catalog, open_table
from kafscale_lakehouse.engine.tables.data_files import file_io_properties
from kafscale_lakehouse.engine.tables.file_io import TABLES_FILE_IO
from kafscale_lakehouse.storage import S3SegmentStore
from kafscale_lakehouse_tests.security.conftest import SecuredRun
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, SeaweedFS

pytestmark = pytest.mark.integration

KMS_KEY_ID = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def objects_under(seaweedfs: SeaweedFS, location: str) -> dict[str, str | None]:
    """Key -> `ServerSideEncryption` from `head_object`, for every object under an `s3://bucket/prefix` location."""
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    client = seaweedfs.s3_client()
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", []) if not o["Key"].endswith("/")]  # SeaweedFS lists directories
    return {key: client.head_object(Bucket=bucket, Key=key).get("ServerSideEncryption") for key in keys}


def test_segments_data_files_and_manifests_of_a_run_are_stored_encrypted(secured_run: SecuredRun):
    seaweedfs = secured_run.world.seaweedfs
    segments = objects_under(seaweedfs, f"s3://{S3_BUCKET}/{secured_run.world.name}/")
    assert len(segments) == 4 and set(segments.values()) == {"AES256"}, segments  # 2 x (.kfs, .index)

    catalog = load_catalog(catalog_settings(secured_run.config))
    for identifier in (secured_run.world.table_name, secured_run.dead_letter_table):
        location = open_table(catalog, identifier).location()
        objects = objects_under(seaweedfs, location)
        data_files = {k: v for k, v in objects.items() if "/data/" in k}
        manifests = {k: v for k, v in objects.items() if k.endswith(".avro")}  # manifest lists and manifests
        assert data_files and set(data_files.values()) == {"AES256"}, (identifier, data_files)
        assert manifests and set(manifests.values()) == {"AES256"}, (identifier, manifests)
        # The `*.metadata.json` files are written by the REST catalog server, with its own settings: not checked.


def test_an_embedded_catalog_on_s3_writes_metadata_and_data_files_encrypted(seaweedfs, unique_prefix):
    # The sql catalog writes its metadata files itself, through the FileIO (a REST catalog server writes its own).
    settings = CatalogSettings(
        type="sql", uri="sqlite:///:memory:", warehouse=f"s3://{S3_BUCKET}/{unique_prefix}",
        s3_endpoint=seaweedfs.s3_endpoint, s3_region=REGION, s3_path_style=True, s3_access_key_id=ACCESS_KEY,
        s3_secret_access_key=SECRET_KEY, s3_sse_type="AES256")
    schema = Schema(NestedField(1, "n", LongType(), required=False))
    table = open_table(load_catalog(settings), "sse.numbers", schema=schema, create_if_missing=True)
    table.append(pa.table({"n": pa.array([1, 2, 3], pa.int64())}))

    objects = objects_under(seaweedfs, table.location())
    kinds = {"metadata.json": [k for k in objects if k.endswith(".metadata.json")],
             "manifest": [k for k in objects if k.endswith(".avro")],
             "data": [k for k in objects if k.endswith(".parquet")]}
    assert all(kinds.values()), kinds
    assert set(objects.values()) == {"AES256"}, objects
    assert table.scan().to_arrow()["n"].to_pylist() == [1, 2, 3]  # and it reads back


def test_without_sse_the_pyarrow_file_io_is_kept_and_nothing_is_requested():
    properties = CatalogSettings(type="rest", uri="http://catalog", s3_endpoint="http://s3:9000").catalog_properties()
    assert not any(key.startswith(("s3.server-side-encryption", "s3.sse")) for key in properties)
    assert properties["py-io-impl"] == TABLES_FILE_IO  # pyiceberg's PyArrow FileIO, a small file one PUT


def test_kms_settings_become_file_io_properties_that_s3fs_sends_with_every_write(tmp_path):
    config = parse_config({
        "s3": {"bucket": "segments", "sse": {"type": "aws:kms", "kms_key_id": KMS_KEY_ID}},
        "iceberg": {"catalog": {"type": "rest", "uri": "http://catalog:8181"}, "warehouse": "s3://warehouse"},
        "offsets": {"backend": "local", "local_path": "offsets.db"},
    }, base_dir=tmp_path)

    properties = catalog_settings(config).catalog_properties()

    assert properties["s3.server-side-encryption"] == "aws:kms"
    assert properties["s3.sse-kms-key-id"] == KMS_KEY_ID
    assert properties["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"
    # What the executors get (file_io_properties keeps s3.* and py-io-impl) builds an s3fs that adds them to writes.
    file_system = FsspecFileIO(properties).get_fs("s3")
    assert file_system.s3_additional_kwargs == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": KMS_KEY_ID}


def test_the_executors_file_io_properties_carry_sse(secured_run: SecuredRun):
    table = open_table(load_catalog(catalog_settings(secured_run.config)), secured_run.world.table_name)
    properties = file_io_properties(table)
    assert properties["s3.server-side-encryption"] == "AES256"
    assert properties["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"


class _CapturingS3(ThreadingHTTPServer):
    """Answers every PUT as S3 does and keeps the server-side encryption headers of each."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                server.sent.append({k.lower(): v for k, v in self.headers.items()
                                    if k.lower().startswith("x-amz-server-side")})
                self.send_response(200)
                self.send_header("ETag", '"0"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_the_segment_store_sends_kms_parameters_with_every_put(tmp_path):
    with _CapturingS3() as s3:
        threading.Thread(target=s3.serve_forever, daemon=True).start()
        try:
            config = parse_config({
                "s3": {"bucket": S3_BUCKET, "endpoint": f"http://127.0.0.1:{s3.server_address[1]}", "region": REGION,
                       "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                       "sse": {"type": "aws:kms", "kms_key_id": KMS_KEY_ID}},
                "iceberg": {"catalog": {"type": "rest", "uri": "http://catalog:8181"}, "warehouse": "s3://warehouse"},
                "offsets": {"backend": "local", "local_path": "offsets.db"},
            }, base_dir=tmp_path)
            store = segment_store_from_config(config)
            assert isinstance(store, S3SegmentStore)
            store.put(f"{tmp_path.name}/a", b"data")
            store.put(f"{tmp_path.name}/b", b"more data")
        finally:
            s3.shutdown()
    assert s3.sent == 2 * [{"x-amz-server-side-encryption": "aws:kms",
                            "x-amz-server-side-encryption-aws-kms-key-id": KMS_KEY_ID}]


@pytest.mark.parametrize(("sse_type", "kms_key_id", "message"), [
    ("aws:kms:dsse", None, "must be one of"),
    ("AES256", KMS_KEY_ID, "only used with"),
])
def test_bad_sse_settings_are_refused_by_the_store_and_the_catalog_settings(sse_type, kms_key_id, message):
    with pytest.raises(ValueError, match=message):
        S3SegmentStore("bucket", sse_type=sse_type, sse_kms_key_id=kms_key_id)
    with pytest.raises(ValueError, match=message):
        CatalogSettings(type="rest", uri="http://catalog", s3_sse_type=sse_type, s3_sse_kms_key_id=kms_key_id)
