"""The warm `ingest --once` process (apps/warm_cli.py): the first command starts it, the next ones run in a child
of it as they would in a process of their own: the caller's directory, environment, streams and exit status, its
signals forwarded, and a caller that dies takes its command down. Real processes: the CLI, the warm process, a
Spark engine, SeaweedFS S3 + REST catalog, etcd."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from kafscale_lakehouse.apps.warm_cli import (
    CONSOLE_SCRIPT,
    SERVER_PROCESS_CODE,
    WARM_CLI_VARIABLE,
    WarmCommand,
    enabled,
    stop_warm_processes,
    warm_key,
)
from kafscale_lakehouse.engine.spark.engine import TOKEN_VARIABLE, token_path
from kafscale_lakehouse.local_processes import (
    CODE_VERSION_VARIABLE,
    DIRECTORY_VARIABLE,
    IDLE_SECONDS_VARIABLE,
    LocalProcessError,
    start_ticks,
)
from kafscale_lakehouse_tests.conftest import REPO_ROOT, hung
from kafscale_lakehouse_tests.engine.ingestion.harness import CLI, IngestWorld
from kafscale_lakehouse_tests.engine.spark.other_user import OTHER_UID, OtherUser
from kafscale_lakehouse_tests.support.servers import SECRET_KEY

pytestmark = pytest.mark.integration

SECRET_VARIABLE = "WARM_CLI_TEST_S3_SECRET"
# Hands the warm process at the socket given a command (given in hex, with /dev/null as its streams), as a caller
# does: "denied" when it cannot connect, "dropped" when the connection ends unanswered, else the answer.
OTHER_USER_CALLER = """
import json, os, socket
path, command = sys.argv[1:]
caller = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    caller.connect(path)
except PermissionError:
    print(json.dumps("denied"))
    sys.exit()
try:
    socket.send_fds(caller, [bytes.fromhex(command)], [os.open(os.devnull, os.O_RDWR) for _ in range(3)])
    answer = caller.makefile("rb").readline().decode()
except OSError:
    answer = ""
