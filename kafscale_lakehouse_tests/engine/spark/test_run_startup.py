"""The fixed cost of a run: `kafscale-lakehouse ingest --once` as a process of its own, on a real Spark
engine (Spark Connect), SeaweedFS S3 + REST catalog and etcd. What it loads and how it starts, not its wall time
(benchmarks/tiny_run.py measures that): a command loads only its own modules, starting (imports, config, session)
runs without garbage collections, which walked everything the ~1,700 imported modules made, again and again, and
the process ends without tearing all of it down object by object."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from kafscale_lakehouse.config.spark_remote import ConnectAddress
from kafscale_lakehouse.engine.spark import DEFAULT_ENGINE_ADDRESS, ENGINE_ADDRESS_VARIABLE, get_spark_session
from kafscale_lakehouse.engine.spark.local_engine import PROBE_TIMEOUT_SECONDS, grpc_handshake
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.ingestion.harness import CLI, IngestWorld

pytestmark = pytest.mark.integration

SESSION_LOGGER = "kafscale_lakehouse.engine.spark"

# The console script's `main()`, with the collector's callbacks counting collections from its call until the Spark
# session is ready (its log line), the scans of installed packages' entry points counted, the modules loaded at exit
# written to a JSON file by an exit function registered then, and an object that marks the interpreter's teardown
# when it is torn down. (Importing the CLI module, before: a few standard library modules, see the test below.)
PROBE = """
import atexit, gc, importlib.metadata, json, logging, sys
from kafscale_lakehouse.apps.cli import main
report_path, argv = sys.argv[1], sys.argv[2:]
startup = {"collections": [], "session_ready": False, "entry_point_scans": []}
scan = importlib.metadata.entry_points
def counted_scan(**selection):
    startup["entry_point_scans"].append(selection)
    return scan(**selection)
importlib.metadata.entry_points = counted_scan
def count(phase, info):
    if phase == "start" and not startup["session_ready"]:
        startup["collections"].append(info["generation"])
def write_report():
    with open(report_path, "w") as out:
        json.dump({**startup, "modules": sorted(sys.modules)}, out)
