"""A sensor world per test: a config, the demo producer writing its segments, and sensor ticks on a test instance.

`embedded` keeps segments in a local directory and offsets/watermarks in sqlite; `production` keeps segments in the
SeaweedFS bucket and offsets/watermarks in etcd. Names (namespace, topic, key prefix) are unique per test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from kafscale_lakehouse.apps.demo_producer import DemoProducer, watermark_publisher
from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.engine.ingestion.topic_scan import WatchSources
from kafscale_lakehouse.orchestration.naming import partitions_def_name
from kafscale_lakehouse.orchestration.sensors import SensorCursor, build_sensors
from kafscale_lakehouse_tests.support.leases import held_leases
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, TABLE_BUCKET

POLL_INTERVAL_SECONDS = 7


@dataclass
class SensorWorld:
    config: LakehouseConfig
    sources: WatchSources
    instance: dg.DagsterInstance

    @property
    def mapping(self):
        return self.config.mappings[0]

    @property
    def topic(self) -> str:
        return self.mapping.topic

    def sensor(self, clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
        [sensor] = build_sensors(self.config, sources=lambda: self.sources, clock=clock)
        return sensor

    def producer(self, partitions: int, records_per_segment: int = 20) -> DemoProducer:
        return DemoProducer(self.sources.store, watermark_publisher(self.config, self.sources.etcd), topic=self.topic,
                            partitions=partitions, records_per_segment=records_per_segment)

    def tick(self, cursor: str | None = None, *, apply: bool = True, at: float | None = None):
        """One evaluation (at epoch seconds `at`, default now); with `apply`, the dynamic partitions it requests are
        added as the daemon would."""
        sensor = self.sensor(time.time if at is None else lambda: at)
        result = sensor.evaluate_tick(dg.build_sensor_context(instance=self.instance, cursor=cursor))
        if apply:
            for request in result.dynamic_partitions_requests or []:
                self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    def registered_partitions(self) -> list[str]:
        return list(self.instance.get_dynamic_partitions(partitions_def_name(self.topic)))

    def commit(self, offsets: dict[int, int]) -> None:
        """Commit `{partition: last offset}` the way an ingest run does (fenced by leases)."""
        with held_leases(self.sources.offsets, self.topic, offsets, "sensor-test") as leases:
            self.sources.offsets.commit_offsets(leases.values(), {p: (o + 1, 0) for p, o in offsets.items()})

    @staticmethod
    def cursor_of(result) -> SensorCursor:
        return SensorCursor.from_json(result.cursor, "test")


def _mapping(name: str) -> dict[str, Any]:
    return {"topic": f"pizzas-{name}", "table": f"{name.replace('-', '_')}.pizzas", "create_table_if_missing": True}


def embedded_document(root: Path, name: str) -> dict[str, Any]:
    (root / "segments").mkdir(parents=True, exist_ok=True)
    return {
        "segments": {"local_root": str(root / "segments")},
        "s3": {"namespace": name},
        "iceberg": {"catalog": {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}"},
                    "warehouse": str(root / "warehouse")},
        "offsets": {"backend": "local", "local_path": str(root / "offsets.db"), "key_prefix": name},
        "discovery": {"mode": "s3"},
        "processor": {"poll_interval_seconds": POLL_INTERVAL_SECONDS},
        "mappings": [_mapping(name)],
    }


def production_document(seaweedfs, etcd_endpoint: str, name: str) -> dict[str, Any]:
    return {
        "s3": {"bucket": S3_BUCKET, "namespace": name, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "username": ACCESS_KEY,
                                "password": SECRET_KEY},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": name},
        "discovery": {"mode": "s3"},
        "etcd": {"endpoints": [f"http://{etcd_endpoint}"]},
        "processor": {"poll_interval_seconds": POLL_INTERVAL_SECONDS},
        "mappings": [_mapping(name)],
    }


@pytest.fixture
def dagster_instance():
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def embedded_world(tmp_path, unique_prefix, dagster_instance) -> SensorWorld:
    config = parse_config(embedded_document(tmp_path, unique_prefix), source="<embedded sensor test>",
                          base_dir=tmp_path)
    return SensorWorld(config, WatchSources.from_config(config), dagster_instance)


@pytest.fixture
def production_world(tmp_path, unique_prefix, seaweedfs, etcd_server, dagster_instance) -> SensorWorld:
    config = parse_config(production_document(seaweedfs, etcd_server.endpoint, unique_prefix),
                          source="<production sensor test>", base_dir=tmp_path)
    sources = WatchSources.from_config(config)
    yield SensorWorld(config, sources, dagster_instance)
    sources.etcd.close()
