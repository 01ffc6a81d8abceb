"""The fault matrix's IO-manager primary: a real Dagster materialization of a downstream asset (engine/faults/io_run.py:
partition `a`, written by the Iceberg IO manager to the SeaweedFS REST catalog through the suite's Spark engine) in a
process of its own, held or killed at a point of each family (before, inside, after its commit) in each write mode,
while another materialization of the asset commits; a run left unfinished (killed) is then failed and re-executed
from its failure, as Dagster's run retries do, and a step that failed is attempted again in its own run (its retry
policy). The invariants, per write mode:
- append: partition `a`'s rows exactly once (never twice after a retry, never missing), every other write's rows once;
- overwrite: partition `a` equals exactly one complete write (all its rows from one run), never a mix;
- upsert: each key exactly once, with the value of the newest write (the later commit wins);
- a failed write (the DataFrame's write raises in a Spark task): the table holds no row of it and no file of it is
  left;
- always: every file a snapshot references exists, and each writer wrote only inside its own directories
  (`data/kafscale-<run id>-w<random>/`).
Plus two partitions of an upsert asset writing the same keys in two processes, one held at its commit while the other
commits: each key once, with the value of the commit that came last."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE
from kafscale_lakehouse.engine.spark.writes import write_arrow
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.writes import TableWrite
from kafscale_lakehouse.orchestration.io_manager import DAGSTER_PARTITIONS_PROPERTY, DAGSTER_RUN_PROPERTY
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.faults.actor import OTHER_POINTS, command
from kafscale_lakehouse_tests.engine.faults.held import files_of_every_snapshot, finish, run_held, wait_reached
from kafscale_lakehouse_tests.engine.faults.io_run import ids_of, instance_of, materialize, spec_document
from kafscale_lakehouse_tests.engine.faults.matrix import point_family
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, TABLE_BUCKET

# (primary, point, action, meanwhile). The primary writes partition `a` in its write mode (`failed`: an append whose
# DataFrame raises); meanwhile another run materializes partition `b` (with upsert: the same keys) or `a` (`same`).
CASES = (
    ("append", "after-write", "pause", "other"),
    ("append", "inside-commit", "unknown", "other"),
    ("append", "after-commit", "kill", "other"),
    ("overwrite", "after-write", "pause", "same"),
    ("overwrite", "inside-commit", "kill", "same"),
    ("overwrite", "after-commit", "kill", "same"),
    ("upsert", "after-rewrite", "pause", "other"),
    ("upsert", "inside-commit", "late", "other"),
    ("upsert", "after-commit", "kill", "other"),
    ("failed", "before-write", "pause", "other"),
)
WRITER_DIR = re.compile(r"/data/kafscale-(?P<run>[\w.-]+)-w[0-9a-f]{12}/[^/]+$")
SEED_RUN = "seed"


def test_the_cases_cover_every_point_family_of_each_write_mode():
    families = {point_family(point) for point in OTHER_POINTS["io"]}
    for mode in ("append", "overwrite", "upsert"):
        assert {point_family(p) for m, p, _, _ in CASES if m == mode} == families, mode
    assert {point_family(p) for m, p, _, _ in CASES if m == "failed"} == {"before"}  # its write raises: no commit


class IoWorld:
    """The asset's table on the SeaweedFS REST catalog, a Dagster instance in a directory of its own, and a spec per
    write mode for io_run.py."""

    def __init__(self, seaweedfs, spark_engine, namespace: str, root: Path) -> None:
        self.seaweedfs = seaweedfs
        self.root = root
        self.config = {
            "s3": {"bucket": S3_BUCKET, "endpoint": seaweedfs.s3_endpoint, "region": REGION, "path_style": True,
                   "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
            "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "username": ACCESS_KEY,
                                    "password": SECRET_KEY}, "warehouse": f"s3://{TABLE_BUCKET}"},
            "offsets": {"backend": "local", "local_path": str(root / "offsets.db")},
            "mappings": [{"topic": "unused", "table": "unused.table"}],
        }
        self.namespace, self.name = namespace, "written"
        self.remote = spark_engine.url
        (root / "dagster").mkdir()
        self.instance = instance_of(self.spec("append"))

    def spec(self, mode: str, *, fail: bool = False) -> str:
        path = self.root / f"spec-{mode}{'-failing' if fail else ''}.json"
        if not path.exists():
            path.write_text(json.dumps(spec_document(config=self.config, namespace=self.namespace, name=self.name,
                                                     mode=mode, dagster_home=self.root / "dagster",
                                                     fail=fail)))
        return str(path)

    def seed(self, partition: str) -> str:
        """The table before the case, holding one write of `partition` (written as the IO manager writes, without a
        run: `SEED_RUN` stands for its run id)."""
        ids = ids_of("append", partition)
        rows = pa.table({"id": pa.array(ids, pa.int64()), "part": [partition] * len(ids),
                         "written_by": [SEED_RUN] * len(ids)})
        write_arrow(self.catalog(), rows, TableWrite(
            f"{self.namespace}.{self.name}", run_id=SEED_RUN, mode="append",
            snapshot_properties={DAGSTER_RUN_PROPERTY: SEED_RUN, DAGSTER_PARTITIONS_PROPERTY: json.dumps([partition])}))
        return SEED_RUN

    def run(self, mode: str, partition: str) -> str:
        """A materialization of `partition` in this process (on the suite's local Spark session); its run id."""
        result = materialize(self.spec(mode), partition, instance=self.instance)
        assert result.success, f"the materialization of {partition} failed"
        return result.run_id

    def env(self) -> dict[str, str]:
        """A materialization's process: a client of the suite's Spark engine."""
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION,
                   PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **{SPARK_REMOTE_VARIABLE: self.remote})
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.pop(name, None)
        return env

    def catalog(self):
        return load_catalog(catalog_settings(parse_config(self.config, base_dir=self.root)))

    def table(self):
        return self.catalog().load_table(f"{self.namespace}.{self.name}")

    def rows(self) -> list[dict]:
        return self.table().scan().to_arrow().to_pylist()

    def stored_files(self) -> set[str]:
        """Every object under the table's data path."""
        bucket, _, prefix = (self.table().location().rstrip("/") + "/data/").removeprefix("s3://").partition("/")
        paginator = self.seaweedfs.s3_client().get_paginator("list_objects_v2")
        return {f"s3://{bucket}/{o['Key']}" for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", []) if not o["Key"].endswith("/")}

    def runs_other_than(self, known: set[str]) -> list[dg.DagsterRun]:
        return [run for run in self.instance.get_runs() if run.run_id not in known]

    def newest_write_of(self, partition: str) -> str:
        """The run of the newest snapshot on main that wrote `partition` (by its summary)."""
        table = self.table()
        snapshot = table.current_snapshot()
        while snapshot is not None:
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if partition in json.loads(summary.get(DAGSTER_PARTITIONS_PROPERTY, "[]")):
                return summary[DAGSTER_RUN_PROPERTY]
            snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
        raise AssertionError(f"no snapshot wrote partition {partition}")

    def assert_files_of_their_writers(self, runs: set[str]) -> None:
        """Every file a snapshot references exists; every file lies in a writer directory of one of `runs`, and the
        files a snapshot added lie in a directory of the run that committed it."""
        table = self.table()
        referenced, stored = files_of_every_snapshot(table), self.stored_files()
        assert referenced <= stored, f"files referenced by a snapshot are gone: {sorted(referenced - stored)[:3]}"
        for path in stored:
            match = WRITER_DIR.search(path)
            assert match and match["run"] in runs, f"{path} is in no writer directory of the case's runs {runs}"
        for snapshot in table.metadata.snapshots:
            run_id = snapshot.summary.additional_properties.get(DAGSTER_RUN_PROPERTY) if snapshot.summary else None
            for manifest in snapshot.manifests(table.io):
                if manifest.added_snapshot_id != snapshot.snapshot_id:
                    continue
                for entry in manifest.fetch_manifest_entry(table.io):
                    if entry.snapshot_id == snapshot.snapshot_id and entry.status.name == "ADDED":
                        assert WRITER_DIR.search(entry.data_file.file_path)["run"] == run_id, (
                            f"snapshot {snapshot.snapshot_id} of run {run_id} added {entry.data_file.file_path}")


@pytest.fixture
def io_world(seaweedfs, spark, spark_engine, unique_prefix, tmp_path) -> IoWorld:
    return IoWorld(seaweedfs, spark_engine, unique_prefix.replace("-", "_"), tmp_path)


@pytest.mark.parametrize(("primary", "point", "action", "meanwhile"), CASES,
                         ids=[f"io-{m}@{p}/{a}+{w}" for m, p, a, w in CASES])
def test_io_manager_case_keeps_its_write_mode_invariant(io_world, primary, point, action, meanwhile, tmp_path):
    world = io_world
    mode = "append" if primary == "failed" else primary
    # The table before the case: partition `b` (append, failed write: `a` is the primary's alone) or `a`.
    known = {world.seed("b" if mode == "append" else "a")}
    before = world.rows()
    other = "a" if meanwhile == "same" else "b"
    meanwhile_runs: list[str] = []

    def concurrent_write() -> None:
        if meanwhile != "none":
            meanwhile_runs.append(world.run(mode, other))

    run_held("io", point, action, ["materialize", world.spec(mode, fail=primary == "failed"), "a"], env=world.env(),
             signal_dir=tmp_path / "signals", wait_for_leases=lambda: None, meanwhile=concurrent_write)
    known.update(meanwhile_runs)
    [primary_run] = world.runs_other_than(known)
    runs = {*known, primary_run.run_id}
    primary_run = world.instance.get_run_by_id(primary_run.run_id)
    if primary == "failed":
        assert primary_run.status == dg.DagsterRunStatus.FAILURE
        unchanged = [r for r in world.rows() if r["written_by"] not in meanwhile_runs]
        assert sorted(map(str, unchanged)) == sorted(map(str, before)), "the failed write changed the table"
        assert not [p for p in world.stored_files() if f"kafscale-{primary_run.run_id}-" in p], "its files are left"
    elif primary_run.status != dg.DagsterRunStatus.SUCCESS:
        # Killed: the run's process is gone (as run monitoring finds it), then a run retry re-executes it.
        assert action == "kill", f"the primary's run ended {primary_run.status}"
        world.instance.report_run_failed(primary_run, "its process was killed")
        retry = materialize(world.spec(mode), "a", parent_run_id=primary_run.run_id, instance=world.instance)
        assert retry.success
        runs.add(retry.run_id)
    world.assert_files_of_their_writers(runs)
    rows = world.rows()
    if mode == "append":
        for partition in ("a", "b"):
            counts = Counter((r["id"], r["written_by"]) for r in rows if r["part"] == partition)
            assert all(n == 1 for n in counts.values()), f"partition {partition}: rows twice: {counts.most_common(3)}"
        ids_a = Counter(r["id"] for r in rows if r["part"] == "a")
        if primary != "failed":
            assert ids_a == Counter(ids_of(mode, "a")), f"partition a not exactly once: {ids_a.most_common(3)}"
    elif mode == "overwrite":
        part_a = [r for r in rows if r["part"] == "a"]
        assert sorted(r["id"] for r in part_a) == ids_of(mode, "a"), "partition a is not one complete write"
        assert {r["written_by"] for r in part_a} == {world.newest_write_of("a")}, "partition a mixes writes"
    else:
        assert sorted(r["id"] for r in rows) == ids_of(mode, "a"), "keys not exactly once"
        # Every write upserts every key: the newest commit's values everywhere.
        newest = world.table().current_snapshot().summary.additional_properties[DAGSTER_RUN_PROPERTY]
        assert {r["written_by"] for r in rows} == {newest}, "a key does not hold the newest write's value"


def test_two_partitions_upserting_one_key_keep_it_once_with_the_last_commit(io_world, tmp_path):
    """Partition `a` held at its commit (plan made, files rewritten) while partition `b`, in another process, upserts
    the same keys and commits; then `a` commits: the keys once each, with `a`'s values (the later commit wins)."""
    world = io_world
    seed = world.seed("a")
    spec = world.spec("upsert")
    (tmp_path / "signals").mkdir()
    held = subprocess.Popen(command("io", "after-rewrite", "pause", tmp_path / "signals", ["materialize", spec, "a"]),
                            cwd=REPO_ROOT, env=world.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_reached(held, tmp_path / "signals")
    other = subprocess.run([sys.executable, "-m", "kafscale_lakehouse_tests.engine.faults.io_run", spec, "b"],
                           cwd=REPO_ROOT, env=world.env(), capture_output=True, text=True, timeout=240)
    assert other.returncode == 0, other.stderr[-3000:]
    (tmp_path / "signals" / "go").write_text("go\n")
    finish(held)
    assert held.returncode == 0, "the held materialization failed"
    [run_a] = [r.run_id for r in world.instance.get_runs() if r.tags.get("dagster/partition") == "a"]
    [run_b] = [r.run_id for r in world.instance.get_runs()
               if r.tags.get("dagster/partition") == "b" and r.run_id != seed]
    rows = world.rows()
    assert sorted(r["id"] for r in rows) == ids_of("upsert", "a"), "keys not exactly once"
    assert {r["written_by"] for r in rows} == {run_a}, f"a key lost the later commit's value (b: {run_b})"
    world.assert_files_of_their_writers({seed, run_a, run_b})
