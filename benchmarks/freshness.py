"""Freshness benchmark: seconds from a segment landing to its rows being visible in the table, in the demo setup.

Run from the repository root: `.venv/bin/python benchmarks/freshness.py [--duration 300] ...`.
Sets up what `make demo` runs, in a temporary directory: the repository's `lakehouse.yaml` (local segment root,
sqlite catalog, sqlite offsets; its relative paths resolve in the temporary directory) and a DAGSTER_HOME with
the repository's `dagster.yaml`; one producer round first (the definitions check that the topic exists), then
the Spark engine (`kafscale-lakehouse spark-engine`, a Spark Connect server on a free loopback port) and `dagster dev`
with `SPARK_REMOTE` pointing at it (webserver + daemon: the mapping's sensor, the run queue, a run worker process per
run, which connects to the engine instead of starting a JVM); `--engine embedded` measures the fallback, where each
run worker starts its own `local[*]` Spark (`KAFSCALE_SPARK_AUTO_ENGINE=0`: not the local engine). Once the
webserver answers, the demo producer's code (`DemoProducer`, demo defaults: a segment of 40 orders per partition,
3 partitions, every 3 s) writes segments for `--duration` seconds, recording the wall time each segment's `.index`
(the object that completes it) landed; the table's committed offsets (`kafscale.offsets.<topic>` in the current
snapshot's summary, read with pyiceberg every `--poll-seconds`) give the time each segment's last offset became
visible. After the producer stops, it waits up to `--drain-seconds` for the last segments.

Prints count, p50, p90 and max freshness for all measured segments and for those that landed after the first run
finished (steady state, without the start of `dagster dev`), the sensor interval, and the runs launched with
their launch overhead (queued → started: run queue, run worker process, code load) and duration (started → ended),
and where a run's time goes (medians between the run's Dagster events: queue, launch, resource and step start,
prepare = leases + discovery + planning, write + commit, checks and end). Every process it started is stopped on
exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pyiceberg.exceptions import NoSuchTableError

from kafscale_lakehouse.apps.demo_producer import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_PARTITIONS,
    DEFAULT_RECORDS_PER_SEGMENT,
    DemoProducer,
    watermark_publisher,
)
from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, LakehouseConfig, load_config
from kafscale_lakehouse.connections import catalog_settings, segment_store_from_config
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE, ConnectAddress, wait_until_ready
from kafscale_lakehouse.engine.spark.local_engine import AUTO_ENGINE_VARIABLE
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.orchestration.naming import ingest_job_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import (
    RUNS_QUERY,
    add_instance_options,
    dagster_home,
    dequeue_interval_seconds,
    graphql,
    log_tail,
    percentile,
    raise_keyboard_interrupt,
    start_dagster_dev,
    start_spark_engine,
    stop_process_group,
    wait_for_webserver,
)
from kafscale_lakehouse_tests.support.servers import free_ports

log = logging.getLogger("benchmarks.freshness")

REPO_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


RUN_EVENTS_QUERY = """
query RunEvents($runId: ID!) {
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection { events { __typename ... on MessageEvent { timestamp message } } }
    ... on PythonError { message }
  }
}"""
# Where a run's time goes: (label, event that starts the phase, event that ends it); `Log:<text>` is a log message.
RUN_PHASES = (
    ("queued (run queue, pool)", "RunEnqueuedEvent", "RunStartingEvent"),
    ("launch (run worker process, code load)", "RunStartingEvent", "RunStartEvent"),
    ("resources and step start", "RunStartEvent", "Log:preparing Kafka partitions"),
    ("prepare (leases, discovery, planning)", "Log:preparing Kafka partitions", "ExecutionStepOutputEvent"),
    ("write + commit (Spark job, Iceberg, etcd)", "ExecutionStepOutputEvent", "HandledOutputEvent"),
    ("checks and run end", "HandledOutputEvent", "RunSuccessEvent"),
)


@dataclass
class SegmentTimes:
    """When each measured segment landed and became visible, by (partition, last offset)."""

    landed: dict[tuple[int, int], float] = field(default_factory=dict)
    visible: dict[tuple[int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    producer_error: BaseException | None = None

    def pending(self) -> list[tuple[int, int]]:
        with self.lock:
            return [segment for segment in self.landed if segment not in self.visible]


@dataclass(frozen=True)
class RunTimes:
    run_id: str
    status: str
    created: float
    started: float | None
    ended: float | None


# ------------------------------------------------------------------------------------------------ processes


def job_runs(url: str, job: str) -> list[RunTimes]:
    answer = graphql(url, RUNS_QUERY, job=job)["runsOrError"]
    if answer["__typename"] != "Runs":
        raise RuntimeError(f"runs of {job}: {answer}")
    return sorted((RunTimes(run["runId"], run["status"], run["creationTime"], run["startTime"], run["endTime"])
                   for run in answer["results"]), key=lambda run: run.created)


def run_phases(url: str, runs: list[RunTimes]) -> dict[str, list[float]]:
    """Seconds spent in each of `RUN_PHASES`, per successful run."""
    phases: dict[str, list[float]] = {label: [] for label, _, _ in RUN_PHASES}
    for run in runs:
        if run.status != "SUCCESS":
            continue
        answer = graphql(url, RUN_EVENTS_QUERY, runId=run.run_id)["logsForRun"]
        if answer["__typename"] != "EventConnection":
            continue
        first: dict[str, float] = {}
        for event in answer["events"]:
            if "timestamp" not in event:
                continue
            name = event["__typename"]
            if name == "LogMessageEvent" and "preparing Kafka partitions" in (event.get("message") or ""):
                name = "Log:preparing Kafka partitions"
            first.setdefault(name, int(event["timestamp"]) / 1000)
        for label, start, end in RUN_PHASES:
            if start in first and end in first:
                phases[label].append(first[end] - first[start])
    return phases


# ------------------------------------------------------------------------------------------------ producing, polling


def produce(producer: DemoProducer, interval_seconds: float, stop: threading.Event, times: SegmentTimes) -> None:
    """A round every `interval_seconds` until `stop`, recording when each segment's `.index` landed."""
    write_segment = producer.store.write_segment
    landed_by_base_offset: dict[tuple[int, int], float] = {}

    def timed_write_segment(topic, partition, base_offset, segment, index):
        keys = write_segment(topic, partition, base_offset, segment, index)
        landed_by_base_offset[(partition, base_offset)] = time.time()  # returns once the `.index` is in place
        return keys

    producer.store.write_segment = timed_write_segment  # type: ignore[method-assign]
    interval_ms = int(interval_seconds * 1000)
    try:
        while not stop.is_set():
            started = time.monotonic()
            for segment in producer.produce_round(time.time_ns() // 1_000_000, interval_ms):
                # Keyed by the last offset, which is what the table's committed offsets are compared with.
                landed_at = landed_by_base_offset.pop((segment.partition, segment.base_offset))
                with times.lock:
                    times.landed[(segment.partition, segment.last_offset)] = landed_at
            stop.wait(max(0.0, interval_seconds - (time.monotonic() - started)))
    except BaseException as exc:
        times.producer_error = exc


def poll_visibility(config: LakehouseConfig, times: SegmentTimes) -> None:
    """Mark the segments whose last offset the table's committed offsets now cover."""
    [mapping] = config.mappings[:1]
    try:
        table = load_catalog(catalog_settings(config)).load_table(mapping.table)
    except NoSuchTableError:
        return  # the first run has not created it yet
    committed = read_topic_offsets(table, mapping.topic)  # {partition: next offset}
    seen_at = time.time()
    with times.lock:
        for partition, last_offset in list(times.landed):
            if (partition, last_offset) not in times.visible and committed.get(partition, 0) > last_offset:
                times.visible[(partition, last_offset)] = seen_at


# ------------------------------------------------------------------------------------------------ output


def print_freshness(label: str, freshness: list[float], not_visible: int) -> None:
    if not freshness:
        print(f"  {label:<38} no segments{f', {not_visible} never visible' if not_visible else ''}")
        return
    print(f"  {label:<38} {len(freshness):5d} {percentile(freshness, 0.5):7.1f} {percentile(freshness, 0.9):7.1f} "
          f"{max(freshness):7.1f}   {not_visible}")


def print_report(args: argparse.Namespace, config: LakehouseConfig, times: SegmentTimes, runs: list[RunTimes],
                 phases: dict[str, list[float]], dagster_started: float, measuring_from: float) -> None:
    with times.lock:
        landed, visible = dict(times.landed), dict(times.visible)
    first_ended = next((run.ended for run in runs if run.status == "SUCCESS" and run.ended), None)
    print("Spark: " + ("the Spark engine (Spark Connect, one server for all runs)" if args.engine == "connect"
                       else "an embedded local[*] session started by each run worker"))
    print(f"demo configuration: {args.partitions} partitions, a segment of {args.records_per_segment} orders per "
          f"partition every {args.interval_seconds:g} s; sensor minimum interval "
          f"{config.processor.poll_interval_seconds} s (processor.poll_interval_seconds); run queue dequeue interval "
          f"{dequeue_interval_seconds(REPO_ROOT / 'dagster.yaml')} s (dagster.yaml); visibility polled every "
          f"{args.poll_seconds:g} s")
    print(f"dagster dev webserver up {measuring_from - dagster_started:.1f} s after start; first run finished "
          + (f"{first_ended - dagster_started:.1f} s after start" if first_ended else "never"))
    print(f"freshness (s, segment .index landed → last offset visible in {config.mappings[0].table}):")
    print(f"  {'segments':<38} {'count':>5} {'p50':>7} {'p90':>7} {'max':>7}   never visible")
    print_freshness("all measured", [visible[s] - landed[s] for s in landed if s in visible],
                    sum(1 for s in landed if s not in visible))
    if first_ended is not None:
        steady = [s for s in landed if landed[s] >= first_ended]
        print_freshness("landed after the first run finished", [visible[s] - landed[s] for s in steady if s in visible],
                        sum(1 for s in steady if s not in visible))

    finished = [run for run in runs if run.started is not None and run.ended is not None]
    statuses = Counter(run.status for run in runs)
    print(f"runs launched: {len(runs)} ("
          + ", ".join(f"{count} {status.lower()}" for status, count in sorted(statuses.items())) + ")")
    if statuses.get("FAILURE"):
        print("  some runs failed: their errors are in dagster.log of the temporary directory (keep it with --keep)")
    if finished:
        launch = [run.started - run.created for run in finished]
        duration = [run.ended - run.started for run in finished]
        print(f"  launch overhead (queued → started): median {statistics.median(launch):.1f} s, "
              f"max {max(launch):.1f} s")
        print(f"  run duration (started → ended, Spark session start included): median "
              f"{statistics.median(duration):.1f} s, max {max(duration):.1f} s")
        print("  where a run's time goes (median s over successful runs):")
        for label, seconds in phases.items():
            if seconds:
                print(f"    {label:<44} {statistics.median(seconds):6.2f}   (max {max(seconds):.2f})")
        gaps = [later.created - earlier.ended for earlier, later in itertools.pairwise(finished)
                if later.created >= earlier.ended]
        if gaps:
            print(f"  gap between a run ending and the next run's request: median {statistics.median(gaps):.1f} s")


# ------------------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300, help="seconds of producing segments (default 300)")
    parser.add_argument("--drain-seconds", type=float, default=180,
                        help="after producing, how long to wait for the last segments to become visible")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--interval-seconds", type=float, default=DEFAULT_INTERVAL_SECONDS,
                        help="seconds between two segments of a partition (demo default)")
    parser.add_argument("--records-per-segment", type=int, default=DEFAULT_RECORDS_PER_SEGMENT)
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="how often the table's offsets are read")
    parser.add_argument("--engine", choices=("connect", "embedded"), default="connect",
                        help="connect: runs use one Spark engine, as `make demo` (default); embedded: each run "
                             "starts its own local Spark (the fallback when no engine is configured)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data) and print it")
    add_instance_options(parser)
    parser.add_argument("--verbose", action="store_true", help="log at INFO level")
    args = parser.parse_args()
    if min(args.duration, args.partitions, args.interval_seconds, args.records_per_segment, args.poll_seconds) <= 0:
        parser.error("--duration, --partitions, --interval-seconds, --records-per-segment and --poll-seconds must "
                     "be positive")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="kafscale-freshness-bench-"))
    try:
        benchmark(args, workdir)
    except KeyboardInterrupt:
        print("interrupted; stopped every process started here", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if args.keep:
            print(f"kept {workdir} (dagster.log, lakehouse.yaml, var/, dagster_home/)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def benchmark(args: argparse.Namespace, workdir: Path) -> None:
    shutil.copy(REPO_ROOT / "lakehouse.yaml", workdir / "lakehouse.yaml")  # relative paths resolve in workdir
    home = dagster_home(workdir, args, REPO_ROOT / "dagster.yaml")  # as `make demo`
    config = load_config(workdir / "lakehouse.yaml")
    mapping = config.mappings[0]
    job = ingest_job_name(mapping.table)
    config.segments.local_root.mkdir(parents=True, exist_ok=True)  # as run_demo_producer does
    producer = DemoProducer(segment_store_from_config(config), watermark_publisher(config), topic=mapping.topic,
                            partitions=args.partitions, records_per_segment=args.records_per_segment)
    # As `make demo`: one round before `dagster dev`, so the topic exists when the definitions load (not measured).
    producer.produce_round(time.time_ns() // 1_000_000, int(args.interval_seconds * 1000))

    env = {**os.environ, "DAGSTER_HOME": str(home), CONFIG_PATH_ENV_VAR: str(workdir / "lakehouse.yaml")}
    env.pop(SPARK_REMOTE_VARIABLE, None)
    if args.engine == "embedded":  # each run worker its own Spark, not the local engine the first run would start
        env[AUTO_ENGINE_VARIABLE] = "0"
    port, engine_port = free_ports(2)
    url = f"http://127.0.0.1:{port}"
    engine = None
    if args.engine == "connect":
        engine = start_spark_engine(workdir, env, engine_port)
        env[SPARK_REMOTE_VARIABLE] = f"sc://127.0.0.1:{engine_port}"
    times = SegmentTimes()
    stop_producing = threading.Event()
    producing = threading.Thread(target=produce, args=(producer, args.interval_seconds, stop_producing, times),
                                 name="demo-producer", daemon=True)
    dagster_started = time.time()
    dagster_dev = start_dagster_dev(workdir, env, port)
    try:
        if engine is not None:
            wait_until_ready(engine, ConnectAddress("127.0.0.1", engine_port), log_path=workdir / "engine.log")
            print(f"Spark engine up at {env[SPARK_REMOTE_VARIABLE]} {time.time() - dagster_started:.1f} s after start",
                  flush=True)
        wait_for_webserver(url, job, dagster_dev, workdir / "dagster.log")
        measuring_from = time.time()
        print(f"dagster dev up at {url} (DAGSTER_HOME {home}); producing for {args.duration:g} s",
              flush=True)
        producing.start()
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            if dagster_dev.poll() is not None:
                raise SystemExit(f"dagster dev exited with {dagster_dev.returncode}; log:\n"
                                 f"{log_tail(workdir / 'dagster.log')}")
            if times.producer_error is not None:
                raise SystemExit(f"the demo producer failed: {times.producer_error!r}")
            poll_visibility(config, times)
            time.sleep(args.poll_seconds)
        stop_producing.set()
        producing.join()
        drain_deadline = time.monotonic() + args.drain_seconds
        while times.pending() and time.monotonic() < drain_deadline:
            poll_visibility(config, times)
            time.sleep(args.poll_seconds)
        runs = job_runs(url, job)
        phases = run_phases(url, runs)
    finally:
        stop_producing.set()
        stop_process_group(dagster_dev)
        if engine is not None:
            stop_process_group(engine)
    print_report(args, config, times, runs, phases, dagster_started, measuring_from)


if __name__ == "__main__":
    main()
