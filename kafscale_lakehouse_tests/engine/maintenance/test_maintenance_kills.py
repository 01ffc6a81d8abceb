"""Maintenance (compaction, manifest rewrite, snapshot expiry, orphan-file removal) running next to ingestion, both
real processes SIGKILLed at random points, round after round: in the end every record is in the table exactly once,
the offsets agree, and every file the table references exists.

The kill times are random (uniform over the processes' start-up, Spark job, commits and clean-up); a failure prints
the seed, and KAFSCALE_KILL_SEED=<seed> replays the same kill times.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.maintenance import MaintenanceSettings, maintain_table, remove_orphan_files
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.ingestion.harness import CLI, LEASE_TTL_SECONDS
from kafscale_lakehouse_tests.engine.maintenance.maintain_run import EVERY_STEP_EVERY_TIME

pytestmark = pytest.mark.integration

ROUNDS = 5
RECORDS_PER_ROUND = 40
ORPHAN_MIN_AGE_SECONDS = 45  # longer than any run here takes: the files of live runs are never orphans
PROCESS_TIMEOUT_SECONDS = 240


def _start(world, args: list[str], log_path: Path) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen(args, cwd=REPO_ROOT, env=world.subprocess_env(), stdout=log, stderr=subprocess.STDOUT)


def test_maintenance_and_ingestion_killed_at_random_points_lose_and_double_nothing(production_world, spark):
    seed = int(os.environ.get("KAFSCALE_KILL_SEED") or secrets.randbits(32))
    rng = random.Random(seed)
    world = production_world
    config_path = world.write_config_file()
    next_base = {0: 0, 1: 0}

    def new_segments() -> None:
        for partition in (0, 1):
            world.write_segments(partition, RECORDS_PER_ROUND, base_offset=next_base[partition],
                                 records_per_segment=RECORDS_PER_ROUND // 2)
            next_base[partition] += RECORDS_PER_ROUND

    for _ in range(3):  # a history of small files and manifests for maintenance to work on
        new_segments()
        ingest(world.config(), spark)

    history = []
    for round_number in range(ROUNDS):
        new_segments()
        world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 5)
        processes = {
            "ingest": _start(world, [str(CLI), "ingest", "--config", str(config_path), "--once"],
                             world.root / f"ingest-{round_number}.log"),
            "maintain": _start(world, [sys.executable, "-m", "kafscale_lakehouse_tests.engine.maintenance.maintain_run",
                                       "--config", str(config_path), "--orphan-min-age-seconds",
                                       str(ORPHAN_MIN_AGE_SECONDS)], world.root / f"maintain-{round_number}.log"),
        }
        victims = rng.choice([("ingest",), ("maintain",), ("ingest", "maintain")])
        kill_at = {name: rng.uniform(2.0, 20.0) for name in victims}
        started = time.monotonic()
        killed = set()
        while any(p.poll() is None for p in processes.values()):
            elapsed = time.monotonic() - started
            assert elapsed < PROCESS_TIMEOUT_SECONDS, f"seed {seed}: round {round_number} did not end"
            for name, at in kill_at.items():
                if name not in killed and elapsed >= at and processes[name].poll() is None:
                    processes[name].send_signal(signal.SIGKILL)
                    killed.add(name)
            time.sleep(0.05)
        history.append({name: f"killed at {kill_at[name]:.1f}s" if name in killed else "finished"
                        for name in processes})
        for name, process in processes.items():
            if name not in killed:
                log = (world.root / f"{name}-{round_number}.log").read_text()[-3000:]
                assert process.returncode == 0, f"seed {seed}, rounds {history}: {name} exit {process.returncode}\n" \
                                                f"{log}"

    # Recovery: one more ingestion run and a maintenance run with nothing else going on (orphans of any age).
    world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 5)
    ingest(world.config(), spark)
    settings = MaintenanceSettings(orphan_min_age=timedelta(0), **EVERY_STEP_EVERY_TIME)
    maintain_table(spark, world.table(), settings)
    time.sleep(1.5)  # every file is now older than this cut-off (object stores keep whole seconds)
    remove_orphan_files(world.table(), older_than=datetime.now(UTC))  # nothing else runs: any unreferenced file goes

    context = f"seed {seed}, rounds {history}"
    assert next_base == {0: (3 + ROUNDS) * RECORDS_PER_ROUND, 1: (3 + ROUNDS) * RECORDS_PER_ROUND}
    try:
        table = world.assert_exactly_once(runs=len(world.our_snapshots()))
    except AssertionError as exc:
        raise AssertionError(f"{context}: {exc}") from exc
    referenced = world.referenced_data_files(table)
    assert referenced <= world.table_data_files(), f"{context}: a referenced data file is gone"
    assert world.recorded_runs() == [], f"{context}: a killed run's files were never settled"
