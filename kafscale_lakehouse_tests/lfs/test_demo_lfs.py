"""`make demo`'s LFS path: `demo-producer --lfs` writes envelopes + blobs beside the local segment directory, and the
embedded default (lakehouse.yaml) resolves them into full orders with their photo and the lfs_* columns."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from kafscale_lakehouse.apps.demo_producer import LFS_EVERY, LOCAL_LFS_BUCKET, run_demo_producer
from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.connections import catalog_settings, segment_store_from_config
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest_mapping
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import decode_segment
from kafscale_lakehouse.format.lfs import is_lfs_envelope, parse_envelope

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDS = 20


def test_demo_producer_lfs_orders_land_resolved_with_their_photo(tmp_path, spark):
    config_path = tmp_path / "lakehouse.yaml"
    shutil.copy(REPO_ROOT / "lakehouse.yaml", config_path)
    config = load_config(config_path)
    assert config.mappings[0].lfs.mode == "resolve"

    run_demo_producer(config, partitions=1, interval_seconds=0.01, records_per_segment=RECORDS, rounds=1, lfs=True)

    store = segment_store_from_config(config)
    [segment] = store.list_segments(config.mappings[0].topic, 0).segments
    values = decode_segment(store.read(segment.kfs_key), key=segment.kfs_key, topic=segment.topic,
                            partition=0).records.column("value").to_pylist()
    envelopes = {offset for offset, value in enumerate(values) if is_lfs_envelope(value)}
    assert envelopes == set(range(0, RECORDS, LFS_EVERY))
    first = parse_envelope(values[0])
    assert first.bucket == LOCAL_LFS_BUCKET
    assert (config.segments.local_root / LOCAL_LFS_BUCKET / first.key).is_file()

    ingest_mapping(IngestContext.from_config(config, spark), config.mappings[0])

    table = open_table(load_catalog(catalog_settings(config)), config.mappings[0].table)
    rows = {r["offset"]: r for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == list(range(RECORDS))
    for offset, row in rows.items():
        order = json.loads(row["value"])
        assert row["order_id"] == order["order_id"]
        if offset in envelopes:
            assert base64.b64decode(order["photo"]).startswith(b"\x89PNG\r\n\x1a\n")
            assert (row["lfs_bucket"], row["lfs_content_type"]) == (LOCAL_LFS_BUCKET, "application/json")
            assert row["lfs_blob_size"] == len(row["value"])
        else:
            assert "photo" not in order and row["lfs_key"] is None
