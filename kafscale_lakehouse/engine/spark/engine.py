"""The long-lived Spark engine: one Spark Connect server that every run connects to, so a run starts no JVM.

A Dagster run is a new process; with an embedded `local[*]` session each run would start a JVM and its Python
workers (5-15 s on 2 cores). A Spark Connect server (shipped with pyspark) keeps the JVM and warm Python workers
between runs; a run's session is a gRPC client (`SparkSession.builder.remote("sc://host:port")`, well under a
second) and its `mapInArrow` tasks run on the server's Python workers, which import this project: the server must
run this project's Python (`PYSPARK_PYTHON`), i.e. the same venv or image as the runs.

Where runs find it: `SPARK_REMOTE` (pyspark's own variable, for deployments) or `spark.remote` in the config;
without either, `engine.spark.get_spark_session` builds the embedded session from `spark.master`.

An engine on a loopback address accepts only clients holding its token: a random one made when it starts, given to
the server in `SPARK_CONNECT_AUTHENTICATE_TOKEN` (Spark Connect's pre-shared bearer token) and kept in
`spark-engine-<port>.token` (mode 0600) in this user's records directory (`local_processes.records_directory`);
`with_engine_token` adds it to the URL of every client of this project. Another local user can reach the port but
not run code with the engine's credentials. An engine on another address (a pod's) takes the token only from the
operator's `SPARK_CONNECT_AUTHENTICATE_TOKEN`; pyspark sends tokens to a remote host over TLS only.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Never, cast

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

from kafscale_lakehouse.config.spark_remote import DEFAULT_CONNECT_PORT, ConnectAddress, parse_remote_url
from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.local_processes import LocalProcessError, digest, records_directory, switched_on

log = logging.getLogger(__name__)

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# pyspark's own variable: its builder refuses a master when it is set, so it selects the engine for every session.
SPARK_REMOTE_VARIABLE = "SPARK_REMOTE"
DEFAULT_ENGINE_ADDRESS = f"127.0.0.1:{DEFAULT_CONNECT_PORT}"
ENGINE_ADDRESS_VARIABLE = "KAFSCALE_SPARK_ENGINE_ADDR"  # `spark-engine --address` default (the engine's pod)
# Every run joins this one session of the engine (a fixed id in the connection string). Spark keeps Python workers
# per session, so with a session per run each run would wait for a new Python daemon and its imports (15-20 s on a
# busy 2-core machine, measured); with one shared session they stay warm (about 1-2 s per job).
SHARED_SESSION_ID = "6f1c1d43-2b4e-4f7a-9c55-3a8e0d1b7c26"
# The engine keeps that session while idle (Spark Connect's default drops it after an hour, and a dropped id
# cannot be used again).
SHARED_SESSION_TIMEOUT = "3650d"
# pyspark's warning when the engine refuses to set a static setting on a session.
STATIC_SETTING_REFUSED = re.compile(r"Failed to set (\S+) to .*CANNOT_MODIFY_CONFIG")
# Spark Connect's pre-shared token: the server's variable (kept off its command line), and the client's connection
# string parameter (pyspark sends it as a bearer token; to `localhost` over a local channel, elsewhere over TLS).
TOKEN_VARIABLE = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # noqa: S105 - a variable's name
TOKEN_PARAMETER = "token"  # noqa: S105 - a parameter's name
READY_TIMEOUT_SECONDS = 300  # a busy 2-core machine took 147 s
STOP_GRACE_SECONDS = 20
CLASS_ARCHIVE_VARIABLE = "KAFSCALE_SPARK_CLASS_ARCHIVE"  # 0/false/no/off: no class-data archive
# How long a stopping engine may take to write its class-data archive (~120 MB; 30-60 s on a busy 2-core machine).
CLASS_ARCHIVE_WRITE_SECONDS = 180
# The JVM's class-data sharing messages (classes it leaves out of an archive) are not the engine log's business.
CLASS_ARCHIVE_QUIET = "-Xlog:cds*=off"


class SparkEngineError(EngineError):
    """The Spark engine cannot be started or reached; the message names the address or setting at fault."""


# The token files of the servers this process started, by the server's pid: removed when it is stopped.
_token_files: dict[int, tuple[Path, str]] = {}
# The class-data archives the servers this process started write when they stop, by the server's pid: (the file
# the server writes, the archive's name once it is complete).
_archives_written: dict[int, tuple[Path, Path]] = {}


def shared_session_url(url: str) -> str:
    """`url` joining the runs' shared session (`SHARED_SESSION_ID`) unless it names a session itself."""
    url = url.strip()
    if ";session_id=" in url:
        return url
    base, _, params = url.partition("/;")
    return f"{base.rstrip('/')}/;" + ";".join(p for p in (params, f"session_id={SHARED_SESSION_ID}") if p)


