"""Three mappings in one namespace on the real servers (SeaweedFS S3 and Iceberg REST, etcd), watched by the one
namespace sensor (`processor.watch: namespace`), and the `land_tables` runs it requests on a test Dagster instance."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pytest

from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.engine.ingestion import WatchSources
from kafscale_lakehouse.orchestration.land_tables import LAND_TABLES_JOB
from kafscale_lakehouse.orchestration.namespace_sensor import NamespaceCursor, build_namespace_sensor
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

POLL_INTERVAL_SECONDS = 7
WORDS = ("orders", "payments", "refunds")


@dataclass
class TopicWorld(IngestWorld):
    """One topic of the shared namespace (`name`) and its table `<name>.<word>`."""

    word: str = "orders"

    @property
    def table_name(self) -> str:
        return f"{self.name.replace('-', '_')}.{self.word}"


@dataclass
class NamespaceWorld:
    topics: dict[str, TopicWorld]  # by word
    instance: dg.DagsterInstance
    processor: dict[str, Any]

    def config(self, **processor: Any) -> LakehouseConfig:
        first = next(iter(self.topics.values()))
        document = first.config_document(**{"poll_interval_seconds": POLL_INTERVAL_SECONDS, "watch": "namespace",
                                            **self.processor, **processor})
        document["mappings"] = [world.config_document()["mappings"][0] for world in self.topics.values()]
        return parse_config(document, source="<namespace test>", base_dir=first.root)

    def sources(self, config: LakehouseConfig | None = None) -> WatchSources:
        return WatchSources.from_config(config or self.config())

    def tick(self, sources: WatchSources, cursor: str | None = None, *, at: float | None = None,
             config: LakehouseConfig | None = None) -> dg.SensorResult:
        """One evaluation of the namespace sensor (at epoch seconds `at`, default now); the dynamic partitions it
        requests are added as the daemon would."""
        clock: Callable[[], float] = time.time if at is None else (lambda: at)
        sensor = build_namespace_sensor(config or self.config(), sources=lambda: sources, clock=clock)
        result = sensor.evaluate_tick(dg.build_sensor_context(instance=self.instance, cursor=cursor))
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    def land(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        """The `land_tables` run the daemon launches for `request`, in this process."""
        job = build_definitions(self.config()).resolve_job_def(LAND_TABLES_JOB)
        return job.execute_in_process(instance=self.instance, run_config=request.run_config, tags=request.tags,
                                      raise_on_error=False)

    @staticmethod
    def cursor_of(result: dg.SensorResult) -> NamespaceCursor:
        return NamespaceCursor.from_json(result.cursor, "test")


@pytest.fixture
def namespace_world(tmp_path, seaweedfs, etcd_server, unique_prefix) -> NamespaceWorld:
    topics = {word: TopicWorld("production", tmp_path, unique_prefix, topic=f"{word}.{unique_prefix}",
                               seaweedfs=seaweedfs, etcd_endpoint=etcd_server.endpoint, word=word)
              for word in WORDS}
    with dg.instance_for_test() as instance:
        yield NamespaceWorld(topics, instance, {})