print(json.dumps(answer or "dropped"))
"""


def served(engines: Path) -> list[tuple[str, int]]:
    """The commands the warm process ran: (command line, pid)."""
    text = "".join(path.read_text() for path in engines.glob("*.cli.log"))
    return [(match[1], int(match[2])) for match in re.finditer(r"running `([^`]*)` in \S+ as pid (\d+)", text)]


def exit_logged(engines: Path, pid: int) -> int | None:
    text = "".join(path.read_text() for path in engines.glob("*.cli.log"))
    match = re.search(rf"pid {pid} exited with status (-?\d+)", text)
    return int(match[1]) if match else None


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what} within {seconds:.0f} s"
        time.sleep(0.1)
    return found


def test_ingest_once_runs_in_the_warm_process_as_in_its_own(production_world: IngestWorld, spark_engine_server,
                                                            tmp_path):
    world = production_world
    spark_engine, engine_process = spark_engine_server
    engines = tmp_path / "engines"
    # The engine's token file is in the test process's records directory, not in `engines`.
    env = {**world.subprocess_env(), WARM_CLI_VARIABLE: "1", DIRECTORY_VARIABLE: str(engines),
           CODE_VERSION_VARIABLE: "test-warm-cli", IDLE_SECONDS_VARIABLE: "120",
           TOKEN_VARIABLE: token_path(spark_engine.port).read_text()}
    document = world.config_document()
    document["spark"] = {"remote": spark_engine.url}
    world.write_config_file(document)  # lakehouse.yaml, named relative to the caller's directory below
    document["s3"]["secret_access_key"] = f"${{{SECRET_VARIABLE}}}"
    (world.root / "from-env.yaml").write_text(yaml.safe_dump(document))

    def ingest(config: str, run_env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLI), "ingest", "--once", "--config", config], cwd=world.root, env=run_env,
                              capture_output=True, text=True, timeout=240)

    try:
        # The first runs in its own process and leaves the warm process behind.
        world.write_segments(0, 60, records_per_segment=20, codecs=("zstd",))
        first = ingest("lakehouse.yaml", env)
        assert first.returncode == 0, first.stderr[-4000:]
        world.assert_exactly_once(runs=1)
        wait_for(lambda: list(engines.glob("*.cli.sock")), 120, "the warm process listens")
        assert served(engines) == []

        # The next runs in the warm process, with the caller's directory (a relative config path), environment (a
        # variable only this caller has) and stderr (the run's last log line).
        world.write_segments(1, 40, records_per_segment=20, codecs=("lz4",))
        second = ingest("from-env.yaml", {**env, SECRET_VARIABLE: SECRET_KEY})
        assert second.returncode == 0, second.stderr[-4000:]
        assert re.search(r"topic orders-\S+ → \S+: 40 records", second.stderr.splitlines()[-1]), second.stderr
        [(command, _pid)] = served(engines)
        assert command == "ingest --once --config from-env.yaml"
        world.assert_exactly_once(runs=2)

        # Its exit status and its error reach the caller: without the variable, the config names it.
        third = ingest("from-env.yaml", env)
        assert third.returncode == 2
        assert f"environment variable {SECRET_VARIABLE} is not set" in third.stderr
        assert len(served(engines)) == 2

        # SIGTERM to the caller is forwarded: the command unwinds (leases released) and its status is the caller's.
        # The engine hangs meanwhile, so the command cannot finish before the signal comes (a race, otherwise).
        world.write_segments(0, 400, records_per_segment=100, base_offset=60, codecs=("gzip",))
        with hung(engine_process):
            caller = subprocess.Popen([str(CLI), "ingest", "--once", "--config", "lakehouse.yaml"], cwd=world.root,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: len(served(engines)) == 3, 60, "the warm process runs the command")
            caller.send_signal(signal.SIGTERM)
            _, stderr = caller.communicate(timeout=120)
        [*_, (_, terminated)] = served(engines)
        assert caller.returncode == 128 + signal.SIGTERM, stderr[-4000:]
        assert wait_for(lambda: exit_logged(engines, terminated), 30, "its exit logged") == 128 + signal.SIGTERM

        # SIGKILL to the caller (nothing to forward): the warm process sees it gone and ends its command.
        with hung(engine_process):
            caller = subprocess.Popen([str(CLI), "ingest", "--once", "--config", "lakehouse.yaml"], cwd=world.root,
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: len(served(engines)) == 4, 60, "the warm process runs the command")
            caller.kill()
            caller.wait(30)
            [*_, (_, orphaned)] = served(engines)
            assert wait_for(lambda: exit_logged(engines, orphaned), 60, "the orphaned command ended") \
                == 128 + signal.SIGTERM
        assert "the caller of pid" in "".join(path.read_text() for path in engines.glob("*.cli.log"))

        # Nothing of the two ended commands landed twice or got lost: the next run lands the rest exactly once.
        fifth = ingest("lakehouse.yaml", env)
        assert fifth.returncode == 0, fifth.stderr[-4000:]
        world.assert_exactly_once(runs=3)
    finally:
        stopped = stop_warm_processes(engines)
    assert len(stopped) == 1
    wait_for(lambda: start_ticks(stopped[0]) is None, 30, "the warm process stopped")
    assert not list(engines.glob("*.cli.sock"))


def test_another_interpreter_setting_or_code_version_gets_another_warm_process():
    base = {CODE_VERSION_VARIABLE: "1"}
    assert warm_key(base) == warm_key({**base, "HOME": "/elsewhere", "AWS_REGION": "xx"})  # read at run time
    assert warm_key(base) != warm_key({**base, CODE_VERSION_VARIABLE: "2"})
    assert warm_key(base) != warm_key({**base, "PYTHONPATH": "/other/site"})
    assert warm_key(base) != warm_key({**base, "SPARK_HOME": "/opt/spark"})


def test_a_package_installed_or_upgraded_gets_another_warm_process(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = warm_key({CODE_VERSION_VARIABLE: "1"})
    (site / "pyiceberg-9.9.dist-info").mkdir()  # what pip does to the directory
    os.utime(site, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert warm_key({CODE_VERSION_VARIABLE: "1"}) != before


def test_a_child_runs_the_console_script_the_package_installs():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kafscale-lakehouse"] == CONSOLE_SCRIPT


def test_the_warm_process_is_an_opt_in_whose_switch_names_itself():
    assert not enabled({}) and not enabled({WARM_CLI_VARIABLE: ""})
    assert enabled({WARM_CLI_VARIABLE: "on"}) and enabled({WARM_CLI_VARIABLE: "1"})
    assert not enabled({WARM_CLI_VARIABLE: "0"}) and not enabled({WARM_CLI_VARIABLE: "Off"})
    with pytest.raises(LocalProcessError, match=f"{WARM_CLI_VARIABLE}: 'maybe' is neither"):
        enabled({WARM_CLI_VARIABLE: "maybe"})


def test_the_warm_process_refuses_another_users_command(other_user: OtherUser):
    directory = Path(tempfile.mkdtemp(prefix="kafscale-warm-"))
    directory.chmod(0o755)  # KAFSCALE_SPARK_ENGINE_DIR may be one others can list and enter
    path = directory / "key.cli.sock"
    # Started by a caller whose umask would leave the socket open to all.
    log_path = directory / "key.cli.log"
    with log_path.open("wb") as output:
        server = subprocess.Popen([sys.executable, "-P", "-c", SERVER_PROCESS_CODE, str(path), "120"], cwd=directory,
                                  stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, umask=0)
    command = WarmCommand(["--help"], "/", {}, 0o022).encode().hex()
    try:
        wait_for(path.exists, 120, "the warm process listens")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert other_user.run(OTHER_USER_CALLER, str(path), command) == "denied"
        # Should the socket be opened to all, the peer's uid is checked: the command is dropped unread.
        path.chmod(0o666)
        assert other_user.run(OTHER_USER_CALLER, str(path), command) == "dropped"
        assert server.poll() is None
        log = log_path.read_text()
        assert f"dropped a caller: a command from uid {OTHER_UID}, not this user's" in log
        assert "running `" not in log
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(directory, ignore_errors=True)
