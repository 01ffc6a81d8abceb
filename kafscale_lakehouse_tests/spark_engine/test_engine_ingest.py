"""Runs on the long-lived Spark engine: a run is a Spark Connect client and starts no JVM; the engine serves one
run after another and every offset lands exactly once (SeaweedFS S3 + REST catalog, etcd, a real Connect server)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

from kafscale_lakehouse.engine.ingest import ingest
from kafscale_lakehouse.engine.spark import get_spark_session
from kafscale_lakehouse.engine.spark_engine import SPARK_REMOTE_VARIABLE
from kafscale_lakehouse_tests.engine_ingest.harness import CLI, IngestWorld

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
