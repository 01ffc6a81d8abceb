"""The warm `ingest --once` process, an opt-in (`KAFSCALE_WARM_CLI=1`) for `ingest --once` run often from a shell or
cron on one machine: a run's own work on a Spark engine is ~0.7 s, but a new interpreter spends 1.2-1.8 s importing
what a driver needs (the Spark Connect client with pandas, pyarrow and grpc, pyiceberg) before it starts; handed to
the warm process, a tiny run took 0.87 s instead of 2.42 s (benchmarks/tiny_run.py). Nothing is gained where each
command runs in a new container (a Kubernetes job). Switched on, the first `ingest --once` runs as before and leaves
behind a process that has imported all of it and waits on a Unix socket; the next `ingest --once` of the same user,
code and settings hands it its command line, working directory, environment and standard streams, and the warm
process forks a child that runs the command as the console script would, writing to the caller's terminal or pipes.
The caller forwards SIGINT, SIGTERM and SIGHUP to that child, waits for it and exits with its status; when the caller
dies first, the child gets SIGTERM (and unwinds, releasing its leases, as a killed `ingest` does).

Only a fork of a process with one Python thread that has imported modules and opened nothing else: no Spark session,
no gRPC channel, no catalog, no etcd client exists before the child makes its own from the caller's config and
environment. (The imports leave two native threads, numpy's OpenBLAS pool and pyarrow's jemalloc background thread;
both libraries register at-fork handlers for that.) The warm process stops after
`KAFSCALE_SPARK_ENGINE_IDLE_SECONDS` without a request; it is keyed like the local engine (the interpreter, the code's
version, the variables read at import time), so edited code or another interpreter gets another one.
Unset (the default) or `KAFSCALE_WARM_CLI=0`, every command runs in its own process and starts none.

Files, in `local_processes.records_directory()`: `<key>.cli.sock` (the socket, mode 0600; the directory is this
user's alone and the peer's uid is checked with `SO_PEERCRED`: another user's command is dropped unread),
`<key>.cli.lock` (held by the warm process while it lives: one per key) and `<key>.cli.log` (its log: one line per
command served).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from kafscale_lakehouse.local_processes import (
    CODE_VERSION_VARIABLE,
    LocalProcessError,
    code_version,
    digest,
    idle_seconds,
    records_directory,
    run_entry_point,
    switched_on,
)

log = logging.getLogger(__name__)

WARM_CLI_VARIABLE = "KAFSCALE_WARM_CLI"  # 1/true/yes/on: hand `ingest --once` to the warm process (off by default)
# Read by the modules the warm process imports (or by the interpreter) when they are imported: another value needs
# another warm process.
KEYED_PREFIXES = ("PYTHON", "PYSPARK_", "SPARK_", "JAVA_HOME", "PYICEBERG_", "PYARROW_", "GRPC_", "PYDANTIC_")
CONSOLE_SCRIPT = "kafscale_lakehouse.apps.cli:main"  # pyproject.toml's [project.scripts]: what a child runs
# What `ingest --once` imports beyond the command line: its own modules, then what the run loads on the way (the
# Spark Connect client, the REST catalog, pyiceberg's Arrow IO with pandas).
PRELOADED_MODULES = (
    "kafscale_lakehouse.apps.cli",
    "kafscale_lakehouse.config",
    "kafscale_lakehouse.engine.ingestion",
    "kafscale_lakehouse.engine.spark",
    "pyspark.sql.connect.session",
    "pyiceberg.catalog.rest",
    "pyiceberg.io.pyarrow",
)
REQUEST_TIMEOUT_SECONDS = 10.0  # a caller that connects and sends nothing is dropped after this
FAILED_RETRY_SECONDS = 3600  # a warm process that failed to start is not started again by every command
LENGTH = struct.Struct("!I")
STANDARD_STREAMS = (0, 1, 2)
# The warm process (not `-m`: the package imports this module before running it as __main__); `-P`: the caller's
# working directory is not put on sys.path.
SERVER_PROCESS_CODE = f"import sys; from {__name__} import serve_main; sys.exit(serve_main(sys.argv[1:]))"


@dataclass(frozen=True)
class WarmCommand:
    """What a caller hands the warm process: the command line (without the program name), its working directory,
    environment and umask."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    umask: int

    def encode(self) -> bytes:
        payload = json.dumps({"argv": self.argv, "cwd": self.cwd, "env": self.env, "umask": self.umask}).encode()
        return LENGTH.pack(len(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> WarmCommand:
        document = json.loads(payload)
        return cls(list(document["argv"]), str(document["cwd"]), dict(document["env"]), int(document["umask"]))


# True in a child of the warm process: the command it runs is not handed on again.
in_warm_child = False


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return switched_on(environ, WARM_CLI_VARIABLE, default=False)


def warm_key(environ: Mapping[str, str] = os.environ) -> str:
    """`<settings>-<code>`: the interpreter, its import path (and when each of its directories last changed: a
    package installed, upgraded or removed there), the variables its imports read, and the code's version."""
    keyed = {name: value for name, value in environ.items()
             if name.startswith(KEYED_PREFIXES) and name != CODE_VERSION_VARIABLE}
    path = [(entry, _changed_ns(entry)) for entry in sys.path]
    settings = json.dumps({"python": sys.executable, "path": path, "env": keyed}, sort_keys=True)
    return f"{digest(settings, 16)}-{code_version(environ)}"


def _changed_ns(entry: str) -> int | None:
    try:
        return os.stat(entry or ".").st_mtime_ns
    except OSError:
        return None


def socket_path(environ: Mapping[str, str] = os.environ) -> Path:
    return records_directory(environ) / f"{warm_key(environ)}.cli.sock"


# ------------------------------------------------------------------------------------------------ the caller


def run_warm(argv: Sequence[str]) -> int | None:
    """Run the console script's command line `argv` in the warm process: its exit status, or None when no warm
    process took it (the caller runs it itself; a warm process is started for the next command)."""
    try:
        path = socket_path()
    except LocalProcessError as err:
        log.warning("running in this process, no warm process: %s", err)
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_address(path) as address:
            connection.connect(address)
        umask = os.umask(0o022)
        os.umask(umask)
        command = WarmCommand(list(argv), os.getcwd(), dict(os.environ), umask)
        socket.send_fds(connection, [command.encode()], _standard_stream_fds())
        messages = connection.makefile("rb")
        started = _read_message(messages)
    except OSError as err:
        connection.close()
        log.debug("no warm process at %s (%s): running in this process", path, err)
        start_warm_process(path)
        return None
    if started is None or "pid" not in started:
        connection.close()
        log.debug("the warm process at %s did not start the command: running in this process", path)
        return None
    with connection, messages:
        return _wait_for(messages, int(started["pid"]), path)


def _standard_stream_fds() -> list[int]:
    """This process's stdin, stdout and stderr; /dev/null for one that is closed."""
    fds = []
    for fd in STANDARD_STREAMS:
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _wait_for(messages: BinaryIO, pid: int, path: Path) -> int:
    """Forward the signals that end a command to the child running it and wait for its exit status."""
    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    ended = _read_message(messages)
    if ended is None or "status" not in ended:
        print(f"error: the warm process ended while it ran this command (pid {pid}); its log: "
              f"{path.with_suffix('.log')}", file=sys.stderr)
        return 1
    return int(ended["status"])


def _read_message(messages: BinaryIO) -> dict | None:
    """One JSON line from the warm process (None: it closed the connection first)."""
    line = messages.readline()
    return json.loads(line) if line.endswith(b"\n") else None


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address for `path` within the 107 bytes a Unix socket's address holds, however long the directory's path
    (a pytest or Kubernetes volume path easily exceeds it): the directory through an open descriptor of it."""
    descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{descriptor}/{path.name}"
    finally:
        os.close(descriptor)


def start_warm_process(path: Path) -> None:
    """A detached warm process for `path` (a session of its own; it exits at once when another one holds the key's
    lock). Not waited for: this command runs in its own process meanwhile. Not again within
    `FAILED_RETRY_SECONDS` of one that failed to start (its error in `<key>.cli.failed` and its log)."""
    failed = path.with_suffix(".failed")
    with contextlib.suppress(OSError):
        if time.time() - failed.stat().st_mtime < FAILED_RETRY_SECONDS:
            log.warning("no warm process: the last one failed to start (%s; log %s), so each `ingest --once` runs in "
                        "its own process until %s is an hour old or removed", failed.read_text().strip(),
                        path.with_suffix(".log"), failed)
            return
    with contextlib.suppress(OSError), path.with_suffix(".log").open("ab") as output:
        subprocess.Popen([sys.executable, "-P", "-c", SERVER_PROCESS_CODE, str(path), str(idle_seconds())],
                         cwd=path.parent, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                         start_new_session=True)


# ------------------------------------------------------------------------------------------------ the warm process


@dataclass
class ServedCommand:
    pid: int
    connection: socket.socket
    pidfd: int
    caller_gone: bool = False


@dataclass
class WarmServer:
    """The warm process's loop: one thread (forking is safe only then), a selector over the listening socket, the
    callers' connections (readable: the caller is gone) and the children's pidfds (readable: the child exited)."""

    path: Path
    idle_seconds: float
    lock: object  # the key's lock file, held while this process lives
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    commands: dict[int, ServedCommand] = field(default_factory=dict)
    listener: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    inode: int = 0

    def listen(self) -> None:
        bound = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        bound.unlink(missing_ok=True)
        with socket_address(bound) as address:
            self.listener.bind(address)
            # This user's alone whatever the umask or the directory's mode: connecting takes write permission on the
            # socket, so another user is refused by the kernel before the peer's uid is checked (`_accept`).
            os.chmod(address, 0o600)
        self.listener.listen(64)
        os.replace(bound, self.path)  # callers see it only once it accepts, and a stale one is replaced
        self.inode = self.path.stat().st_ino
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        log.info("warm process %d ready on %s (stops after %.0f s without a command)", os.getpid(), self.path,
                 self.idle_seconds)

    def serve(self) -> int:
        last_active = time.monotonic()
        try:
            while self.commands or time.monotonic() - last_active < self.idle_seconds:
                for key, _ in self.selector.select(timeout=1.0):
                    if key.data == "listener":
                        self._accept()
                    elif (served := self.commands.get(key.data[1])) is not None:
                        self._exited(served) if key.data[0] == "exited" else self._caller_gone(served)
                    last_active = time.monotonic()
                if not self._still_ours():
                    log.info("%s is another warm process's now: this one stops", self.path)
                    return 0
            log.info("no command for %.0f s: the warm process stops", self.idle_seconds)
            return 0
        finally:
            if self._still_ours():
                self.path.unlink(missing_ok=True)
            self.listener.close()

    def _still_ours(self) -> bool:
        try:
            return self.path.stat().st_ino == self.inode
        except OSError:
            return False

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        try:
            connection.settimeout(REQUEST_TIMEOUT_SECONDS)
            uid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))[1]
            if uid != os.getuid():
                raise ValueError(f"a command from uid {uid}, not this user's")
            command, fds = _receive_command(connection)
        except (OSError, ValueError, KeyError) as err:
            log.warning("dropped a caller: %s", err)
            connection.close()
            return
        for stream in (sys.stdout, sys.stderr, *(handler for handler in logging.root.handlers)):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self._close_in_child(connection)
                _run_child(command, fds)
            finally:
                os._exit(70)  # EX_SOFTWARE: _run_child never returns
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does itself: a signal forwarded at once finds its group
        for fd in fds:
            os.close(fd)  # else the caller's pipes never reach end of file while this process lives
        served = ServedCommand(pid, connection, os.pidfd_open(pid))
        self.commands[pid] = served
        self.selector.register(served.pidfd, selectors.EVENT_READ, ("exited", pid))
        self.selector.register(connection, selectors.EVENT_READ, ("caller", pid))
        log.info("running `%s` in %s as pid %d", " ".join(command.argv), command.cwd, pid)
        with contextlib.suppress(OSError):
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _close_in_child(self, connection: socket.socket) -> None:
        """What the child must not hold: the socket, the lock, the other callers' connections (a caller learns that
        this process died from its connection's end)."""
        self.listener.close()
        connection.close()
        self.lock.close()  # type: ignore[attr-defined]
        for served in self.commands.values():
            served.connection.close()
            os.close(served.pidfd)
        self.selector.close()

    def _exited(self, served: ServedCommand) -> None:
        _, wait_status = os.waitpid(served.pid, 0)
        status = os.waitstatus_to_exitcode(wait_status)
        status = 128 - status if status < 0 else status  # killed by a signal: as a shell reports it
        log.info("pid %d exited with status %d", served.pid, status)
        self.selector.unregister(served.pidfd)
        os.close(served.pidfd)
        if not served.caller_gone:
            self.selector.unregister(served.connection)
            with contextlib.suppress(OSError):
                served.connection.sendall(json.dumps({"status": status}).encode() + b"\n")
        served.connection.close()
        del self.commands[served.pid]

    def _caller_gone(self, served: ServedCommand) -> None:
        """The caller's end was readable: it sends nothing after its command, so it closed (it died)."""
        log.warning("the caller of pid %d is gone: SIGTERM to it", served.pid)
        served.caller_gone = True
        self.selector.unregister(served.connection)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(served.pid, signal.SIGTERM)


def stop_warm_processes(directory: Path) -> list[int]:
    """SIGTERM to the warm processes recorded in `directory` (their lock files name them; only a process whose
    command line is a warm process's of that socket): the pids signalled. The commands they run go on."""
    stopped = []
    for lock_path in directory.glob("*.cli.lock"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(lock_path.read_text().strip() or 0)
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if pid and str(lock_path.with_suffix(".sock")).encode() in command_line:
                os.kill(pid, signal.SIGTERM)
                stopped.append(pid)
    return stopped


def _receive_command(connection: socket.socket) -> tuple[WarmCommand, list[int]]:
    received, fds, _, _ = socket.recv_fds(connection, 65536, len(STANDARD_STREAMS))
    if len(fds) != len(STANDARD_STREAMS):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(fds)} file descriptors, not the caller's stdin, stdout and stderr")
    while len(received) < LENGTH.size or len(received) < LENGTH.size + LENGTH.unpack_from(received)[0]:
        chunk = connection.recv(65536)
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise ValueError("the caller closed the connection before its whole command")
        received += chunk
    return WarmCommand.decode(received[LENGTH.size:]), fds


def _run_child(command: WarmCommand, fds: list[int]) -> None:
    """In the forked child: become the caller's command (its streams, directory, environment, arguments, the
    signal handling of a new interpreter), run the console script's `main` and exit as its process would."""
    global in_warm_child
    in_warm_child = True
    os.setpgid(0, 0)  # a group of its own: the caller's forwarded signals reach what it starts too
    for fd, target in zip(fds, STANDARD_STREAMS, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's streams, never closed
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for handler in list(logging.root.handlers):  # the warm process's log file; the command configures its own
        logging.root.removeHandler(handler)
    os.environ.clear()
    os.environ.update(command.env)
    time.tzset()  # the caller's TZ for its log lines' times
    os.umask(command.umask)
    try:
        os.chdir(command.cwd)
    except OSError:
        sys.excepthook(*sys.exc_info())
        os._exit(1)
    run_entry_point(CONSOLE_SCRIPT, ["kafscale-lakehouse", *command.argv])


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def serve_main(argv: Sequence[str]) -> int:
    """The warm process: `SOCKET_PATH IDLE_SECONDS`. Exits at once when another warm process holds the key."""
    path, idle = Path(argv[0]), float(argv[1])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lock = path.with_suffix(".lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # the socket goes with the process (`finally` in serve)
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # for stop_warm_processes
    lock.flush()
    started = time.monotonic()
    failed = path.with_suffix(".failed")
    try:
        # As the console script starts: the same modules, the same pydantic setting, what they made frozen (never
        # walked by a collection, shared with the children until written).
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
        for module in PRELOADED_MODULES:
            importlib.import_module(module)
        import gc

        gc.freeze()
        log.info("imported what `ingest --once` needs in %.1f s", time.monotonic() - started)
        server = WarmServer(path, idle, lock)
        server.listen()
    except Exception as err:
        failed.write_text(f"{type(err).__name__}: {err}\n")
        raise
    failed.unlink(missing_ok=True)
    return server.serve()
