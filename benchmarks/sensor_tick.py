"""Sensor tick benchmark: what one tick of a mapping's sensor costs in S3 and etcd requests, by ingested backlog.

Run from the repository root: `.venv/bin/python benchmarks/sensor_tick.py [--segments 10 1000 10000] ...`.
Starts SeaweedFS (S3) and etcd (`kafscale_lakehouse_tests/support/servers.py`) under a temporary directory. For each
N in `--segments`, a topic of `--partitions` partitions gets N tiny segments (one pizza order each, uploaded in
parallel, `.kfs` before `.index`), its committed offsets in etcd are set to the end (so all N count as ingested),
the broker watermarks and the broker's metadata snapshot are published in etcd as a KafScale broker does, and the
topic's sensor (`orchestration/sensors.py`, built by `build_sensors` and evaluated with `build_sensor_context` on a
real Dagster instance, as the daemon does) is ticked:
- restart: an empty cursor (a new deployment or a reset cursor) over the ingested backlog;
- steady, 0 new: the previous tick's cursor, nothing new;
- steady, 3 new: the previous tick's cursor after 3 new segments per partition landed (not ingested yet);
- cold (with `--cold`): an empty cursor and nothing committed (another offsets key prefix), i.e. a backlog that
  was never ingested; this one grows with N by design, up to the per-tick footer-read bound.
With `--watch namespace --topics N`: N topics of `--partitions` partitions (`--segments`: the ingested segments per
partition, one value), each with its table, watched by the ONE namespace sensor (orchestration/namespace_sensor.py);
ticks: idle (nothing new), then with `--new-per-partition` new segments per partition (default 1 and 2: at 200 topics
x 2 partitions, 400 and 800 new segments), then with one new segment per partition while a land_tables run holds every
table (the steady state while a batch lands). Printed per tick: wall time, requests by kind (S3, etcd, catalog loads)
and the time per phase (listing, footer/index reads, offsets reads from etcd, table offsets loads, run lookups in the
Dagster instance, packing); phases on threads add up their threads' time ("thread-s"), the scan's wall time is apart.
`--scan namespace-listing` ticks with the namespace scan as it was before it listed only the partitions whose
broker watermark moved (one listing of the whole namespace per tick), for A/B figures in the same minutes; the
printed cursor size is what the daemon stores after each tick.
Each topic's table (SeaweedFS's Iceberg REST catalog) holds `--table-snapshots` commits of ours (no data files; the
last at the committed end), and each tick reads its offsets as the sensor does in production: one `loadTable` per
tick (`TableOffsetsReader`). `--no-table` ticks without reading the table (as a sensor that reads no table).
S3 requests are the segment store's request counters (`SegmentStore.request_counts`), etcd calls are counted at
`EtcdClient._call` (one per logical call, retries not counted). Each scenario is ticked `--repeat` times; counts
are the same every time, the tick time printed is the median.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import boto3
import dagster as dg
from botocore.config import Config

from kafscale_lakehouse.apps.workload import PIZZA_COLUMNS, pizza_order
from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.connections import catalog_settings, offset_store_from_config, segment_store_from_config
from kafscale_lakehouse.engine.ingestion.topic_scan import (
    NAMESPACE_SCAN_THREADS,
    TABLE_OFFSETS_MAX_AGE_SECONDS,
    NamespaceScan,
    TableOffsetsReader,
    TopicOffsets,
    TopicScan,
    WatchSources,
    scan_topic,
)
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.records import broker_next_offset_key
from kafscale_lakehouse.orchestration import namespace_sensor, sensors
from kafscale_lakehouse.orchestration.namespace_sensor import build_namespace_sensor
from kafscale_lakehouse.orchestration.sensors import build_sensors, sensor_name
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.storage import DiscoveryMode, NamespaceListing, ObjectKind, discover_partitions, segment_key
from kafscale_lakehouse.storage.discovery import METADATA_SNAPSHOT_KEY

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

log = logging.getLogger("benchmarks.sensor_tick")

UPLOAD_THREADS = 32
NEW_SEGMENTS_PER_TICK = 3
OWNER_ID = "sensor-tick-benchmark"


class CountingEtcdClient(EtcdClient):
    """An `EtcdClient` that counts its calls by kind (`get`, `get prefix`, `put`, `transaction`, ...)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()

    def _call(self, operation, fn):
        # `operation` reads "<kind> <key or details>"; "get prefix" is the one two-word kind.
        kind = "get prefix" if operation.startswith("get prefix") else operation.split(" ", 1)[0]
        self.calls[kind] += 1
        return super()._call(operation, fn)


