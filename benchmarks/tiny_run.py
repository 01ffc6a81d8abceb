"""Where a tiny run's time goes: `kafscale-lakehouse ingest --once` of a few hundred records, as a whole process.

Run from the repository root: `.venv/bin/python benchmarks/tiny_run.py [--records 400] [--repeat 3]`.
Starts SeaweedFS (S3 + Iceberg REST catalog) and etcd (`kafscale_lakehouse_tests/support/servers.py`) under a temporary
directory; before every measured run it uploads `--records` new pizza orders (realistic workload) as one segment per
partition, so each run lands records (a run with nothing pending skips the Spark job). Measures:

1. imports: a fresh interpreter's `import` of what `ingest --once` loads (`python -X importtime`), in total and the
   heaviest top-level packages, and a bare interpreter's start for comparison;
2. whole processes, spawn to exit (median of `--repeat`): `ingest --once` embedded (`KAFSCALE_SPARK_AUTO_ENGINE=0`:
   `local[2]` Spark, JVM and Python workers start in the process), then with no engine configured (the local engine
   of engine/spark/local_engine.py: the first run starts it, shown apart, the later runs reuse it; its records in
   the temporary directory, `KAFSCALE_SPARK_ENGINE_CODE_VERSION` fixed), then with a Spark engine
   (`kafscale-lakehouse spark-engine` on a loopback port, `SPARK_REMOTE`; its own start and first warm-up are shown
   apart). The local engine and the Spark engine are each measured twice: every run in its own process
   (`KAFSCALE_WARM_CLI=0`, the default), then handed to the warm process of apps/warm_cli.py (the opt-in
   `KAFSCALE_WARM_CLI=1`; the run that starts it is shown apart, the series says how many runs it served). Each run's
   log lines (timestamps) split it into: start to the first log line (interpreter, imports, config), Spark session,
   the run (planning, Spark job, commit), and exit;
3. in this process, against the engine: the run's phases (`engine.phases.phase_listener`) and its round trips
   (etcd calls, Iceberg REST requests, S3 requests by kind).

The issue's targets: a tiny run at most 5 s without an engine configured and 1.5 s with one (whole process).

Every process measured runs as an installed package does: with bytecode caches (`pip install`, as the Dockerfile
runs it, compiles them). They are kept under the temporary directory (`PYTHONPYCACHEPREFIX`), written by the first,
uncounted, start; `PYTHONDONTWRITEBYTECODE` (set in some development shells) would compile the package's ~110
modules again in every process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from kafscale_lakehouse.apps.warm_cli import WARM_CLI_VARIABLE, stop_warm_processes
from kafscale_lakehouse.apps.workload import PIZZA_COLUMNS, PIZZA_TOPIC, write_partition_segments
from kafscale_lakehouse.engine.spark.local_engine import (
    AUTO_ENGINE_VARIABLE,
    EngineRecord,
    stop_engine,
)
from kafscale_lakehouse.local_processes import CODE_VERSION_VARIABLE, DIRECTORY_VARIABLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import bench_servers, stop_process_group, with_bytecode_cache
from kafscale_lakehouse_tests.support.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    Etcd,
    SeaweedFS,
    free_ports,
)

log = logging.getLogger("benchmarks.tiny_run")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PARTITIONS = 2
# What `ingest --once` imports before it can read its config (the CLI, then run_ingest's own imports).
INGEST_IMPORTS = ("kafscale_lakehouse.apps.cli", "kafscale_lakehouse.config", "kafscale_lakehouse.engine.ingestion",
                  "kafscale_lakehouse.engine.spark")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ([\w.]+): (.*)$")


# ------------------------------------------------------------------------------------------------ workload


class Topic:
    """The benchmark's topic: every `land()` uploads `records` new orders, one segment per partition."""

    def __init__(self, s3, root: Path, namespace: str, records: int) -> None:
        self.s3, self.root, self.namespace, self.records = s3, root, namespace, records
        self.next_offset = dict.fromkeys(range(PARTITIONS), 0)

    def land(self) -> None:
        for partition in range(PARTITIONS):
            count = self.records // PARTITIONS + (1 if partition < self.records % PARTITIONS else 0)
            for segment in write_partition_segments(self.root, record_count=count, namespace=self.namespace,
                                                    topic=PIZZA_TOPIC, partition=partition,
                                                    base_offset=self.next_offset[partition], records_per_segment=count,
                                                    codecs=("zstd",), workload="realistic"):
                for path in (segment.kfs_path, segment.index_path):  # .kfs before .index, as the broker does
                    self.s3.upload_file(str(path), S3_BUCKET, path.relative_to(self.root).as_posix())
            self.next_offset[partition] += count


