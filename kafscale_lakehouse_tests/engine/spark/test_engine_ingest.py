"""Runs on the long-lived Spark engine: a run is a Spark Connect client and starts no JVM; the engine serves one
run after another and every offset lands exactly once (SeaweedFS S3 + REST catalog, etcd, a real Connect server)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.spark.engine import (
    SHARED_SESSION_ID,
    SPARK_REMOTE_VARIABLE,
    ConnectAddress,
    port_open,
    token_path,
)
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse_tests.conftest import REPO_ROOT, hung
from kafscale_lakehouse_tests.engine.ingestion.harness import CLI, IngestWorld
from kafscale_lakehouse_tests.support.servers import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture
def production_world(tmp_path, seaweedfs, etcd_server, unique_prefix) -> IngestWorld:
    return IngestWorld("production", tmp_path, unique_prefix, f"orders-{unique_prefix}", seaweedfs=seaweedfs,
                       etcd_endpoint=etcd_server.endpoint)


def engine_config_document(world: IngestWorld, url: str) -> dict:
    document = world.config_document()
    document["spark"] = {"remote": url}
    return document


def env_without_java(world: IngestWorld, tmp_path) -> dict[str, str]:
    """The CLI's environment with no Java to start: a run that tried to start a JVM would fail."""
    no_java = tmp_path / "no-java"
    (no_java / "bin").mkdir(parents=True)
    env = dict(world.subprocess_env(), JAVA_HOME=str(no_java))
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.exists(os.path.join(d, "java")))
    env.pop(SPARK_REMOTE_VARIABLE, None)
    return env


def test_runs_on_the_engine_start_no_jvm_and_land_every_offset_once(production_world, spark_engine, tmp_path):
    world = production_world
    world.write_segments(0, 200, records_per_segment=40, codecs=("none", "gzip", "snappy", "lz4", "zstd"))
    world.write_segments(1, 120, records_per_segment=40, codecs=("zstd",))
    world.write_segments(2, 90, records_per_segment=30, codecs=("lz4",))
    config_path = world.write_config_file(engine_config_document(world, spark_engine.url))

    # First run: the CLI in a process of its own that cannot start a JVM.
    started = time.monotonic()
    done = subprocess.run([str(CLI), "ingest", "--config", str(config_path), "--once"],
                          env=env_without_java(world, tmp_path), capture_output=True, text=True, timeout=240)
    first_run_seconds = time.monotonic() - started

    assert done.returncode == 0, done.stderr[-4000:]
    assert f"engine {spark_engine.url} (Spark Connect, from spark.remote)" in done.stderr
    world.assert_exactly_once(runs=1)

    # Later runs reuse the warm engine: a second client session (here in this process), new segments land once.
    world.write_segments(0, 80, records_per_segment=40, base_offset=200, codecs=("zstd",))
    world.write_segments(3, 50, records_per_segment=25, codecs=("snappy",))
    config = world.config(engine_config_document(world, spark_engine.url))
    session = get_spark_session(config.spark.master, dict(config.spark.conf), remote=config.spark.remote)
    assert isinstance(session, ConnectSparkSession)
    started = time.monotonic()
    [result] = ingest(config, session)
    second_run_seconds = time.monotonic() - started

    assert result.records == 130 and result.snapshot_id is not None
    world.assert_exactly_once(runs=2)
    [nothing] = ingest(config, session)
    assert nothing.records == 0 and nothing.snapshot_id is None
    world.assert_exactly_once(runs=2)
    print(f"first run (CLI process, cold Python workers) {first_run_seconds:.1f} s, "
          f"second run (warm engine) {second_run_seconds:.1f} s")