@dataclass(frozen=True)
class TickCost:
    scenario: str
    segments: int  # already-ingested segments per partition
    s3: Counter[str]
    etcd: Counter[str]
    milliseconds: float
    run_requested: bool


@dataclass
class TopicUnderTest:
    topic: str
    partitions: int
    next_offset: int  # per partition: every partition holds the same offsets


# ------------------------------------------------------------------------------------------------ setup


def benchmark_config(seaweedfs: SeaweedFS, etcd: Etcd, *, namespace: str, key_prefix: str, discovery: str,
                     topics: list[str], watch: str = "per_table") -> LakehouseConfig:
    return parse_config({
        "processor": {"watch": watch},
        "s3": {"bucket": S3_BUCKET, "namespace": namespace, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": key_prefix},
        "etcd": {"endpoints": [etcd.endpoint]},
        "discovery": {"mode": discovery},
        "mappings": [{"topic": topic, "table": f"bench.{topic.replace('-', '_')}", "create_table_if_missing": True,
                      "schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]}}
                     for topic in topics],
    }, source="benchmarks/sensor_tick.py")


def watch_sources(config: LakehouseConfig, *, read_tables: bool) -> tuple[WatchSources, CountingEtcdClient]:
    """The sensor's connections, built as `WatchSources.from_config` does but with a counting etcd client (and
    without the table reader when not `read_tables`)."""
    etcd = CountingEtcdClient(config.etcd.endpoints)
    sources = WatchSources(store=segment_store_from_config(config), offsets=offset_store_from_config(config, etcd),
                           discovery_mode=DiscoveryMode.parse(config.discovery.mode), etcd=etcd,
                           tables=TableOffsetsReader(catalog_settings(config)) if read_tables else None)
    return sources, etcd


def land_table(config: LakehouseConfig, topic: TopicUnderTest, snapshots: int) -> None:
    """The topic's table with `snapshots` commits of ours (no data files) up to the committed end, as `snapshots`
    ingest runs leave it."""
    [mapping] = [m for m in config.mappings if m.topic == topic.topic]
    table = open_table(load_catalog(catalog_settings(config)), mapping.table, schema=table_schema(PIZZA_COLUMNS),
                       create_if_missing=True)
    partitions = range(topic.partitions)
    start = 0
    for number in range(1, snapshots + 1):
        end = topic.next_offset * number // snapshots
        commit_append(table, [], topic.topic, dict.fromkeys(partitions, start), dict.fromkeys(partitions, end),
                      f"{OWNER_ID}-{number}")
        start = end


def upload_client(seaweedfs: SeaweedFS):
    """A boto3 S3 client with a connection per upload thread (boto3 keeps 10 by default)."""
    return boto3.client("s3", endpoint_url=seaweedfs.s3_endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY,
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=UPLOAD_THREADS))


def upload_segments(s3, namespace: str, topic: TopicUnderTest, count: int) -> None:
    """`count` one-record segments per partition after `topic.next_offset`, uploaded in parallel; each segment's
    `.kfs` goes up before its `.index`, as the broker uploads them."""
    first = topic.next_offset

    def upload(partition: int, offset: int) -> None:
        segment = encode_segment([pizza_order(offset, partition=partition)], base_offset=offset, codec="none",
                                 records_per_batch=1)
        for kind, body in ((ObjectKind.SEGMENT, segment.kfs), (ObjectKind.INDEX, segment.index)):
            s3.put_object(Bucket=S3_BUCKET, Key=segment_key(namespace, topic.topic, partition, offset, kind), Body=body)

    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        for future in [pool.submit(upload, partition, offset) for partition in range(topic.partitions)
                       for offset in range(first, first + count)]:
            future.result()
    topic.next_offset = first + count


def publish_broker_state(etcd: EtcdClient, topics: list[TopicUnderTest]) -> None:
    """The broker's watermarks and metadata snapshot (what `discovery.mode` auto/etcd reads), as KafScale writes."""
    for topic in topics:
        for partition in range(topic.partitions):
            etcd.put(broker_next_offset_key(topic.topic, partition), str(topic.next_offset))
    snapshot = {"Topics": [{"Name": topic.topic, "ErrorCode": 0,
                            "Partitions": [{"PartitionIndex": p, "ErrorCode": 0} for p in range(topic.partitions)]}
                           for topic in topics]}
    etcd.put(METADATA_SNAPSHOT_KEY, json.dumps(snapshot, separators=(",", ":")))


def commit_to_end(sources: WatchSources, topic: TopicUnderTest) -> None:
    """Mark everything so far as ingested: committed offsets at the last offset, as an ingest run commits them."""
    partitions = range(topic.partitions)
    with held_leases(sources.offsets, topic.topic, partitions, OWNER_ID) as leases:
        sources.offsets.commit_offsets(leases.values(), dict.fromkeys(partitions, (topic.next_offset, 0)))


# ------------------------------------------------------------------------------------------------ ticks


class SensorTicker:
    """Evaluates one mapping's sensor as the daemon does and measures each tick."""

    def __init__(self, config: LakehouseConfig, topic: str, sources: WatchSources, etcd: CountingEtcdClient,
                 instance: dg.DagsterInstance):
        self.sources, self.etcd, self.instance = sources, etcd, instance
        [mapping] = [m for m in config.mappings if m.topic == topic]
        [self.sensor] = [s for s in build_sensors(config, sources=lambda: sources)
                         if s.name == sensor_name(mapping.table)]

    def tick(self, scenario: str, segments: int, cursor: str | None) -> tuple[TickCost, str | None]:
        s3_before, etcd_before = self.sources.store.request_counts, Counter(self.etcd.calls)
        started = time.perf_counter()
        result = self.sensor.evaluate_tick(dg.build_sensor_context(instance=self.instance, cursor=cursor))
        milliseconds = 1000 * (time.perf_counter() - started)
        s3 = self.sources.store.request_counts - s3_before
        etcd = self.etcd.calls - etcd_before
        # The daemon applies the dynamic-partition requests after the tick (not part of the tick's reads).
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return TickCost(scenario, segments, s3, etcd, milliseconds, bool(result.run_requests)), result.cursor


def median_cost(costs: list[TickCost]) -> TickCost:
    """The first tick's counts (every repeat costs the same requests) with the median tick time."""
    if any((c.s3, c.etcd) != (costs[0].s3, costs[0].etcd) for c in costs):
        log.warning("%s with %d segments: request counts differ between repeats: %s", costs[0].scenario,
                    costs[0].segments, [(dict(c.s3), dict(c.etcd)) for c in costs])
    first = costs[0]
    return TickCost(first.scenario, first.segments, first.s3, first.etcd,
                    statistics.median(c.milliseconds for c in costs), first.run_requested)


def measure_topic(args: argparse.Namespace, s3, ticker: SensorTicker, cold_ticker: SensorTicker | None,
                  namespace: str, topic: TopicUnderTest, publish: Callable[[], None]) -> list[TickCost]:
    segments = topic.next_offset
    costs: list[TickCost] = []
    # The first evaluation registers the topic's partitions in the instance; it is not one of the measured ticks.
    _, cursor = ticker.tick("registration", segments, None)

    restart = []
    for _ in range(args.repeat):
        cost, cursor = ticker.tick("restart (empty cursor)", segments, None)
        restart.append(cost)
    costs.append(median_cost(restart))

    if cold_ticker is not None:
        cold_ticker.tick("registration", segments, None)
        costs.append(median_cost([cold_ticker.tick("cold (nothing committed)", segments, None)[0]
                                  for _ in range(args.repeat)]))

    idle = []
    for _ in range(args.repeat):
        cost, cursor = ticker.tick("steady, 0 new/partition", segments, cursor)
        idle.append(cost)
    costs.append(median_cost(idle))

    new = []
    for _ in range(args.repeat):
        upload_segments(s3, namespace, topic, NEW_SEGMENTS_PER_TICK)
        publish()
        cost, cursor = ticker.tick(f"steady, {NEW_SEGMENTS_PER_TICK} new/partition", segments, cursor)
        new.append(cost)
    costs.append(median_cost(new))
    return costs


# ------------------------------------------------------------------------------------------------ output


def print_costs(costs: list[TickCost], partitions: int) -> None:
    print(f"{'ingested segments':>17} {'tick':<26} {'S3 list':>7} {'S3 get':>6} {'S3 head':>7} {'etcd calls':>10} "
          f"{'tick ms':>8}  run requested  etcd calls by kind")
    for cost in costs:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(cost.etcd.items())) or "-"
        print(f"{cost.segments * partitions:17,d} {cost.scenario:<26} {cost.s3['list']:7d} {cost.s3['get']:6d} "
              f"{cost.s3['head']:7d} {sum(cost.etcd.values()):10d} {cost.milliseconds:8.1f}  "
              f"{'yes' if cost.run_requested else 'no':<13}  {kinds}")


