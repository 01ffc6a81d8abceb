"""A catalog that refuses connections or never answers: readiness names it within the time budget, /metrics still
answers and counts the failure (the offsets come from the local store, so no server is needed)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

TIMEOUT_SECONDS = 1.0


@pytest.fixture
def silent_catalog() -> Iterator[str]:
    """A URI whose TCP port accepts connections (the kernel's backlog) but never answers, like a hung server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    # Closing the listener resets the waiting connections, so the blocked request threads end.


@pytest.fixture
def refusing_catalog() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: connections are refused


def collector_for(tmp_path, unique_prefix, catalog_uri: str) -> LakehouseStateCollector:
    world = IngestWorld("embedded", tmp_path, unique_prefix, f"orders-{unique_prefix}")
    document = world.config_document()
    document["iceberg"] = {"catalog": {"type": "rest", "uri": catalog_uri}, "warehouse": "s3://warehouse"}
    return LakehouseStateCollector(world.config(document), source_timeout_seconds=TIMEOUT_SECONDS)


def test_a_catalog_that_never_answers_fails_readiness_and_scrapes_within_the_time_budget(tmp_path, unique_prefix,
                                                                                       silent_catalog):
    collector = collector_for(tmp_path, unique_prefix, silent_catalog)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        started = time.monotonic()
        problems = collector.readiness_problems()
        # The hung request still holds the catalog's slot: the scrape does not start a second one.
        errors = registry.get_sample_value("kafscale_processor_errors_total", {"stage": "sink"})
        elapsed = time.monotonic() - started
    finally:
        collector.close()

    assert problems == {"catalog": f"SourceTimeoutError: Iceberg catalog at {silent_catalog} did not answer within "
                                   f"{TIMEOUT_SECONDS:g}s"}
    assert errors == 1
    assert registry.get_sample_value("kafscale_processor_errors_total", {"stage": "checkpoint"}) == 0
    assert elapsed < 4 * TIMEOUT_SECONDS


def test_a_refused_catalog_is_named_with_its_endpoint(tmp_path, unique_prefix, refusing_catalog):
    collector = collector_for(tmp_path, unique_prefix, refusing_catalog)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        problems = collector.readiness_problems()
        errors = registry.get_sample_value("kafscale_processor_errors_total", {"stage": "sink"})
    finally:
        collector.close()

    assert problems == {"catalog": f"CatalogUnavailableError: Iceberg catalog at {refusing_catalog} is unreachable "
                                   "(ConnectionError)"}
    assert errors == 1
    assert registry.get_sample_value("kafscale_processor_records_total",
                                     {"topic": f"orders-{unique_prefix}", "result": "written"}) is None
