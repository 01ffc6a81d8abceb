"""`ForkingRunLauncher`: Dagster's default run launcher, each run's process forked from one that has already loaded
the code location. An opt-in for one host landing hundreds of topics (docs/operations-one-host.md, with its measured
gain: `kafscale-lakehouse dagster-home DIR --forking-launcher`, or the `run_launcher` section shown there).

The default launcher has the code server spawn a new interpreter per run, which imports Dagster and the location's
code and builds its definitions again before the run starts: ~8 CPU-s with 200 mappings (imports 3.4, definitions
4.4), 15-45 s of wall on two busy cores, in the path of every table of the run. This launcher keeps per code location
a process that has done it once (the forker, started at the location's first run) and forks each run's process from
it; the child runs `dagster api execute_run`, as a container launcher's run worker does, on the definitions built
once. The forker is tied to the code server it was started for (its server id): a reload of the location starts a
new code server and so a new forker, so a run executes the code and config the location has loaded, as the UI shows
it.

The launcher falls back to the default (the run's events say why) when the location is not a gRPC server, the forker
cannot start (its interpreter lacks this package, the definitions do not load in it) or cannot fork safely: a thread
other than the main one running Python, or a gRPC thread (a fork copies only the forking thread; what the others held
stays held). The native threads the imports leave (pyarrow's jemalloc, numpy's OpenBLAS) register at-fork handlers,
and obstore makes a new runtime in a forked child. A forked run is cancelled with SIGINT, which Dagster's run worker
takes as a termination request, as the code server's cancellation does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from io import BufferedRWPair
from typing import Any

from dagster import DefaultRunLauncher, deserialize_value, serialize_value
from dagster._core.launcher import LaunchRunContext

from kafscale_lakehouse.local_processes import fork_unsafe_threads, run_entry_point, start_ticks

log = logging.getLogger(__name__)

RUN_WORKER_PID_TAG = "kafscale/run_worker_pid"
# With the pid, the process's start time (clock ticks since boot): a pid reused by another process is not signalled.
RUN_WORKER_START_TAG = "kafscale/run_worker_start_ticks"
# The interpreter's own entry point for `dagster` (pyproject.toml of dagster: [project.scripts]).
DAGSTER_ENTRY_POINT = "dagster._cli:main"
# Loading a location of 200 mappings takes ~8 CPU-s: minutes on a machine that busy runs keep saturated.
READY_TIMEOUT_SECONDS = 600.0
FORK_TIMEOUT_SECONDS = 60.0
FORKER_CODE = f"import sys; from {__name__} import serve_forks; sys.exit(serve_forks(int(sys.argv[1])))"


class ForkerError(RuntimeError):
    """The forker of a code location cannot start or cannot fork a run."""


class ForkingRunLauncher(DefaultRunLauncher):
    """Launches each run as a fork of a process that has loaded its code location (module docstring); a run it cannot
    fork is launched as by `DefaultRunLauncher`, through the location's code server."""

    def __init__(self, inst_data: Any = None) -> None:
        super().__init__(inst_data=inst_data)
        self._forkers: dict[str, _Forker] = {}
        self._refused: dict[tuple[str, str], str] = {}  # (location, server id) → why it has no forker
        self._lock = threading.Lock()

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        forker, why_not = self._forker(context)
        if forker is not None:
            try:
                pid, started = forker.fork(serialize_value(_execute_run_args(run, self._instance.get_ref())))
            except ForkerError as err:
                why_not = str(err)
            else:
                self._instance.add_run_tags(run.run_id, {RUN_WORKER_PID_TAG: str(pid),
                                                         RUN_WORKER_START_TAG: str(started)})
                self._instance.report_engine_event(
                    f"Run worker forked (pid {pid}) from the process that loaded code location "
                    f"{forker.location_name!r} (pid {forker.pid})", run, cls=self.__class__)
                self._run_ids.add(run.run_id)
                return
        if why_not:
            self._instance.report_engine_event(f"Launched through the code server, not forked: {why_not}", run,
                                               cls=self.__class__)
        super().launch_run(context)

    def _forker(self, context: LaunchRunContext) -> tuple[_Forker | None, str | None]:
        """The forker of the run's code location, started when there is none for its code server yet; else why not
        (None: the default launcher's case, nothing to report)."""
        from dagster._core.remote_representation.code_location import GrpcServerCodeLocation

        run = context.dagster_run
        if context.workspace is None or run.job_code_origin is None or run.remote_job_origin is None:
            return None, None
        location_name = run.remote_job_origin.repository_origin.code_location_origin.location_name
        location = context.workspace.get_code_location(location_name)
        if not isinstance(location, GrpcServerCodeLocation):
            return None, None
        server_id = location.server_id
        with self._lock:
            forker = self._forkers.get(location_name)
            if forker is not None and forker.server_id == server_id and forker.alive():
                return forker, None
            if forker is not None:  # the location was reloaded (or its forker died): the old one goes
                forker.close()
                del self._forkers[location_name]
            if (refused := self._refused.get((location_name, server_id))) is not None:
                return None, refused
            try:
                forker = _Forker.start(location_name, server_id, run.job_code_origin.repository_origin,
                                       self._instance.get_ref())
            except ForkerError as err:
                self._refused[(location_name, server_id)] = str(err)
                log.warning("code location %r: runs are launched through its code server: %s", location_name, err)
                return None, str(err)
            self._forkers[location_name] = forker
            return forker, None

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or run.is_finished or RUN_WORKER_PID_TAG not in run.tags:
            return super().terminate(run_id)
        pid = int(run.tags[RUN_WORKER_PID_TAG])
        self._instance.report_run_canceling(run)
        if str(start_ticks(pid)) != run.tags.get(RUN_WORKER_START_TAG):
            self._instance.report_engine_event(f"Run worker pid {pid} is gone: nothing to terminate", run,
                                               cls=self.__class__)
            return False
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: nothing left to interrupt
            os.kill(pid, signal.SIGINT)
        return True

    def dispose(self) -> None:
        with self._lock:
            for forker in self._forkers.values():
                forker.close()
            self._forkers.clear()
        super().dispose()


