"""Fan-out benchmark: N topics on one deployment, each partition receiving a segment every few seconds (issue 22).

Run from the repository root: `.venv/bin/python benchmarks/fanout.py --topics 10 50 200 [--duration 300]
[--watch per_table|namespace] ...`. For each N, in a temporary directory: SeaweedFS (S3 + Iceberg REST catalog) and
etcd (offsets, leases, broker watermarks), a config of N mappings (topic `fan-NNN` → table `fanout.tNNN`, pizza
columns, `processor.watch` from `--watch`), and what `make demo` runs (scripts/run-demo.sh): the Spark engine
(`kafscale-lakehouse spark-engine`) and `dagster dev` with `SPARK_REMOTE` pointing at it, the repository's
dagster.yaml as its instance. The code location, the daemon's sensors and the runs reach S3 through a counting proxy
in a process of its own, which attributes every connection to the process that opened it (code server = sensors, run
workers, the engine's Python workers); the producer writes to SeaweedFS directly. `--no-proxy` points them at
SeaweedFS itself (no S3 counts), to measure what the proxy costs.

Once the webserver answers, every partition (`--partitions`, default 2) of every topic receives a segment of
`--records-per-segment` realistic records (apps/workload.py: per-record trace headers with their own values, mixed
value sizes) every `--interval-seconds` (default 10), the partitions' writes spread over the interval, for
`--duration` seconds; the committed offsets in etcd (written right after each table's Iceberg commit) are read every
`--poll-seconds` to find when each segment became visible. Then up to `--drain-seconds` for the last segments.

Printed per N: freshness p50/p90/max per table and over all segments (segment `.index` landed → its last offset
committed) and whether a table starved (max > 3 x p90); runs launched per minute (by job and status); sensor tick
durations from the instance's tick records (per sensor kind); S3 requests per sensor tick (the code server's, by
kind); CPU seconds and peak RSS of the daemon, the code server(s), the webserver, the run workers and the engine
(JVM and Python workers; sampled from /proc every second); aggregate records/s landed, against the single-topic
figure of benchmarks/ingest.py when `--single-topic-records-per-second` gives it (measured on the same machine).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from freshness import (  # the demo's process handling: one implementation for both benchmarks
    _raise_keyboard_interrupt,
    _tail,
    dequeue_interval_seconds,
    percentile,
    start_dagster_dev,
    start_spark_engine,
    stop_process_group,
    wait_for_webserver,
)

from kafscale_lakehouse.apps.demo_producer import RECORDS_PER_BATCH, watermark_publisher
from kafscale_lakehouse.apps.workload import PIZZA_COLUMNS, pizza_orders
from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, LakehouseConfig, parse_config
from kafscale_lakehouse.connections import segment_store_from_config
from kafscale_lakehouse.engine.spark.engine import (
    SPARK_REMOTE_VARIABLE,
    ConnectAddress,
    wait_until_ready,
)
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.offsets.records import decode_offset
from kafscale_lakehouse.orchestration.naming import ingest_job_name
from kafscale_lakehouse.testing.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    Etcd,
    SeaweedFS,
    free_ports,
)

log = logging.getLogger("benchmarks.fanout")

REPO_ROOT = Path(__file__).resolve().parent.parent
KEY_PREFIX = "fanout"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


# ------------------------------------------------------------------------------------------------ processes by kind


def process_kind(cmdline: str) -> str:
    """What a process of `dagster dev` or the engine is, by its command line."""
    if "SparkConnectServer" in cmdline:
        return "engine JVM"
    if "pyspark.daemon" in cmdline or "pyspark/daemon.py" in cmdline or "pyspark.worker" in cmdline:
        return "engine Python workers"
    if "spark-engine" in cmdline:
        return "engine launcher"
    if "dagster._daemon" in cmdline or "dagster-daemon" in cmdline:
        return "daemon"
    if "dagster-webserver" in cmdline or "dagster_webserver" in cmdline:
        return "webserver"
    if "multiprocessing.spawn" in cmdline or "execute_run" in cmdline or "resource_tracker" in cmdline:
        return "run workers"
    if "api grpc" in cmdline or "code-server start" in cmdline or "code_server start" in cmdline:
        return "code server"
    if " dev " in f"{cmdline} ":
        return "dagster dev"
    return "other"


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, CPU ticks user+system, RSS bytes) of `pid`."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE_SIZE


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class ProcessSampler:
    """Every second: the processes under `roots` (dagster dev, the engine), their kind, CPU and RSS."""

    roots: list[int]
    kinds: dict[int, str] = field(default_factory=dict)
    cpu_ticks: dict[int, int] = field(default_factory=dict)
    baseline_ticks: dict[int, int] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by kind: peak of the kind's sum
    peak_process_rss: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)
    measuring: bool = False

    def sample(self) -> None:
        parents: dict[int, int] = {}
        stats: dict[int, tuple[int, int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            stat = _proc_stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)] = stat[0]
                stats[int(entry.name)] = stat[1:]
        ours = set(self.roots)
        changed = True
        while changed:
            changed = False
            for pid, parent in parents.items():
                if parent in ours and pid not in ours:
                    ours.add(pid)
                    changed = True
        rss_by_kind: Counter[str] = Counter()
        with self.lock:
            for pid in ours:
                if pid not in stats:
                    continue
                kind = self.kinds.get(pid)
                if kind is None:
                    kind = self.kinds[pid] = process_kind(_cmdline(pid))
                ticks, rss = stats[pid]
                if not self.measuring:
                    self.baseline_ticks[pid] = ticks
                self.cpu_ticks[pid] = ticks
                rss_by_kind[kind] += rss
                if self.measuring:
                    self.peak_process_rss[kind] = max(self.peak_process_rss[kind], rss)
            if self.measuring:
                for kind, rss in rss_by_kind.items():
                    self.peak_rss[kind] = max(self.peak_rss[kind], rss)

    def cpu_seconds(self) -> dict[str, float]:
        by_kind: Counter[str] = Counter()
        with self.lock:
            for pid, ticks in self.cpu_ticks.items():
                by_kind[self.kinds[pid]] += (ticks - self.baseline_ticks.get(pid, 0)) / CLOCK_TICKS
        return dict(by_kind)


def run_sampler(sampler: ProcessSampler, stop: threading.Event) -> None:
    while not stop.is_set():
        sampler.sample()
        stop.wait(1.0)


# ------------------------------------------------------------------------------------------------ counting S3 proxy
#
# The proxy runs in a process of its own (multiprocessing, spawn): in the benchmark's process it shared the GIL with
# the producer, which encodes segments all the time at 200 topics, so every S3 request of the sensors, the runs and
# the engine waited for the benchmark, not for the deployment. It sends the requests it counted back when stopped.


def socket_inode(client_port: int, server_port: int) -> str | None:
    """The inode of the socket 127.0.0.1:`client_port` → `server_port` (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.rsplit(":", 1)[1], 16) == client_port and int(remote.rsplit(":", 1)[1], 16) == server_port:
            return fields[9]
    return None


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None:
                children[stat[0]].append(int(entry.name))
    return children