class SessionReady(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Spark session ready"):
            startup["session_ready"] = True
            atexit.register(write_report)  # as the command's own exit functions are: after main() started
gc.callbacks.append(count)
logging.getLogger("kafscale_lakehouse.engine.spark.session").addHandler(SessionReady())
class TornDown:
    def __del__(self, open=open, path=report_path + ".teardown"):  # builtins may be gone by then
        open(path, "w").close()
marker = TornDown()
sys.argv = ["kafscale-lakehouse", *argv]
sys.exit(main())
"""

# Loaded by no `ingest` run of a JSON mapping (with their submodules): the Dagster layer, the operator tools'
# modules, maintenance, the registry formats' decoders. (pandas, pyarrow and grpc are not here: the Spark Connect
# client imports them itself.)
NOT_FOR_INGEST = ("dagster", "kafscale_lakehouse.orchestration", "kafscale_lakehouse.apps.segment_inspect",
                  "kafscale_lakehouse.apps.report", "kafscale_lakehouse.apps.metrics",
                  "kafscale_lakehouse.engine.maintenance", "fastavro", "kafscale_lakehouse.value_formats.avro",
                  "kafscale_lakehouse.value_formats.protobuf", "kafscale_lakehouse.value_formats.json_schema_values")


def test_ingest_once_starts_without_collections_loads_no_dagster_and_ends_without_teardown(
        production_world: IngestWorld, spark_engine, tmp_path):
    world = production_world
    world.write_segments(0, 120, records_per_segment=40, codecs=("zstd",))
    world.write_segments(1, 80, records_per_segment=40, codecs=("lz4",))
    document = world.config_document()
    document["spark"] = {"remote": spark_engine.url}
    config_path = world.write_config_file(document)
    report_path = tmp_path / "startup.json"

    done = subprocess.run([sys.executable, "-c", PROBE, str(report_path), "ingest", "--once", "--config",
                           str(config_path)], cwd=REPO_ROOT, env=world.subprocess_env(), capture_output=True,
                          text=True, timeout=240)

    assert done.returncode == 0, done.stderr[-4000:]
    assert "topic orders-" in done.stderr.splitlines()[-1]  # the last log line got out
    world.assert_exactly_once(runs=1)
    report = json.loads(report_path.read_text())  # the exit functions ran
    assert not Path(f"{report_path}.teardown").exists(), "the interpreter tore down the modules' objects at exit"
    assert report["session_ready"], done.stderr[-4000:]
    assert report["collections"] == [], f"collections (by generation) while the run started: {report['collections']}"
    assert report["entry_point_scans"] == []  # pydantic's plugin lookup reads every installed distribution's
    loaded = [name for name in report["modules"]
              if any(name == module or name.startswith(f"{module}.") for module in NOT_FOR_INGEST)]
    assert loaded == []


def test_the_command_line_module_loads_no_engine_library():
    """What every command pays before it runs: nothing of pyspark, pyiceberg, boto3, pydantic or our own layers."""
    code = "import json, sys; import kafscale_lakehouse.apps.cli; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    modules = json.loads(done.stdout)
    heavy = [name for name in modules if name.split(".")[0] in {"pyspark", "pyiceberg", "boto3", "botocore", "pandas",
                                                                 "pyarrow", "pydantic", "dagster", "grpc"}]
    ours = [name for name in modules if name.startswith("kafscale_lakehouse.")
            and name not in ("kafscale_lakehouse.apps", "kafscale_lakehouse.apps.cli")]
    assert heavy == [] and ours == []


def test_spark_engine_help_names_the_engine_address_setting():
    """The CLI writes the engine address variable and default out (importing them would load pyspark): they agree."""
    done = subprocess.run([str(CLI), "spark-engine", "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True)
    assert f"${ENGINE_ADDRESS_VARIABLE}, then {DEFAULT_ENGINE_ADDRESS};" in " ".join(done.stdout.split())


def test_a_static_spark_setting_on_the_engine_is_one_log_line_not_a_warning(spark_engine, caplog):
    """`spark.conf` keys the engine cannot change per session (here `spark.ui.showConsoleProgress`, which the embedded
    session needs): pyspark warned with its own text on every run; the run names the key once in its log."""
    with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.INFO, logger=SESSION_LOGGER):
        warnings.simplefilter("always")
        session = get_spark_session("local[2]", {"spark.ui.showConsoleProgress": "false",
                                                 "spark.sql.session.timeZone": "UTC"}, remote=spark_engine.url)
    try:
        assert [str(warning.message) for warning in warned] == []
        assert session.conf.get("spark.sql.session.timeZone") == "UTC"  # a runtime setting is still applied
    finally:
        session.stop()
    assert [record.getMessage() for record in caplog.records if "static setting" in record.getMessage()] == [
        "spark.conf spark.ui.showConsoleProgress is a static setting: the Spark engine keeps its own (set it where the "
        "engine starts)"]


def test_the_local_engines_liveness_check_answers_in_milliseconds(spark_engine):
    """Every run that reuses the local engine first checks it answers (a stopped one is replaced): grpc's
    channel_ready_future noticed the ready channel only on its 0.2 s polls. A socket that accepts but never answers
    (a SIGSTOPped engine: the kernel still accepts) is not live."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        assert grpc_handshake(spark_engine, PROBE_TIMEOUT_SECONDS)
        seconds.append(time.perf_counter() - started)
    assert min(seconds) < 0.1, seconds

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.perf_counter()
        assert not grpc_handshake(ConnectAddress("127.0.0.1", silent.getsockname()[1]), 0.5)
        assert 0.5 <= time.perf_counter() - started < 5