def token_path(port: int, environ: Mapping[str, str] = os.environ) -> Path:
    """The token file of the loopback engine on `port`, in this user's records directory."""
    try:
        return records_directory(environ) / f"spark-engine-{port}.token"
    except LocalProcessError as err:
        raise SparkEngineError(str(err)) from None


def create_engine_token(port: int, environ: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """The token of the loopback engine on `port` (`SPARK_CONNECT_AUTHENTICATE_TOKEN` when set, else a new random
    one), written to its token file (mode 0600 whatever the umask; replaced whole, so a client never reads half of
    one)."""
    path = token_path(port, environ)
    token = environ.get(TOKEN_VARIABLE) or secrets.token_urlsafe(32)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(descriptor, "w") as output:
            output.write(token)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path, token


def with_engine_token(url: str, environ: Mapping[str, str] = os.environ) -> str:
    """`url` with the token of the loopback engine it names (`sc://localhost:PORT/;...;token=...`: pyspark sends a
    token over a local channel only to `localhost`): `SPARK_CONNECT_AUTHENTICATE_TOKEN` when set (a client whose
    records directory is not the engine's), else the engine's token file. `url` itself when it holds a token already,
    names another host, or no engine of this user's recorded one for its port (an engine started without a token)."""
    address = parse_remote_url(url)
    params = url.strip().partition("/;")[2]
    if not _is_loopback(address.host) or any(p.startswith(f"{TOKEN_PARAMETER}=") for p in params.split(";")):
        return url
    token = environ.get(TOKEN_VARIABLE, "")
    if not token:
        try:
            token = token_path(address.port, environ).read_text().strip()
        except FileNotFoundError:
            return url
        except (OSError, SparkEngineError) as err:
            log.warning("connecting to %s without a token: %s", address.url, err)
            return url
    return f"sc://localhost:{address.port}/;" + ";".join(p for p in (params, f"{TOKEN_PARAMETER}={token}") if p)


def parse_engine_address(address: str) -> ConnectAddress:
    """`HOST:PORT` the engine listens on (`0.0.0.0:15002` in a pod, `127.0.0.1:15002` on a workstation)."""
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--address: {address!r} is not HOST:PORT")
    return ConnectAddress(host, int(port))


def spark_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The pyspark package directory: it holds `bin/spark-submit` and the jars (no separate Spark install)."""
    import pyspark

    return Path(environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)


def java_executable(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The Java `spark-submit` runs (`$JAVA_HOME/bin/java`, else `java` on the PATH), links resolved; None: none."""
    if environ.get("JAVA_HOME"):
        java: str | None = str(Path(environ["JAVA_HOME"]) / "bin" / "java")
    else:
        java = shutil.which("java", path=environ.get("PATH"))
    return Path(java).resolve() if java and Path(java).is_file() else None


def class_archive_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The class-data archive of the engine's JVM in this user's records directory, named by what it holds classes
    of: the Java executable and the Spark jars (names, sizes, modification times). None: switched off
    (`KAFSCALE_SPARK_CLASS_ARCHIVE`) or no Java found."""
    try:
        if not switched_on(environ, CLASS_ARCHIVE_VARIABLE):
            return None
        directory = records_directory(environ)
    except LocalProcessError as err:
        raise SparkEngineError(str(err)) from None
    java = java_executable(environ)
    if java is None:
        return None
    jars = sorted((jar.name, jar.stat().st_size, jar.stat().st_mtime_ns)
                  for jar in (spark_home(environ) / "jars").glob("*.jar"))
    identity = json.dumps([str(java), java.stat().st_size, java.stat().st_mtime_ns, jars])
    return directory / f"spark-classes-{digest(identity, 16)}.jsa"


def class_archive_options(archive: Path) -> tuple[list[str], Path | None]:
    """The JVM options that use `archive` when it exists, else write it (to a file of this start's own, renamed
    to `archive` once the JVM stopped cleanly: `finish_class_archive`); and the file the JVM writes (None: none)."""
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", CLASS_ARCHIVE_QUIET], None
    for stale in archive.parent.glob("spark-classes-*.tmp"):  # left by a JVM killed while writing
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > CLASS_ARCHIVE_WRITE_SECONDS:
                stale.unlink()
    written = archive.with_name(f"{archive.name}.{secrets.token_hex(4)}.tmp")
    return [f"-XX:ArchiveClassesAtExit={written}", CLASS_ARCHIVE_QUIET], written


def finish_class_archive(written: Path, archive: Path, returncode: int | None) -> None:
    """Once the JVM that wrote `written` stopped: `written` becomes `archive` unless the JVM was killed (a JVM killed
    while writing leaves half a file), and archives of other Java or Spark versions are removed."""
    if returncode in (None, -signal.SIGKILL) or not written.is_file():
        written.unlink(missing_ok=True)
        return
    os.replace(written, archive)
    for other in archive.parent.glob("spark-classes-*.jsa"):
        if other != archive:
            other.unlink(missing_ok=True)  # an engine still running keeps its mapping of it
    log.info("class-data archive of the Spark engine's JVM written: %s (%.0f MB)", archive,
             archive.stat().st_size / 1e6)


def connect_server_command(address: ConnectAddress, master: str, conf: Mapping[str, str], *,
                           ui_enabled: bool = True, java_options: Sequence[str] = ()) -> list[str]:
    """The `spark-submit` command line of a Spark Connect server on `address` running Spark on `master`;
    `java_options` go before the ones `conf` gives the driver (`spark.driver.defaultJavaOptions`)."""
    settings = {"spark.ui.enabled": "true" if ui_enabled else "false",
                "spark.connect.session.manager.defaultSessionTimeout": SHARED_SESSION_TIMEOUT, **conf,
                "spark.connect.grpc.binding.address": address.host,
                "spark.connect.grpc.binding.port": str(address.port)}
    if java_options:
        default_options = " ".join((*java_options, conf.get("spark.driver.defaultJavaOptions", "")))
        settings["spark.driver.defaultJavaOptions"] = default_options.strip()
    if _is_loopback(address.host):
        settings.setdefault("spark.driver.bindAddress", address.host)
        settings.setdefault("spark.driver.host", address.host)
    command = [str(spark_home() / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS, "--master", master,
               "--name", "kafscale-lakehouse-engine"]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def connect_server_env(environ: Mapping[str, str], address: ConnectAddress, token: str | None = None
                       ) -> dict[str, str]:
    """The server's environment: this Python for its workers (they import the project), loopback when bound there,
    the clients' `token` when given, and no Connect client settings (the server is not a client of itself)."""
    env = {name: value for name, value in environ.items()
           if name not in (SPARK_REMOTE_VARIABLE, "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    if _is_loopback(address.host):
        env.setdefault("SPARK_LOCAL_IP", address.host)
    if token is not None:
        env[TOKEN_VARIABLE] = token
    return env


def start_connect_server(address: ConnectAddress, master: str = "local[*]", conf: Mapping[str, str] | None = None,
                         *, log_path: Path | None = None, ui_enabled: bool = True,
                         environ: Mapping[str, str] | None = None, class_archive: bool = False,
                         while_starting: Callable[[], None] | None = None) -> subprocess.Popen:
    """Start the server in a process group of its own (so `stop_connect_server` also stops its Python workers)
    and return once it accepts connections; raises `SparkEngineError` with its log tail when it does not. On a
    loopback address it accepts only clients with a new token (`create_engine_token`; `with_engine_token`).
    `class_archive`: its JVM maps the class-data archive (`class_archive_path`), or writes it when it stops.
    `while_starting` is called once the server process runs, before waiting for it."""
    if port_open(address):
        raise SparkEngineError(f"{address.host}:{address.port} is already in use: is a Spark engine already running? "
                               f"(runs connect to it with SPARK_REMOTE={address.url})")
    environ = os.environ if environ is None else environ
    archive = class_archive_path(environ) if class_archive else None
    java_options, archive_written = class_archive_options(archive) if archive is not None else ([], None)
    command = connect_server_command(address, master, conf or {}, ui_enabled=ui_enabled, java_options=java_options)
    token_file, token = create_engine_token(address.port, environ) if _is_loopback(address.host) else (None, None)
    output = log_path.open("ab") if log_path is not None else None
    log.info("starting the Spark engine (Spark Connect) on %s, master %s%s", address.url, master,
             f"; clients need the token in {token_file}" if token_file else "")
    process = subprocess.Popen(command, env=connect_server_env(environ, address, token),
                               stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT if output else None,
                               start_new_session=True, preexec_fn=_die_with_parent)
    if output is not None:
        output.close()  # the child has its own descriptor
    if token_file is not None and token is not None:
        _token_files[process.pid] = (token_file, token)
    if archive is not None and archive_written is not None:
        log.info("the Spark engine's JVM writes its class-data archive %s when it stops", archive)
        _archives_written[process.pid] = (archive_written, archive)
    try:
        if while_starting is not None:
            while_starting()
        wait_until_ready(process, address, log_path=log_path)
    except BaseException:
        stop_connect_server(process)
        raise
    return process


def wait_until_ready(process: subprocess.Popen, address: ConnectAddress, *, timeout: float = READY_TIMEOUT_SECONDS,
                     log_path: Path | None = None) -> None:
    """Until the gRPC port accepts connections (it opens once the server's SparkContext is up)."""
    started = time.monotonic()
    while not port_open(address):
        if process.poll() is not None:
            raise SparkEngineError(f"the Spark engine on {address.url} exited with {process.returncode}"
                                   + _log_tail(log_path))
        if time.monotonic() - started > timeout:
            raise SparkEngineError(f"the Spark engine on {address.url} is not accepting connections after "
                                   f"{timeout:.0f} s" + _log_tail(log_path))
        time.sleep(0.25)
    log.info("Spark engine ready on %s after %.1f s", address.url, time.monotonic() - started)


def stop_connect_server(process: subprocess.Popen, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM to the server's process group (JVM and Python workers), SIGKILL after `grace_seconds` (or after
    `CLASS_ARCHIVE_WRITE_SECONDS` when its JVM writes a class-data archive as it stops)."""
    archive = _archives_written.pop(process.pid, None)
    if archive is not None:
        grace_seconds = max(grace_seconds, CLASS_ARCHIVE_WRITE_SECONDS)
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
            os.killpg(process.pid, signal.SIGCONT)  # a stopped (hung) server acts on SIGTERM only once continued
        except ProcessLookupError:
            break
        try:
            process.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    _remove_token_file(process.pid)
    if archive is not None:
        finish_class_archive(*archive, process.returncode)
    # Python workers outlive the JVM briefly; the group is gone once they noticed.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def _remove_token_file(pid: int) -> None:
    """The token file of the server `pid`, unless a newer engine on its port wrote its own since."""
    path, token = _token_files.pop(pid, (None, None))
    if path is not None:
        with contextlib.suppress(OSError):
            if path.read_text().strip() == token:
                path.unlink()


def warm_up(session: SparkSession, tasks: int, modules: Sequence[str]) -> float:
    """Start the shared session's Python workers and import `modules` in them (the ingestion job's: pyiceberg,
    pyarrow, the decoder, the writer), so the first run does not wait for that (the slowest part of a cold engine:
    40-70 s on a busy 2-core machine); returns seconds."""
    started = time.monotonic()
    job = session.range(0, tasks, 1, numPartitions=tasks).mapInArrow(partial(_import_modules, tuple(modules)),
                                                                     "ready boolean")
    job.collect()
    return time.monotonic() - started


def _import_modules(modules: tuple[str, ...], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs in the engine's Python workers."""
    for module in modules:
        importlib.import_module(module)
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"ready": [True] * batch.num_rows})


