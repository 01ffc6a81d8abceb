"""Building the segment store from a processor config."""

from __future__ import annotations

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import segment_store_from_config
from kafscale_lakehouse.storage import LocalSegmentStore, S3SegmentStore
from kafscale_lakehouse_tests.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY
from kafscale_lakehouse_tests.storage.conftest import write_segments

ICEBERG = {"catalog": {"type": "rest", "uri": "http://127.0.0.1:1"}, "warehouse": "s3://warehouse"}
OFFSETS = {"backend": "local", "local_path": "offsets.db"}


def test_s3_config_gives_a_working_s3_store(seaweedfs, unique_prefix, tmp_path):
    config = parse_config({
        "s3": {"bucket": S3_BUCKET, "namespace": unique_prefix, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": ICEBERG, "offsets": OFFSETS,
    }, base_dir=tmp_path)
    store = segment_store_from_config(config)
    assert isinstance(store, S3SegmentStore) and store.namespace == unique_prefix
    write_segments(store, "orders", 0, [0])
    assert [s.base_offset for s in store.list_segments("orders", 0).segments] == [0]


def test_local_root_wins_and_keeps_the_namespace(tmp_path):
    config = parse_config({"s3": {"namespace": ""}, "segments": {"local_root": str(tmp_path)}, "iceberg": ICEBERG,
                           "offsets": OFFSETS},
                          base_dir=tmp_path)
    store = segment_store_from_config(config)
    assert isinstance(store, LocalSegmentStore) and store.root == tmp_path.resolve() and store.namespace == ""
    write_segments(store, "orders", 1, [5])
    assert (tmp_path / "orders" / "1" / "segment-00000000000000000005.kfs").is_file()
