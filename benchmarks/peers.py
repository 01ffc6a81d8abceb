"""The peers side by side: KafScale's Go Iceberg processor, Iceberg's Kafka Connect sink and this project, landing
the same records on one machine in one run.

Run from the repository root after `make install-test`, the jars (`mvn -q -f benchmarks/peers/pom.xml
dependency:copy-dependencies@kafka dependency:copy-dependencies@sink`) and a hand-built Go processor
(benchmarks/peers/README.md says how):

    .venv/bin/python benchmarks/peers.py --go-processor /tmp/ksplat/iceberg-processor [--records 2000000]
        [--partitions 4] [--freshness-seconds 90] [--freshness-mib-per-second 2] [--systems ...]

Servers: SeaweedFS (S3 and its Iceberg REST catalog: the one catalog every system writes to), an etcd for the
KafScale broker and this project, another etcd for the Go processor (both processors use the keys `processors/...`),
KafScale's broker (segments in the SeaweedFS bucket) and Apache Kafka in KRaft mode (Maven Central jars).

Records: realistic pizza orders (apps/workload.py: key, 1-3 trace headers with values of their own, values of
mixed size), produced by librdkafka (confluent-kafka) with acks=all, one producer per codec (none, gzip, snappy,
lz4, zstd) taking turns, to both brokers at once; every order id is unique, so a table's duplicates are its rows
less its distinct order ids.

Systems, one after the other (each alone on the cores; brokers and servers are not counted in its figures):
- `go`: KafScale's Go processor, one process per partition (a process holds one partition's lease), reading the
  KafScale broker's segments, its own etcd;
- `cli`: `kafscale-lakehouse ingest` (the processor loop) with SPARK_REMOTE on a long-lived `kafscale-lakehouse
  spark-engine` (started before; its start is printed apart);
- `dagster`: `dagster dev` with the repository's dagster.yaml and the demo's mapping (sensor + run), on the same
  engine;
- `connect-5`, `connect-300`: Iceberg's Kafka Connect sink in a standalone worker on the Apache Kafka broker, with
  the commit interval matching ours (the sensor's and the loop's 5 s) and at its default (300 s).

Per system: the backlog (`--records`) from the system's start until every row is visible (a reader polling the
table's current snapshot), CPU seconds and peak RSS of all its processes (sampled from /proc), Iceberg commits and
data files; then freshness: the system restarted on a topic of its own, primed with one record per partition, a
steady producer of `--freshness-mib-per-second` for `--freshness-seconds`, each record's broker acknowledgement
time against the first poll at which the table held that many rows (the k-th acknowledged record counts visible
once the table holds k of the measured records: exact where records land in acknowledgement order).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow.compute as pc
import yaml

from kafscale_lakehouse.apps.workload import ALL_CODECS, PIZZA_COLUMNS, pizza_order
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE, ConnectAddress, wait_until_ready
from kafscale_lakehouse.orchestration.dagster_home import write_dagster_home

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import (  # the demo's process handling
    start_dagster_dev,
    start_spark_engine,
    stop_process_group,
    with_bytecode_cache,
)
from kafscale_lakehouse_tests.support.process_usage import _all_process_stats
from kafscale_lakehouse_tests.support.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    Etcd,
    SeaweedFS,
    _stop,
    _tcp_open,
    _wait_for,
    free_ports,
    log_tail,
)

log = logging.getLogger("benchmarks.peers")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
JARS = ROOT / "benchmarks" / "peers" / "target"
DEFAULT_BROKER = next(iter(sorted((ROOT / ".tools" / "bin").glob("kafscale-broker-*"))), Path("/tmp/gotools/broker"))
S3_NAMESPACE = "peers"  # the KafScale broker's segment prefix
ICEBERG_NAMESPACE = "peers"
BACKLOG_TOPIC = "pizza-orders"  # the broker seeds a topic "orders" of 1 partition
OUR_INTERVAL_SECONDS = 5  # processor.poll_interval_seconds: the sensor's minimum interval and the CLI loop's
CORES = os.cpu_count() or 1
SYSTEMS = ("go", "cli", "dagster", "connect-5", "connect-300")
POLL_SECONDS = 0.5


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


# ------------------------------------------------------------------------------------------------ servers


@dataclass
class Server:
    """A process of its own session (so its whole group stops), its log in `log_path`."""

    label: str
    proc: subprocess.Popen
    log_path: Path

    @classmethod
    def spawn(cls, label: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Server:
        proc = subprocess.Popen(list(argv), stdout=log_path.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        return cls(label, proc, log_path)

    def stop(self) -> None:
        _stop(self.proc, grace=15)


def start_kafscale_broker(binary: Path, workdir: Path, seaweedfs: SeaweedFS, etcd: Etcd, partitions: int) -> tuple[
        Server, str]:
    """KafScale's broker at its defaults (4 MiB segments, 500 ms flush, a flush before every acks>0 produce answer)."""
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"KafScale broker binary {binary} not found: pass --kafscale-broker PATH")
    port, metrics_port, control_port = free_ports(3)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("KAFSCALE_", "AWS_"))}
    env.update({
        "KAFSCALE_BROKER_ADDR": f"127.0.0.1:{port}", "KAFSCALE_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
        "KAFSCALE_CONTROL_ADDR": f"127.0.0.1:{control_port}", "KAFSCALE_S3_BUCKET": S3_BUCKET,
        "KAFSCALE_S3_REGION": REGION, "KAFSCALE_S3_ENDPOINT": seaweedfs.s3_endpoint, "KAFSCALE_S3_PATH_STYLE": "true",
        "KAFSCALE_S3_ACCESS_KEY": ACCESS_KEY, "KAFSCALE_S3_SECRET_KEY": SECRET_KEY,
        "KAFSCALE_S3_NAMESPACE": S3_NAMESPACE, "KAFSCALE_ETCD_ENDPOINTS": f"http://{etcd.endpoint}",
        "KAFSCALE_AUTO_CREATE_TOPICS": "false",  # created with their partitions by create_topic
    })
    (workdir / "kafscale").mkdir()
    server = Server.spawn("KafScale broker", [str(binary)], workdir / "kafscale" / "broker.log", env,
                          workdir / "kafscale")
    _wait_for(lambda: _tcp_open(port), "KafScale broker", 60, server.proc, server.log_path)
    if "in-memory" in server.log_path.read_text(errors="replace"):
        server.stop()
        raise SystemExit(f"the KafScale broker fell back to an in-memory store:\n{log_tail(server.log_path)}")
    return server, f"127.0.0.1:{port}"


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise SystemExit("`java` not found (OpenJDK 17)")
    return found


