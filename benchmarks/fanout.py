"""Fan-out benchmark: N topics on one deployment, each partition receiving a segment every few seconds.

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
figure of benchmarks/ingest.py when `--single-topic-records-per-second` gives it (measured on the same machine);
each land_tables run's milestones from its event log.

`--backlog-records N` measures throughput instead (realistic traffic offers far less than one topic can land): N
records spread over the topics' partitions are written before the deployment starts, and the time until every one
is visible (from dagster dev's start and from the first run's start) gives the landed records/s. `--single-topic`
first lands the same records as one topic with benchmarks/ingest.py's code path on the same engine, the figure the
aggregate is compared with. `--phase-log` adds the engine's phases per land_tables run (prepare, Spark job, commits,
checks) from the run workers.
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
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path

import yaml

from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, parse_config
from kafscale_lakehouse.engine.spark.engine import (
    SPARK_REMOTE_VARIABLE,
    ConnectAddress,
    wait_until_ready,
)
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets.records import decode_offset
from kafscale_lakehouse.orchestration.naming import ingest_job_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import (
    CLOCK_TICKS,
    KEY_PREFIX,
    FanoutProducer,
    Landings,
    ProcessSampler,
    add_instance_options,
    config_document,
    dagster_home,
    dequeue_interval_seconds,
    log_tail,
    mapping_document,
    percentile,
    proc_stat,
    process_cmdline,
    process_kind,
    raise_keyboard_interrupt,
    run_sampler,
    start_dagster_dev,
    start_spark_engine,
    stop_process_group,
    topic_name,
    wait_for_webserver,
    with_bytecode_cache,
)
from kafscale_lakehouse_tests.support.servers import (
    Etcd,
    SeaweedFS,
    free_ports,
)

log = logging.getLogger("benchmarks.fanout")

REPO_ROOT = Path(__file__).resolve().parent.parent
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


# ------------------------------------------------------------------------------------------------ processes by kind


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
            stat = proc_stat(int(entry.name))
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
                kind = self.kinds[pid] = process_kind(process_cmdline(pid))
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
    SeaweedFS had closed them (the request was sent again, as a client's retry would); requests it could not forward;
    client connections reset between two requests."""

    requests: list[tuple[float, str, str]] = field(default_factory=list)
    reopened: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    client_resets: int = 0
    cpu_seconds: float = 0.0  # of the proxy process, all its life
    connections: int = 0
    owner_seconds: float = 0.0  # finding the connections' owners

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
                started = time.perf_counter()
                self.owner = proxy.owners.kind(self.client_address[1], self.server.server_address[1])
                with proxy.lock:
                    proxy.counts.connections += 1
                    proxy.counts.owner_seconds += time.perf_counter() - started
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

            def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
                if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
                    with proxy.lock:  # a client reset its kept-alive connection (a run worker exits): not an error
                        proxy.counts.client_resets += 1
                else:
                    super().handle_error(request, client_address)

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
        proxy.counts.cpu_seconds = time.process_time()
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
    batches: list[BatchRun]  # the land_tables runs


@dataclass
class BatchRun:
    """A land_tables run's milestones from its event log (epoch seconds; None when the event is not there)."""

    run_id: str
    status: str
    created: float
    tables: int  # from its "landing N tables" log message
    starting: float | None  # launched by the queue
    started: float | None  # the run worker runs
    landing: float | None  # the op logged "landing N tables" (resources built, step started)
    first_materialization: float | None  # everything prepared, written, committed and checked: events from here
    ended: float | None
    events: int
    pid: int | None  # the run worker's, from "Started process for run (pid: N)"


