"""What a scrape costs the segment store: the stalled-segment listing is kept between scrapes (its ages advanced)
and listed again only in the background once older than `STALLED_REFRESH_SECONDS` (SeaweedFS S3, etcd)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

import kafscale_lakehouse.apps.metrics as metrics
from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.storage import ObjectKind
from kafscale_lakehouse.testing.servers import S3_BUCKET
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

pytestmark = pytest.mark.integration

SERIES = "kafscale_processor_stalled_segment_age_seconds"


def test_stalled_listing_is_kept_between_scrapes_and_refreshed_in_the_background(
        tmp_path, seaweedfs, etcd_server, unique_prefix, monkeypatch):
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=etcd_server.endpoint)
    world.write_segments(0, 160, records_per_segment=40)  # segments 0, 40, 80, 120; 80..119 a `.kfs` alone
    seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=world.segment_object_key(0, 80, ObjectKind.INDEX))
    collector = LakehouseStateCollector(world.config(orphan_segment_grace_seconds=0))
    registry = CollectorRegistry()
    registry.register(collector)
    store = collector._segments
    try:
        first_age = registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "0"})
        assert first_age is not None
        listed = store.request_counts

        time.sleep(0.5)
        second_age = registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "0"})
        assert store.request_counts == listed, "a scrape within the refresh interval lists nothing"
        assert second_age >= first_age + 0.5, "the kept listing's ages advance"

        # Older than the refresh interval: this scrape answers from the kept listing and lists again meanwhile.
        monkeypatch.setattr(metrics, "STALLED_REFRESH_SECONDS", 0.0)
        assert registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "0"}) is not None
        deadline = time.monotonic() + 30
        while store.request_counts == listed or collector._stalled_refreshing.is_set():
            assert time.monotonic() < deadline, "no background listing"
            time.sleep(0.1)
        assert sum((store.request_counts - listed).values()) > 0
    finally:
        collector.close()


def test_with_the_namespace_watch_the_stalled_listing_lists_the_namespace_once(
        tmp_path, seaweedfs, etcd_server, unique_prefix):
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=etcd_server.endpoint)
    world.write_segments(0, 160, records_per_segment=40)
    world.write_segments(1, 80, records_per_segment=40)
    seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=world.segment_object_key(0, 80, ObjectKind.INDEX))
    collector = LakehouseStateCollector(world.config(orphan_segment_grace_seconds=0, watch="namespace"))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        assert registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "0"}) is not None
        assert registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "1"}) is None
        assert collector._segments.request_counts["list"] == 1, "one listing of the namespace, not one per partition"
    finally:
        collector.close()
