"""The local engine's class-data archive (engine/spark/engine.py): the first engine's JVM writes it as it stops, the
engines after it map it; a half-written one is never used."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kafscale_lakehouse.engine.spark.engine import (
    CLASS_ARCHIVE_VARIABLE,
    ConnectAddress,
    class_archive_options,
    class_archive_path,
    connect_server_command,
    finish_class_archive,
    start_connect_server,
    stop_connect_server,
)
from kafscale_lakehouse.local_processes import DIRECTORY_VARIABLE
from kafscale_lakehouse_tests.support.servers import free_ports


def driver_default_options(command: list[str]) -> str:
    settings = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "--conf")
    return settings["spark.driver.defaultJavaOptions"]


def test_the_archive_options_go_before_the_drivers_own(tmp_path):
    archive = tmp_path / "spark-classes-0123.jsa"
    options, written = class_archive_options(archive)
    assert written is not None and written.parent == tmp_path and written != archive
    command = connect_server_command(ConnectAddress("127.0.0.1", 15010), "local[2]",
                                     {"spark.driver.defaultJavaOptions": "-Dmine=1"}, java_options=options)
    assert driver_default_options(command) == f"-XX:ArchiveClassesAtExit={written} -Xlog:cds*=off -Dmine=1"

    archive.write_bytes(b"archive")
    options, written = class_archive_options(archive)
    assert written is None and options[0] == f"-XX:SharedArchiveFile={archive}"


def test_a_jvm_killed_while_writing_leaves_no_archive(tmp_path):
    archive = tmp_path / "spark-classes-0123.jsa"
    older = tmp_path / "spark-classes-4567.jsa"  # another Java's or Spark's
    older.write_bytes(b"older")
    for returncode in (-signal.SIGKILL, None):
        _, written = class_archive_options(archive)
        written.write_bytes(b"half")
        finish_class_archive(written, archive, returncode)
        assert not written.exists() and not archive.exists()
    _, written = class_archive_options(archive)
    written.write_bytes(b"whole")
    finish_class_archive(written, archive, 143)  # stopped by SIGTERM
    assert archive.read_bytes() == b"whole" and not written.exists() and not older.exists()


def test_the_archive_is_named_by_the_java_and_the_spark_jars(tmp_path):
    env = {DIRECTORY_VARIABLE: str(tmp_path), "PATH": "/usr/bin:/bin"}
    archive = class_archive_path(env)
    assert archive is not None and archive.parent == tmp_path and archive.name.startswith("spark-classes-")
    assert class_archive_path({**env, "SPARK_HOME": str(tmp_path)}) != archive  # no jars there
    assert class_archive_path({**env, CLASS_ARCHIVE_VARIABLE: "0"}) is None


def mapped(pid: int, path: Path) -> bool:
    return str(path) in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.integration
def test_the_second_engine_maps_the_archive_the_first_wrote(tmp_path, monkeypatch):
    monkeypatch.setenv(DIRECTORY_VARIABLE, str(tmp_path))
    monkeypatch.setenv(CLASS_ARCHIVE_VARIABLE, "1")
    archive = class_archive_path()
    assert archive is not None
    for run in ("writes", "maps"):
        [port] = free_ports(1)
        server = start_connect_server(ConnectAddress("127.0.0.1", port), "local[1]", {}, ui_enabled=False,
                                      log_path=tmp_path / f"{run}.log", class_archive=True)
        try:
            # spark-submit execs the JVM: the server process is the JVM.
            assert mapped(server.pid, archive) == (run == "maps")
        finally:
            stop_connect_server(server)
        assert archive.is_file(), (tmp_path / f"{run}.log").read_text(errors="replace")[-4000:]
    assert list(tmp_path.glob("*.tmp")) == []
