"""`serve-metrics` scrape benchmark: how long one Prometheus scrape of `/metrics` takes with N mapped tables.

Run from the repository root: `.venv/bin/python benchmarks/metrics_scrape.py [--tables 200] [--repeat 5]`.
Starts SeaweedFS (S3 + Iceberg REST catalog) and etcd (`kafscale_lakehouse_tests/support/servers.py`) under a temporary
directory, then lands N topics as N ingest runs' worth of state would leave them: each topic's table holds
`--snapshots` commits of ours (no data files, as `benchmarks/sensor_tick.py` writes them), its `--partitions`
partitions have committed offsets and broker watermarks in etcd and one completed segment each in S3 (what the
stalled-segment listing reads). `serve-metrics` (`MetricsServer` over `LakehouseStateCollector`, the same code the
command runs) serves on a free loopback port and `/metrics` is fetched over HTTP `--repeat` times, as Prometheus
does: the first scrape (a fresh process: every table's snapshots are walked) and the later ones (the steady state)
are printed apart, with the series count and the errors the collector counted. The target: a scrape
with 200 tables under a second.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import kafscale_lakehouse.apps.metrics as metrics
from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.apps.metrics_server import MetricsServer
from kafscale_lakehouse.apps.workload import PIZZA_COLUMNS, pizza_order
from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.connections import catalog_settings, etcd_client_from_config, offset_store_from_config
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.storage import ObjectKind, segment_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import bench_servers
from kafscale_lakehouse_tests.support.leases import held_leases
from kafscale_lakehouse_tests.support.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    Etcd,
    SeaweedFS,
)

log = logging.getLogger("benchmarks.metrics_scrape")

SETUP_THREADS = 16
RECORDS_PER_PARTITION = 10
OWNER_ID = "metrics-scrape-benchmark"


def benchmark_config(seaweedfs: SeaweedFS, etcd: Etcd, namespace: str, topics: list[str],
                     watch: str) -> LakehouseConfig:
    return parse_config({
        "s3": {"bucket": S3_BUCKET, "namespace": namespace, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": namespace},
        "etcd": {"endpoints": [etcd.endpoint]},
        "discovery": {"mode": "s3"},
        "processor": {"watch": watch},
        "mappings": [{"topic": topic, "table": f"{namespace}.{topic.replace('-', '_')}",
                      "schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]}} for topic in topics],
    }, source="benchmarks/metrics_scrape.py")


def land_topics(config: LakehouseConfig, seaweedfs: SeaweedFS, *, partitions: int, snapshots: int) -> None:
    """Every mapping's table with `snapshots` commits of ours, its offsets and watermarks in etcd, and one completed
    segment per partition in S3, set up in parallel."""
    catalog = load_catalog(catalog_settings(config))
    catalog.create_namespace_if_not_exists(config.mappings[0].table.split(".")[0])
    s3 = seaweedfs.s3_client()
    etcd = etcd_client_from_config(config)
    offsets = offset_store_from_config(config, etcd)
    ids = range(partitions)

    def land(topic: str, table_name: str) -> None:
        table = open_table(catalog, table_name, schema=table_schema(PIZZA_COLUMNS), create_if_missing=True)
        start = 0
        for number in range(1, snapshots + 1):
            end = RECORDS_PER_PARTITION * number // snapshots
            commit_append(table, [], topic, dict.fromkeys(ids, start), dict.fromkeys(ids, end),
                          f"{OWNER_ID}-{number}")
            start = end
        with held_leases(offsets, topic, ids, OWNER_ID) as leases:
            offsets.commit_offsets(leases.values(), dict.fromkeys(ids, (RECORDS_PER_PARTITION, 0)))
        for partition in ids:
            etcd.put(broker_next_offset_key(topic, partition), str(RECORDS_PER_PARTITION + 5))
            segment = encode_segment([pizza_order(o, partition=partition) for o in range(RECORDS_PER_PARTITION)],
                                     base_offset=0, codec="none", records_per_batch=RECORDS_PER_PARTITION)
            for kind, body in ((ObjectKind.SEGMENT, segment.kfs), (ObjectKind.INDEX, segment.index)):
                key = segment_key(config.s3.namespace, topic, partition, 0, kind)
                s3.put_object(Bucket=S3_BUCKET, Key=key, Body=body)

    try:
        with ThreadPoolExecutor(SETUP_THREADS) as pool:
            for future in [pool.submit(land, m.topic, m.table) for m in config.mappings]:
                future.result()
    finally:
        offsets.close()
        etcd.close()


def scrape(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as response:
        body = response.read().decode()
    return time.perf_counter() - started, body


def series(body: str, name: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(name)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=200, help="mapped topics, each with its table (default 200)")
    parser.add_argument("--partitions", type=int, default=2, help="partitions per topic (default 2)")
    parser.add_argument("--snapshots", type=int, default=10, help="commits of ours per table (default 10)")
    parser.add_argument("--repeat", type=int, default=5, help="scrapes after the first (default 5)")
    parser.add_argument("--watch", choices=["per_table", "namespace"], default="per_table",
                        help="processor.watch (namespace: the stalled-segment listing lists the namespace once)")
    parser.add_argument("--breakdown", action="store_true", help="also time each source of a scrape on its own")
    parser.add_argument("--threads", type=int, nargs="+", default=[metrics.READ_THREADS],
                        help=f"apps/metrics.py READ_THREADS to measure with (default {metrics.READ_THREADS})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    namespace = f"m{uuid.uuid4().hex[:8]}"
    with bench_servers("kafscale-metrics-bench-") as servers:
        topics = [f"topic-{number:03d}" for number in range(args.tables)]
        config = benchmark_config(servers.seaweedfs, servers.etcd, namespace, topics, args.watch)
        started = time.perf_counter()
        land_topics(config, servers.seaweedfs, partitions=args.partitions, snapshots=args.snapshots)
        print(f"setup: {args.tables} tables x {args.snapshots} snapshots, {args.partitions} partitions "
              f"each, in {time.perf_counter() - started:.1f} s", flush=True)
        for threads in args.threads:
            metrics.READ_THREADS = threads
            print(f"READ_THREADS {threads}:")
            run_scrapes(config, args)


def run_scrapes(config: LakehouseConfig, args: argparse.Namespace) -> None:
    collector = LakehouseStateCollector(config)
    server = MetricsServer(collector, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        first, body = scrape(server.url)
        later = []
        for _ in range(args.repeat):
            seconds, body = scrape(server.url)
            later.append(seconds)
    finally:
        server.shutdown()
        server.close()
        collector.close()
    batches = series(body, "kafscale_processor_batches_total{")
    lags = series(body, "kafscale_processor_lag{")
    errors = [line for line in series(body, "kafscale_processor_errors_total{") if not line.endswith(" 0.0")]
    print(f"scrape of {args.tables} tables ({len(batches)} with batches_total, {len(lags)} lag series; errors "
          f"{errors or 'none'}): first {first:.3f} s, then median {statistics.median(later):.3f} s "
          f"(min {min(later):.3f}, max {max(later):.3f}, {args.repeat} scrapes)")
    sys.stdout.flush()
    if args.breakdown:
        breakdown(config)


def breakdown(config: LakehouseConfig) -> None:
    """Each source of a scrape read on its own (the collector's readers, without deadlines), once cold, once warm."""
    collector = LakehouseStateCollector(config)
    try:
        for label in ("cold", "warm"):
            timings = {}
            started = time.perf_counter()
            offsets = collector._read_offsets()
            timings["etcd offsets"] = time.perf_counter() - started
            started = time.perf_counter()
            collector._read_tables()
            timings["catalog tables"] = time.perf_counter() - started
            started = time.perf_counter()
            collector._read_stalled(offsets)
            timings["segment listings"] = time.perf_counter() - started
            print(f"  {label}: " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in timings.items()))
    finally:
        collector.close()


if __name__ == "__main__":
    main()
