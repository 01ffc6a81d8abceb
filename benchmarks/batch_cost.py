"""What a table costs a `land_tables` run: CPU seconds per table and where they go, without a deployment's noise.

Run from the repository root: `.venv/bin/python benchmarks/batch_cost.py [--tables 100] [--cycles 4]`.

At hundreds of topics every table is landed again every few minutes, each time with a handful of new records, so what
bounds freshness on a given machine is the fixed cost of landing one table (its leases, plan, Spark share, commit,
checks, event-log writes), not the records. `fanout.py` measures the deployment as a whole, where runs of the same code
differ 1.6x on 2 busy cores; this benchmark measures that fixed cost alone, in CPU seconds, which a busy machine
inflates far less than wall time.

In a temporary directory: SeaweedFS (S3 + Iceberg REST catalog), etcd and the Spark engine (as `make demo`), a config
of `--tables` mappings as `fanout.py`'s (pizza columns, 2 partitions, `processor.watch: namespace`,
`max_batch_runs: 1`, so one run takes every table), and a sqlite Dagster instance with the repository's dagster.yaml
(as `dagster dev`'s). A cycle writes `--segments` segments (default 1) of 40 realistic records per partition
(fanout.py's producer, not measured), ticks the namespace sensor once and executes the `land_tables` run it requests in
this process (no run worker start: that cost is per run, `tiny_run.py` measures it). The first cycle creates the
tables and warms the engine and is not counted. Printed per counted cycle and as medians: tables landed, the tick's
and the run's wall time, and per table the CPU of this process (the run's op and its threads; the tick apart), of the
engine (JVM and Python workers), of SeaweedFS and of etcd.

To see where this process's CPU goes, attach a sampling profiler to the pid it prints (py-spy record -p PID).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, parse_config
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE, ConnectAddress, wait_until_ready
from kafscale_lakehouse.engine.spark.local_engine import AUTO_ENGINE_VARIABLE
from kafscale_lakehouse.orchestration.component import build_definitions
from kafscale_lakehouse.orchestration.land_tables import LAND_TABLES_JOB
from kafscale_lakehouse.orchestration.namespace_sensor import NAMESPACE_SENSOR_NAME

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import (
    FanoutProducer,
    ProcessSampler,
    add_instance_options,
    bench_servers,
    config_document,
    dagster_home,
    start_spark_engine,
    stop_process_group,
    topic_name,
)
from kafscale_lakehouse_tests.support.servers import Etcd, SeaweedFS, free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORDS_PER_SEGMENT = 40  # fanout.py's realistic traffic: a segment of 40 records per partition


@dataclass
class Cycle:
    tables: int
    tick_seconds: float
    tick_cpu: float
    run_seconds: float
    cpu: dict[str, float]  # CPU seconds of the run by process kind

    def per_table(self, kind: str) -> float:
        return self.cpu.get(kind, 0.0) / max(1, self.tables)


def run_cycle(producer: FanoutProducer, sensor: dg.SensorDefinition, job: dg.JobDefinition,
              instance: dg.DagsterInstance, cursor: str | None, sampler: ProcessSampler,
              segments: int) -> tuple[Cycle, str | None]:
    for _ in range(segments):
        producer.round_once()
    started, cpu_started = time.perf_counter(), time.process_time()
    result = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))
    for partitions in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(partitions.partitions_def_name, list(partitions.partition_keys))
    tick_seconds, tick_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    requests = result.run_requests or []
    if len(requests) != 1:
        raise SystemExit(f"the tick requested {len(requests)} runs, expected one land_tables run: "
                         f"{result.skip_message or ''}")
    request = requests[0]
    tables = len(request.run_config["ops"]["land_listed_tables"]["config"]["tables"])
    with sampler.lock:
        sampler.measuring = False
    sampler.sample()
    with sampler.lock:
        sampler.measuring = True
    started = time.perf_counter()
    outcome = job.execute_in_process(instance=instance, run_config=request.run_config, tags=request.tags,
                                     raise_on_error=False)
    run_seconds = time.perf_counter() - started
    sampler.sample()
    if not outcome.success:
        raise SystemExit(f"the land_tables run failed: {outcome.get_run_failure_event()}")
    return Cycle(tables, tick_seconds, tick_cpu, run_seconds, sampler.cpu_seconds()), result.cursor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=100, help="mappings (topics of 2 partitions), default 100")
    parser.add_argument("--cycles", type=int, default=4, help="counted cycles after the first (default 4)")
    parser.add_argument("--segments", type=int, default=1,
                        help="segments per partition per cycle (default 1; a 200-topic fanout.py run carries ~13)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    add_instance_options(parser)  # a run executed in this process: only the storage opt-in applies
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with bench_servers("batch-cost-", keep=args.keep) as servers:
        measure(args, servers.workdir, servers.seaweedfs, servers.etcd)


def measure(args: argparse.Namespace, workdir: Path, seaweedfs: SeaweedFS, etcd: Etcd) -> None:
    engine = None
    try:
        document = config_document(seaweedfs, etcd, seaweedfs.s3_endpoint, args.tables, "namespace",
                                   max_batch_runs=1)
        document["processor"]["max_bytes_per_batch_run"] = 1 << 40  # one run for every table, whatever the N
        config_path = workdir / "lakehouse.yaml"
        config_path.write_text(json.dumps(document))  # JSON is YAML; the engine reads it too
        os.environ[CONFIG_PATH_ENV_VAR] = str(config_path)
        config = parse_config(document, source=str(config_path))
        producer = FanoutProducer(config, [topic_name(t) for t in range(args.tables)], 2, RECORDS_PER_SEGMENT)
        home = dagster_home(workdir, args, REPO_ROOT / "dagster.yaml")  # as `make demo`
        os.environ["DAGSTER_HOME"] = str(home)
        os.environ[AUTO_ENGINE_VARIABLE] = "0"
        (engine_port,) = free_ports(1)
        engine = start_spark_engine(workdir, {k: v for k, v in os.environ.items() if k != SPARK_REMOTE_VARIABLE},
                                    engine_port)
        wait_until_ready(engine, ConnectAddress("127.0.0.1", engine_port), log_path=workdir / "engine.log")
        os.environ[SPARK_REMOTE_VARIABLE] = f"sc://127.0.0.1:{engine_port}"
        cpu_started = time.process_time()
        definitions = build_definitions(config)
        job = definitions.resolve_job_def(LAND_TABLES_JOB)
        sensor = definitions.resolve_sensor_def(NAMESPACE_SENSOR_NAME)
        definitions_cpu = time.process_time() - cpu_started
        sampler = ProcessSampler([engine.pid], labelled={os.getpid(): "this process (the run)",
                                                         seaweedfs.proc.pid: "SeaweedFS",  # type: ignore[union-attr]
                                                         etcd.proc.pid: "etcd"})  # type: ignore[union-attr]
        print(f"{args.tables} tables, {args.segments} segments per partition per cycle; definitions built in "
              f"{definitions_cpu:.2f} CPU-s; pid {os.getpid()}; load "
              f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
        cursor: str | None = None
        cycles: list[Cycle] = []
        with dg.DagsterInstance.get() as instance:
            for number in range(args.cycles + 1):
                cycle, cursor = run_cycle(producer, sensor, job, instance, cursor, sampler, args.segments)
                label = "warm-up (not counted)" if number == 0 else f"cycle {number}"
                print(f"{label}: {cycle.tables} tables, tick {cycle.tick_seconds:.2f} s ({cycle.tick_cpu:.2f} CPU-s), "
                      f"run {cycle.run_seconds:.1f} s; CPU-s per table: "
                      + ", ".join(f"{kind} {cycle.per_table(kind):.3f}" for kind in sorted(cycle.cpu))
                      + f"; load {os.getloadavg()[0]:.1f}", flush=True)
                if number:
                    cycles.append(cycle)
        kinds = sorted({kind for cycle in cycles for kind in cycle.cpu})
        print(f"median of {len(cycles)} cycles: run {statistics.median(c.run_seconds for c in cycles):.1f} s for "
              f"{cycles[0].tables} tables, tick {statistics.median(c.tick_seconds for c in cycles):.2f} s; CPU-s per "
              "table: " + ", ".join(f"{kind} {statistics.median(c.per_table(kind) for c in cycles):.3f}"
                                    for kind in kinds)
              + f", all {statistics.median(sum(c.cpu.values()) / c.tables for c in cycles):.3f}", flush=True)
    finally:
        if engine is not None:
            stop_process_group(engine)


if __name__ == "__main__":
    main()