def serve(address: ConnectAddress, master: str, conf: Mapping[str, str], *, warm_modules: Sequence[str],
          keep_serving: Callable[[], bool] | None = None, watch_parent: bool = True,
          class_archive: bool = False) -> int:
    """Run the engine at `address` until SIGTERM or Ctrl-C, or until the parent process is gone (`make demo` killed
    hard; unless not `watch_parent`), or `keep_serving()` says no (checked every second: the local engine's idle
    timeout); runs connect to it with `SPARK_REMOTE`. Returns the exit code: 1 when the server died by itself.
    `class_archive`: as `start_connect_server`'s. `SparkEngineError` when it cannot start or its workers cannot
    import `warm_modules`."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parent = os.getppid()
    # Its client (the warm-up below) loads while the server starts rather than after.
    server = start_connect_server(address, master, conf, class_archive=class_archive,
                                  while_starting=import_connect_client)
    wildcard = address.host in ("0.0.0.0", "::")  # noqa: S104 - a wildcard server is reached on loopback
    client_url = f"sc://127.0.0.1:{address.port}" if wildcard else address.url
    os.environ.pop(SPARK_REMOTE_VARIABLE, None)  # this process is a client of its own engine only
    try:
        # Runs share one session of the engine: warm its Python workers now rather than in the first run.
        session, _ = open_connect_session(shared_session_url(with_engine_token(client_url)), {},
                                          "kafscale-lakehouse")
        try:
            seconds = warm_up(session, os.cpu_count() or 1, warm_modules)
        except Exception as err:
            raise SparkEngineError(
                f"the Spark engine on {address.url} cannot run the ingestion job's Python "
                f"code (its workers import kafscale_lakehouse with {sys.executable}): {err}"
            ) from err
        finally:
            # Close this client now (the shared session stays): at exit it would otherwise retry its pending
            # requests against the stopped server for minutes.
            session.stop()
        log.info(
            "Spark engine serving on %s (Python workers warmed up in %.1f s); runs connect with SPARK_REMOTE=%s",
            address.url,
            seconds,
            client_url,
        )
        while server.poll() is None and (not watch_parent or os.getppid() == parent):
            if keep_serving is not None and not keep_serving():
                break
            time.sleep(1)
        if server.returncode is not None:
            log.error("the Spark engine exited with %s", server.returncode)
            return 1
    except (KeyboardInterrupt, SystemExit):
        log.info("stopping the Spark engine")
    finally:
        stop_connect_server(server)
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> Never:
    raise SystemExit(128 + signum)


def import_connect_client() -> None:
    """Load pyspark's Spark Connect client (`open_connect_session`'s), 1-1.5 s of imports."""
    importlib.import_module("pyspark.sql.connect.session")


def open_connect_session(url: str, conf: Mapping[str, str], app_name: str) -> tuple[SparkSession, str]:
    """A new Spark Connect client session at `url` (`sc://...`) and the engine's Spark version."""
    from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

    # As `SparkSession.builder.remote` does: `pyspark.sql.functions` (F.col, ...) in the assets' own code build
    # Spark Connect columns only with this set.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder = ConnectSparkSession.builder.remote(url).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    before = ConnectSparkSession.getActiveSession()
    with warnings.catch_warnings(record=True) as refused:
        warnings.simplefilter("always")
        try:
            session = builder.create()  # not getOrCreate: that would hand back a session that just failed
        except BaseException:
            # create() makes the session active before its first call to the engine: a call that failed, or that
            # SIGTERM interrupted while the engine hangs, leaves a client whose exit hook would call the engine again.
            failed = ConnectSparkSession.getActiveSession()
            if failed is not None and failed is not before:
                close_connect_client(failed)
            raise
    # At exit, pyspark's own hook calls the engine (its ML cache's clean-up) with no deadline: a process told to stop
    # while its engine hangs would never exit. Closed first (atexit runs the last registered first), it makes none.
    atexit.register(close_connect_client, session)
    for warning in refused:
        # A static setting (spark.ui.*, spark.executor.*) is the engine's from its start; pyspark warns on every run.
        static = STATIC_SETTING_REFUSED.search(str(warning.message))
        if static is None:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
        else:
            log.info("spark.conf %s is a static setting: the Spark engine keeps its own (set it where the engine "
                     "starts)", static.group(1))
    session.release_session_on_close = False  # other runs share it
    # The Connect session serves the classic session's API (pyspark 4 types them apart).
    return cast("SparkSession", session), session.version  # the first round trip: fails here if the engine cannot serve


def close_connect_client(session: ConnectSparkSession) -> None:
    """Close a Spark Connect client without a call to the engine: its server-side session stays (runs share it)."""
    session.release_session_on_close = False
    session.stop()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies, even by SIGKILL, so no engine
    is left holding its port (Linux; `spark-submit` execs the JVM, which keeps this setting)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def port_open(address: ConnectAddress) -> bool:
    host = "127.0.0.1" if address.host in ("0.0.0.0", "::") else address.host  # noqa: S104 - not a bind
    try:
        with socket.create_connection((host, address.port), timeout=0.5):
            return True
    except OSError:
        return False


def _log_tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None:
        return ""
    try:
        return "; log:\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
