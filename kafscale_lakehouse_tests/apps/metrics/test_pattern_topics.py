"""serve-metrics with a `topic_pattern` mapping: the series of every matching topic, and of a topic that appears
while it runs once the topics are listed again (SeaweedFS S3 + Iceberg REST, etcd)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

import kafscale_lakehouse.apps.metrics as metrics
from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

pytestmark = pytest.mark.integration

WRITTEN = "kafscale_processor_records_total"


def test_pattern_topics_have_their_series_and_a_new_topic_joins_when_listed_again(
        tmp_path, seaweedfs, etcd_server, unique_prefix, monkeypatch):
    def world(kind: str) -> IngestWorld:
        return IngestWorld("production", tmp_path, unique_prefix, f"{kind}.{unique_prefix}", seaweedfs=seaweedfs,
                           etcd_endpoint=etcd_server.endpoint)

    orders, clicks = world("orders"), world("clicks")
    orders.write_segments(0, 20, records_per_segment=20)
    document = orders.config_document()
    document["mappings"] = [{"topic_pattern": rf"(orders|clicks)\.{re.escape(unique_prefix)}",
                             "table": f"{unique_prefix.replace('-', '_')}.{{topic}}"}]
    collector = LakehouseStateCollector(parse_config(document, base_dir=tmp_path))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        def written(topic: str) -> float | None:
            return registry.get_sample_value(WRITTEN, {"topic": topic, "result": "written"})

        assert written(orders.topic) == 0  # its table does not exist yet: nothing written
        clicks.write_segments(0, 20, records_per_segment=20)
        assert written(clicks.topic) is None, "the topics are listed again only after TOPICS_REFRESH_SECONDS"
        monkeypatch.setattr(metrics, "TOPICS_REFRESH_SECONDS", 0.0)
        assert written(clicks.topic) == 0 and written(orders.topic) == 0
    finally:
        collector.close()