class ConnectionOwners:
    """Which kind of process opened a connection to the proxy (code server, run workers, engine workers, ...).

    Its socket's owner is found by the processes' fds: first among the processes that opened connections before,
    then the process trees under `roots` (dagster dev, the engine; newest first), then every other process. Scanning
    every process's fds for every connection made the proxy, and the S3 requests behind it, slow at 200 topics."""

    def __init__(self, roots: Sequence[int]) -> None:
        self.roots = roots  # a shared array: the benchmark fills it in once dagster dev and the engine run
        self.kinds: dict[int, str] = {}  # owners seen before → kind
        self.lock = threading.Lock()
        self.tree: list[int] = []
        self.tree_read_at = 0.0

    def _tree(self) -> list[int]:
        with self.lock:
            if time.monotonic() - self.tree_read_at > 1.0:
                children = _children_by_parent()
                found: set[int] = set()
                pending = [pid for pid in self.roots if pid]
                while pending:
                    pid = pending.pop()
                    if pid not in found:
                        found.add(pid)
                        pending.extend(children.get(pid, ()))
                self.tree = sorted(found, reverse=True)
                self.tree_read_at = time.monotonic()
            return self.tree

    def kind(self, client_port: int, server_port: int) -> str:
        inode = socket_inode(client_port, server_port)
        if inode is None:
            return "unknown"
        target = f"socket:[{inode}]"
        others = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
        for pid in itertools.chain(list(self.kinds), self._tree(), others):
            try:
                if not any(os.readlink(fd) == target for fd in Path(f"/proc/{pid}/fd").iterdir()):
                    continue
            except OSError:
                continue
            kind = self.kinds.get(pid)
            if kind is None:
                kind = self.kinds[pid] = process_kind(_cmdline(pid))
            return kind
        return "unknown"