def _python_daemon(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:  # a Python worker's parent is the per-session PySpark daemon that forked it
        yield pa.RecordBatch.from_pydict({"daemon": [os.getppid()] * batch.num_rows})


def test_runs_share_one_engine_session_and_its_warm_python_workers(spark_engine):
    def daemons(session) -> set[int]:
        rows = session.range(0, 2, 1, numPartitions=2).mapInArrow(_python_daemon, "daemon long").collect()
        return {row.daemon for row in rows}

    first = get_spark_session(remote=spark_engine.url)
    second = get_spark_session(remote=spark_engine.url)  # another run: a client of its own

    assert first is not second
    assert first.session_id == second.session_id == SHARED_SESSION_ID
    assert daemons(first) == daemons(second), "a run's session started Python workers of its own"
    # A run ending (its session stopped) does not end the shared session for the runs still going.
    second.stop()
    assert first.range(3).count() == 3
    first.stop()


def test_an_assets_own_column_functions_run_on_the_engine(spark_engine):
    """A downstream asset written with `pyspark.sql.functions` (as the demo's are) works on the engine too."""
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention

    session = get_spark_session(remote=spark_engine.url)
    rows = session.range(3).select((F.col("id") * 2).alias("doubled")).where(F.col("doubled") > 0).collect()
    assert [row.doubled for row in rows] == [2, 4]
    session.stop()  # while the engine is up: a client left open retries the stopped engine at exit


def test_spark_engine_command_serves_warm_workers_and_stops_cleanly(tmp_path):
    """`kafscale-lakehouse spark-engine`, as `make demo` runs it: serving once its workers are warm, gone on SIGTERM."""
    [port] = free_ports(1)
    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text((REPO_ROOT / "lakehouse.yaml").read_text())  # relative paths resolve in tmp_path
    log_path = tmp_path / "engine.log"
    env = {k: v for k, v in os.environ.items() if k != SPARK_REMOTE_VARIABLE}
    env["KAFSCALE_SPARK_MASTER"] = "local[2]"
    with log_path.open("wb") as log_file:
        engine = subprocess.Popen([str(CLI), "spark-engine", "--config", str(config_path), "--address",
                                   f"127.0.0.1:{port}"], env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "Spark engine serving on" not in log_path.read_text(errors="replace"):
            assert engine.poll() is None, log_path.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        assert f"runs connect with SPARK_REMOTE=sc://127.0.0.1:{port}" in log_path.read_text()
        token_file = token_path(port)
        assert f"clients need the token in {token_file}" in log_path.read_text()
        assert token_file.stat().st_mode & 0o777 == 0o600
        session = get_spark_session(remote=f"sc://127.0.0.1:{port}")  # reads the token file
        assert session.range(5).count() == 5

        os.killpg(engine.pid, signal.SIGTERM)
        assert engine.wait(60) == 0
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
    assert not port_open(ConnectAddress("127.0.0.1", port)), "the Spark Connect server outlived the command"
    assert not token_file.exists()


def test_a_run_told_to_stop_while_its_engine_hangs_exits(production_world, spark_engine_server, tmp_path):
    """SIGTERM (Kubernetes, `kill`) ends a run whose engine accepts and never answers: pyspark's exit hook would call
    that engine again with no deadline (its ML cache's clean-up), so the process never exited."""
    world = production_world
    address, engine = spark_engine_server
    world.write_segments(0, 40, records_per_segment=20, codecs=("zstd",))
    config_path = world.write_config_file(engine_config_document(world, address.url))
    with hung(engine):
        run = subprocess.Popen([str(CLI), "ingest", "--config", str(config_path), "--once"],
                               env=world.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Its config loaded (the CLI's SIGTERM handler is set next), then at its engine's first call or before it:
        # the run cannot end by itself either way. On a loaded machine the imports alone can take seconds.
        head = []
        while (line := run.stderr.readline()) and "loaded config" not in line:
            head.append(line)
        time.sleep(2)
        assert run.poll() is None, "".join(head)
        run.send_signal(signal.SIGTERM)
        try:
            _, rest = run.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            raise
        stderr = "".join(head) + line + rest
    assert run.returncode == 128 + signal.SIGTERM, stderr[-4000:]

    done = subprocess.run([str(CLI), "ingest", "--config", str(config_path), "--once"], env=world.subprocess_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    world.assert_exactly_once(runs=1)
