"""The local Spark engine: started by the first run that needs Spark and reused by the runs after it.

Without `SPARK_REMOTE` or `spark.remote`, every `ingest --once` and every Dagster run worker would start its own
JVM and Python workers (7-10 s and more on 2 cores) before a job of a second. With a `local` master, they instead
share one Spark Connect server on loopback (`engine.serve`), which this module starts on first use, detached from
the process that started it, and which stops itself once no client was connected for
`KAFSCALE_SPARK_ENGINE_IDLE_SECONDS` (default 600).

One engine per set of settings: a key hashes the master, the Spark settings, the Python interpreter, the environment
its workers inherit (`AWS_*`, `JAVA_HOME`, `PYSPARK_*`, `SPARK_HOME`) and the code's version
(`KAFSCALE_SPARK_ENGINE_CODE_VERSION`, else this package's source files): the engine's Python workers keep the
modules they imported, so edited code gets a new engine, and the one before stops as soon as its last client is gone
(a run in flight on it finishes). Under the key, in a directory of
this user's (`$KAFSCALE_SPARK_ENGINE_DIR`, else `$XDG_RUNTIME_DIR` or the temporary directory), are a lock file (two
processes do not start two engines: the second waits for the first's), a record (`<key>.json`: pid, port) and the
engine's log; by its port, the token its clients need (`spark-engine-<port>.token`, engine.py). A recorded engine
is used only if its process is the one recorded and it completes a gRPC handshake within `PROBE_TIMEOUT_SECONDS`; a
dead, hung or foreign one is stopped and replaced, and the log line says why.

`KAFSCALE_SPARK_AUTO_ENGINE=0` keeps the embedded session of every run; so does a Spark session already active in
the process (tests). Only `ingest` and the Dagster resources ask for it (`get_spark_session(local_engine=...)`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kafscale_lakehouse.engine.spark.engine import (
    READY_TIMEOUT_SECONDS,
    SPARK_REMOTE_VARIABLE,
    ConnectAddress,
    SparkEngineError,
    port_open,
    serve,
    wait_until_ready,
)
from kafscale_lakehouse.local_processes import (
    CODE_VERSION_VARIABLE,
    DEFAULT_IDLE_SECONDS,
    PACKAGE_ROOT,
    LocalProcessError,
    code_version,
    digest,
    idle_seconds,
    records_directory,
    start_ticks,
    switched_on,
)

log = logging.getLogger(__name__)

AUTO_ENGINE_VARIABLE = "KAFSCALE_SPARK_AUTO_ENGINE"  # 0/false/no/off: never; 1/true/yes/on: even if the config says no
# A live engine answers the HTTP/2 handshake in milliseconds; a stopped (SIGSTOP, swapped-out) one never does.
PROBE_TIMEOUT_SECONDS = 10.0
# RFC 9113 3.4 and 6.5: the client's connection preface, an empty SETTINGS frame (length 0, type 4, no flags, stream
# 0), and the 9-byte frame header of the server's answer, whose fourth byte is the frame type.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_SETTINGS_FRAME_TYPE = 4
HTTP2_EMPTY_SETTINGS = bytes([0, 0, 0, HTTP2_SETTINGS_FRAME_TYPE, 0, 0, 0, 0, 0])
HTTP2_FRAME_HEADER_BYTES = 9
# The variables the engine's JVM and Python workers inherit from the process that starts it and that change what
# they do: an engine started with other credentials or another Java is not shared.
INHERITED_PREFIXES = ("AWS_", "PYSPARK_", "SPARK_HOME", "JAVA_HOME", "KAFSCALE_SPARK_CONF_", "KAFSCALE_SPARK_MASTER")
# The engine process (not `-m`: the package imports this module before running it as __main__).
ENGINE_PROCESS_CODE = f"import sys; from {__name__} import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True)
class LocalEngine:
    """A request for the local engine: stop after `idle_seconds` without a client; warm `warm_modules` (the
    ingestion job's) in its Python workers on start."""

    idle_seconds: int = DEFAULT_IDLE_SECONDS
    warm_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineRecord:
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: a pid reused by another process does not match
    port: int
    key: str

    @property
    def address(self) -> ConnectAddress:
        return ConnectAddress("127.0.0.1", self.port)


def local_engine_request(warm_modules: Sequence[str] = (), environ: Mapping[str, str] = os.environ
                         ) -> LocalEngine | None:
    """The local engine for a run (None: `KAFSCALE_SPARK_AUTO_ENGINE` opts out), idle timeout from
    `KAFSCALE_SPARK_ENGINE_IDLE_SECONDS`; a value that is not one of these names its variable."""
    try:
        if not switched_on(environ, AUTO_ENGINE_VARIABLE):
            return None
        return LocalEngine(idle_seconds(environ), tuple(warm_modules))
    except LocalProcessError as err:
        raise SparkEngineError(str(err)) from None


def local_engine_url(master: str, conf: Mapping[str, str], request: LocalEngine, *,
                     environ: Mapping[str, str] = os.environ) -> str:
    """The `sc://127.0.0.1:PORT` of the local engine of these settings, started now if there is none that answers.
    `SparkEngineError` names the engine's address (and its log) when it cannot be started."""
    directory = engine_directory(environ)
    key = engine_key(master, conf, environ)
    record_path, lock_path, log_path = (directory / f"{key}{suffix}" for suffix in (".json", ".lock", ".log"))
    with _locked(lock_path):
        record = _read_record(record_path)
        if record is not None:
            problem = engine_problem(record)
            if problem is None:
                os.utime(record_path)  # its last use: the engine does not stop while a client is about to connect
                log.info("using the local Spark engine on %s (pid %d)", record.address.url, record.pid)
                return record.address.url
            log.warning("replacing the local Spark engine on %s (pid %d): %s", record.address.url, record.pid,
                        problem)
            stop_engine(record)
            record_path.unlink(missing_ok=True)
        record = start_engine(key, master, conf, request, log_path, environ)
        _write_record(record_path, record)
    _supersede(directory, key)
    return record.address.url


def engine_directory(environ: Mapping[str, str] = os.environ) -> Path:
    """This user's directory of engine records (`local_processes.records_directory`)."""
    try:
        return records_directory(environ)
    except LocalProcessError as err:
        raise SparkEngineError(str(err)) from None


def engine_key(master: str, conf: Mapping[str, str], environ: Mapping[str, str] = os.environ, *,
               package_root: Path = PACKAGE_ROOT) -> str:
    """`<settings>-<code>`: a hash of what the engine runs with, and one of the code's version
    (`local_processes.code_version`)."""
    inherited = {name: value for name, value in environ.items()
                 if name.startswith(INHERITED_PREFIXES) and name != CODE_VERSION_VARIABLE}
    settings = json.dumps({"master": master, "conf": dict(conf), "python": sys.executable, "env": inherited},
                          sort_keys=True)
    return f"{digest(settings, 16)}-{code_version(environ, package_root=package_root)}"


def _supersede(directory: Path, key: str) -> None:
    """The records of engines with these settings and older code are removed: each stops once its last client is
    gone (`IdleWatch`) instead of idling on."""
    settings = key.split("-")[0]
    for path in directory.glob(f"{settings}-*.json"):
        if path.stem != key:
            record = _read_record(path)
            path.unlink(missing_ok=True)
            if record is not None:
                log.info("the local Spark engine on %s (older code) stops once its clients are done",
                         record.address.url)


def engine_problem(record: EngineRecord) -> str | None:
    """Why the recorded engine cannot serve a run (None: it can)."""
    if start_ticks(record.pid) != record.start_ticks:
        return "its process is gone"
    if not port_open(record.address):
        return f"nothing accepts connections on port {record.port}"
    if not grpc_handshake(record.address, PROBE_TIMEOUT_SECONDS):
        return f"no gRPC handshake within {PROBE_TIMEOUT_SECONDS:.0f} s (hung or stopped)"
    return None


def grpc_handshake(address: ConnectAddress, timeout: float) -> bool:
    """Whether the gRPC server at `address` answers the HTTP/2 handshake within `timeout`: our connection preface,
    then its SETTINGS frame (the first frame a server sends). A stopped or hung process never answers, though the
    kernel still accepts the connection. On a socket of our own, not grpc's `channel_ready_future`: that notices a
    ready channel only on its 0.2 s polls, 0.2 s of every run reusing the engine (benchmarks/tiny_run.py)."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout) as connection:
            connection.sendall(HTTP2_PREFACE + HTTP2_EMPTY_SETTINGS)
            header = b""
            while len(header) < HTTP2_FRAME_HEADER_BYTES:
                connection.settimeout(max(deadline - time.monotonic(), 0.001))
                received = connection.recv(HTTP2_FRAME_HEADER_BYTES - len(header))
                if not received:
                    return False  # closed without answering
                header += received
    except OSError:  # refused, reset or timed out
        return False
    return header[3] == HTTP2_SETTINGS_FRAME_TYPE


def start_engine(key: str, master: str, conf: Mapping[str, str], request: LocalEngine, log_path: Path,
                 environ: Mapping[str, str]) -> EngineRecord:
    """A detached engine process (a session of its own, not a child that dies with this process)."""
    port = _free_loopback_port()
    address = ConnectAddress("127.0.0.1", port)
    command = [sys.executable, "-c", ENGINE_PROCESS_CODE, "--port", str(port), "--master", master, "--conf",
               json.dumps(dict(conf)), "--idle-seconds", str(request.idle_seconds), "--record",
               str(log_path.with_suffix(".json")), *(f"--warm-module={module}" for module in request.warm_modules)]
    env = {name: value for name, value in environ.items() if name != SPARK_REMOTE_VARIABLE}
    # Its Python workers import this project whatever the directory it runs in.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT.parent), env.get("PYTHONPATH")) if p)
    log.info("starting a local Spark engine on %s (master %s; it stops after %d s without a client; log %s)",
             address.url, master, request.idle_seconds, log_path)
    started = time.monotonic()
    with log_path.open("wb") as output:
        process = subprocess.Popen(command, env=env, cwd=log_path.parent, stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_ready(process, address, log_path=log_path)
    except BaseException:
        _signal_group(process.pid, signal.SIGKILL)
        raise
    log.info("local Spark engine ready on %s after %.1f s", address.url, time.monotonic() - started)
    ticks = start_ticks(process.pid)
    if ticks is None:
        raise SparkEngineError(f"the local Spark engine on {address.url} exited after starting; log {log_path}")
    return EngineRecord(process.pid, ticks, port, key)


def _free_loopback_port() -> int:
    """A port nobody listens on now (the engine binds it a few seconds later; should another process take it first,
    the engine exits and the error names the address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_engine(record: EngineRecord, grace_seconds: float = 5.0) -> None:
    """SIGTERM to the recorded engine process and to its Spark server (continued, should either be stopped), SIGKILL
    to both when the engine process is not gone after `grace_seconds`; only the process recorded, never a pid reused
    since."""
    if start_ticks(record.pid) != record.start_ticks:
        return
    groups = [record.pid, *_children(record.pid)]  # the Spark server runs in a process group of its own
    for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process acts on SIGTERM only once continued
        for group in groups:
            _signal_group(group, sig)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if start_ticks(record.pid) != record.start_ticks:
            return
        time.sleep(0.1)
    for group in groups:
        _signal_group(group, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    found = []
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat_path.read_text()
            if int(text[text.rindex(")") + 2:].split()[1]) == pid:
                found.append(int(stat_path.parent.name))
    return found


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _read_record(path: Path) -> EngineRecord | None:
    try:
        return EngineRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        log.warning("ignoring the unreadable local Spark engine record %s: %s", path, err)
        return None


def _write_record(path: Path, record: EngineRecord) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(record)))
    temporary.replace(path)


@contextlib.contextmanager
def _locked(path: Path, timeout: float = READY_TIMEOUT_SECONDS + 60, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive `flock` on `path` (released when the holder dies); yields False when `wait` is off and another
    process holds it."""
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                if time.monotonic() > deadline:
                    raise SparkEngineError(f"another process has held {path} (starting a local Spark engine) for "
                                           f"{timeout:.0f} s") from None
                time.sleep(0.2)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------------ the engine process


class IdleWatch:
    """In the engine process: whether it is still in use. In use while a client is connected to its port, or its
    record was touched (a client found it) within `idle_seconds`; decided under the record's lock, and the record
    removed before stopping, so no client picks an engine that is about to stop."""

    def __init__(self, port: int, idle_seconds: float, record_path: Path) -> None:
        self.port, self.idle_seconds, self.record_path = port, idle_seconds, record_path
        self.last_connected = time.monotonic()
        self.recorded = False  # its starter wrote the record (once it accepted connections)

    def keep_serving(self) -> bool:
        if self.record_path.exists():
            self.recorded = True
            superseded = False
        else:
            superseded = self.recorded
        if connected_clients(self.port):
            self.last_connected = time.monotonic()
            return True
        if superseded:
            log.info("superseded (newer code) and no client left: the local Spark engine on port %d stops",
                     self.port)
            return False
        if time.monotonic() - self.last_connected < self.idle_seconds:
            return True
        with _locked(self.record_path.with_suffix(".lock"), wait=False) as held:
            if not held:
                return True  # a client is looking at the record now
            try:
                touched = self.record_path.stat().st_mtime
            except FileNotFoundError:
                touched = 0.0
            if time.time() - touched < self.idle_seconds or connected_clients(self.port):
                return True
            record = _read_record(self.record_path)
            if record is not None and record.pid == os.getpid():
                self.record_path.unlink(missing_ok=True)
        log.info("no client for %.0f s: the local Spark engine on port %d stops", self.idle_seconds, self.port)
        return False


def connected_clients(port: int) -> int:
    """Established TCP connections to local `port` (Linux `/proc/net/tcp*`; elsewhere 0, and the record's last use
    alone decides)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a local Spark engine (started by local_engine_url)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--conf", default="{}", help="Spark settings, JSON")
    parser.add_argument("--idle-seconds", type=float, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--warm-module", action="append", default=[])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watch = IdleWatch(args.port, args.idle_seconds, args.record)
    keep_serving: Callable[[], bool] = watch.keep_serving
    try:
        return serve(ConnectAddress("127.0.0.1", args.port), args.master, json.loads(args.conf),
                     warm_modules=args.warm_module, keep_serving=keep_serving, watch_parent=False)
    except SparkEngineError as err:
        log.error("%s", err)
        return 2
