"""Processes this package leaves running for the next command of the same user on this machine: the local Spark
engine (engine/spark/local_engine.py) and the warm `ingest --once` process (apps/warm_cli.py). Standard library
only: a command asks for them before it imports anything heavy.

Both are found through files in one directory of this user's (`$KAFSCALE_SPARK_ENGINE_DIR`, else `$XDG_RUNTIME_DIR`
or the temporary directory), keyed by what they run with, the code's version included; both stop by themselves
after `KAFSCALE_SPARK_ENGINE_IDLE_SECONDS` (default 600) without a client. With them, what a process that forks
children to run a console script needs (the warm process; the Dagster run launcher's forker,
orchestration/forking_launcher.py): whether forking is safe, and the child's run of the script."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import json
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

DIRECTORY_VARIABLE = "KAFSCALE_SPARK_ENGINE_DIR"
IDLE_SECONDS_VARIABLE = "KAFSCALE_SPARK_ENGINE_IDLE_SECONDS"
DEFAULT_IDLE_SECONDS = 600
# The code's version (an image tag, a release): processes of another version are not used. Unset, a hash of the
# package's source files stands for it, so an edit in a working tree gets a new process.
CODE_VERSION_VARIABLE = "KAFSCALE_SPARK_ENGINE_CODE_VERSION"
PACKAGE_ROOT = Path(__file__).resolve().parent  # kafscale_lakehouse/


class LocalProcessError(OSError):
    """The directory of the local processes cannot be used, or a variable of theirs holds a value they cannot use."""


def records_directory(environ: Mapping[str, str] = os.environ) -> Path:
    """This user's directory of local processes' records; refused when another user owns it or may write to it (a
    record there decides where runs send their data, a socket there runs commands as this user). The default one
    (and its parent) is kept at mode 0700; a configured one keeps its mode, its secrets their own (a Spark engine's
    token file 0600, the warm process's socket 0600)."""
    configured = environ.get(DIRECTORY_VARIABLE)
    if configured:
        directory = Path(configured)
    else:
        base = environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
        directory = Path(base) / f"kafscale-lakehouse-{os.getuid()}" / "spark-engines"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The default's parent is ours too (in /tmp, another user could have made it first and swap what is inside).
    for checked in (directory,) if configured else (directory, directory.parent):
        status = checked.stat()
        if status.st_uid != os.getuid() or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise LocalProcessError(f"{checked} (the local Spark engines' records, {DIRECTORY_VARIABLE}) is not this "
                                    "user's alone: owned by another user or writable by others")
        if not configured and stat.S_IMODE(status.st_mode) != 0o700:
            checked.chmod(0o700)  # made with the umask's mode (the parent), or by an older version
    return directory


def switched_on(environ: Mapping[str, str], variable: str, *, default: bool = True) -> bool:
    """A switch: on when set to 1/true/yes/on, off when set to 0/false/no/off, `default` when unset or empty; another
    value names the variable."""
    value = environ.get(variable, "").strip().lower()
    if not value:
        return default
    if value in ("0", "false", "no", "off"):
        return False
    if value not in ("1", "true", "yes", "on"):
        raise LocalProcessError(f"{variable}: {value!r} is neither 1/true/yes/on nor 0/false/no/off")
    return True


def idle_seconds(environ: Mapping[str, str] = os.environ) -> int:
    """`KAFSCALE_SPARK_ENGINE_IDLE_SECONDS`, a positive number of seconds; another value names the variable."""
    idle = environ.get(IDLE_SECONDS_VARIABLE, str(DEFAULT_IDLE_SECONDS)).strip()
    if not idle.isdigit() or int(idle) == 0:
        raise LocalProcessError(f"{IDLE_SECONDS_VARIABLE}: {idle!r} is not a positive number of seconds")
    return int(idle)


def code_version(environ: Mapping[str, str] = os.environ, *, package_root: Path = PACKAGE_ROOT) -> str:
    """A short hash of the code's version: `KAFSCALE_SPARK_ENGINE_CODE_VERSION`, else this package's source files
    (names, sizes, modification times)."""
    version = environ.get(CODE_VERSION_VARIABLE) or json.dumps(sorted(
        (str(path.relative_to(package_root)), path.stat().st_mtime_ns, path.stat().st_size)
        for path in package_root.rglob("*.py")))
    return digest(version, 8)


def digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def start_ticks(pid: int) -> int | None:
    """The start time of process `pid` (None when there is none, or it is a zombie): with the pid, it names one
    process (a pid reused by another process does not match)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    if fields[0] == "Z":
        return None
    return int(fields[19])


# Threads a fork copies in a state the child cannot use: gRPC's (its pollers and executors hold locks). Python threads
# are checked apart (any but the main one). The native threads imports leave are fork-aware: pyarrow's jemalloc
# background thread and numpy's OpenBLAS pool register at-fork handlers, obstore makes a new runtime in a child.
FORK_UNSAFE_THREAD_PREFIXES = ("grpc", "default-executo", "resolver-execu", "timer_manager")


def fork_unsafe_threads(task_directory: Path = Path("/proc/self/task")) -> list[str]:
    """The threads of this process that make forking it unsafe: Python threads but the main one, and gRPC's."""
    unsafe = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    with contextlib.suppress(OSError):
        for task in task_directory.iterdir():
            with contextlib.suppress(OSError):
                name = (task / "comm").read_text().strip()
                if name.startswith(FORK_UNSAFE_THREAD_PREFIXES):
                    unsafe.append(name)
    return unsafe


def run_entry_point(entry_point: str, argv: list[str]) -> NoReturn:
    """In a forked child: run the console script `module:function` with `sys.argv = argv` and exit as its process
    would (its status; an uncaught exception reported as the interpreter does, status 1), after the exit functions
    registered and the output written."""
    sys.argv = argv
    status: int
    try:
        module, function = entry_point.split(":")
        status = getattr(importlib.import_module(module), function)()
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception, then exits with 1
        sys.excepthook(*sys.exc_info())
        status = 1
    atexit._run_exitfuncs()  # the command's own exit functions (a console script ends through them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status or 0)
