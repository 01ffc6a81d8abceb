"""Another user of this machine for the tests of what the local processes refuse it: uid and gid 65534 (`nobody`),
running the system Python (the venv's interpreter lives under root's home, which that user cannot read) with only
what its script needs copied into a directory it can read (grpc, for a gRPC client of the Spark engine)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
import typing_extensions

OTHER_UID = 65534
SYSTEM_PYTHON = Path("/usr/bin/python3")
# Copied for a gRPC client: the package (its compiled core matches the system Python of the same minor version) and
# the one module it imports beyond the standard library.
GRPC_FILES = (Path(grpc.__file__).parent, Path(typing_extensions.__file__))


class OtherUser:
    """Runs a script as uid 65534, with `sys.path[0]` a directory of modules it can read."""

    def __init__(self, modules: Path) -> None:
        self.modules = modules

    def run(self, script: str, *args: str, timeout: float = 120) -> dict:
        """The JSON document `script` prints last; `sys.argv[1:]` are `args`."""
        code = f"import sys; sys.path.insert(0, {str(self.modules)!r})\n{script}"
        done = subprocess.run([str(SYSTEM_PYTHON), "-I", "-c", code, *args], user=OTHER_UID, group=OTHER_UID,
                              extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.splitlines()[-1])


def other_user_or_skip() -> None:
    """Skips a test that needs another uid where this process cannot switch to one."""
    if os.geteuid() != 0:
        pytest.skip("running as another user needs root")
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no {SYSTEM_PYTHON} for the other user")
    version = subprocess.run([str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"{SYSTEM_PYTHON} is Python {version}, not this one's: grpc's compiled core does not load there")


def make_other_user() -> tuple[OtherUser, Path]:
    """The other user and the directory of its modules (readable by all; the caller removes it)."""
    other_user_or_skip()
    modules = Path(tempfile.mkdtemp(prefix="kafscale-other-user-"))
    for source in GRPC_FILES:
        if source.is_dir():
            shutil.copytree(source, modules / source.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, modules / source.name)
    for path in (modules, *modules.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return OtherUser(modules), modules