def _execute_run_args(run: Any, instance_ref: Any) -> Any:
    from dagster._grpc.types import ExecuteRunArgs

    return ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=instance_ref)


class _Forker:
    """The launcher's end of a forker: its process and a socket of requests and replies (one JSON line each)."""

    def __init__(self, location_name: str, server_id: str, process: subprocess.Popen[bytes],
                 connection: socket.socket) -> None:
        self.location_name, self.server_id, self.process = location_name, server_id, process
        self.connection = connection
        self.stream: BufferedRWPair = connection.makefile("rwb")
        self.lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, location_name: str, server_id: str, repository_origin: Any, instance_ref: Any) -> _Forker:
        """A forker for the location's code (its interpreter and working directory, as its code server runs it),
        returned once it has loaded the definitions."""
        working_directory = getattr(repository_origin.code_pointer, "working_directory", None) or os.getcwd()
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [repository_origin.executable_path, "-c", FORKER_CODE, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], cwd=working_directory, stdin=subprocess.DEVNULL)
        except OSError as err:
            ours.close()
            raise ForkerError(f"cannot start {repository_origin.executable_path}: {err}") from err
        finally:
            theirs.close()
        forker = cls(location_name, server_id, process, ours)
        try:
            forker._request({"location_name": location_name, "instance_ref": serialize_value(instance_ref),
                             "repository_origin": serialize_value(repository_origin)}, READY_TIMEOUT_SECONDS)
        except ForkerError:
            forker.close()
            raise
        log.info("code location %r (server %s): runs are forked from pid %d", location_name, server_id,
                 process.pid)
        return forker

    def fork(self, execute_run_args: str) -> tuple[int, int]:
        """The run worker's pid and start time (clock ticks since boot)."""
        reply = self._request({"execute_run_args": execute_run_args}, FORK_TIMEOUT_SECONDS)
        return int(reply["pid"]), int(reply["start_ticks"])

    def alive(self) -> bool:
        return self.process.poll() is None

    def _request(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        with self.lock:
            self.connection.settimeout(timeout)
            try:
                self.stream.write(json.dumps(message).encode() + b"\n")
                self.stream.flush()
                line = self.stream.readline()
            except OSError as err:  # socket.timeout included
                raise ForkerError(f"the forker (pid {self.pid}) did not answer: {err}") from err
        if not line.endswith(b"\n"):
            raise ForkerError(f"the forker (pid {self.pid}) exited (status {self.process.poll()}); its error is in "
                              "the log of the process that launched it")
        reply = json.loads(line)
        if "error" in reply:
            raise ForkerError(reply["error"])
        return reply

    def close(self) -> None:
        """The forker exits when its socket closes; the runs it forked go on."""
        with contextlib.suppress(OSError):
            self.stream.close()
            self.connection.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ------------------------------------------------------------------------------------------------ the forker


def serve_forks(fd: int) -> int:
    """The forker: loads the code location named by the first request, then forks a run worker per request, until
    its socket closes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    connection = socket.socket(fileno=fd)
    stream = connection.makefile("rwb")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the run workers are reaped by the kernel, not waited for
    # A Ctrl-C of `dagster dev` reaches its whole process group: the run workers take it (a cancellation), this
    # process ends with the launcher's socket instead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def reply(message: Mapping[str, Any]) -> None:
        stream.write(json.dumps(message).encode() + b"\n")
        stream.flush()

    hello = _read(stream)
    if hello is None:
        return 0
    try:
        _load_location(hello["location_name"], hello["repository_origin"], hello["instance_ref"])
        unsafe = fork_unsafe_threads()
        if unsafe:
            raise ForkerError(f"loading the location left threads a fork would break: {', '.join(unsafe)}")
    except Exception as err:
        log.exception("code location %r cannot be forked from", hello.get("location_name"))
        reply({"error": f"the forker could not load code location {hello.get('location_name')!r}: "
                        f"{type(err).__name__}: {err}"})
        return 1
    reply({"ready": True})
    while (request := _read(stream)) is not None:
        if unsafe := fork_unsafe_threads():
            reply({"error": f"the forker has threads a fork would break: {', '.join(unsafe)}"})
            continue
        for output in (sys.stdout, sys.stderr):
            output.flush()
        pid = os.fork()
        if pid == 0:
            try:
                stream.close()
                connection.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for handler in list(logging.root.handlers):  # the run configures its own logging
                    logging.root.removeHandler(handler)
                run_entry_point(DAGSTER_ENTRY_POINT, ["dagster", "api", "execute_run", request["execute_run_args"]])
            finally:
                os._exit(70)  # EX_SOFTWARE: run_entry_point never returns
        reply({"pid": pid, "start_ticks": start_ticks(pid)})
    return 0


def _read(stream: BufferedRWPair) -> dict[str, Any] | None:
    line = stream.readline()
    return json.loads(line) if line.endswith(b"\n") else None


def _load_location(location_name: str, serialized_origin: str, serialized_instance_ref: str) -> None:
    """Load the location as a run worker would, once: its environment from the instance's secrets (the code server's
    `.env`), its modules, its definitions; a module's definitions attribute is replaced by the repository built, so
    a forked run worker finds it built (a file's or a dg project's definitions are built again; their imports are
    not)."""
    import gc

    from dagster._core.code_pointer import ModuleCodePointer, PackageCodePointer
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._core.instance.ref import InstanceRef
    from dagster._core.origin import RepositoryPythonOrigin

    instance_ref = deserialize_value(serialized_instance_ref, InstanceRef)
    secrets = instance_ref.secrets_loader
    if secrets is not None:
        os.environ.update(secrets.get_secrets_for_environment(location_name))
    origin = deserialize_value(serialized_origin, RepositoryPythonOrigin)
    pointer = origin.code_pointer
    repository = ReconstructableRepository(pointer).get_definition()
    if isinstance(pointer, ModuleCodePointer):
        setattr(sys.modules[pointer.module], pointer.fn_name, repository)
    elif isinstance(pointer, PackageCodePointer):
        setattr(sys.modules[pointer.module], pointer.attribute, repository)
    gc.freeze()  # shared with the children until written, never walked by their collections
    log.info("code location %r loaded (%s): forking its runs", location_name, pointer.describe())
