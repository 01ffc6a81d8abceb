"""Building the segment store (and the offsets store) from a processor config: `connections`."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.connections import offset_store_from_config, segment_store_from_config
from kafscale_lakehouse.storage import LocalSegmentStore, S3SegmentStore
from kafscale_lakehouse_tests.storage.conftest import write_segments
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY

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


def test_a_value_the_store_refuses_comes_back_naming_the_config_key(tmp_path):
    config = parse_config({"s3": {"bucket": "lake", "sse": {"type": "AES256"}}, "iceberg": ICEBERG, "offsets": OFFSETS},
                          base_dir=tmp_path)
    config.s3.sse.type = "aws:kms:dsse"  # a value the config would refuse, to reach the store's own check

    with pytest.raises(ConfigError, match=r"s3\.sse\.type: must be one of") as raised:
        segment_store_from_config(config)

    assert isinstance(raised.value.__cause__, ValueError)
    assert str(raised.value.__cause__).startswith("sse_type: ")  # the storage layer names its argument only


def test_offsets_settings_the_store_refuses_name_their_config_key(tmp_path):
    config = parse_config({"s3": {"bucket": "lake"}, "iceberg": ICEBERG, "offsets": OFFSETS}, base_dir=tmp_path)
    config.offsets.key_prefix = ""

    with pytest.raises(ConfigError, match=r"offsets\.key_prefix: must not be empty"):
        offset_store_from_config(config)