def read_instance(dagster_home: Path) -> InstanceFigures:
    from dagster import DagsterEventType, DagsterInstance
    from dagster._core.definitions.run_request import InstigatorType

    ticks: dict[str, list[tuple[float, float | None, str]]] = {}
    batches: list[BatchRun] = []
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
            ticks[state.instigator_name] = [
                (tick.timestamp, tick.end_timestamp, tick.status.value)
                for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1_000_000)]
        records = instance.get_run_records()
        runs = [(run.job_name, run.status.value, record.create_timestamp.timestamp())
                for record in records for run in [record.dagster_run]]
        for record in records:
            if "land_tables" not in record.dagster_run.job_name:
                continue
            first: dict[str, float] = {}
            tables, pid = 0, None
            events = instance.all_logs(record.dagster_run.run_id)
            for event in events:
                kind = event.dagster_event.event_type_value if event.dagster_event else "LOG"
                message = event.user_message or ""
                if kind == "LOG" and message.startswith("landing ") and "landing" not in first:
                    first["landing"] = event.timestamp
                    tables = int(message.split()[1])
                elif kind == DagsterEventType.ENGINE_EVENT.value and pid is None and "(pid: " in message:
                    pid = int(message.split("(pid: ", 1)[1].split(")", 1)[0])
                first.setdefault(kind, event.timestamp)
                if kind in (DagsterEventType.RUN_SUCCESS.value, DagsterEventType.RUN_FAILURE.value):
                    first["ended"] = event.timestamp
            batches.append(BatchRun(
                record.dagster_run.run_id, record.dagster_run.status.value, record.create_timestamp.timestamp(),
                tables, first.get(DagsterEventType.RUN_STARTING.value), first.get(DagsterEventType.RUN_START.value),
                first.get("landing"), first.get(DagsterEventType.ASSET_MATERIALIZATION.value), first.get("ended"),
                len(events), pid))
    return InstanceFigures(ticks, runs, sorted(batches, key=lambda batch: batch.created))


# ------------------------------------------------------------------------------------------------ the runs' phases
#
# With --phase-log, every Python process of `dagster dev` (the run workers are what matters) appends the engine's
# timed phases (engine/phases.py: its "phase X took S s" debug lines) to a file of its own: a sitecustomize module
# on PYTHONPATH sets that logger up, so the run's code and its Dagster event log stay as they are.

PHASE_LOG_SITECUSTOMIZE = """\
import logging, os
class _PerProcess(logging.Handler):  # the file of the process that logs (a forked run worker's, not its forker's)
    def emit(self, record):
        with open(os.path.join({directory!r}, f"phases-{{os.getpid()}}.log"), "a") as log:
            log.write(self.format(record) + "\\n")
_handler = _PerProcess()
_handler.setFormatter(logging.Formatter("%(created).3f %(threadName)s %(message)s"))
_logger = logging.getLogger("kafscale_lakehouse.engine.phases")
_logger.setLevel(logging.DEBUG)
_logger.addHandler(_handler)
_logger.propagate = False
"""


@dataclass(frozen=True)
class PhaseLine:
    pid: int
    name: str
    started: float
    seconds: float

    @property
    def ended(self) -> float:
        return self.started + self.seconds


def install_phase_log(workdir: Path, env: dict[str, str]) -> Path:
    directory = workdir / "phases"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(PHASE_LOG_SITECUSTOMIZE.format(directory=str(directory)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))
    return directory


