"""serve-metrics in this test process (a thread) and scraping it with urllib, as Prometheus and kubelet would."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.apps.metrics_server import MetricsServer
from kafscale_lakehouse.config import LakehouseConfig

# sample name → {sorted label items: value}
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


@contextmanager
def running_metrics_server(config: LakehouseConfig) -> Iterator[MetricsServer]:
    """`serve-metrics` for `config` on a free loopback port, served by a background thread."""
    collector = LakehouseStateCollector(config)
    server = MetricsServer(collector, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, name="serve-metrics", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.close()
        collector.close()
        thread.join(timeout=5)


def http_get(url: str, timeout_seconds: float = 15) -> tuple[int, str]:
    """(status, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def parse_samples(exposition: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def scrape(url: str) -> Samples:
    status, body = http_get(f"{url}/metrics")
    assert status == 200, body
    return parse_samples(body)


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get(name, {}).get(tuple(sorted(labels.items())))
