"""The local Spark engine (engine/spark/local_engine.py): `ingest --once` processes with no engine configured share
one engine that the first of them started; a killed or hung engine is replaced, not hung on; it stops by itself once
idle. Real processes: the CLI, the engine (a Spark Connect server on `local[1]`), an embedded world's sqlite catalog."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE
from kafscale_lakehouse.engine.spark.local_engine import (
    AUTO_ENGINE_VARIABLE,
    EngineRecord,
    IdleWatch,
    SparkEngineError,
    engine_directory,
    engine_key,
    local_engine_request,
    stop_engine,
)
from kafscale_lakehouse.local_processes import (
    CODE_VERSION_VARIABLE,
    DIRECTORY_VARIABLE,
    IDLE_SECONDS_VARIABLE,
    start_ticks,
)
from kafscale_lakehouse_tests.engine.ingestion.harness import CLI, IngestWorld
from kafscale_lakehouse_tests.support.servers import free_ports

pytestmark = pytest.mark.integration

# The engines of the first three runs outlive any gap between two runs (on a loaded machine, with another test process
# beside, a run's start alone took over 20 s); the last run's engine stops after IDLE_SECONDS without a client.
SHARED_IDLE_SECONDS = 300
IDLE_SECONDS = 20


def run_ingest(world: IngestWorld, config_path: Path, env: dict[str, str]) -> str:
    done = subprocess.run([str(CLI), "ingest", "--config", str(config_path), "--once"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def engine_record(directory: Path) -> EngineRecord:
    [path] = directory.glob("*.json")
    return EngineRecord(**json.loads(path.read_text()))


def children(pid: int) -> list[int]:
    found = []
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat_path.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(stat_path.parent.name))
    return found


def test_runs_share_one_local_engine_and_a_dead_or_hung_one_is_replaced(embedded_world, tmp_path):
    world = embedded_world
    engines = tmp_path / "engines"
    # A fixed code version: other engineers' edits of the shared working tree must not give a run a new engine.
    env = {**world.subprocess_env(), AUTO_ENGINE_VARIABLE: "1", DIRECTORY_VARIABLE: str(engines),
           IDLE_SECONDS_VARIABLE: str(SHARED_IDLE_SECONDS), CODE_VERSION_VARIABLE: "test-local-engine"}
    env.pop(SPARK_REMOTE_VARIABLE, None)
    document = world.config_document()
    document["spark"] = {"master": "local[1]", "conf": {"spark.ui.enabled": "false"}}
    config_path = world.write_config_file(document)
    records: list[EngineRecord] = []
    try:
        # The first process starts the engine and runs on it; the second finds it and starts no Spark of its own.
        world.write_segments(0, 60, records_per_segment=20, codecs=("zstd",))
        first = run_ingest(world, config_path, env)
        records.append(engine_record(engines))
        url = f"sc://127.0.0.1:{records[0].port}"
        assert f"starting a local Spark engine on {url}" in first
        assert f"engine {url} (Spark Connect, from {AUTO_ENGINE_VARIABLE}" in first
        world.assert_exactly_once(runs=1)

        world.write_segments(1, 40, records_per_segment=20, codecs=("lz4",))
        started = time.monotonic()
        second = run_ingest(world, config_path, env)
        second_seconds = time.monotonic() - started
        assert f"using the local Spark engine on {url} (pid {records[0].pid})" in second
        assert "starting a local Spark engine" not in second and "Spark session ready: master=" not in second
        assert engine_record(engines) == records[0]
        world.assert_exactly_once(runs=2)

        # Killed (the JVM, as the OOM killer would): the next process replaces it.
        [jvm] = children(records[0].pid)
        os.kill(jvm, signal.SIGKILL)
        world.write_segments(0, 20, records_per_segment=20, base_offset=60, codecs=("zstd",))
        third = run_ingest(world, config_path, env)
        records.append(engine_record(engines))
        assert records[1].pid != records[0].pid
        assert re.search(rf"replacing the local Spark engine on {url} \(pid {records[0].pid}\): (its process is "
                         rf"gone|nothing accepts connections)", third), third[-3000:]
        assert f"starting a local Spark engine on sc://127.0.0.1:{records[1].port}" in third
        world.assert_exactly_once(runs=3)

        # Hung (stopped): the handshake times out, it is replaced, and the stopped engine is gone too.
        [jvm] = children(records[1].pid)
        os.kill(jvm, signal.SIGSTOP)
        world.write_segments(1, 20, records_per_segment=20, base_offset=40, codecs=("zstd",))
        fourth = run_ingest(world, config_path, {**env, IDLE_SECONDS_VARIABLE: str(IDLE_SECONDS)})
        records.append(engine_record(engines))
        assert f"replacing the local Spark engine on sc://127.0.0.1:{records[1].port} (pid {records[1].pid}): no " \
               "gRPC handshake" in fourth, fourth[-3000:]
        world.assert_exactly_once(runs=4)
        deadline = time.monotonic() + 60
        while (start_ticks(records[1].pid) is not None or start_ticks(jvm) is not None) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert start_ticks(records[1].pid) is None and start_ticks(jvm) is None, "the hung engine is still there"

        # Idle: with no client for IDLE_SECONDS the engine stops and takes its record with it.
        deadline = time.monotonic() + IDLE_SECONDS + 60
        while start_ticks(records[2].pid) is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert start_ticks(records[2].pid) is None, "the idle engine did not stop"
        assert not list(engines.glob("*.json"))
        print(f"second run on the shared engine: {second_seconds:.2f} s")
    finally:
        for record in records:
            stop_engine(record)


def test_edited_code_or_other_settings_get_another_engine(tmp_path):
    package = tmp_path / "package"
    (package / "engine").mkdir(parents=True)
    module = package / "engine" / "job.py"
    module.write_text("x = 1\n")
    key = engine_key("local[2]", {"spark.sql.shuffle.partitions": "2"}, {}, package_root=package)
    assert engine_key("local[2]", {"spark.sql.shuffle.partitions": "2"}, {}, package_root=package) == key
    settings, code = key.split("-")

    module.write_text("x = 22\n")
    edited = engine_key("local[2]", {"spark.sql.shuffle.partitions": "2"}, {}, package_root=package)
    assert edited.split("-")[0] == settings and edited.split("-")[1] != code
    assert engine_key("local[1]", {"spark.sql.shuffle.partitions": "2"}, {}, package_root=package)[:16] != settings
    assert engine_key("local[2]", {}, {}, package_root=package)[:16] != settings
    assert engine_key("local[2]", {"spark.sql.shuffle.partitions": "2"}, {"AWS_ACCESS_KEY_ID": "other"},
                      package_root=package)[:16] != settings
    # A named version stands for the sources: an edit does not change it.
    pinned = engine_key("local[2]", {}, {CODE_VERSION_VARIABLE: "1.2.3"}, package_root=package)
    module.write_text("x = 333\n")
    assert engine_key("local[2]", {}, {CODE_VERSION_VARIABLE: "1.2.3"}, package_root=package) == pinned


def test_the_variables_opt_out_and_name_themselves():
    assert local_engine_request(["m"], {}).idle_seconds == 600
    assert local_engine_request(["m"], {AUTO_ENGINE_VARIABLE: "1", IDLE_SECONDS_VARIABLE: "30"}).idle_seconds == 30
    assert local_engine_request(["m"], {AUTO_ENGINE_VARIABLE: "0"}) is None
    assert local_engine_request(["m"], {AUTO_ENGINE_VARIABLE: "off"}) is None
    with pytest.raises(SparkEngineError, match=AUTO_ENGINE_VARIABLE):
        local_engine_request(["m"], {AUTO_ENGINE_VARIABLE: "maybe"})
    with pytest.raises(SparkEngineError, match=IDLE_SECONDS_VARIABLE):
        local_engine_request(["m"], {IDLE_SECONDS_VARIABLE: "0"})


def test_a_superseded_engine_stops_once_no_client_is_left(tmp_path):
    record = tmp_path / "settings-code.json"
    record.write_text("{}")
    [port] = free_ports(1)
    watch = IdleWatch(port, idle_seconds=3600, record_path=record)
    assert watch.keep_serving()  # recorded, idle for less than an hour
    with socket.create_server(("127.0.0.1", port)) as server, socket.create_connection(("127.0.0.1", port)):
        connection, _ = server.accept()
        with connection:
            record.unlink()  # a newer engine of these settings took over
            assert watch.keep_serving(), "a client is still connected: its run finishes"
    assert not watch.keep_serving()


def test_a_records_directory_others_may_write_to_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user could plant a record sending runs' data to an engine of theirs
    with pytest.raises(SparkEngineError, match=f"{shared} .*{DIRECTORY_VARIABLE}.* writable by others"):
        engine_directory({DIRECTORY_VARIABLE: str(shared)})
    # The default directory's parent too: whoever made it first could swap the directory inside.
    parent = tmp_path / "runtime" / f"kafscale-lakehouse-{os.getuid()}"
    parent.mkdir(parents=True)
    parent.chmod(0o777)
    with pytest.raises(SparkEngineError, match=f"{parent} .*writable by others"):
        engine_directory({"XDG_RUNTIME_DIR": str(tmp_path / "runtime")})
    parent.chmod(0o755)
    assert engine_directory({"XDG_RUNTIME_DIR": str(tmp_path / "runtime")}).stat().st_mode & 0o777 == 0o700