def config_document(seaweedfs: SeaweedFS, etcd: Etcd, namespace: str, table: str) -> dict:
    return {
        "s3": {"bucket": S3_BUCKET, "namespace": namespace, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "etcd", "key_prefix": f"tiny-{namespace}"},
        "etcd": {"endpoints": [etcd.endpoint]},
        "discovery": {"mode": "s3"},
        "spark": {"master": "local[2]", "conf": {"spark.ui.showConsoleProgress": "false"}},
        "mappings": [{"topic": PIZZA_TOPIC, "table": table, "create_table_if_missing": True,
                      "schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]}}],
    }


# ------------------------------------------------------------------------------------------------ imports


@dataclass
class ImportFigures:
    bare_seconds: float
    import_seconds: float  # wall, interpreter start + imports
    cumulative_us: int  # -X importtime, sum of the top-level imports
    by_package: dict[str, int]  # top-level package → microseconds it cost first (self time of all its modules)


def measure_imports(env: Mapping[str, str]) -> ImportFigures:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=env)
    bare = time.perf_counter() - started
    statement = "import " + ", ".join(INGEST_IMPORTS)
    subprocess.run([sys.executable, "-c", statement], check=True, env=env, cwd=ROOT)  # writes the caches
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-X", "importtime", "-c", statement],
                               check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - started
    by_package: Counter[str] = Counter()
    for line in completed.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, self_us, _, name = re.split(r"[:|]", line, maxsplit=3)
        by_package[name.strip().split(".")[0]] += int(self_us)
    cumulative = sum(by_package.values())
    return ImportFigures(bare, seconds, cumulative, dict(by_package.most_common()))


# ------------------------------------------------------------------------------------------------ whole processes


@dataclass
class ProcessRun:
    seconds: float
    split: dict[str, float] = field(default_factory=dict)
    started_engine: bool = False  # it started a local Spark engine


def run_once(config_path: Path, env: dict[str, str], log_path: Path) -> ProcessRun:
    """`kafscale-lakehouse ingest --once`, spawn to exit; split by the timestamps of its log lines."""
    spawned_wall = time.time()
    started = time.perf_counter()
    with log_path.open("w") as output:
        completed = subprocess.run([str(BIN / "kafscale-lakehouse"), "ingest", "--once", "--config", str(config_path)],
                                   stdout=output, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
    seconds = time.perf_counter() - started
    ended_wall = spawned_wall + seconds
    text = log_path.read_text(errors="replace")
    if completed.returncode:
        raise SystemExit(f"ingest --once exited with {completed.returncode}; log {log_path}:\n{text[-4000:]}")
    if not re.search(r"topic \S+ → \S+: [1-9]\d* records", text):
        raise SystemExit(f"ingest --once landed no records; log {log_path}:\n{text[-4000:]}")
    return ProcessRun(seconds, split_by_log(text, spawned_wall, ended_wall),
                      started_engine="starting a local Spark engine" in text)


def split_by_log(text: str, spawned: float, ended: float) -> dict[str, float]:
    """Seconds from spawn to the first log line, to the session being ready, to the run's result line, to exit."""
    marks: list[tuple[str, float]] = []
    for line in text.splitlines():
        match = LOG_LINE.match(line)
        if not match:
            continue
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        message = match.group(4)
        if not marks:
            marks.append(("start, imports, config (to the first log line)", stamp))
        if message.startswith(("Spark session ready", "Spark Connect session")):
            marks.append(("Spark session", stamp))
        if re.match(r"topic \S+ → \S+: \d+ records", message):
            marks.append(("run (plan, Spark job, commit)", stamp))
    split, previous = {}, spawned
    for name, stamp in marks:
        split[name] = max(0.0, stamp - previous)
        previous = stamp
    split["exit (session stop, JVM shutdown)"] = max(0.0, ended - previous)
    return split


def whole_process_runs(topic: Topic, config_path: Path, env: dict[str, str], logs: Path, repeat: int,
                       label: str) -> list[ProcessRun]:
    runs = []
    for number in range(repeat):
        topic.land()
        run = run_once(config_path, env, logs / f"{label}-{number}.log")
        log.info("%s run %d: %.2f s %s", label, number, run.seconds, run.split)
        runs.append(run)
    return runs


def warm_series(topic: Topic, config_path: Path, env: dict[str, str], logs: Path, repeat: int, label: str,
                engines: Path, title: str, target: float) -> None:
    """The opt-in: each run handed to the warm process (apps/warm_cli.py). The run that starts it is printed
    apart; every measured run must have been served by it (its log names each command it ran)."""
    warm_env = {**env, WARM_CLI_VARIABLE: "1"}
    stop_warm_processes(engines)  # another series' warm process has other variables: not this series' key
    topic.land()
    starting = run_once(config_path, warm_env, logs / f"{label}-warm-first.log")
    deadline = time.monotonic() + 120
    while not list(engines.glob("*.cli.sock")) and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"{title}, first run (runs in its own process, starts the warm process): {starting.seconds:.2f} s (not "
          f"counted)")
    served_before = warm_commands_served(engines)
    runs = whole_process_runs(topic, config_path, warm_env, logs, repeat, f"{label}-warm")
    served = warm_commands_served(engines) - served_before
    print_runs(f"{title}, handed to the warm process ({served} of {len(runs)} served by it)", runs, target)


def warm_commands_served(engines: Path) -> int:
    return sum(path.read_text().count("INFO kafscale_lakehouse.apps.warm_cli: running `")
               for path in engines.glob("*.cli.log"))


def print_runs(label: str, runs: list[ProcessRun], target: float) -> None:
    seconds = [run.seconds for run in runs]
    started = sum(run.started_engine for run in runs)
    print(f"{label}: median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, max {max(seconds):.2f}, "
          f"{len(runs)} runs; target <= {target:.1f} s)"
          + (f"; {started} of them started a local engine (the package's sources changed)" if started else ""))
    names: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for name, value in run.split.items():
            names[name].append(value)
    for name, values in names.items():
        print(f"    {name:<52} {statistics.median(values):6.2f} s")


# ------------------------------------------------------------------------------------------------ in process


def in_process_breakdown(document: dict, engine_url: str, topic: Topic) -> tuple[dict[str, float], Counter[str],
                                                                                  float, float]:
    """One run in this process against the engine: phase seconds, round trips by kind, session and context opening
    seconds. Counters patch the clients' own request methods (etcd `_call`, requests' `Session.send`)."""
    import requests

    from kafscale_lakehouse.config import parse_config
    from kafscale_lakehouse.engine.ingestion import IngestContext, ingest
    from kafscale_lakehouse.engine.phases import phase_listener
    from kafscale_lakehouse.engine.spark import get_spark_session
    from kafscale_lakehouse.etcd.client import EtcdClient

    trips: Counter[str] = Counter()
    original_call, original_send = EtcdClient._call, requests.Session.send

    def counted_call(self, operation, fn):
        # One line per kind of call: the key prefix, run ids and lease ids stripped, transactions by key count.
        kind = re.sub(r"lease [0-9a-f]+", "lease", re.sub(r"(runs/[^/]+/)[0-9a-f]{32}", r"\1<run>",
                                                           operation.replace(prefix, "")))
        kind = re.sub(r"transaction on (.*)", lambda m: f"transaction on {m.group(1).count(',') + 1} key(s)", kind)
        trips[f"etcd {kind}"] += 1
        return original_call(self, operation, fn)

    def counted_send(self, request, **kwargs):
        path = re.sub(r"/namespaces/[^/]+", "/namespaces/N", request.path_url.split("?")[0])
        path = re.sub(r"/tables/[^/]+", "/tables/T", path)
        trips[f"REST {request.method} {path}"] += 1
        return original_send(self, request, **kwargs)

    phases: dict[str, float] = defaultdict(float)
    prefix = document["offsets"]["key_prefix"] + "/"
    config = parse_config(document, source="benchmarks/tiny_run.py")
    topic.land()
    EtcdClient._call, requests.Session.send = counted_call, counted_send
    os.environ["SPARK_REMOTE"] = engine_url
    spark = None
    try:
        started = time.perf_counter()
        spark = get_spark_session(config.spark.master, dict(config.spark.conf))
        session_seconds = time.perf_counter() - started
        started = time.perf_counter()
        with IngestContext.from_config(config, spark) as context:
            context_seconds = time.perf_counter() - started
            with phase_listener(lambda name, seconds: phases.__setitem__(name, phases[name] + seconds)):
                started = time.perf_counter()
                [result] = ingest(config, spark, context=context)
                phases["(whole ingest call)"] = time.perf_counter() - started
            s3_counts = context.store.request_counts
        if result.records == 0:
            raise SystemExit("the in-process run landed no records")
        for kind, count in s3_counts.items():
            trips[f"S3 {kind}"] += count
    finally:
        EtcdClient._call, requests.Session.send = original_call, original_send
        os.environ.pop("SPARK_REMOTE", None)
        if spark is not None:
            # Closed now, while the engine runs: at exit its client would retry against the stopped engine.
            spark.stop()
    return dict(phases), trips, session_seconds, context_seconds


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400, help="records per run (over 2 partitions)")
    parser.add_argument("--repeat", type=int, default=3, help="whole-process runs per set-up (median printed)")
    parser.add_argument("--no-embedded", action="store_true", help="skip the embedded runs")
    parser.add_argument("--no-local-engine", action="store_true",
                        help="skip the runs with no engine configured (the local engine)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {os.cpu_count()} cores, load average at start "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; {args.records} records per run")

    run = uuid.uuid4().hex[:8]
    namespace = f"tiny-{run}"
    with bench_servers("kafscale-tiny-run-") as servers:
        workdir, seaweedfs, etcd = servers.workdir, servers.seaweedfs, servers.etcd
        base_env = with_bytecode_cache(os.environ, workdir / "pycache")
        imports = measure_imports(base_env)
        print(f"imports of `ingest --once` ({', '.join(INGEST_IMPORTS)}): {imports.import_seconds:.2f} s wall in a "
              f"fresh interpreter (bare interpreter {imports.bare_seconds:.2f} s); -X importtime self times: "
              f"{imports.cumulative_us / 1e6:.2f} s, by top-level package:")
        for package, microseconds in list(imports.by_package.items())[:12]:
            print(f"    {package:<30} {microseconds / 1e6:6.2f} s")
        engines = workdir / "engines"
        engine = None
        try:
            topic = Topic(seaweedfs.s3_client(), workdir / "segments", namespace, args.records)
            document = config_document(seaweedfs, etcd, namespace, f"tiny_{run}.pizzas")
            config_path = workdir / "lakehouse.yaml"
            config_path.write_text(json.dumps(document))  # JSON is YAML
            # A fixed code version, as a deployment of one release has: in a working tree that others edit while
            # this runs, the sources' hash would give nearly every run a new engine (measured: 3 of 3 at 00:57).
            # Each run in its own process unless a series says otherwise.
            env = {**base_env, "KAFSCALE_LAKEHOUSE_LOG_LEVEL": "INFO", AUTO_ENGINE_VARIABLE: "0",
                   DIRECTORY_VARIABLE: str(engines), CODE_VERSION_VARIABLE: "tiny-run", WARM_CLI_VARIABLE: "0"}
            env.pop("SPARK_REMOTE", None)
            local_env = {**env, AUTO_ENGINE_VARIABLE: "1"}
            logs = workdir / "logs"
            logs.mkdir()
            # The first run creates the table: not a tiny run's cost, so not measured.
            topic.land()
            first = run_once(config_path, env, logs / "create.log")
            print(f"first run (creates the table, embedded Spark): {first.seconds:.2f} s (not counted)")
            if not args.no_embedded:
                print_runs("ingest --once, embedded local[2] (KAFSCALE_SPARK_AUTO_ENGINE=0)",
                           whole_process_runs(topic, config_path, env, logs, args.repeat, "embedded"), 5.0)
            if not args.no_local_engine:
                topic.land()
                starting = run_once(config_path, local_env, logs / "local-first.log")
                print(f"no engine configured, first run (starts the local engine): {starting.seconds:.2f} s "
                      f"(not counted)")
                print_runs("ingest --once, no engine configured (the local engine), each in its own process",
                           whole_process_runs(topic, config_path, local_env, logs, args.repeat, "local"), 5.0)
                warm_series(topic, config_path, local_env, logs, args.repeat, "local", engines,
                            "ingest --once, no engine configured (the local engine)", 5.0)

            from kafscale_lakehouse.engine.spark.engine import ConnectAddress, wait_until_ready

            [port] = free_ports(1)
            started = time.perf_counter()
            engine = subprocess.Popen([str(BIN / "kafscale-lakehouse"), "spark-engine", "--config", str(config_path),
                                       "--address", f"127.0.0.1:{port}"], cwd=workdir, env=env,
                                      stdout=(workdir / "engine.log").open("wb"), stderr=subprocess.STDOUT,
                                      start_new_session=True)
            wait_until_ready(engine, ConnectAddress("127.0.0.1", port), log_path=workdir / "engine.log")
            engine_seconds = time.perf_counter() - started
            engine_url = f"sc://127.0.0.1:{port}"
            remote_env = {**env, "SPARK_REMOTE": engine_url}
            topic.land()
            warm = run_once(config_path, remote_env, logs / "engine-first.log")
            print(f"Spark engine: port open after {engine_seconds:.1f} s; first run on it {warm.seconds:.2f} s "
                  f"(not counted)")
            print_runs("ingest --once, Spark engine (SPARK_REMOTE), each in its own process",
                       whole_process_runs(topic, config_path, remote_env, logs, args.repeat, "engine"), 1.5)
            warm_series(topic, config_path, remote_env, logs, args.repeat, "engine", engines,
                        "ingest --once, Spark engine (SPARK_REMOTE)", 1.5)

            phases, trips, session_seconds, context_seconds = in_process_breakdown(document, engine_url, topic)
            print(f"in this process against the engine: Connect session {session_seconds:.2f} s, IngestContext "
                  f"{context_seconds:.2f} s, then the run's phases:")
            for name, seconds in sorted(phases.items(), key=lambda item: -item[1]):
                print(f"    {name:<52} {seconds:6.3f} s")
            print("round trips of that run (context opening and the run):")
            for kind, count in sorted(trips.items()):
                print(f"    {kind:<52} {count:4d}")
        finally:
            stop_warm_processes(engines)
            for record_path in engines.glob("*.json"):
                stop_engine(EngineRecord(**json.loads(record_path.read_text())))
            if engine is not None:
                stop_process_group(engine)


if __name__ == "__main__":
    main()