def write_log4j2(path: Path, level: str) -> Path:
    path.write_text(f"status = warn\nappender.out.type = Console\nappender.out.name = out\n"
                    f"appender.out.layout.type = PatternLayout\nappender.out.layout.pattern = [%d] %p %c{{1}}: %m%n\n"
                    f"rootLogger.level = {level}\nrootLogger.appenderRef.out.ref = out\n")
    return path


def jvm_command(heap: str, log_config: Path, main_class: str, *args: str) -> list[str]:
    return [java(), f"-Xmx{heap}", "-XX:+UseG1GC", f"-Dlog4j2.configurationFile={log_config}",
            "-cp", f"{JARS / 'kafka'}/*", main_class, *args]


def start_kafka_broker(workdir: Path, partitions: int) -> tuple[Server, str]:
    """Apache Kafka in KRaft mode, one node that is broker and controller, replication factor 1 everywhere."""
    if not (JARS / "kafka").is_dir() or not (JARS / "plugins" / "iceberg-sink").is_dir():
        raise SystemExit(f"jars missing under {JARS}: run `mvn -q -f benchmarks/peers/pom.xml "
                         f"dependency:copy-dependencies@kafka dependency:copy-dependencies@sink`")
    directory = workdir / "kafka"
    directory.mkdir()
    port, controller_port = free_ports(2)
    properties = directory / "server.properties"
    properties.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}", "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={directory / 'data'}", f"num.partitions={partitions}", "auto.create.topics.enable=true",
        "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1", "group.initial.rebalance.delay.ms=0",
        # The orders carry their 2024 order times as record timestamps: with the default 7-day retention the broker
        # deletes them as soon as a segment rolls (measured: every sink consumer reset to the log end).
        "log.retention.ms=-1",
    ]) + "\n")
    log4j = write_log4j2(directory / "log4j2.properties", "WARN")
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    formatted = subprocess.run(jvm_command("256m", log4j, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                                           "-c", str(properties)), capture_output=True, text=True, check=False)
    if formatted.returncode:
        raise SystemExit(f"kafka-storage format failed: {formatted.stdout}{formatted.stderr}")
    server = Server.spawn("Kafka broker", jvm_command("1g", log4j, "kafka.Kafka", str(properties)),
                          directory / "broker.log")
    _wait_for(lambda: _tcp_open(port), "Kafka broker", 90, server.proc, server.log_path)
    return server, f"127.0.0.1:{port}"


# ------------------------------------------------------------------------------------------------ process figures


class GroupSampler:
    """CPU seconds and peak RSS (sum over the tree) of the processes under `roots`, sampled from /proc."""

    def __init__(self, roots: Callable[[], Sequence[int]], interval: float = 0.25):
        self._roots, self._interval = roots, interval
        self._baseline: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peers-sampler", daemon=True)
        self._known = set(_all_process_stats())  # processes already running: CPU counted from now

    def __enter__(self) -> GroupSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._sample()

    @property
    def cpu_seconds(self) -> float:
        return sum(ticks - self._baseline.get(pid, 0) for pid, ticks in self._last.items()) / os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        stats = _all_process_stats()
        children: dict[int, list[int]] = defaultdict(list)
        for pid, (parent, _, _) in stats.items():
            children[parent].append(pid)
        tree, pending = set(), [pid for pid in self._roots() if pid in stats]
        while pending:
            pid = pending.pop()
            if pid not in tree:
                tree.add(pid)
                pending.extend(children.get(pid, ()))
        for pid in tree:
            if pid not in self._baseline:
                self._baseline[pid] = stats[pid][2] if pid in self._known else 0
            self._last[pid] = stats[pid][2]
        self.peak_rss = max(self.peak_rss, sum(stats[pid][1] for pid in tree))


