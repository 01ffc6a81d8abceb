"""A fault-matrix actor run as a process of its own, held or killed at its point while something else happens: the
driver of the primaries whose invariants are not the append table's (test_fault_matrix_upsert.py, the batch's in
orchestration/namespace/test_fault_matrix_batch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pyiceberg.table import Table

from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.faults.actor import command
from kafscale_lakehouse_tests.engine.faults.matrix import PROCESS_TIMEOUT_SECONDS


def run_held(actor: str, point: str, action: str, cli_args: list[str], *, env: Mapping[str, str], signal_dir: Path,
             wait_for_leases: Callable[[], None], meanwhile: Callable[[], None]) -> None:
    """Start `actor` (`cli_args` its command), wait until it reaches `point`, run `meanwhile` while it is held (or,
    killed or ended on a lost answer, after it), then let it go on to its end. `wait_for_leases` returns once its
    leases are gone: before `meanwhile` unless it is paused (a frozen actor's expire, a killed one's too, a `late`
    one released them), and at the end."""
    signal_dir.mkdir(parents=True, exist_ok=True)
    primary = subprocess.Popen(command(actor, point, action, signal_dir, cli_args), cwd=REPO_ROOT, env=dict(env),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_reached(primary, signal_dir)
    if action in ("kill", "unknown"):
        finish(primary)
    if action != "pause":
        wait_for_leases()
    meanwhile()
    if action == "freeze":
        os.kill(primary.pid, signal.SIGCONT)
    elif action in ("pause", "late"):
        (signal_dir / "go").write_text("go\n")
    if primary.returncode is None:
        finish(primary)
    if action == "late":
        assert (signal_dir / "applied").exists() or (signal_dir / "refused").exists()
    wait_for_leases()


def wait_reached(process: subprocess.Popen, signal_dir: Path) -> None:
    deadline = time.monotonic() + PROCESS_TIMEOUT_SECONDS
    while not (signal_dir / "reached").exists():
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"the actor ended (exit {process.returncode}) before its point:\n{stderr[-4000:]}")
        assert time.monotonic() < deadline, f"the actor did not reach its point in {PROCESS_TIMEOUT_SECONDS}s"
        time.sleep(0.05)


def finish(process: subprocess.Popen) -> None:
    try:
        process.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        raise AssertionError(f"the actor still ran after {PROCESS_TIMEOUT_SECONDS}s:\n{stderr[-4000:]}") from None


def files_of_every_snapshot(table: Table) -> set[str]:
    """The data files any retained snapshot of `table` (any ref, or none) references."""
    return {entry.data_file.file_path for snapshot in table.metadata.snapshots
            for manifest in snapshot.manifests(table.io) for entry in manifest.fetch_manifest_entry(table.io)}
