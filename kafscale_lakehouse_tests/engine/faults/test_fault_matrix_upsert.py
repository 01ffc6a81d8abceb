"""The fault matrix's upsert primary: `ingest` of an upsert mapping (actor.py's `upsert` points) held or killed at a
point of each family (before, inside, after its commit), with another run of the mapping meanwhile; then settling
runs. The invariant is an upsert table's: the table equals the state per key that the log alone leads to (every
column), no run record is left, every file a snapshot references exists and every data file is referenced by one
(nothing the held or killed run wrote is left behind, nothing committed was deleted)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pyiceberg.table import Table

from kafscale_lakehouse.engine.ingestion import IngestFailedError, ingest
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.faults.actor import OTHER_POINTS, command
from kafscale_lakehouse_tests.engine.faults.matrix import PROCESS_TIMEOUT_SECONDS, point_family
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS
from kafscale_lakehouse_tests.engine.upsert.changes import STORE_COLUMNS, StoreChanges, assert_state

# (point, action, secondary): `ingest` is a second run of the mapping while the primary is held (refused while it
# holds its leases; landing the log once they expired under a frozen primary) or after it was killed.
CASES = (
    ("after-write", "freeze", "ingest"),
    ("before-commit", "pause", "ingest"),
    ("after-rewrite", "kill", "ingest"),
    ("inside-commit", "unknown", "ingest"),
    ("inside-commit", "late", "ingest"),
    ("after-commit", "kill", "ingest"),
)


def test_the_cases_cover_every_point_family_of_the_upsert_primary():
    assert {point_family(point) for point, _, _ in CASES} == {point_family(p) for p in OTHER_POINTS["upsert"]}


@pytest.mark.parametrize(("point", "action", "secondary"), CASES, ids=[f"upsert@{p}/{a}+{s}" for p, a, s in CASES])
def test_upsert_case_ends_in_the_logs_state_with_every_referenced_file(production_world, spark, spark_engine, point,
                                                                       action, secondary, tmp_path):
    world = production_world
    changes = StoreChanges(world, seed=11)
    document = world.config_document()
    document["mappings"][0].update(mode="upsert", id_columns=["store_id"], schema={"columns": STORE_COLUMNS})
    config_path = world.write_config_file(document)
    changes.write(80)
    ingest(world.config(document), spark)
    changes.write(80)  # pending for the primary
    signal_dir = tmp_path / "signals"
    signal_dir.mkdir()
    env = dict(world.subprocess_env(), **{SPARK_REMOTE_VARIABLE: spark_engine.url})
    primary = subprocess.Popen(command("upsert", point, action, signal_dir,
                                       ["ingest", "--config", str(config_path), "--once"]),
                               cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_reached(primary, signal_dir)
    if action in ("kill", "unknown"):
        finish(primary)
    if action != "pause":
        # Frozen with its lease keeper, killed, or ended on a lost answer (`late`: its process stays until the
        # catalog applies the commit): its leases expire or were released.
        world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 4)
    if secondary == "ingest":
        changes.write(20)
        with contextlib.suppress(IngestFailedError):  # the primary holds the partitions' leases (pause)
            ingest(world.config(document), spark)
    if action == "freeze":
        os.kill(primary.pid, signal.SIGCONT)
    elif action in ("pause", "late"):
        (signal_dir / "go").write_text("go\n")
    if primary.returncode is None:
        finish(primary)
    if action == "late":
        assert (signal_dir / "applied").exists() or (signal_dir / "refused").exists()
    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 4)
    for _ in range(2):  # settling runs
        ingest(world.config(document), spark)

    assert_state(world, changes)
    assert world.recorded_runs() == []
    table = world.table()
    referenced = files_of_every_snapshot(table)
    stored = world.table_data_files(table)
    assert referenced <= stored, f"referenced files are gone: {sorted(referenced - stored)[:3]}"
    assert stored <= referenced, f"files no snapshot references were left: {sorted(stored - referenced)[:3]}"


def wait_reached(process: subprocess.Popen, signal_dir: Path) -> None:
    deadline = time.monotonic() + PROCESS_TIMEOUT_SECONDS
    while not (signal_dir / "reached").exists():
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"the upsert run ended (exit {process.returncode}) before its point:\n"
                                 f"{stderr[-4000:]}")
        assert time.monotonic() < deadline, f"the upsert run did not reach its point in {PROCESS_TIMEOUT_SECONDS}s"
        time.sleep(0.05)


def finish(process: subprocess.Popen) -> None:
    try:
        process.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        raise AssertionError(f"the upsert run still ran after {PROCESS_TIMEOUT_SECONDS}s:\n{stderr[-4000:]}") from None


def files_of_every_snapshot(table: Table) -> set[str]:
    return {entry.data_file.file_path for snapshot in table.metadata.snapshots
            for manifest in snapshot.manifests(table.io) for entry in manifest.fetch_manifest_entry(table.io)}