def read_phase_log(directory: Path) -> list[PhaseLine]:
    lines = []
    for path in directory.glob("phases-*.log"):
        pid = int(path.stem.split("-")[1])
        for line in path.read_text(errors="replace").splitlines():
            created, _, rest = line.partition(" ")
            name = rest.partition(" phase ")[2].rpartition(" took ")
            if name[1]:
                seconds = float(name[2].split()[0])
                lines.append(PhaseLine(pid, name[0], float(created) - seconds, seconds))
    return lines


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
    dagster_dev = engine = None
    proxy: ProxyProcess | None = None
    proxy_counts: ProxyCounts | None = None
    stop = threading.Event()
    # The sampler's own: the producer stops at the end of --duration, the CPU figures cover the drain too.
    stop_sampling = threading.Event()
    sampler = ProcessSampler([], labelled={os.getpid(): "benchmark (producer, poller)"})
    for server, label in ((seaweedfs, "SeaweedFS (S3, catalog)"), (etcd, "etcd")):
        if server.proc is not None:
            sampler.labelled[server.proc.pid] = label
    landings = Landings()
    single: SingleTopic | None = None
    phase_directory: Path | None = None
    try:
        direct = parse_config(config_document(seaweedfs, etcd, seaweedfs.s3_endpoint, topics, args.watch),
                              source="benchmarks/fanout.py")
        producer = FanoutProducer(direct, [topic_name(t) for t in range(topics)], args.partitions,
                                  args.records_per_segment)
        if args.backlog_records:
            started = time.time()
            producer.write_backlog(args.backlog_records, landings)
            print(f"[N={topics}] backlog: {args.backlog_records} realistic records ({producer.kfs_bytes / 1e6:.1f} MB "
                  f"of zstd segments; {len(landings.landed)} segments of at most {args.records_per_segment} records; "
                  f"{args.partitions} partitions per topic) written in {time.time() - started:.1f} s, before the "
                  f"deployment starts; load {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
        else:
            producer.round_once()  # as `make demo`: the topics exist before the definitions load (not measured)
        if args.proxy:
            proxy = ProxyProcess(int(seaweedfs.s3_endpoint.rsplit(":", 1)[1]))
        document = config_document(seaweedfs, etcd, proxy.endpoint if proxy else seaweedfs.s3_endpoint, topics,
                                   args.watch, args.max_batch_runs)
        config_path = workdir / "lakehouse.yaml"
        config_path.write_text(json.dumps(document))  # JSON is YAML
        home = dagster_home(workdir, args, REPO_ROOT / "dagster.yaml")  # as `make demo`
        instance_yaml = home / "dagster.yaml"
        if args.max_concurrent_runs:
            set_max_concurrent_runs(instance_yaml, args.max_concurrent_runs)
        # Bytecode caches as an installed package has them (PYTHONDONTWRITEBYTECODE, set in some shells, would have
        # every run worker compile this project's modules again: ~0.6 CPU-s a run).
        env = with_bytecode_cache({**os.environ, "DAGSTER_HOME": str(home),
                                   CONFIG_PATH_ENV_VAR: str(config_path)}, workdir / "pycache")
        env.pop(SPARK_REMOTE_VARIABLE, None)
        port, engine_port = free_ports(2)
        url = f"http://127.0.0.1:{port}"
        started = time.time()
        engine = start_spark_engine(workdir, env, engine_port)
        engine_address = ConnectAddress("127.0.0.1", engine_port)
        env[SPARK_REMOTE_VARIABLE] = f"sc://127.0.0.1:{engine_port}"
        if args.backlog_records and args.single_topic:
            wait_until_ready(engine, engine_address, log_path=workdir / "engine.log")
            single = measure_single_topic(args, seaweedfs, etcd, env[SPARK_REMOTE_VARIABLE])
        if args.phase_log:
            phase_directory = install_phase_log(workdir, env)
        deployment_started = time.time()
        dagster_dev = start_dagster_dev(workdir, env, port)
        sampler.roots[:] = [dagster_dev.pid, engine.pid]
        if proxy is not None:
            proxy.set_roots(sampler.roots)
        sampler.sample()  # CPU is counted from here (the single-topic run's is not)
        with sampler.lock:
            sampler.measuring = bool(args.backlog_records)  # a backlog is measured from dagster dev's start
        sampling = threading.Thread(target=run_sampler, args=(sampler, stop_sampling), name="sampler", daemon=True)
        sampling.start()
        wait_until_ready(engine, engine_address, log_path=workdir / "engine.log")
        wait_for_webserver(url, ingest_job_name(document["mappings"][0]["table"]), dagster_dev,
                           workdir / "dagster.log")
        webserver_up = time.time()
        if args.backlog_records:
            print(f"[N={topics}] dagster dev up after {webserver_up - deployment_started:.1f} s; waiting for the "
                  f"backlog (at most {args.backlog_timeout:g} s; watch {args.watch}); load "
                  f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
            load_samples = wait_for_backlog(args, dagster_dev, workdir, etcd, landings)
            measuring_from, producing_ended = deployment_started, time.time()
        else:
            print(f"[N={topics}] engine and dagster dev up after {webserver_up - started:.1f} s; producing for "
                  f"{args.duration:g} s ({topics} topics x {args.partitions} partitions, a segment of "
                  f"{args.records_per_segment} records each every {args.interval_seconds:g} s; watch "
                  f"{args.watch}); load {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
            measuring_from = time.time()
            with sampler.lock:
                sampler.measuring = True
            load_samples, producing_ended = stream(args, producer, dagster_dev, workdir, etcd, landings, stop)
        measured_until = time.time()
        stop_sampling.set()
        figures = read_instance(home)  # before stopping: runs in flight are not yet interrupted
    finally:
        stop.set()
        stop_sampling.set()
        if dagster_dev is not None:
            stop_process_group(dagster_dev)
        if engine is not None:
            stop_process_group(engine)
        if proxy is not None:
            proxy_counts = proxy.stop()
        etcd.stop()
        seaweedfs.stop()
    if args.backlog_records:
        report_backlog(args, topics, producer.kfs_bytes, landings, figures, proxy_counts, sampler,
                       deployment_started, webserver_up, measured_until, load_samples, single,
                       read_phase_log(phase_directory) if phase_directory else None)
    else:
        report(args, topics, landings, figures, proxy_counts, sampler, measuring_from, producing_ended,
               measured_until, load_samples, read_phase_log(phase_directory) if phase_directory else None)


def stream(args: argparse.Namespace, producer: FanoutProducer, dagster_dev: subprocess.Popen, workdir: Path,
           etcd: Etcd, landings: Landings, stop: threading.Event) -> tuple[list[float], float]:
    """Realistic traffic for `--duration` seconds, then up to `--drain-seconds` for the last segments: the load
    average samples and when producing ended."""
    producing = threading.Thread(target=producer.run, args=(args.interval_seconds, stop, landings),
                                 name="producer", daemon=True)
    producing.start()
    load_samples = [os.getloadavg()[0]]
    with EtcdClient([etcd.endpoint]) as client:
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            if dagster_dev.poll() is not None:
                raise SystemExit(f"dagster dev exited with {dagster_dev.returncode}; log:\n"
                                 f"{log_tail(workdir / 'dagster.log')}")
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
    return load_samples, producing_ended


def wait_for_backlog(args: argparse.Namespace, dagster_dev: subprocess.Popen, workdir: Path, etcd: Etcd,
                     landings: Landings) -> list[float]:
    """Until every backlog segment is visible (or `--backlog-timeout`): the load average samples."""
    load_samples = [os.getloadavg()[0]]
    with EtcdClient([etcd.endpoint]) as client:
        deadline = time.monotonic() + args.backlog_timeout
        while landings.pending() and time.monotonic() < deadline:
            if dagster_dev.poll() is not None:
                raise SystemExit(f"dagster dev exited with {dagster_dev.returncode}; log:\n"
                                 f"{log_tail(workdir / 'dagster.log')}")
            poll_committed(client, landings)
            load_samples.append(os.getloadavg()[0])
            time.sleep(args.poll_seconds)
    return load_samples


# ------------------------------------------------------------------------------------------------ one topic


SINGLE_NAMESPACE = "single-topic"  # not under the deployment's namespace "fanout/" (its watch lists that prefix)


@dataclass
class SingleTopic:
    """The same records as the backlog in one topic, landed by benchmarks/ingest.py's code path."""

    records: int
    partitions: int
    segments: int
    megabytes: float
    seconds: float
    warmup_seconds: float
    runs: int
    load: float
    phases: dict[str, float]


def measure_single_topic(args: argparse.Namespace, seaweedfs: SeaweedFS, etcd: Etcd, remote: str) -> SingleTopic:
    """benchmarks/ingest.py's measurement (`ingest_all`: runs of `ingest_mapping` in this process until every record
    is in; a warm-up run first that starts the engine's Python workers, not counted) of one topic holding as many
    records of the same mix as the backlog, in segments of the same size, on the deployment's engine, before the
    deployment starts: the single-topic figure of the same machine in the same minutes."""
    from ingest import PhaseTimer, ingest_all  # benchmarks/ingest.py; its imports are heavy, so only here

    from kafscale_lakehouse.engine.ingestion.run import IngestContext
    from kafscale_lakehouse.engine.spark.session import get_spark_session

    document = config_document(seaweedfs, etcd, seaweedfs.s3_endpoint, 0, args.watch)
    document["s3"]["namespace"] = document["offsets"]["key_prefix"] = SINGLE_NAMESPACE
    document["mappings"] = [mapping_document("single", "fanout_single.pizzas"),
                            mapping_document("warmup", "fanout_single.warmup")]
    config = parse_config(document, source="benchmarks/fanout.py (one topic)")
    warmup = FanoutProducer(config, ["warmup"], 2, 100)
    warmup.write_backlog(200, Landings())
    producer = FanoutProducer(config, ["single"], args.single_topic_partitions, args.records_per_segment)
    landings = Landings()
    producer.write_backlog(args.backlog_records, landings)
    spark = get_spark_session(remote=remote, app_name="fanout-single-topic")
    context = IngestContext.from_config(config, spark)
    try:
        started = time.perf_counter()
        ingest_all(context, "warmup", 200)
        warmup_seconds = time.perf_counter() - started
        load = os.getloadavg()[0]
        timer = PhaseTimer()
        started = time.perf_counter()
        with timer.listening():
            runs = ingest_all(context, "single", args.backlog_records)
        seconds = time.perf_counter() - started
    finally:
        context.close()
        # While the engine is up: a Connect session left open retries releasing its executions at exit, for minutes
        # once the engine is gone. Stopping a client session does not stop the engine.
        spark.stop()
    return SingleTopic(args.backlog_records, args.single_topic_partitions, len(landings.landed),
                       producer.kfs_bytes / 1e6, seconds, warmup_seconds, runs, load, dict(timer.seconds))


# ------------------------------------------------------------------------------------------------ output


def report(args: argparse.Namespace, topics: int, landings: Landings, figures: InstanceFigures,
           proxy_counts: ProxyCounts | None, sampler: ProcessSampler, start: float, producing_ended: float,
           measured_until: float, load_samples: list[float], phases: list[PhaseLine] | None = None) -> None:
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
          f"{dequeue_interval_seconds(REPO_ROOT / 'dagster.yaml')} s")
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

    print_batches(figures.batches, start, measured_until, phases)
    counts = print_ticks(figures, "while producing", start, producing_ended)
    if proxy_counts is None:
        print("S3 requests: not counted (--no-proxy)")
    else:
        print_s3_requests(proxy_counts, counts, "while producing", start, producing_ended)
    print_processes(sampler, "while producing and draining", measured_until - start)

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


BATCH_ROWS = 20  # land_tables runs printed one by one


def _seconds(start: float | None, end: float | None) -> str:
    return f"{end - start:7.1f}" if start is not None and end is not None else "      -"


def print_batches(batches: list[BatchRun], start: float, end: float, phases: list[PhaseLine] | None) -> None:
    """Where each land_tables run created between `start` and `end` spent its time: its Dagster events' milestones
    and, with the phase log, the engine's phases in its run worker."""
    batches = [batch for batch in batches if start <= batch.created < end]
    if not batches:
        return
    print(f"land_tables runs: {len(batches)} (seconds between their events: queued = created → launched, launch = "
          "→ run worker running, start = → the op's 'landing N tables' (resources, step), work = → first "
          "materialization (prepare, Spark job, commits, checks), events = → run end (materializations, check "
          "results: one event-log write each))")
    with_phases = phases is not None
    print("  run       status   tables queued  launch   start    work  events  total  events"
          + ("  prepare    Spark  commits(n)  checks" if with_phases else ""))
    for batch in batches[:BATCH_ROWS]:
        line = (f"  {batch.run_id[:8]}  {batch.status[:7]:<7} {batch.tables:6d}"
                f" {_seconds(batch.created, batch.starting)} {_seconds(batch.starting, batch.started)}"
                f" {_seconds(batch.started, batch.landing)}"
                f" {_seconds(batch.landing, batch.first_materialization)}"
                f" {_seconds(batch.first_materialization, batch.ended)} {_seconds(batch.created, batch.ended)}"
                f" {batch.events:7d}")
        if with_phases and phases is not None:
            line += batch_phases(batch, phases)
        print(line)
    if len(batches) > BATCH_ROWS:
        print(f"  ... {len(batches) - BATCH_ROWS} more")
    if with_phases and phases is not None:
        totals: dict[str, float] = defaultdict(float)
        counts: Counter[str] = Counter()
        pids = {batch.pid for batch in batches}
        for phase in phases:
            if phase.pid in pids:
                totals[phase.name] += phase.seconds
                counts[phase.name] += 1
        print("  engine phases summed over these runs' workers (seconds on all threads, calls): " + ", ".join(
            f"{name} {seconds:.1f} s ({counts[name]})"
            for name, seconds in sorted(totals.items(), key=lambda item: -item[1])))


def batch_phases(batch: BatchRun, phases: list[PhaseLine]) -> str:
    """prepare = 'landing' log → the Spark job's start; Spark = the batch's Spark job; commits = first commit's
    start → last commit's end (how many); checks = last commit's end → first materialization."""
    mine = [phase for phase in phases if phase.pid == batch.pid]
    spark = [phase for phase in mine if phase.name.startswith("Spark job")]
    commits = [phase for phase in mine if "commit" in phase.name and phase.name.startswith("Iceberg")]
    if not spark or batch.landing is None:
        return "        -        -           -       -"
    commits_start = min((phase.started for phase in commits), default=None)
    commits_end = max((phase.ended for phase in commits), default=None)
    return (f" {_seconds(batch.landing, spark[0].started)}  {spark[0].seconds:7.1f}"
            f" {_seconds(commits_start, commits_end)}({len(commits):3d})"
            f" {_seconds(commits_end, batch.first_materialization)}")


def report_backlog(args: argparse.Namespace, topics: int, kfs_bytes: int, landings: Landings,
                   figures: InstanceFigures, proxy_counts: ProxyCounts | None, sampler: ProcessSampler,
                   deployment_started: float, webserver_up: float, measured_until: float, load_samples: list[float],
                   single: SingleTopic | None, phases: list[PhaseLine] | None) -> None:
    with landings.lock:
        landed, visible, records = dict(landings.landed), dict(landings.visible), dict(landings.records)
    visible_records = sum(records[segment] for segment in visible)
    batches = [batch for batch in figures.batches if batch.created >= deployment_started]
    first_run_start = min((batch.started for batch in batches if batch.started is not None), default=None)
    print(f"\n=== N = {topics} topics, watch {args.watch}, backlog: {sum(records.values())} records "
          f"({kfs_bytes / 1e6:.1f} MB, {len(landed)} segments), {visible_records} visible "
          f"({len(visible)} of {len(landed)} segments"
          + (")" if len(visible) == len(landed) else f"; NOT all within --backlog-timeout {args.backlog_timeout:g} s)")
          + f"; load average {min(load_samples):.1f}-{max(load_samples):.1f} (median "
          f"{statistics.median(load_samples):.1f}) on {os.cpu_count()} cores")
    runs = Counter(f"{job} {status.lower()}" for job, status, created in figures.runs if created >= deployment_started)
    print("runs: " + ", ".join(f"{name} {count}" for name, count in runs.most_common()))
    rate = rate_from_run = None
    if visible:
        last_visible = max(visible.values())
        rate = visible_records / (last_visible - deployment_started)
        line = (f"backlog visible {last_visible - deployment_started:.1f} s after dagster dev's start (the webserver "
                f"answered after {webserver_up - deployment_started:.1f} s) = {rate:,.0f} records/s")
        if first_run_start is not None:
            rate_from_run = visible_records / (last_visible - first_run_start)
            line += (f"; {last_visible - first_run_start:.1f} s after the first land_tables run started = "
                     f"{rate_from_run:,.0f} records/s")
        print(line)
    if single is not None:
        single_rate = single.records / single.seconds
        print(f"single topic of the same records ({single.partitions} partitions, {single.segments} segments, "
              f"{single.megabytes:.1f} MB), benchmarks/ingest.py's code path (runs of ingest_mapping in one process) "
              f"on the same engine just before dagster dev started (load {single.load:.1f}): {single.seconds:.1f} s in "
              f"{single.runs} run(s) = {single_rate:,.0f} records/s (warm-up run {single.warmup_seconds:.1f} s not "
              "counted); phases: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in
                                                sorted(single.phases.items(), key=lambda item: -item[1])))
        compare_with_single_topic("the same invocation's single topic", single_rate, rate, rate_from_run)
    if args.single_topic_records_per_second:
        compare_with_single_topic("--single-topic-records-per-second", args.single_topic_records_per_second, rate,
                                  rate_from_run)
    print_batches(figures.batches, deployment_started, measured_until, phases)
    counts = print_ticks(figures, "until the backlog was visible", deployment_started, measured_until)
    if proxy_counts is None:
        print("S3 requests: not counted (--no-proxy)")
    else:
        print_s3_requests(proxy_counts, counts, "until the backlog was visible", deployment_started, measured_until)
    print_processes(sampler, "from dagster dev's start until the backlog was visible",
                    measured_until - deployment_started)


def compare_with_single_topic(label: str, single_rate: float, rate: float | None,
                              rate_from_run: float | None) -> None:
    if rate is None:
        print(f"aggregate against {label} ({single_rate:,.0f} records/s): nothing visible")
        return
    print(f"aggregate against {label} ({single_rate:,.0f} records/s): "
          + (f"{rate_from_run / single_rate:.1%} from the first run's start, " if rate_from_run else "")
          + f"{rate / single_rate:.1%} from dagster dev's start (target >= 70%)", flush=True)


def print_ticks(figures: InstanceFigures, label: str, start: float, end: float) -> Counter[str]:
    """Tick durations per sensor kind of the ticks that started between `start` and `end`; the ticks per kind."""
    print(f"sensor ticks {label} (duration = tick start → end, the instance's tick records):")
    by_kind: dict[str, list[float]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for name, ticks in figures.ticks.items():
        for started, ended, _status in ticks:
            if start <= started < end:
                counts[sensor_kind(name)] += 1
                if ended is not None:
                    by_kind[sensor_kind(name)].append(ended - started)
    for kind, durations in sorted(by_kind.items()):
        print(f"  {kind:<26} {counts[kind]:6d} ticks ({counts[kind] / (end - start) * 60:.0f}/min), duration p50 "
              f"{percentile(durations, 0.5):.3f} s, p90 {percentile(durations, 0.9):.3f} s, max {max(durations):.3f} s")
    return counts


def print_processes(sampler: ProcessSampler, label: str, seconds: float) -> None:
    cpu = sampler.cpu_seconds()
    print(f"CPU seconds and peak RSS {label} ({seconds:.0f} s):")
    for kind in sorted(set(cpu) | set(sampler.peak_rss)):
        print(f"  {kind:<24} CPU {cpu.get(kind, 0.0):7.1f} s ({cpu.get(kind, 0.0) / seconds:.2f} "
              f"cores)  peak RSS {sampler.peak_rss.get(kind, 0) / 2**20:7.0f} MB (largest process "
              f"{sampler.peak_process_rss.get(kind, 0) / 2**20:.0f} MB)")
    with sampler.lock:
        busy = (sampler.machine_ticks - sampler.baseline_machine_ticks) / CLOCK_TICKS
    print(f"  the machine in all: {busy:.1f} CPU-s busy = {busy / seconds:.2f} of {os.cpu_count()} cores")
    daemon_code = sampler.peak_rss.get("daemon", 0) + sampler.peak_rss.get("code server", 0)
    print(f"  daemon + code server peak RSS {daemon_code / 2**20:.0f} MB (target < 1536 MB)")


def print_s3_requests(proxy_counts: ProxyCounts, ticks: Counter[str], label: str, start: float, end: float) -> None:
    s3 = proxy_counts.between(start, end)
    sensor_requests = Counter({kind: count for (owner, kind), count in s3.items() if owner == "code server"})
    ingest_ticks = ticks.get("namespace watch", 0) + ticks.get("per-table ingest sensors", 0)
    print(f"S3 requests of the code server (sensors) {label}: {sum(sensor_requests.values())} ("
          + ", ".join(f"{kind} {count}" for kind, count in sensor_requests.most_common()) + ")"
          + (f" = {sum(sensor_requests.values()) / ingest_ticks:.1f} per ingest-sensor tick, "
             f"{sensor_requests.get('LIST', 0) / ingest_ticks:.1f} lists" if ingest_ticks else ""))
    print(f"S3 requests by process kind {label}: " + ", ".join(
        f"{owner}/{kind} {count}" for (owner, kind), count in s3.most_common()))
    print(f"S3 proxy (a process of its own): {len(proxy_counts.requests)} requests in all, CPU "
          f"{proxy_counts.cpu_seconds:.1f} s; {proxy_counts.connections} client connections, their owners found in "
          f"{proxy_counts.owner_seconds:.1f} s; {proxy_counts.reopened} "
          f"upstream connections SeaweedFS had closed reopened (request sent again), "
          + (", ".join(f"{count} {name}" for name, count in proxy_counts.failed.items()) or "0")
          + f" requests failed (502 to the client); {proxy_counts.client_resets} connections reset by their client "
            "between requests")


def set_max_concurrent_runs(instance_yaml: Path, limit: int) -> None:
    """The instance's run limit (`concurrency.runs.max_concurrent_runs`) set to `limit` in its dagster.yaml."""
    document = yaml.safe_load(instance_yaml.read_text(encoding="utf-8"))
    document.setdefault("concurrency", {}).setdefault("runs", {})["max_concurrent_runs"] = limit
    instance_yaml.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, nargs="+", default=[10, 50, 200], help="values of N, one run each")
    parser.add_argument("--watch", choices=("per_table", "namespace"), default="per_table",
                        help="processor.watch: a sensor per table (default) or one namespace watch")
    parser.add_argument("--max-batch-runs", type=int, default=None,
                        help="processor.max_batch_runs of the namespace watch (default: the config's default, 2)")
    parser.add_argument("--max-concurrent-runs", type=int, default=None,
                        help="the instance's concurrency.runs.max_concurrent_runs (default: dagster.yaml's, 4)")
    parser.add_argument("--duration", type=float, default=300, help="seconds of producing (default 300)")
    parser.add_argument("--drain-seconds", type=float, default=180)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--interval-seconds", type=float, default=10.0,
                        help="seconds between two segments of a partition")
    parser.add_argument("--records-per-segment", type=int, default=None,
                        help="40 by default (a segment per 10 s of realistic traffic); with --backlog-records 10000 "
                             "(benchmarks/ingest.py's default)")
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="how often the committed offsets are read")
    parser.add_argument("--single-topic-records-per-second", type=float, default=None,
                        help="benchmarks/ingest.py's records/s on this machine, to compare the aggregate with")
    parser.add_argument("--backlog-records", type=int, default=0,
                        help="saturating mode: this many records in all, spread over the topics' partitions, are "
                             "written before the deployment starts; measured: the time until all are visible "
                             "(landed records/s). 0 (default): realistic traffic for --duration")
    parser.add_argument("--single-topic", action="store_true",
                        help="with --backlog-records: first land the same records as one topic with "
                             "benchmarks/ingest.py's code path on the same engine (the single-topic figure)")
    parser.add_argument("--single-topic-partitions", type=int, default=4,
                        help="partitions of that one topic (4, as benchmarks/ingest.py's default)")
    parser.add_argument("--backlog-timeout", type=float, default=900,
                        help="seconds to wait for the backlog after dagster dev started")
    parser.add_argument("--phase-log", action="store_true",
                        help="the run workers log the engine's phases to files of their own (a sitecustomize on "
                             "PYTHONPATH): prepare, Spark job, commits and checks per land_tables run")
    parser.add_argument("--no-proxy", dest="proxy", action="store_false",
                        help="S3 straight to SeaweedFS, not through the counting proxy (S3 requests not counted): "
                             "what the proxy costs is the difference")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories (logs, data)")
    add_instance_options(parser)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: --duration 60 --drain-seconds 60 unless given")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.quick:
        given = " ".join(sys.argv)
        args.duration = args.duration if "--duration" in given else 60
        args.drain_seconds = args.drain_seconds if "--drain-seconds" in given else 60
    if args.records_per_segment is None:
        args.records_per_segment = 10_000 if args.backlog_records else 40
    args.poll_interval_label = "processor.poll_interval_seconds (default 5 s)"
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
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
