"""serve-metrics against the real servers: the Go processor's series with the values of a real ingest run, and
health/readiness when etcd is down."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import socket
import subprocess
import time

import pytest

from kafscale_lakehouse.apps.metrics import WRITE_LATENCY_BUCKETS_MS
from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.summary import WRITE_LATENCY_PROPERTY
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse_tests.apps.metrics.conftest import (
    http_get,
    parse_samples,
    running_metrics_server,
    scrape,
    value,
)
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.ingestion.harness import CLI, IngestWorld

pytestmark = pytest.mark.integration

PARTITION_0_RECORDS = 200
PARTITION_1_RECORDS = 20
INVALID_POSITION = 7  # in partition 1: a value without the required order_id goes to the dead-letter table
BROKER_NEXT = {0: 230, 1: 20, 2: 15}  # partition 2: the broker has records, nothing is ingested yet


@pytest.fixture
def world(tmp_path, seaweedfs, etcd_server, unique_prefix) -> IngestWorld:
    return IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                       etcd_endpoint=etcd_server.endpoint)


def config_document(world: IngestWorld) -> dict:
    document = world.config_document()
    document["mappings"][0]["dead_letter_table"] = f"{world.table_name}_dead_letters"
    return document


def etcd_offset_record(world: IngestWorld, partition: int) -> dict:
    with EtcdClient([world.etcd_endpoint]) as client:
        return json.loads(client.get(f"{world.name}/offsets/{world.topic}/{partition}"))


def test_metrics_carry_the_go_processor_series_with_the_values_of_an_ingest_run(world, spark):
    world.write_segments(0, PARTITION_0_RECORDS, records_per_segment=50)
    records = pizza_orders(0, PARTITION_1_RECORDS, partition=1)
    records[INVALID_POSITION] = Record(key=None, value=b'{"store_id": 5}', timestamp_ms=records[0].timestamp_ms)
    # The last record is older than the others: Go's watermark timestamp is the last record's, not the newest one.
    records[-1] = dataclasses.replace(records[-1], timestamp_ms=records[0].timestamp_ms - 60_000)
    world.write_records(1, 0, records)
    config = world.config(config_document(world))
    before_ms = time.time_ns() // 1_000_000
    [result] = ingest(config, spark)
    after_ms = time.time_ns() // 1_000_000
    assert result.invalid_count == 1 and result.snapshot_id is not None
    with EtcdClient([world.etcd_endpoint]) as client:
        for partition, next_offset in BROKER_NEXT.items():
            client.put(broker_next_offset_key(world.topic, partition), str(next_offset))
    latency_ms = int(world.table().current_snapshot().summary[WRITE_LATENCY_PROPERTY])

    with running_metrics_server(config) as server:
        samples = scrape(server.url)
        again = scrape(server.url)
        health = http_get(f"{server.url}/healthz")
        ready = http_get(f"{server.url}/readyz")

    topic = world.topic
    records_total = "kafscale_processor_records_total"
    assert value(samples, records_total, topic=topic, result="written") == PARTITION_0_RECORDS + PARTITION_1_RECORDS - 1
    assert value(samples, records_total, topic=topic, result="invalid") == 1
    assert value(samples, records_total, topic=topic, result="dropped") == 0
    assert value(samples, "kafscale_processor_batches_total", topic=topic) == 1
    rows = world.table().scan(selected_fields=("partition", "offset", "timestamp_ms")).to_arrow().to_pylist()
    last_timestamps = {p: max((r["offset"], r["timestamp_ms"]) for r in rows if r["partition"] == p)[1] for p in (0, 1)}
    assert last_timestamps[1] == records[-1].timestamp_ms
    assert last_timestamps[1] < max(r["timestamp_ms"] for r in rows if r["partition"] == 1)
    # The gauges hold what the Go processor sets after its commit; etcd what it writes (docs/kafscale-format.md §7).
    for partition, end in ((0, PARTITION_0_RECORDS), (1, PARTITION_1_RECORDS)):
        labels = {"topic": topic, "partition": str(partition)}
        stored = etcd_offset_record(world, partition)
        assert stored["offset"] == end - 1
        assert value(samples, "kafscale_processor_last_offset", **labels) == end - 1
        assert value(samples, "kafscale_processor_watermark_offset", **labels) == end - 1
        assert value(samples, "kafscale_processor_watermark_timestamp_ms", **labels) == last_timestamps[partition]
        # Go's `last_timestamp_ms` is the wall-clock time of the commit, written with `updated_at`.
        assert before_ms <= stored["last_timestamp_ms"] <= stored["updated_at"] <= after_ms
    assert value(samples, "kafscale_processor_last_offset", topic=topic, partition="2") is None
    assert dict(samples["kafscale_processor_lag"].items()) == {
        (("partition", "0"), ("topic", topic)): BROKER_NEXT[0] - PARTITION_0_RECORDS,
        (("partition", "1"), ("topic", topic)): 0,
        (("partition", "2"), ("topic", topic)): BROKER_NEXT[2],
    }
    # One observation of the run's write latency, in the first bucket that holds it.
    histogram = "kafscale_processor_write_latency_ms"
    assert value(samples, f"{histogram}_count", topic=topic) == 1
    assert value(samples, f"{histogram}_sum", topic=topic) == latency_ms
    bucket_counts = {float(dict(labels)["le"]): count for labels, count in samples[f"{histogram}_bucket"].items()}
    assert bucket_counts == {bound: (1 if latency_ms <= bound else 0)
                             for bound in (*map(float, WRITE_LATENCY_BUCKETS_MS), math.inf)}
    assert samples["kafscale_processor_errors_total"] == {(("stage", "checkpoint"),): 0, (("stage", "sink"),): 0}
    assert kafscale_series(again) == kafscale_series(samples), "a second scrape of unchanged state: same values"
    assert samples["process_resident_memory_bytes"][()] > 0  # the process series, as Go's default handler
    assert health == (200, "ok")
    assert ready == (200, "ok")


def kafscale_series(samples: dict) -> dict:
    return {name: by_labels for name, by_labels in samples.items() if name.startswith("kafscale_processor_")}


def free_port() -> int:
    """A loopback port nothing listens on (bound and closed again)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_with_etcd_down_health_stays_ok_readiness_names_etcd_and_metrics_count_the_error(world):
    document = world.config_document()
    dead_etcd = f"http://127.0.0.1:{free_port()}"
    document["etcd"]["endpoints"] = [dead_etcd]
    config_path = world.write_config_file(document)
    process = subprocess.Popen(
        [str(CLI), "serve-metrics", "--config", str(config_path), "--address", "127.0.0.1:0"], cwd=REPO_ROOT,
        env=world.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = wait_for_listening(process)

        health = http_get(f"{url}/healthz")
        ready_status, ready_body = http_get(f"{url}/readyz")
        metrics_status, metrics_body = http_get(f"{url}/metrics")
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)

    assert health == (200, "ok")
    assert ready_status == 503
    assert ready_body.startswith(f"etcd: EtcdUnavailableError: etcd unreachable at {dead_etcd}"), ready_body
    assert "catalog" not in ready_body and "Traceback" not in ready_body
    assert metrics_status == 200
    samples = parse_samples(metrics_body)
    assert value(samples, "kafscale_processor_errors_total", stage="checkpoint") >= 1
    assert value(samples, "kafscale_processor_errors_total", stage="sink") == 0
    assert "kafscale_processor_last_offset" not in samples and "kafscale_processor_lag" not in samples
    # The catalog still answers: the table (not created yet) counts nothing so far.
    assert value(samples, "kafscale_processor_records_total", topic=world.topic, result="written") == 0
    assert process.returncode == 0 and "serve-metrics stopped" in stderr, stderr[-3000:]


def wait_for_listening(process: subprocess.Popen, timeout_seconds: float = 60) -> str:
    """The URL serve-metrics logs once it listens (port 0 → the port it got)."""
    deadline = time.monotonic() + timeout_seconds
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break  # the process ended
        lines.append(line)
        match = re.search(r"serving Prometheus metrics on (http://\S+?)/metrics", line)
        if match:
            return match.group(1)
    process.kill()
    raise AssertionError("serve-metrics did not report listening:\n" + "".join(lines)[-3000:])