def request_kind(method: str, path: str) -> str:
    query = path.partition("?")[2]
    if method == "GET" and ("list-type" in query or "prefix=" in query or "delimiter" in query):
        return "LIST"
    return method


@dataclass
class ProxyCounts:
    """What the proxy saw: every request (time, process kind, request kind); upstream connections it reopened after
    SeaweedFS had closed them (the request was sent again, as a client's retry would); requests it could not forward."""

    requests: list[tuple[float, str, str]] = field(default_factory=list)
    reopened: int = 0
    failed: Counter[str] = field(default_factory=Counter)

    def between(self, start: float, end: float) -> Counter[tuple[str, str]]:
        return Counter((owner, kind) for at, owner, kind in self.requests if start <= at < end)


class CountingProxy:
    """A reverse proxy to SeaweedFS's S3 port that counts requests by (process kind, request kind) and by time;
    SigV4 signatures hold because the Host header is passed on as the client sent it. Each client connection keeps
    one upstream connection (keep-alive both ways); one SeaweedFS closed while idle is reopened and the request sent
    again, instead of failing the client's request (120 RemoteDisconnected at 200 topics before)."""

    def __init__(self, upstream_port: int, owners: ConnectionOwners) -> None:
        self.upstream_port = upstream_port
        self.owners = owners
        self.lock = threading.Lock()
        self.counts = ProxyCounts()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.owner = proxy.owners.kind(self.client_address[1], self.server.server_address[1])
                self.upstream = proxy.connect()

            def finish(self) -> None:
                super().finish()
                self.upstream.close()

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._read_chunked()
                else:
                    body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.counts.requests.append((time.time(), self.owner, request_kind(self.command, self.path)))
                try:
                    status, reason, headers, data = self._exchange(body)
                except (OSError, http.client.HTTPException) as exc:
                    with proxy.lock:
                        proxy.counts.failed[type(exc).__name__] += 1
                    self.upstream.close()
                    self.send_error(502, f"upstream: {exc!r}")
                    return
                self.send_response_only(status, reason)
                for name, value in headers:
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        self.send_header(name, value)
                length_header = {k.lower(): v for k, v in headers}.get("content-length")
                self.send_header("Content-Length", length_header if self.command == "HEAD" and length_header
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _exchange(self, body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
                for attempt in (1, 2):
                    try:
                        self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                        for name, value in self.headers.items():
                            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                                self.upstream.putheader(name, value)
                        if body is not None or self.command in ("PUT", "POST"):
                            self.upstream.putheader("Content-Length", str(len(body or b"")))
                        self.upstream.endheaders(body)
                        response = self.upstream.getresponse()
                        data = response.read()
                        if response.will_close:
                            self.upstream.close()
                        return response.status, response.reason, response.getheaders(), data
                    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                        # SeaweedFS closed the kept-alive connection before reading this request: send it again.
                        self.upstream.close()
                        if attempt == 2:
                            raise
                        with proxy.lock:
                            proxy.counts.reopened += 1
                raise AssertionError("unreachable")

            def _read_chunked(self) -> bytes:
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815 - the handler's names

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024  # the default listen backlog of 5 drops connections when hundreds arrive at once

        self.server = Server(("127.0.0.1", 0), Handler)

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=120)


def serve_counting_proxy(upstream_port: int, roots: Sequence[int], channel: Connection) -> None:
    """The proxy process: sends its port, serves until the benchmark sends anything, then sends back its counts."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the benchmark, which stops this process
    proxy = CountingProxy(upstream_port, ConnectionOwners(roots))
    serving = threading.Thread(target=proxy.server.serve_forever, name="s3-proxy", daemon=True)
    serving.start()
    channel.send(proxy.server.server_address[1])
    channel.recv()
    proxy.server.shutdown()
    proxy.server.server_close()
    with proxy.lock:
        channel.send(proxy.counts)


class ProxyProcess:
    """The counting proxy's process, seen from the benchmark."""

    def __init__(self, upstream_port: int) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        self.roots = context.Array("i", 4, lock=False)
        self.channel, child = context.Pipe()
        self.process = context.Process(target=serve_counting_proxy, args=(upstream_port, self.roots, child),
                                       name="s3-proxy", daemon=True)
        self.process.start()
        if not self.channel.poll(60):
            raise SystemExit("the S3 proxy process did not start within 60 s")
        self.port: int = self.channel.recv()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_roots(self, pids: list[int]) -> None:
        self.roots[:len(pids)] = pids

    def stop(self) -> ProxyCounts:
        """Stops the proxy; what it counted (nothing if it does not answer within 60 s)."""
        try:
            self.channel.send("stop")
            counts = self.channel.recv() if self.channel.poll(60) else ProxyCounts()
        except (OSError, EOFError):
            counts = ProxyCounts()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
        return counts


# ------------------------------------------------------------------------------------------------ topics, producing


def topic_name(number: int) -> str:
    return f"fan-{number:03d}"


def config_document(seaweedfs: SeaweedFS, etcd: Etcd, s3_endpoint: str, topics: int, watch: str) -> dict:
    mappings = [{"topic": topic_name(i), "table": f"fanout.t{i:03d}", "create_table_if_missing": True,
                 "schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]}} for i in range(topics)]
    return {
        "s3": {"bucket": S3_BUCKET, "namespace": KEY_PREFIX, "endpoint": s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": KEY_PREFIX},
        "etcd": {"endpoints": [etcd.endpoint]},
        "discovery": {"mode": "s3"},
        "processor": {"watch": watch},
        "mappings": mappings,
    }


@dataclass
class Landings:
    """When each segment landed and became visible, by (topic, partition, last offset)."""

    landed: dict[tuple[str, int, int], float] = field(default_factory=dict)
    visible: dict[tuple[str, int, int], float] = field(default_factory=dict)
    records: dict[tuple[str, int, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: BaseException | None = None

    def pending(self) -> int:
        with self.lock:
            return sum(1 for segment in self.landed if segment not in self.visible)


class FanoutProducer:
    """A segment of realistic records per partition per `interval_seconds`, the partitions' writes spread evenly over
    the interval; next offsets continue from what it wrote before."""

    def __init__(self, config: LakehouseConfig, topics: int, partitions: int, records_per_segment: int) -> None:
        self.store = segment_store_from_config(config)
        self.publish_watermark = watermark_publisher(config)
        self.slots = [(topic_name(t), p) for t in range(topics) for p in range(partitions)]
        self.records_per_segment = records_per_segment
        self.next_offsets = dict.fromkeys(self.slots, 0)
        self.written = 0

    def write(self, topic: str, partition: int, now: float) -> tuple[tuple[str, int, int], float, int]:
        base = self.next_offsets[(topic, partition)]
        records = pizza_orders(base, self.records_per_segment, partition=partition, start_ms=int(now * 1000),
                               interval_ms=10, workload="realistic", seed=hash(topic) & 0xFFFF)
        segment = encode_segment(records, base_offset=base, codec="zstd", records_per_batch=RECORDS_PER_BATCH,
                                 created_ms=int(now * 1000))
        self.publish_watermark(topic, partition, segment.last_offset + 1)
        self.store.write_segment(topic, partition, base, segment.kfs, segment.index)  # returns once .index is in
        self.next_offsets[(topic, partition)] = segment.last_offset + 1
        return (topic, partition, segment.last_offset), time.time(), len(records)

    def round_once(self) -> None:
        """One segment per partition at once (before `dagster dev`, so the topics exist when the definitions load)."""
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda slot: self.write(*slot, time.time()), self.slots))

    def run(self, interval_seconds: float, stop: threading.Event, landings: Landings) -> None:
        spacing = interval_seconds / len(self.slots)
        started = time.monotonic()
        try:
            with ThreadPoolExecutor(4) as pool:
                for number in range(1 << 62):
                    due = started + number * spacing
                    if stop.wait(max(0.0, due - time.monotonic())):
                        return
                    topic, partition = self.slots[number % len(self.slots)]
                    pool.submit(self._write_recorded, topic, partition, landings)
        except BaseException as exc:
            landings.error = exc

    def _write_recorded(self, topic: str, partition: int, landings: Landings) -> None:
        try:
            segment, landed_at, records = self.write(topic, partition, time.time())
        except BaseException as exc:
            landings.error = exc
            return
        with landings.lock:
            landings.landed[segment] = landed_at
            landings.records[segment] = records


def poll_committed(etcd: EtcdClient, landings: Landings) -> None:
    """Mark the segments whose last offset the offsets store now covers (one prefix read for every topic)."""
    prefix = f"{KEY_PREFIX}/offsets/"
    committed: dict[tuple[str, int], int] = {}
    for entry in etcd.get_prefix(prefix):
        topic, _, partition = entry.key[len(prefix):].rpartition("/")
        committed[(topic, int(partition))] = decode_offset("etcd", entry.key, entry.value).next_offset
    seen_at = time.time()
    with landings.lock:
        for segment in landings.landed:
            topic, partition, last_offset = segment
            if segment not in landings.visible and committed.get((topic, partition), 0) > last_offset:
                landings.visible[segment] = seen_at


# ------------------------------------------------------------------------------------------------ the instance


@dataclass
class InstanceFigures:
    ticks: dict[str, list[tuple[float, float | None, str]]]  # sensor → (start, end, status)
    runs: list[tuple[str, str, float]]  # (job, status, created)


def read_instance(dagster_home: Path) -> InstanceFigures:
    from dagster import DagsterInstance
    from dagster._core.definitions.run_request import InstigatorType

    ticks: dict[str, list[tuple[float, float | None, str]]] = {}
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
            ticks[state.instigator_name] = [
                (tick.timestamp, tick.end_timestamp, tick.status.value)
                for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1_000_000)]
        runs = [(run.job_name, run.status.value, record.create_timestamp.timestamp())
                for record in instance.get_run_records() for run in [record.dagster_run]]
    return InstanceFigures(ticks, runs)


def sensor_kind(name: str) -> str:
    if "namespace" in name:
        return "namespace watch"
    if "pattern" in name:
        return "topic patterns"
    if "maintenance" in name:
        return "maintenance"
    return "per-table ingest sensors" if name.startswith(("fanout", "kafscale")) else name


# ------------------------------------------------------------------------------------------------ one N


def measure(args: argparse.Namespace, topics: int, workdir: Path) -> None:
    seaweedfs = SeaweedFS(workdir / "seaweedfs").start()
    etcd = Etcd(workdir / "etcd").start()
    dagster_dev = engine = proxy = None
    stop = threading.Event()
    sampler = ProcessSampler([])
    try:
        direct = parse_config(config_document(seaweedfs, etcd, seaweedfs.s3_endpoint, topics, args.watch),
                              source="benchmarks/fanout.py")
        producer = FanoutProducer(direct, topics, args.partitions, args.records_per_segment)
        producer.round_once()  # as `make demo`: the topics exist before the definitions load (not measured)
        if args.proxy:
            proxy = ProxyProcess(int(seaweedfs.s3_endpoint.rsplit(":", 1)[1]))
        document = config_document(seaweedfs, etcd, proxy.endpoint if proxy else seaweedfs.s3_endpoint, topics,
                                   args.watch)
        config_path = workdir / "lakehouse.yaml"
        config_path.write_text(json.dumps(document))  # JSON is YAML
        dagster_home = workdir / "dagster_home"
        dagster_home.mkdir()
        shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
        env = {**os.environ, "DAGSTER_HOME": str(dagster_home), CONFIG_PATH_ENV_VAR: str(config_path)}
        env.pop(SPARK_REMOTE_VARIABLE, None)
        port, engine_port = free_ports(2)
        url = f"http://127.0.0.1:{port}"
        started = time.time()
        engine = start_spark_engine(workdir, env, engine_port)
        env[SPARK_REMOTE_VARIABLE] = f"sc://127.0.0.1:{engine_port}"
        dagster_dev = start_dagster_dev(workdir, env, port)
        sampler.roots[:] = [dagster_dev.pid, engine.pid]
        if proxy is not None:
            proxy.set_roots(sampler.roots)
        sampling = threading.Thread(target=run_sampler, args=(sampler, stop), name="sampler", daemon=True)
        sampling.start()
        wait_until_ready(engine, ConnectAddress("127.0.0.1", engine_port), log_path=workdir / "engine.log")
        wait_for_webserver(url, ingest_job_name(document["mappings"][0]["table"]), dagster_dev,
                           workdir / "dagster.log")
        print(f"[N={topics}] engine and dagster dev up after {time.time() - started:.1f} s; producing for "
              f"{args.duration:g} s ({topics} topics x {args.partitions} partitions, a segment of "
              f"{args.records_per_segment} records each every {args.interval_seconds:g} s; watch {args.watch}); "
              f"load {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
        landings = Landings()
        measuring_from = time.time()
        with sampler.lock:
            sampler.measuring = True
        producing = threading.Thread(target=producer.run, args=(args.interval_seconds, stop, landings),
                                     name="producer", daemon=True)
        producing.start()
        load_samples = [os.getloadavg()[0]]
        with EtcdClient([etcd.endpoint]) as client:
            deadline = time.monotonic() + args.duration
            while time.monotonic() < deadline:
                if dagster_dev.poll() is not None:
                    raise SystemExit(f"dagster dev exited with {dagster_dev.returncode}; log:\n"
                                     f"{_tail(workdir / 'dagster.log')}")
                if landings.error is not None:
                    raise SystemExit(f"the producer failed: {landings.error!r}")
                poll_committed(client, landings)
                load_samples.append(os.getloadavg()[0])
                time.sleep(args.poll_seconds)
            producing_ended = time.time()
            stop.set()
            producing.join()
            drain_deadline = time.monotonic() + args.drain_seconds
            while landings.pending() and time.monotonic() < drain_deadline:
                poll_committed(client, landings)
                time.sleep(args.poll_seconds)
        measured_until = time.time()
        figures = read_instance(dagster_home)  # before stopping: runs in flight are not yet interrupted
    finally:
        stop.set()
        if dagster_dev is not None:
            stop_process_group(dagster_dev)
        if engine is not None:
            stop_process_group(engine)
        proxy_counts = proxy.stop() if proxy is not None else None
        etcd.stop()
        seaweedfs.stop()
    report(args, topics, landings, figures, proxy_counts, sampler, measuring_from, producing_ended, measured_until,
           load_samples)


# ------------------------------------------------------------------------------------------------ output


def report(args: argparse.Namespace, topics: int, landings: Landings, figures: InstanceFigures,
           proxy_counts: ProxyCounts | None, sampler: ProcessSampler, start: float, producing_ended: float,
           measured_until: float, load_samples: list[float]) -> None:
    minutes = (producing_ended - start) / 60
    with landings.lock:
        landed, visible, records = dict(landings.landed), dict(landings.visible), dict(landings.records)
    by_table: dict[str, list[float]] = defaultdict(list)
    never: Counter[str] = Counter()
    for segment, at in landed.items():
        if segment in visible:
            by_table[segment[0]].append(visible[segment] - at)
        else:
            never[segment[0]] += 1
    everything = [value for values in by_table.values() for value in values]
    print(f"\n=== N = {topics} topics, watch {args.watch}: {len(landed)} segments landed in {minutes * 60:.0f} s, "
          f"{len(everything)} visible, {sum(never.values())} never (drain {args.drain_seconds:g} s); load average "
          f"{min(load_samples):.1f}-{max(load_samples):.1f} (median {statistics.median(load_samples):.1f}) on "
          f"{os.cpu_count()} cores; sensor interval {args.poll_interval_label}, dequeue every "
          f"{dequeue_interval_seconds()} s")
    if everything:
        p90 = percentile(everything, 0.9)
        print(f"freshness over all segments (s): p50 {percentile(everything, 0.5):.1f}, p90 {p90:.1f}, max "
              f"{max(everything):.1f} (targets at 200 topics: p90 <= 60 s, max <= 3 x p90 = {3 * p90:.1f})")
        table_p90 = [percentile(v, 0.9) for v in by_table.values()]
        nothing_visible = sorted(set(never) - set(by_table))
        print(f"per-table p90 (s): min {min(table_p90):.1f}, median {statistics.median(table_p90):.1f}, max "
              f"{max(table_p90):.1f}; starved: {sum(1 for v in by_table.values() if max(v) > 3 * p90)} tables whose "
              f"max > 3 x overall p90, {len(nothing_visible)} with no segment visible at all "
              f"({', '.join(nothing_visible[:5])}{', ...' if len(nothing_visible) > 5 else ''}) of {topics}")
        print("  table      segments    p50    p90    max  never")
        for topic in sorted(set(by_table) | set(never)):
            values = by_table.get(topic) or [float("nan")]
            print(f"  {topic:<10} {len(by_table.get(topic, [])):8d} {percentile(values, 0.5):6.1f} "
                  f"{percentile(values, 0.9):6.1f} {max(values):6.1f} {never[topic]:6d}")

    runs = [run for run in figures.runs if start <= run[2] < producing_ended]
    by_job = Counter("land_tables" if "land_tables" in job else "per-table ingest" if "ingest" in job else job
                     for job, _, _ in runs)
    statuses = Counter(status for _, status, created in figures.runs if start <= created < measured_until)
    print(f"runs launched while producing: {len(runs)} = {len(runs) / minutes:.1f} per minute ("
          + ", ".join(f"{job}: {count}" for job, count in by_job.most_common()) + "); statuses of all runs at the end: "
          + ", ".join(f"{status.lower()} {count}" for status, count in statuses.most_common()))

    ticks_total = 0
    print("sensor ticks while producing (duration = tick start → end, the instance's tick records):")
    by_kind: dict[str, list[float]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for name, ticks in figures.ticks.items():
        for started, ended, _status in ticks:
            if start <= started < producing_ended:
                counts[sensor_kind(name)] += 1
                if ended is not None:
                    by_kind[sensor_kind(name)].append(ended - started)
    for kind, durations in sorted(by_kind.items()):
        ticks_total += counts[kind]
        print(f"  {kind:<26} {counts[kind]:6d} ticks ({counts[kind] / minutes:.0f}/min), duration p50 "
              f"{percentile(durations, 0.5):.3f} s, p90 {percentile(durations, 0.9):.3f} s, max {max(durations):.3f} s")
    if proxy_counts is None:
        print("S3 requests: not counted (--no-proxy)")
    else:
        print_s3_requests(proxy_counts, counts, start, producing_ended, measured_until)

    cpu = sampler.cpu_seconds()
    print(f"CPU seconds and peak RSS while producing and draining ({measured_until - start:.0f} s):")
    for kind in sorted(set(cpu) | set(sampler.peak_rss)):
        print(f"  {kind:<24} CPU {cpu.get(kind, 0.0):7.1f} s ({cpu.get(kind, 0.0) / (measured_until - start):.2f} "
              f"cores)  peak RSS {sampler.peak_rss.get(kind, 0) / 2**20:7.0f} MB (largest process "
              f"{sampler.peak_process_rss.get(kind, 0) / 2**20:.0f} MB)")
    daemon_code = sampler.peak_rss.get("daemon", 0) + sampler.peak_rss.get("code server", 0)
    print(f"  daemon + code server peak RSS {daemon_code / 2**20:.0f} MB (target < 1536 MB)")

    landed_records = sum(records[s] for s in visible if s in records)
    rate = landed_records / (measured_until - start)
    offered = topics * args.partitions * args.records_per_segment / args.interval_seconds
    line = (f"aggregate: {landed_records} records visible, {rate:,.0f} records/s over producing + drain "
            f"(offered {offered:,.0f} records/s)")
    if args.single_topic_records_per_second:
        line += (f"; {rate / args.single_topic_records_per_second:.1%} of the single-topic figure "
                 f"{args.single_topic_records_per_second:,.0f} records/s (benchmarks/ingest.py)")
    else:
        line += "; no single-topic figure to compare with (--single-topic-records-per-second, benchmarks/ingest.py)"
    print(line, flush=True)


def print_s3_requests(proxy_counts: ProxyCounts, ticks: Counter[str], start: float, producing_ended: float,
                      measured_until: float) -> None:
    s3 = proxy_counts.between(start, producing_ended)
    sensor_requests = Counter({kind: count for (owner, kind), count in s3.items() if owner == "code server"})
    ingest_ticks = ticks.get("namespace watch", 0) + ticks.get("per-table ingest sensors", 0)
    print(f"S3 requests of the code server (sensors) while producing: {sum(sensor_requests.values())} ("
          + ", ".join(f"{kind} {count}" for kind, count in sensor_requests.most_common()) + ")"
          + (f" = {sum(sensor_requests.values()) / ingest_ticks:.1f} per ingest-sensor tick, "
             f"{sensor_requests.get('LIST', 0) / ingest_ticks:.1f} lists" if ingest_ticks else ""))
    print("S3 requests by process kind while producing: " + ", ".join(
        f"{owner}/{kind} {count}" for (owner, kind), count in s3.most_common()))
    print(f"S3 proxy (a process of its own): {len(proxy_counts.requests)} requests in all, {proxy_counts.reopened} "
          f"upstream connections SeaweedFS had closed reopened (request sent again), "
          + (", ".join(f"{count} {name}" for name, count in proxy_counts.failed.items()) or "0")
          + " requests failed (502 to the client)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, nargs="+", default=[10, 50, 200], help="values of N, one run each")
    parser.add_argument("--watch", choices=("per_table", "namespace"), default="per_table",
                        help="processor.watch: a sensor per table (default) or one namespace watch")
    parser.add_argument("--duration", type=float, default=300, help="seconds of producing (default 300)")
    parser.add_argument("--drain-seconds", type=float, default=180)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--interval-seconds", type=float, default=10.0,
                        help="seconds between two segments of a partition")
    parser.add_argument("--records-per-segment", type=int, default=40)
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="how often the committed offsets are read")
    parser.add_argument("--single-topic-records-per-second", type=float, default=None,
                        help="benchmarks/ingest.py's records/s on this machine, to compare the aggregate with")
    parser.add_argument("--no-proxy", dest="proxy", action="store_false",
                        help="S3 straight to SeaweedFS, not through the counting proxy (S3 requests not counted): "
                             "what the proxy costs is the difference")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories (logs, data)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: --duration 60 --drain-seconds 60 unless given")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.quick:
        given = " ".join(sys.argv)
        args.duration = args.duration if "--duration" in given else 60
        args.drain_seconds = args.drain_seconds if "--drain-seconds" in given else 60
    args.poll_interval_label = "processor.poll_interval_seconds (default 5 s)"
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    for topics in args.topics:
        workdir = Path(tempfile.mkdtemp(prefix=f"kafscale-fanout-{topics}-"))
        try:
            measure(args, topics, workdir)
        except KeyboardInterrupt:
            print("interrupted; stopped every process started here", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            if args.keep:
                print(f"kept {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