def process_cpu_seconds(pid: int) -> float:
    stats = _all_process_stats().get(pid)
    return stats[2] / os.sysconf("SC_CLK_TCK") if stats else 0.0


# ------------------------------------------------------------------------------------------------ records


@dataclass
class Produced:
    records: int = 0
    payload_bytes: int = 0  # keys, values and header names and values
    errors: list[str] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)  # monotonic ack times (freshness)


class Producers:
    """One librdkafka producer per codec per broker: the same records to every broker."""

    def __init__(self, bootstraps: Sequence[str], codecs: Sequence[str], linger_ms: int):
        from confluent_kafka import Producer

        self.codecs = list(codecs)
        self.by_codec = {codec: [Producer({
            "bootstrap.servers": bootstrap, "compression.type": codec, "acks": "all", "linger.ms": linger_ms,
            "batch.size": 1_000_000, "queue.buffering.max.kbytes": 256 * 1024, "enable.idempotence": False,
            "api.version.request": True,
        }) for bootstrap in bootstraps] for codec in self.codecs}

    def send(self, producer, topic: str, partition: int, record, on_delivery) -> None:
        while True:
            try:
                producer.produce(topic, value=record.value, key=record.key, partition=partition,
                                 headers=list(record.headers), timestamp=record.timestamp_ms, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    def flush(self) -> None:
        for producers in self.by_codec.values():
            for producer in producers:
                remaining = producer.flush(120)
                if remaining:
                    raise RuntimeError(f"{remaining} records not acknowledged after 120 s")

    def poll(self) -> None:
        for producers in self.by_codec.values():
            for producer in producers:
                producer.poll(0)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create `topic` with `partitions` partitions and wait until the broker's metadata lists them all."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30).values():
        try:
            future.result(60)
        except Exception as error:
            if "TOPIC_ALREADY_EXISTS" not in str(error):
                raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is not None and metadata.error is None and len(metadata.partitions) == partitions:
            return
        time.sleep(0.5)
    raise RuntimeError(f"topic {topic} on {bootstrap} does not list {partitions} partitions after 60 s")


def record_bytes(record) -> int:
    return len(record.key or b"") + len(record.value or b"") + sum(len(k) + len(v) for k, v in record.headers)


def produce_backlog(producers: Producers, topic: str, records: int, partitions: int, seed: int,
                    produced: list[Produced]) -> None:
    """`records` orders over `partitions` partitions, the codecs taking turns in equal slices."""

    def on_delivery_for(target: Produced):
        def on_delivery(error, _message) -> None:
            if error is not None:
                target.errors.append(str(error))
        return on_delivery

    callbacks = [on_delivery_for(target) for target in produced]
    per_partition = [records // partitions + (1 if p < records % partitions else 0) for p in range(partitions)]
    codecs = producers.codecs
    for turn, codec in enumerate(codecs):
        # The codec's slice is made first, then sent as fast as the client goes, so batches fill up as a busy
        # producer's do (the broker writes a segment per produce request and partition).
        ranges = [range(share * turn // len(codecs), share * (turn + 1) // len(codecs)) for share in per_partition]
        batch = [(partition, pizza_order(index, seed=seed, partition=partition, workload="realistic"))
                 for index in range(max(len(r) and r[-1] + 1 for r in ranges))
                 for partition in range(partitions) if index in ranges[partition]]
        for number, (partition, record) in enumerate(batch):
            size = record_bytes(record)
            for target, producer, callback in zip(produced, producers.by_codec[codec], callbacks, strict=True):
                producers.send(producer, topic, partition, record, callback)
                target.records += 1
                target.payload_bytes += size
            if number % 2000 == 0:
                producers.poll()
        producers.flush()


# ------------------------------------------------------------------------------------------------ tables


def open_catalog(seaweedfs: SeaweedFS):
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog("peers", uri=seaweedfs.rest_uri, warehouse=f"s3://{TABLE_BUCKET}",
                       credential=f"{ACCESS_KEY}:{SECRET_KEY}", **{
                           "s3.endpoint": seaweedfs.s3_endpoint, "s3.access-key-id": ACCESS_KEY,
                           "s3.secret-access-key": SECRET_KEY, "s3.region": REGION, "s3.path-style-access": "true"})


def visible_rows(catalog, identifier: str) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        snapshot = catalog.load_table(identifier).current_snapshot()
    except NoSuchTableError:
        return 0
    return int(snapshot.summary["total-records"]) if snapshot is not None and snapshot.summary else 0


@dataclass
class TableFigures:
    rows: int
    distinct: int
    commits: int
    data_files: int


def table_figures(catalog, identifier: str) -> TableFigures:
    """Rows and distinct order ids of the current snapshot, commits (snapshots that added rows) and data files."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return TableFigures(0, 0, 0, 0)
    if table.current_snapshot() is None:
        return TableFigures(0, 0, 0, 0)
    order_ids = table.scan(selected_fields=("order_id",)).to_arrow()["order_id"]
    commits = sum(1 for snapshot in table.snapshots()
                  if snapshot.summary is not None and int(snapshot.summary.get("added-records", 0) or 0) > 0)
    files = len(table.inspect.files())
    return TableFigures(len(order_ids), len(pc.unique(order_ids.drop_null())) if len(order_ids) else 0, commits, files)


# ------------------------------------------------------------------------------------------------ systems


@dataclass
class Environment:
    workdir: Path
    seaweedfs: SeaweedFS
    etcd: Etcd  # the KafScale broker's and this project's
    go_etcd: Etcd
    kafscale_bootstrap: str
    kafka_bootstrap: str
    partitions: int
    go_processor: Path | None
    engine_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)


class System:
    """A system landing `topic` into `table`: `start` spawns its processes, `pids` are their roots."""

    name = ""
    label = ""
    broker = "kafscale"  # or "kafka"

    def __init__(self, environment: Environment):
        self.environment = environment
        self.servers: list[Server] = []

    def start(self, topic: str, table: str, run: str) -> None:
        raise NotImplementedError

    def pids(self) -> list[int]:
        return [server.proc.pid for server in self.servers]

    def check_alive(self) -> None:
        for server in self.servers:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.label} exited with {server.proc.returncode}; log "
                                   f"{server.log_path}:\n{log_tail(server.log_path)}")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []


class GoProcessor(System):
    name, label = "go", "KafScale Go processor v1.6.0 (segments of a v1.5.0 broker)"

    def start(self, topic: str, table: str, run: str) -> None:
        e = self.environment
        if e.go_processor is None or not os.access(e.go_processor, os.X_OK):
            raise RuntimeError(f"no Go processor binary ({e.go_processor}): pass --go-processor PATH")
        directory = e.workdir / f"go-{run}"
        directory.mkdir()
        config = {
            "s3": {"bucket": S3_BUCKET, "namespace": S3_NAMESPACE, "endpoint": e.seaweedfs.s3_endpoint,
                   "region": REGION, "path_style": True},
            "iceberg": {"catalog": {"type": "rest", "uri": e.seaweedfs.rest_uri, "username": ACCESS_KEY,
                                    "password": SECRET_KEY}, "warehouse": f"s3://{TABLE_BUCKET}"},
            "offsets": {"backend": "etcd", "key_prefix": f"processors-{run}"},
            "etcd": {"endpoints": [f"http://{e.go_etcd.endpoint}"]},
            "processor": {"poll_interval_seconds": OUR_INTERVAL_SECONDS},
            "discovery": {"mode": "auto"},
            "schema": {"mode": "off"},
            "mappings": [{"topic": topic, "table": table, "mode": "append", "create_table_if_missing": True,
                          "schema": {"columns": [{"name": c.name, "type": c.type, "required": False}
                                                 for c in PIZZA_COLUMNS]},
                          "lfs": {"mode": "off"}}],
        }
        config_path = directory / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}
        # A process holds the lease of one partition at a time and keeps it: one process per partition.
        self.metrics_ports = free_ports(e.partitions)
        for number, port in enumerate(self.metrics_ports):
            self.servers.append(Server.spawn(f"Go processor {number}", [str(e.go_processor), "-config",
                                                                         str(config_path)],
                                             directory / f"processor-{number}.log",
                                             {**env, "KAFSCALE_METRICS_ADDR": f"127.0.0.1:{port}"}, directory))


    def error_counts(self) -> dict[str, float]:
        """Its `errors_total` counters by stage, summed over the processes: it logs only sink errors, so a segment
        it cannot decode shows only here."""
        counts: dict[str, float] = defaultdict(float)
        for port in self.metrics_ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith('kafscale_processor_errors_total{stage="'):
                    counts[line.split('"')[1]] += float(line.rsplit(" ", 1)[1])
        return dict(counts)

    def stop(self) -> None:
        if self.servers:
            self.last_errors = self.error_counts()
        super().stop()


def our_config(environment: Environment, topic: str, table: str, run: str) -> dict:
    """The demo's mapping of the pizza orders (lakehouse.yaml: mapped columns, day partitions) on the shared S3,
    catalog and etcd."""
    e = environment
    return {
        "s3": {"bucket": S3_BUCKET, "namespace": S3_NAMESPACE, "endpoint": e.seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": e.seaweedfs.rest_uri,
                                "credential": f"{ACCESS_KEY}:{SECRET_KEY}"}, "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": f"lakehouse-{run}"},  # `run` names the system too
        "etcd": {"endpoints": [e.etcd.endpoint]},
        "discovery": {"mode": "auto"},
        "processor": {"poll_interval_seconds": OUR_INTERVAL_SECONDS},
        "mappings": [{"topic": topic, "table": table, "create_table_if_missing": True,
                      "schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]},
                      "partition_spec": [{"source": "date_ordered", "transform": "day"}]}],
    }


class LakehouseCli(System):
    name, label = "cli", "kafscale-lakehouse ingest (CLI, engine up)"

    def start(self, topic: str, table: str, run: str) -> None:
        e = self.environment
        directory = e.workdir / f"cli-{run}"
        directory.mkdir()
        config_path = directory / "lakehouse.yaml"
        config_path.write_text(json.dumps(our_config(e, topic, table, f"{self.name}-{run}")))  # JSON is YAML
        env = {**e.env, SPARK_REMOTE_VARIABLE: e.engine_url, "KAFSCALE_LAKEHOUSE_LOG_LEVEL": "INFO"}
        self.servers.append(Server.spawn("kafscale-lakehouse ingest", [str(BIN / "kafscale-lakehouse"), "ingest",
                                                                        "--config", str(config_path)],
                                         directory / "ingest.log", env, directory))

    def stop(self) -> None:
        for server in self.servers:  # Ctrl-C, as a user stops the loop
            stop_process_group(server.proc)
        self.servers = []


class LakehouseDagster(System):
    name, label = "dagster", "kafscale-lakehouse on Dagster (sensor + run)"

    def start(self, topic: str, table: str, run: str) -> None:
        e = self.environment
        directory = e.workdir / f"dagster-{run}"
        directory.mkdir()
        config_path = directory / "lakehouse.yaml"
        config_path.write_text(json.dumps(our_config(e, topic, table, f"{self.name}-{run}")))
        dagster_home = directory / "dagster_home"
        dagster_home.mkdir()
        write_dagster_home(dagster_home, ROOT / "dagster.yaml")  # as `make demo`
        from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR

        env = {**e.env, "DAGSTER_HOME": str(dagster_home), CONFIG_PATH_ENV_VAR: str(config_path),
               SPARK_REMOTE_VARIABLE: e.engine_url}
        [port] = free_ports(1)
        proc = start_dagster_dev(directory, env, port)
        self.servers.append(Server("dagster dev", proc, directory / "dagster.log"))

    def stop(self) -> None:
        for server in self.servers:
            stop_process_group(server.proc)
        self.servers = []


class ConnectSink(System):
    broker = "kafka"

    def __init__(self, environment: Environment, interval_seconds: int):
        super().__init__(environment)
        self.interval_seconds = interval_seconds
        self.name = f"connect-{interval_seconds}"
        self.label = f"Iceberg Kafka Connect sink, commit every {interval_seconds} s"

    def start(self, topic: str, table: str, run: str) -> None:
        e = self.environment
        run = f"{self.name}-{run}"  # connector, consumer groups and control topic of this system's own
        directory = e.workdir / run
        directory.mkdir()
        [rest_port] = free_ports(1)
        worker = directory / "worker.properties"
        worker.write_text("\n".join([
            f"bootstrap.servers={e.kafka_bootstrap}",
            "key.converter=org.apache.kafka.connect.storage.StringConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable=false",
            f"offset.storage.file.filename={directory / 'connect.offsets'}", "offset.flush.interval.ms=10000",
            "consumer.auto.offset.reset=earliest",  # Connect's default for sinks, written out
            f"plugin.path={JARS / 'plugins'}", "plugin.discovery=service_load",  # the sink has its manifest
            f"listeners=http://127.0.0.1:{rest_port}",
        ]) + "\n")
        connector = directory / "iceberg-sink.properties"
        connector.write_text("\n".join([
            f"name=iceberg-{run}", "connector.class=org.apache.iceberg.connect.IcebergSinkConnector",
            f"tasks.max={e.partitions}", f"topics={topic}", f"iceberg.tables={table}",
            "iceberg.tables.auto-create-enabled=true", "iceberg.tables.evolve-schema-enabled=true",
            f"iceberg.control.topic=control-{run}", f"iceberg.control.group-id-prefix=cg-control-{run}",
            f"iceberg.control.commit.interval-ms={self.interval_seconds * 1000}",
            "iceberg.catalog.type=rest", f"iceberg.catalog.uri={e.seaweedfs.rest_uri}",
            f"iceberg.catalog.credential={ACCESS_KEY}:{SECRET_KEY}", f"iceberg.catalog.warehouse=s3://{TABLE_BUCKET}",
            "iceberg.catalog.io-impl=org.apache.iceberg.aws.s3.S3FileIO",
            f"iceberg.catalog.s3.endpoint={e.seaweedfs.s3_endpoint}", "iceberg.catalog.s3.path-style-access=true",
            f"iceberg.catalog.s3.access-key-id={ACCESS_KEY}", f"iceberg.catalog.s3.secret-access-key={SECRET_KEY}",
            f"iceberg.catalog.client.region={REGION}",
        ]) + "\n")
        log4j = write_log4j2(directory / "log4j2.properties", "INFO")
        env = {**os.environ, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
               "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        self.servers.append(Server.spawn(
            "Connect worker", jvm_command("2g", log4j, "org.apache.kafka.connect.cli.ConnectStandalone", str(worker),
                                          str(connector)), directory / "connect.log", env, directory))


# ------------------------------------------------------------------------------------------------ measuring


@dataclass
class Backlog:
    seconds: float | None = None
    cpu_seconds: float = 0.0
    peak_rss: int = 0
    table: TableFigures | None = None
    error: str | None = None
    start_note: str = ""


@dataclass
class Freshness:
    p50: float | None = None
    p90: float | None = None
    measured: int = 0
    not_visible: int = 0
    mib_per_second: float = 0.0
    error: str | None = None


def wait_until_rows(system: System, catalog, table: str, rows: int, timeout: float, stall_seconds: float = 0,
                    on_poll: Callable[[float, int], None] | None = None) -> float | None:
    """Seconds until `table` holds at least `rows` rows; None after `timeout`, or once the count has not moved for
    `stall_seconds` (when given) after the first rows showed. Raises if the system died."""
    started = time.monotonic()
    last_count, last_change = 0, started
    while time.monotonic() - started < timeout:
        now = time.monotonic()
        seen = visible_rows(catalog, table)
        if on_poll is not None:
            on_poll(now, seen)
        if seen >= rows:
            return now - started
        if seen != last_count:
            last_count, last_change = seen, now
        elif stall_seconds and seen and now - last_change > stall_seconds:
            return None
        system.check_alive()
        time.sleep(POLL_SECONDS)
    return None


def measure_backlog(system: System, catalog, topic: str, table: str, records: int, timeout: float,
                    stall_seconds: float) -> Backlog:
    result = Backlog()
    print(f"[{system.name}] backlog of {records:,} records, load {load()}", flush=True)
    try:
        with GroupSampler(system.pids) as sampler:
            started = time.monotonic()
            system.start(topic, table, "backlog")
            result.seconds = wait_until_rows(system, catalog, table, records, timeout, stall_seconds)
            sampler.stop()
            if result.seconds is None:
                result.error = (f"{visible_rows(catalog, table):,} of {records:,} rows visible after "
                                f"{time.monotonic() - started:.0f} s (timeout {timeout:.0f} s, or no new row for "
                                f"{stall_seconds:.0f} s)")
            else:
                result.seconds = time.monotonic() - started
        result.cpu_seconds, result.peak_rss = sampler.cpu_seconds, sampler.peak_rss
        time.sleep(2 * POLL_SECONDS)  # a commit just behind the last one would show as duplicates
    except Exception as error:
        log.exception("%s failed", system.name)
        result.error = f"{type(error).__name__}: {str(error)[-600:]}"
    finally:
        system.stop()
    if getattr(system, "last_errors", None):
        result.error = f"{result.error or ''}; its errors_total by stage: {system.last_errors}".lstrip("; ")
    result.table = table_figures(catalog, table)
    print(f"[{system.name}] backlog: {result.seconds and f'{result.seconds:.1f} s'}, CPU {result.cpu_seconds:.1f} s, "
          f"peak RSS {result.peak_rss / 2**20:.0f} MiB, {result.table}, error {result.error}; load {load()}",
          flush=True)
    return result


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure_freshness(system: System, catalog, bootstrap: str, partitions: int, seconds: float,
                      mib_per_second: float, seed: int, drain_seconds: float) -> Freshness:
    """The system on a topic of its own: primed (one record per partition, visible before measuring), then a
    steady producer; the k-th acknowledged record is visible once the table holds k measured rows."""
    result = Freshness()
    topic = f"fresh-{system.name}"
    table = f"{ICEBERG_NAMESPACE}.fresh_{system.name.replace('-', '_')}"
    # Uncompressed: the Go processor v1.6.0 decodes no compressed batch ("compressed batches are not supported").
    producers = Producers([bootstrap], ["none"], linger_ms=200)
    producer = producers.by_codec["none"][0]
    acks: list[float] = []
    errors: list[str] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            acks.append(time.monotonic())

    print(f"[{system.name}] freshness: {seconds:.0f} s at {mib_per_second:g} MiB/s, load {load()}", flush=True)
    try:
        create_topic(bootstrap, topic, partitions)
        for partition in range(partitions):
            producers.send(producer, topic, partition, pizza_order(0, seed=seed, partition=partition,
                                                                   workload="realistic"), on_delivery)
        producers.flush()
        system.start(topic, table, "fresh")
        if wait_until_rows(system, catalog, table, partitions, 300) is None:
            raise RuntimeError("the primed records were not visible after 300 s")
        acks.clear()
        polls: list[tuple[float, int]] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                polls.append((time.monotonic(), visible_rows(catalog, table) - partitions))
                time.sleep(POLL_SECONDS)

        poller = threading.Thread(target=poll, name="peers-freshness-poll", daemon=True)
        poller.start()
        started, sent_bytes, index = time.monotonic(), 0, 1
        while time.monotonic() - started < seconds:
            for partition in range(partitions):
                record = pizza_order(index, seed=seed, partition=partition, workload="realistic")
                producers.send(producer, topic, partition, record, on_delivery)
                sent_bytes += record_bytes(record)
            index += 1
            ahead = sent_bytes / (mib_per_second * 2**20) - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            producer.poll(0)
        producers.flush()
        result.mib_per_second = sent_bytes / 2**20 / (time.monotonic() - started)
        total = len(acks)
        deadline = time.monotonic() + drain_seconds
        while time.monotonic() < deadline and (not polls or polls[-1][1] < total):
            system.check_alive()
            time.sleep(POLL_SECONDS)
        stop.set()
        poller.join()
        ordered = sorted(acks)
        latencies, position = [], 0
        for k, acked in enumerate(ordered, start=1):
            while position < len(polls) and polls[position][1] < k:
                position += 1
            if position == len(polls):
                result.not_visible = total - k + 1
                break
            latencies.append(max(0.0, polls[position][0] - acked))
        result.measured = len(latencies)
        if latencies:
            result.p50, result.p90 = percentile(latencies, 0.5), percentile(latencies, 0.9)
        if errors:
            result.error = f"{len(errors)} produce errors, first: {errors[0]}"
    except Exception as error:
        log.exception("%s freshness failed", system.name)
        result.error = f"{type(error).__name__}: {str(error)[-600:]}"
    finally:
        system.stop()
    if getattr(system, "last_errors", None):
        result.error = f"{result.error or ''}; its errors_total by stage: {system.last_errors}".lstrip("; ")
    print(f"[{system.name}] freshness: {result}; load {load()}", flush=True)
    return result


# ------------------------------------------------------------------------------------------------ report


def mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"


def print_table(records: int, payload_bytes: int, systems: list[System], backlogs: dict[str, Backlog],
                freshness: dict[str, Freshness], brokers: dict[str, tuple[float, int]]) -> None:
    ours = backlogs.get("cli")
    print()
    print(f"backlog: {records:,} records, {payload_bytes / 2**20:,.0f} MiB of keys, values and headers; "
          f"{CORES} cores; per core = over all {CORES} cores")
    print()
    print("| system | backlog s | records/s | MiB/s per core | CPU s per M records | peak RSS | commits/min | "
          "data files/min | rows | duplicates | missing | freshness p50 / p90 s | vs CLI (records/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for system in systems:
        backlog = backlogs.get(system.name, Backlog(error="not run"))
        fresh = freshness.get(system.name)
        figures = backlog.table or TableFigures(0, 0, 0, 0)
        seconds = backlog.seconds
        rate = records / seconds if seconds else None
        minutes = seconds / 60 if seconds else None
        ratio = (f"{(ours.seconds / seconds):.2f}x" if ours and ours.seconds and seconds else "-")
        fresh_text = "-"
        if fresh is not None:
            fresh_text = (f"{fmt(fresh.p50)} / {fmt(fresh.p90)} ({fresh.measured:,} rec, {fresh.mib_per_second:.1f} "
                          f"MiB/s{f', {fresh.not_visible:,} not visible' if fresh.not_visible else ''})")
            if fresh.error:
                fresh_text += f" error: {fresh.error}"
        print(f"| {system.label} | {fmt(seconds)} | {fmt(rate, 0)} | "
              f"{fmt(payload_bytes / 2**20 / seconds / CORES if seconds else None, 2)} | "
              f"{fmt(backlog.cpu_seconds / records * 1e6 if backlog.cpu_seconds else None)} | "
              f"{mib(backlog.peak_rss) if backlog.peak_rss else '-'} | "
              f"{fmt(figures.commits / minutes if minutes else None)} | "
              f"{fmt(figures.data_files / minutes if minutes else None)} | {figures.rows:,} | "
              f"{figures.rows - figures.distinct:,} | {records - figures.distinct:,} | {fresh_text} | {ratio} |")
        if backlog.error:
            print(f"|   ↳ {system.name} error | {backlog.error} |")
    print()
    for name, (cpu, records_in) in brokers.items():
        print(f"broker {name}: {cpu:.1f} CPU s while {records_in:,} records were produced to it "
              f"({cpu / records_in * 1e6 if records_in else 0:.1f} CPU s per M records)")


# ------------------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000, help="backlog records (all partitions)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--codecs", nargs="+", default=list(ALL_CODECS), choices=ALL_CODECS)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--go-processor", type=Path, default=None, help="the hand-built Go processor binary")
    parser.add_argument("--kafscale-broker", type=Path, default=DEFAULT_BROKER, help="KafScale broker binary")
    parser.add_argument("--backlog-timeout", type=float, default=900)
    parser.add_argument("--stall-seconds", type=float, default=180,
                        help="a backlog ends when no row was added for this long (a peer that lost records)")
    parser.add_argument("--freshness-seconds", type=float, default=90, help="0: no freshness phase")
    parser.add_argument("--freshness-mib-per-second", type=float, default=2.0)
    parser.add_argument("--drain-seconds", type=float, default=120)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {CORES} cores, load {load()}; {args.records:,} records, "
          f"{args.partitions} partitions, codecs {' '.join(args.codecs)}; systems {' '.join(args.systems)}",
          flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="kafscale-peers-"))
    servers: list[Server] = []
    seaweedfs = etcd = go_etcd = engine = None
    try:
        seaweedfs = SeaweedFS(workdir / "seaweedfs").start()
        etcd = Etcd(workdir / "etcd").start()
        go_etcd = Etcd(workdir / "go-etcd").start()
        kafscale, kafscale_bootstrap = start_kafscale_broker(args.kafscale_broker, workdir, seaweedfs, etcd,
                                                             args.partitions)
        servers.append(kafscale)
        kafka, kafka_bootstrap = start_kafka_broker(workdir, args.partitions)
        servers.append(kafka)
        catalog = open_catalog(seaweedfs)
        catalog.create_namespace_if_not_exists(ICEBERG_NAMESPACE)
        environment = Environment(workdir, seaweedfs, etcd, go_etcd, kafscale_bootstrap, kafka_bootstrap,
                                  args.partitions, args.go_processor,
                                  env=with_bytecode_cache(os.environ, workdir / "pycache"))
        environment.env.pop(SPARK_REMOTE_VARIABLE, None)

        # The backlog, to both brokers at once; the brokers' CPU is shown apart.
        broker_cpu = {name: process_cpu_seconds(server.proc.pid) for name, server in
                      (("KafScale", kafscale), ("Apache Kafka", kafka))}
        produced = [Produced(), Produced()]
        started = time.monotonic()
        for bootstrap in (kafscale_bootstrap, kafka_bootstrap):
            create_topic(bootstrap, BACKLOG_TOPIC, args.partitions)
        producers = Producers([kafscale_bootstrap, kafka_bootstrap], args.codecs, linger_ms=500)
        produce_backlog(producers, BACKLOG_TOPIC, args.records, args.partitions, seed=1, produced=produced)
        produce_seconds = time.monotonic() - started
        brokers = {name: (process_cpu_seconds(server.proc.pid) - broker_cpu[name], args.records)
                   for name, server in (("KafScale", kafscale), ("Apache Kafka", kafka))}
        for name, target in zip(("KafScale", "Apache Kafka"), produced, strict=True):
            if target.errors:
                raise SystemExit(f"{len(target.errors)} records not acknowledged by {name}: {target.errors[0]}")
        segments = sum(1 for _ in seaweedfs.s3_client().get_paginator("list_objects_v2").paginate(
            Bucket=S3_BUCKET, Prefix=f"{S3_NAMESPACE}/{BACKLOG_TOPIC}/").search("Contents[?ends_with(Key, '.kfs')]"))
        print(f"produced {args.records:,} records ({produced[0].payload_bytes / 2**20:,.0f} MiB) to both brokers in "
              f"{produce_seconds:.1f} s; KafScale wrote {segments} segments; load {load()}", flush=True)

        systems: list[System] = []
        for name in args.systems:
            if name == "go":
                systems.append(GoProcessor(environment))
            elif name == "cli":
                systems.append(LakehouseCli(environment))
            elif name == "dagster":
                systems.append(LakehouseDagster(environment))
            else:
                systems.append(ConnectSink(environment, int(name.split("-")[1])))
        if any(system.name in ("cli", "dagster") for system in systems):
            [port] = free_ports(1)
            (workdir / "engine").mkdir()
            # The engine reads its Spark settings from the config in its directory, as `make demo`'s does.
            (workdir / "engine" / "lakehouse.yaml").write_text(json.dumps(
                our_config(environment, BACKLOG_TOPIC, f"{ICEBERG_NAMESPACE}.engine", "engine")))
            started = time.monotonic()
            engine = start_spark_engine(workdir / "engine", environment.env, port)
            wait_until_ready(engine, ConnectAddress("127.0.0.1", port), log_path=workdir / "engine" / "engine.log")
            environment.engine_url = f"sc://127.0.0.1:{port}"
            print(f"Spark engine (kafscale-lakehouse spark-engine) up after {time.monotonic() - started:.1f} s "
                  f"(not counted below); load {load()}", flush=True)

        backlogs: dict[str, Backlog] = {}
        freshness: dict[str, Freshness] = {}
        for number, system in enumerate(systems):
            if system.name in ("cli", "dagster"):
                roots = system.pids
                system.pids = lambda roots=roots: [*roots(), engine.pid]  # the engine works for the system
            table = f"{ICEBERG_NAMESPACE}.backlog_{system.name.replace('-', '_')}"
            backlogs[system.name] = measure_backlog(system, catalog, BACKLOG_TOPIC, table, args.records,
                                                    args.backlog_timeout, args.stall_seconds)
            if args.freshness_seconds > 0 and not (isinstance(system, ConnectSink)
                                                   and system.interval_seconds * 2 > args.freshness_seconds):
                bootstrap = kafka_bootstrap if system.broker == "kafka" else kafscale_bootstrap
                freshness[system.name] = measure_freshness(system, catalog, bootstrap, args.partitions,
                                                           args.freshness_seconds, args.freshness_mib_per_second,
                                                           seed=100 + number, drain_seconds=args.drain_seconds)
        print_table(args.records, produced[0].payload_bytes, systems, backlogs, freshness, brokers)
        print(f"\nload at the end {load()}; work directory {workdir}{'' if args.keep else ' (removed)'}")
    finally:
        if engine is not None:
            stop_process_group(engine)
        for server in reversed(servers):
            server.stop()
        for server in (go_etcd, etcd, seaweedfs):
            if server is not None:
                server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
