"""The fault matrix's upsert primary: `ingest` of an upsert mapping (actor.py's `upsert` points) held or killed at a
point of each family (before, inside, after its commit), with another run of the mapping meanwhile; then settling
runs. The invariant is an upsert table's: the table equals the state per key that the log alone leads to (every
column), no run record is left, every file a snapshot references exists and every data file is referenced by one
(nothing the held or killed run wrote is left behind, nothing committed was deleted)."""

from __future__ import annotations

import contextlib

import pytest

from kafscale_lakehouse.engine.ingestion import IngestFailedError, ingest
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE
from kafscale_lakehouse_tests.engine.faults.actor import OTHER_POINTS
from kafscale_lakehouse_tests.engine.faults.held import files_of_every_snapshot, run_held
from kafscale_lakehouse_tests.engine.faults.matrix import point_family
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
    env = dict(world.subprocess_env(), **{SPARK_REMOTE_VARIABLE: spark_engine.url})

    def second_run() -> None:
        changes.write(20)
        with contextlib.suppress(IngestFailedError):  # the primary holds the partitions' leases (pause)
            ingest(world.config(document), spark)

    run_held("upsert", point, action, ["ingest", "--config", str(config_path), "--once"], env=env,
             signal_dir=tmp_path / "signals",
             wait_for_leases=lambda: world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 4),
             meanwhile=second_run if secondary == "ingest" else lambda: None)
    for _ in range(2):  # settling runs
        ingest(world.config(document), spark)

    assert_state(world, changes)
    assert world.recorded_runs() == []
    table = world.table()
    referenced = files_of_every_snapshot(table)
    stored = world.table_data_files(table)
    assert referenced <= stored, f"referenced files are gone: {sorted(referenced - stored)[:3]}"
    assert stored <= referenced, f"files no snapshot references were left: {sorted(stored - referenced)[:3]}"

