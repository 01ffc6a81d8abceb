"""The harness the benchmarks share (`benchmarks/`): the servers they start in a temporary directory (SeaweedFS,
etcd), the processes of a deployment as `make demo` runs them (the Spark engine, `dagster dev`, its DAGSTER_HOME with
the opt-ins of docs/operations-one-host.md), what they measure those processes with, and the fan-out workload of
`fanout.py` and `batch_cost.py` (N topics of pizza orders). The benchmarks import it from the repository (test
support is not in the wheel)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from kafscale_lakehouse.apps.demo_producer import RECORDS_PER_BATCH, watermark_publisher
from kafscale_lakehouse.apps.workload import PIZZA_COLUMNS, pizza_orders
from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.connections import segment_store_from_config
from kafscale_lakehouse.format import EncodedSegment, encode_segment
from kafscale_lakehouse.orchestration.dagster_home import write_dagster_home
from kafscale_lakehouse_tests.support.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    Etcd,
    SeaweedFS,
    log_tail,
)

log = logging.getLogger(__name__)

BIN = Path(sys.executable).parent


# ----------------------------------------------------------------------------------------- servers

@dataclass
class BenchServers:
    workdir: Path
    seaweedfs: SeaweedFS
    etcd: Etcd | None


@contextlib.contextmanager
def bench_servers(prefix: str, *, etcd: bool = True, keep: bool = False) -> Iterator[BenchServers]:
    """A temporary directory with SeaweedFS (S3 and an Iceberg REST catalog) and, unless `etcd` is false, etcd running
    in it on free loopback ports; both stopped at the end and the directory removed (kept and named with `keep`)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    started: list[SeaweedFS | Etcd] = []
    try:
        seaweedfs = SeaweedFS(workdir / "seaweedfs").start()
        started.append(seaweedfs)
        etcd_server = Etcd(workdir / "etcd").start() if etcd else None
        if etcd_server is not None:
            started.append(etcd_server)
        yield BenchServers(workdir, seaweedfs, etcd_server)
    finally:
        for server in reversed(started):
            server.stop()
        if keep:
            log.warning("kept %s (logs, data)", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------------------- processes

STOP_GRACE_SECONDS = 30



def start_dagster_dev(workdir: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    # A session of its own, so stopping the process group also stops the daemon, code servers and run workers.
    return subprocess.Popen([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port),
                             "-m", "kafscale_lakehouse.definitions"],
                            cwd=workdir, env=env, stdout=(workdir / "dagster.log").open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)



def start_spark_engine(workdir: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    """As `make demo`: the engine command in a session of its own; it stops its Spark Connect server on Ctrl-C."""
    return subprocess.Popen([str(BIN / "kafscale-lakehouse"), "spark-engine", "--address", f"127.0.0.1:{port}"],
                            cwd=workdir, env=env, stdout=(workdir / "engine.log").open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)



def stop_process_group(process: subprocess.Popen) -> None:
    """Ctrl-C for the whole process group, as in a terminal; SIGKILL for what is left after a grace period."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_SECONDS), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(process.pid, 0)  # anything of the group still alive (children included)?
            except ProcessLookupError:
                return
            time.sleep(0.5)



def raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")



def with_bytecode_cache(env: Mapping[str, str], cache: Path) -> dict[str, str]:
    """`env` for a process that reads and writes its bytecode caches under `cache`, as an installed package runs."""
    cached = {name: value for name, value in env.items() if name != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = str(cache)
    return cached


# ------------------------------------------------------------------------------------- dagster dev

WEBSERVER_TIMEOUT_SECONDS = 180

DEFAULT_DEQUEUE_SECONDS = 5  # Dagster's QueuedRunCoordinator default

RUNS_QUERY = """
query Runs($job: String!) {
  runsOrError(filter: {pipelineName: $job}) {
    __typename
    ... on Runs { results { runId status creationTime startTime endTime } }
    ... on PythonError { message }
  }
}"""



def graphql(url: str, query: str, **variables) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    if "errors" in answer:
        raise RuntimeError(f"GraphQL errors from {url}: {answer['errors']}")
    return answer["data"]



def wait_for_webserver(url: str, job: str, dagster_dev: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + WEBSERVER_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if dagster_dev.poll() is not None:
            raise SystemExit(f"dagster dev exited with {dagster_dev.returncode}; log:\n{log_tail(log_path)}")
        try:
            graphql(url, RUNS_QUERY, job=job)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, RuntimeError):
            time.sleep(1)
    raise SystemExit(f"dagster dev webserver at {url} not answering after {WEBSERVER_TIMEOUT_SECONDS} s; log:\n"
                     f"{log_tail(log_path)}")



def dequeue_interval_seconds(instance_yaml: Path) -> int:
    """How often the run queue of the instance configured by `instance_yaml` (a dagster.yaml) starts runs."""
    instance = yaml.safe_load(instance_yaml.read_text()) or {}
    coordinator = (instance.get("run_coordinator") or {}).get("config") or {}
    return coordinator.get("dequeue_interval_seconds", DEFAULT_DEQUEUE_SECONDS)



def add_instance_options(parser: argparse.ArgumentParser) -> None:
    """The DAGSTER_HOME opt-ins of `kafscale-lakehouse dagster-home` (docs/operations-one-host.md), off by default as
    in `make demo`."""
    parser.add_argument("--kept-connections", action="store_true",
                        help="the instance's sqlite storage keeps its connections open (an opt-in)")
    parser.add_argument("--forking-launcher", action="store_true",
                        help="each run's process is forked from one that has loaded the code location (an opt-in)")


def dagster_home(workdir: Path, args: argparse.Namespace, template: Path) -> Path:
    """`workdir/dagster_home` as `make demo` makes it from `template` (the repository's dagster.yaml), with the
    opt-ins `args` asked for; returns the directory."""
    home = workdir / "dagster_home"
    write_dagster_home(home, template, kept_connections=args.kept_connections,
                       forking_launcher=args.forking_launcher)
    return home


# --------------------------------------------------------------------------------------- measuring

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# Run workers started by a code server (spawn), by `dagster api execute_run`, or forked (and their forker, whose
# command line imports serve_forks; a code server's names the launcher's module in its instance ref).
RUN_WORKER_MARKS = ("multiprocessing.spawn", "execute_run", "resource_tracker", "import serve_forks")



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
    if any(mark in cmdline for mark in RUN_WORKER_MARKS):
        return "run workers"
    if "api grpc" in cmdline or "code-server start" in cmdline or "code_server start" in cmdline:
        return "code server"
    if " dev " in f"{cmdline} ":
        return "dagster dev"
    return "other"



def proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, CPU ticks user+system, RSS bytes) of `pid`."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE_SIZE



def _machine_busy_ticks() -> int:
    """CPU ticks of every core spent not idle (user, nice, system, irq, softirq, steal) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4]  # less idle and iowait



def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""



@dataclass
class ProcessSampler:
    """Every second: the processes under `roots` (dagster dev, the engine), their kind, CPU and RSS."""

    roots: list[int]
    # Processes outside those trees, counted under a kind of their own (not their children): the servers and this
    # benchmark (producer, offsets poller, this sampler), which share the machine with the deployment.
    labelled: dict[int, str] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    cpu_ticks: dict[int, int] = field(default_factory=dict)
    baseline_ticks: dict[int, int] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by kind: peak of the kind's sum
    peak_process_rss: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)
    measuring: bool = False
    baseline_machine_ticks: int = 0  # every core's non-idle time (/proc/stat), at the start and the last sample
    machine_ticks: int = 0

    def sample(self) -> None:
        parents: dict[int, int] = {}
        stats: dict[int, tuple[int, int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            stat = proc_stat(int(entry.name))
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
            self.kinds.update(self.labelled)
            for pid in ours | set(self.labelled):
                if pid not in stats:
                    continue
                kind = self.kinds.get(pid)
                if kind is None:
                    kind = self.kinds[pid] = process_kind(process_cmdline(pid))
                ticks, rss = stats[pid]
                if not self.measuring:
                    self.baseline_ticks[pid] = ticks
                self.cpu_ticks[pid] = ticks
                rss_by_kind[kind] += rss
                if self.measuring:
                    self.peak_process_rss[kind] = max(self.peak_process_rss[kind], rss)
            busy = _machine_busy_ticks()
            if not self.measuring:
                self.baseline_machine_ticks = busy
            self.machine_ticks = busy
            if self.measuring:
                for kind, rss in rss_by_kind.items():
                    self.peak_rss[kind] = max(self.peak_rss[kind], rss)

    def cpu_seconds(self) -> dict[str, float]:
        by_kind: defaultdict[str, float] = defaultdict(float)
        with self.lock:
            for pid, ticks in self.cpu_ticks.items():
                by_kind[self.kinds[pid]] += (ticks - self.baseline_ticks.get(pid, 0)) / CLOCK_TICKS
        return dict(by_kind)



def run_sampler(sampler: ProcessSampler, stop: threading.Event) -> None:
    while not stop.is_set():
        sampler.sample()
        stop.wait(1.0)



def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest value with at least `fraction` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


# ---------------------------------------------------------------------------- the fan-out workload

KEY_PREFIX = "fanout"



def topic_name(number: int) -> str:
    return f"fan-{number:03d}"



def mapping_document(topic: str, table: str) -> dict:
    return {"topic": topic, "table": table, "create_table_if_missing": True,
            "schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]}}



def config_document(seaweedfs: SeaweedFS, etcd: Etcd, s3_endpoint: str, topics: int, watch: str,
                    max_batch_runs: int | None = None) -> dict:
    mappings = [mapping_document(topic_name(i), f"fanout.t{i:03d}") for i in range(topics)]
    return {
        "s3": {"bucket": S3_BUCKET, "namespace": KEY_PREFIX, "endpoint": s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": KEY_PREFIX},
        "etcd": {"endpoints": [etcd.endpoint]},
        "discovery": {"mode": "s3"},
        "processor": {"watch": watch, **({"max_batch_runs": max_batch_runs} if max_batch_runs else {})},
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

    def __init__(self, config: LakehouseConfig, topics: list[str], partitions: int, records_per_segment: int) -> None:
        self.store = segment_store_from_config(config)
        self.publish_watermark = watermark_publisher(config)
        self.slots = [(topic, p) for topic in topics for p in range(partitions)]
        self.records_per_segment = records_per_segment
        self.next_offsets = dict.fromkeys(self.slots, 0)
        self.kfs_bytes = 0
        self.lock = threading.Lock()
        # Every topic gets the same segment bytes for the same partition, offsets and count (`write`): generating and
        # encoding realistic records costs ~10k records/s per core, which at 200 topics took a third of a core from
        # the deployment it measures (a producer runs elsewhere in production).
        self.same_segments: dict[tuple[int, int, int], EncodedSegment] = {}

    def write(self, topic: str, partition: int, now: float, count: int | None = None,
              same_segments: dict[tuple[int, int, int], EncodedSegment] | None = None,
              ) -> tuple[tuple[str, int, int], float, int]:
        """Writes the partition's next segment of `count` (default `records_per_segment`) records. With
        `same_segments`, every topic gets the same segment bytes for the same partition, offset and count (encoded
        once: generating realistic records costs ~10k records/s per core, and the topics' contents do not matter)."""
        base = self.next_offsets[(topic, partition)]
        count = count or self.records_per_segment
        segment = same_segments.get((partition, base, count)) if same_segments is not None else None
        if segment is None:
            records = pizza_orders(base, count, partition=partition, start_ms=int(now * 1000), interval_ms=10,
                                   workload="realistic", seed=hash(topic) & 0xFFFF)
            segment = encode_segment(records, base_offset=base, codec="zstd", records_per_batch=RECORDS_PER_BATCH,
                                     created_ms=int(now * 1000))
            if same_segments is not None:
                same_segments[(partition, base, count)] = segment
        self.publish_watermark(topic, partition, segment.last_offset + 1)
        self.store.write_segment(topic, partition, base, segment.kfs, segment.index)  # returns once .index is in
        self.next_offsets[(topic, partition)] = segment.last_offset + 1
        with self.lock:
            self.kfs_bytes += len(segment.kfs)
        return (topic, partition, segment.last_offset), time.time(), count

    def round_once(self) -> None:
        """One segment per partition at once (before `dagster dev`, so the topics exist when the definitions load)."""
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda slot: self.write(slot[0], slot[1], time.time(), same_segments=self.same_segments),
                          self.slots))

    def write_backlog(self, records: int, landings: Landings) -> None:
        """`records` in all, spread evenly over the partitions, each partition's in segments of at most
        `records_per_segment` (before the deployment starts: the producer does not compete with it for the cores)."""
        per_slot = {slot: records // len(self.slots) + (1 if n < records % len(self.slots) else 0)
                    for n, slot in enumerate(self.slots)}

        def write_slot(slot: tuple[str, int]) -> None:
            left = per_slot[slot]
            while left:
                segment, landed_at, count = self.write(*slot, time.time(), min(left, self.records_per_segment),
                                                       self.same_segments)
                left -= count
                with landings.lock:
                    landings.landed[segment] = landed_at
                    landings.records[segment] = count

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(write_slot, [slot for slot, count in per_slot.items() if count]))

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
        except BaseException as exc:  # handed to the measuring thread, which stops on it
            landings.error = exc

    def _write_recorded(self, topic: str, partition: int, landings: Landings) -> None:
        try:
            segment, landed_at, records = self.write(topic, partition, time.time(), same_segments=self.same_segments)
        except BaseException as exc:  # handed to the measuring thread, which stops on it
            landings.error = exc
            return
        with landings.lock:
            landings.landed[segment] = landed_at
            landings.records[segment] = records

