"""`kafscale_processor_stalled_segment_age_seconds`: a partition waiting behind an orphaned segment object (the broker
uploads `.kfs` and `.index` in parallel; a failed upload leaves one) past `processor.orphan_segment_grace_seconds`;
and, from the same listing, `retention_headroom_seconds` and `replay_window_seconds`."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.storage import ObjectKind
from kafscale_lakehouse.storage.retention import topic_config_key
from kafscale_lakehouse_tests.apps.metrics.conftest import running_metrics_server, scrape
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.storage.test_retention import topic_config
from kafscale_lakehouse_tests.support.servers import S3_BUCKET

pytestmark = pytest.mark.integration

SERIES = "kafscale_processor_stalled_segment_age_seconds"


def test_a_partition_stalled_past_the_grace_has_the_age_of_its_orphan(tmp_path, seaweedfs, etcd_server,
                                                                         unique_prefix):
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=etcd_server.endpoint)
    world.write_segments(0, 160, records_per_segment=40)  # segments 0, 40, 80, 120
    world.write_segments(1, 40, records_per_segment=40)
    orphan_index = world.segment_object_key(0, 80, ObjectKind.INDEX)
    seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=orphan_index)  # offsets 80..119: a .kfs alone

    with running_metrics_server(world.config()) as server:  # the default grace: its upload may still complete
        assert scrape(server.url).get(SERIES, {}) == {}
    with running_metrics_server(world.config(orphan_segment_grace_seconds=0)) as server:
        samples = scrape(server.url)
    [(labels, age)] = samples[SERIES].items()
    assert dict(labels) == {"topic": world.topic, "partition": "0"} and 0 <= age < 600
    assert samples["kafscale_processor_errors_total"] == {(("stage", "checkpoint"),): 0, (("stage", "sink"),): 0}


def test_retention_headroom_and_replay_window_of_partitions_with_records_not_landed(tmp_path, seaweedfs, etcd_server,
                                                                                    unique_prefix):
    world = IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                        etcd_endpoint=etcd_server.endpoint)
    world.write_segments(0, 80, records_per_segment=40)
    with EtcdClient([etcd_server.endpoint]) as etcd:  # as the broker stores `retention.ms` set by AlterConfigs
        etcd.put(topic_config_key(world.topic), topic_config(world.topic, retention_ms=3_600_000))
    with running_metrics_server(world.config()) as server:
        samples = scrape(server.url)
    labels = (("partition", "0"), ("topic", world.topic))
    assert 3000 < samples["kafscale_processor_retention_headroom_seconds"][labels] <= 3600
    assert 0 <= samples["kafscale_processor_replay_window_seconds"][labels] < 600