# ------------------------------------------------------------------------------------------------ namespace watch


class PhaseTimer:
    """Time and calls per phase, summed over threads, of methods wrapped on objects or modules."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def wrap(self, owner: object, attribute: str, phase: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[phase] += time.perf_counter() - started
                    self.calls[phase] += 1

        setattr(owner, attribute, timed)

    def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        with self._lock:
            return Counter(self.seconds), Counter(self.calls)


@dataclass(frozen=True)
class NamespaceTick:
    scenario: str
    new_segments: int
    milliseconds: float
    s3: Counter[str]
    etcd: Counter[str]
    phase_seconds: Counter[str]
    phase_calls: Counter[str]
    tables_requested: int
    cursor_bytes: int  # the cursor the daemon stores after the tick


def benchmark_namespace(args: argparse.Namespace, seaweedfs: SeaweedFS, etcd: Etcd, workdir: Path, run: str) -> None:
    namespace = f"ns-tick-{run}"
    topics = [TopicUnderTest(f"ns-{number:03d}", args.partitions, 0) for number in range(args.topics)]
    config = benchmark_config(seaweedfs, etcd, namespace=namespace, key_prefix=f"bench-{run}",
                              discovery=args.discovery, topics=[t.topic for t in topics], watch="namespace")
    sources, counting_etcd = watch_sources(config, read_tables=not args.no_table)
    s3 = upload_client(seaweedfs)
    started = time.perf_counter()
    backlog = args.segments[0]

    def prepare(topic: TopicUnderTest) -> None:
        upload_segments(s3, namespace, topic, backlog)
        commit_to_end(sources, topic)
        land_table(config, topic, args.table_snapshots)

    prepare(topics[0])  # creates the tables' namespace, which concurrent creations would race for
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(prepare, topics[1:]))
    publish_broker_state(counting_etcd, topics)
    print(f"{args.topics} topics x {args.partitions} partitions, {backlog} ingested one-record segments each, "
          f"tables of {args.table_snapshots} commits ({'not read' if args.no_table else 'read every tick'}), "
          f"set up in {time.perf_counter() - started:.1f} s; discovery.mode {args.discovery}")

    timer = PhaseTimer()
    timer.wrap(sources.store, "_list_page", "S3 listing")
    timer.wrap(sources.store, "_get", "S3 footer/index reads")
    timer.wrap(sources.offsets, "committed_offsets", "etcd offsets reads")
    timer.wrap(sources.offsets, "broker_watermarks", "etcd watermark reads")
    if sources.tables is not None:
        timer.wrap(sources.tables, "read", "table offsets loads")
    if args.scan == "namespace-listing":
        namespace_sensor.scan_namespace = scan_namespace_by_listing  # type: ignore[assignment]
    timer.wrap(namespace_sensor, "scan_namespace", "scan (wall)")
    timer.wrap(sources.store, "list_partitions", "S3 partition discovery")
    timer.wrap(namespace_sensor, "_new_partitions", "dynamic partitions lookup")
    timer.wrap(namespace_sensor, "retry_wait", "retry_wait lookups")
    timer.wrap(namespace_sensor, "topic_observation", "observations")
    timer.wrap(namespace_sensor, "_tables_in_flight", "runs in flight lookup")
    timer.wrap(sensors.RequestedRuns, "record", "requested run lookups")
    timer.wrap(sensors.RequestedRuns, "committed", "requested run lookups")
    timer.wrap(namespace_sensor, "pack_batches", "packing")

    (workdir / "dagster_home").mkdir()
    instance = dg.DagsterInstance.local_temp(str(workdir / "dagster_home"))
    sensor = build_namespace_sensor(config, sources=lambda: sources)
    ticks: list[NamespaceTick] = []

    def tick(scenario: str, new: int, cursor: str | None) -> str | None:
        s3_before, etcd_before = sources.store.request_counts, Counter(counting_etcd.calls)
        seconds_before, calls_before = timer.snapshot()
        tick_started = time.perf_counter()
        result = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))
        milliseconds = 1000 * (time.perf_counter() - tick_started)
        seconds, calls = timer.snapshot()
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        requested = sum(len(r.tags.get(namespace_sensor.BATCH_TABLES_TAG, "").split(","))
                        for r in result.run_requests or [])
        ticks.append(NamespaceTick(scenario, new, milliseconds, sources.store.request_counts - s3_before,
                                   counting_etcd.calls - etcd_before, seconds - seconds_before, calls - calls_before,
                                   requested, len(result.cursor or "")))
        return result.cursor

    cursor = tick("registration (empty cursor)", 0, None)
    for _ in range(args.repeat):
        cursor = tick("idle, 0 new", 0, cursor)
    for new in args.new_per_partition:
        for _ in range(args.repeat):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda topic, count=new: upload_segments(s3, namespace, topic, count), topics))
            publish_broker_state(counting_etcd, topics)
            cursor = tick(f"{new} new/partition", new * args.topics * args.partitions, cursor)
    # Steady state under load: every table in a land_tables run in flight (its new segments wait for the next tick).
    instance.add_run(dg.DagsterRun(job_name=namespace_sensor.LAND_TABLES_JOB, run_id=uuid.uuid4().hex[:8] + "-busy",
                                   tags={namespace_sensor.BATCH_TABLES_TAG: ",".join(m.table for m in config.mappings)},
                                   status=dg.DagsterRunStatus.STARTED))
    for _ in range(args.repeat):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda topic: upload_segments(s3, namespace, topic, 1), topics))
        publish_broker_state(counting_etcd, topics)
        cursor = tick("1 new/partition, all busy", args.topics * args.partitions, cursor)
    instance.dispose()
    counting_etcd.close()
    print_namespace_ticks(ticks)


def scan_namespace_by_listing(sources: WatchSources, tables, cursors=None, *, unread_newest=()) -> NamespaceScan:
    """The namespace scan as it was before it listed partitions by watermark (commit 970ff59): every tick lists the
    whole namespace (`NamespaceListing`) and every partition is scanned from that listing; kept here for A/B."""
    cursors = cursors or {}
    before = sources.store.request_counts["list"]
    listing = NamespaceListing.from_store(sources.store)
    discovered = discover_partitions(sources.discovery_mode, listing, sources.etcd, topics=list(tables))
    view = replace(sources, store=listing)
    committed = sources.offsets.committed_offsets_by_topic(tables)
    watermarks = sources.offsets.broker_watermarks_by_topic(tables)

    def scan(topic: str) -> TopicScan:
        return scan_topic(view, topic, cursors.get(topic), table=tables[topic],
                          partitions=discovered.partitions.get(topic, []),
                          offsets=TopicOffsets(committed[topic], watermarks[topic]),
                          table_offsets_max_age_seconds=TABLE_OFFSETS_MAX_AGE_SECONDS,
                          read_newest_footers=topic not in unread_newest)

    topics = list(tables)
    with ThreadPoolExecutor(max_workers=min(NAMESPACE_SCAN_THREADS, len(topics))) as pool:
        scans = list(pool.map(scan, topics))
    by_topic = dict(zip(topics, scans, strict=True))
    pending = {topic: {p: listing.segment_bytes(topic, p, r.start, r.end) for p, state in scan.partitions.items()
                       if (r := state.pending_range) is not None}
               for topic, scan in by_topic.items()}
    return NamespaceScan(by_topic, pending, sum(len(s.listed) for s in scans),
                         sources.store.request_counts["list"] - before)


def print_namespace_ticks(ticks: list[NamespaceTick]) -> None:
    phases = sorted({phase for t in ticks for phase in t.phase_seconds})
    print(f"{'tick':<28} {'new seg':>7} {'tick ms':>8} {'S3 list':>7} {'S3 get':>6} {'etcd':>5} {'tables':>6} "
          f"{'cursor':>7}  phases (thread-s, calls)")
    for t in ticks:
        detail = ", ".join(f"{phase} {t.phase_seconds[phase]:.2f} ({t.phase_calls[phase]})" for phase in phases
                           if t.phase_calls[phase])
        print(f"{t.scenario:<28} {t.new_segments:7d} {t.milliseconds:8.1f} {t.s3['list']:7d} {t.s3['get']:6d} "
              f"{sum(t.etcd.values()):5d} {t.tables_requested:6d} {t.cursor_bytes:7d}  {detail}")


# ------------------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[10, 1_000, 10_000],
                        help="already-ingested segments per partition, one topic per value")
    parser.add_argument("--partitions", type=int, default=1, help="Kafka partitions per topic")
    parser.add_argument("--discovery", choices=("auto", "etcd", "s3"), default="auto",
                        help="discovery.mode of the sensor (default: the config default, auto: the broker's "
                             "metadata snapshot in etcd)")
    parser.add_argument("--repeat", type=int, default=3, help="ticks per scenario (median time)")
    parser.add_argument("--table-snapshots", type=int, default=50,
                        help="commits of ours in each topic's table (its metadata grows with them)")
    parser.add_argument("--no-table", action="store_true",
                        help="tick without reading the table's offsets (as a sensor that reads no table)")
    parser.add_argument("--cold", action="store_true",
                        help="also tick with an empty cursor and nothing committed (a never-ingested backlog)")
    parser.add_argument("--watch", choices=("per_table", "namespace"), default="per_table",
                        help="namespace: the one namespace sensor over --topics topics (the module docstring)")
    parser.add_argument("--topics", type=int, default=200, help="topics of the namespace watch (--watch namespace)")
    parser.add_argument("--new-per-partition", type=int, nargs="+", default=[1, 2],
                        help="new segments per partition before each measured busy tick (--watch namespace)")
    parser.add_argument("--scan", choices=("watermarks", "namespace-listing"), default="watermarks",
                        help="namespace-listing: one listing of the whole namespace per tick, not of the partitions "
                             "whose watermark moved, for A/B figures (--watch namespace)")
    parser.add_argument("--verbose", action="store_true", help="log at INFO level")
    args = parser.parse_args()
    if min(*args.segments, args.partitions, args.repeat, args.table_snapshots) < 1:
        parser.error("--segments, --partitions, --repeat and --table-snapshots must be positive")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # The sensor's `context.log` is a console logger outside the logging hierarchy, at INFO: mute INFO globally.
        logging.disable(logging.INFO)
    run = uuid.uuid4().hex[:8]
    with bench_servers("kafscale-sensor-bench-") as servers:
        measure = benchmark_namespace if args.watch == "namespace" else benchmark
        measure(args, servers.seaweedfs, servers.etcd, servers.workdir, run)


def benchmark(args: argparse.Namespace, seaweedfs: SeaweedFS, etcd: Etcd, workdir: Path, run: str) -> None:
    namespace = f"tick-{run}"
    topics = [TopicUnderTest(f"ticks-{count}", args.partitions, 0) for count in args.segments]
    config = benchmark_config(seaweedfs, etcd, namespace=namespace, key_prefix=f"bench-{run}",
                              discovery=args.discovery, topics=[t.topic for t in topics])
    cold_config = benchmark_config(seaweedfs, etcd, namespace=namespace, key_prefix=f"bench-cold-{run}",
                                   discovery=args.discovery, topics=[t.topic for t in topics])
    sources, counting_etcd = watch_sources(config, read_tables=not args.no_table)
    cold_sources, cold_etcd = watch_sources(cold_config, read_tables=False) if args.cold else (None, None)
    s3 = upload_client(seaweedfs)
    started = time.perf_counter()
    for topic, count in zip(topics, args.segments, strict=False):
        upload_segments(s3, namespace, topic, count)
        commit_to_end(sources, topic)
        land_table(config, topic, args.table_snapshots)
    publish = lambda: publish_broker_state(counting_etcd, topics)  # noqa: E731
    publish()
    print(f"{sum(args.segments) * args.partitions:,} one-record segments in {len(topics)} topics of "
          f"{args.partitions} partition(s) uploaded to SeaweedFS and committed in etcd in "
          f"{time.perf_counter() - started:.1f} s; discovery.mode {args.discovery}, {args.repeat} ticks per "
          f"scenario; tables of {args.table_snapshots} commits, "
          f"{'not read (--no-table)' if args.no_table else 'read every tick'}")

    costs: list[TickCost] = []
    (workdir / "dagster_home").mkdir()
    instance = dg.DagsterInstance.local_temp(str(workdir / "dagster_home"))
    try:
        for topic in topics:
            ticker = SensorTicker(config, topic.topic, sources, counting_etcd, instance)
            cold_ticker = (SensorTicker(cold_config, topic.topic, cold_sources, cold_etcd, instance)
                           if cold_sources is not None else None)
            costs += measure_topic(args, s3, ticker, cold_ticker, namespace, topic, publish)
    finally:
        instance.dispose()
        for client in (counting_etcd, cold_etcd):
            if client is not None:
                client.close()
    print_costs(costs, args.partitions)


if __name__ == "__main__":
    main()
