"""What a scrape costs the segment store: the stalled-segment listing is kept between scrapes (its ages advanced)
and listed again only in the background once older than `STALLED_REFRESH_SECONDS` (SeaweedFS S3, etcd)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

import kafscale_lakehouse.apps.metrics as metrics
from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.connections import offset_store_from_config
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.storage import ObjectKind
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.support.servers import S3_BUCKET

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


def test_the_stalled_listing_does_not_grow_with_the_segments_the_namespace_keeps(
        tmp_path, seaweedfs, etcd_server, unique_prefix):
    """With either watch, each partition is listed from its committed next offset, and a partition whose broker
    watermark is there is not listed at all: with the namespace watch it was a listing of the whole namespace, every
    object retention keeps (~7M a day at 200 topics and a segment per 10 s) on every refresh."""
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=etcd_server.endpoint)
    world.write_segments(0, 160, records_per_segment=40)  # segments 0, 40, 80, 120; 80..119 a `.kfs` alone
    seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=world.segment_object_key(0, 80, ObjectKind.INDEX))
    world.write_segments(1, 300, records_per_segment=1)  # 600 objects of landed history
    config = world.config(orphan_segment_grace_seconds=0, watch="namespace")
    with EtcdClient([etcd_server.endpoint]) as etcd, offset_store_from_config(config, etcd) as offsets:
        with offsets.acquire_lease(world.topic, 1, "test") as lease:
            offsets.commit_offsets([lease], {1: (300, 0)})
        etcd.put(broker_next_offset_key(world.topic, 1), "300")  # the broker has nothing beyond: settled
    collector = LakehouseStateCollector(config)
    listed_keys: list[str] = []
    store = collector._segments
    list_page = store._list_page

    def counted_list_page(prefix, **kwargs):
        page = list_page(prefix, **kwargs)
        listed_keys.extend(info.key for info in page.objects)
        return page

    store._list_page = counted_list_page
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        assert registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "0"}) is not None
        assert registry.get_sample_value(SERIES, {"topic": world.topic, "partition": "1"}) is None
        assert not [key for key in listed_keys if "/1/" in key], "the settled partition's history was listed"
        assert len(listed_keys) <= 8, listed_keys  # partition 0 from its start: 4 segments, an orphan (1200+ before)
    finally:
        collector.close()
