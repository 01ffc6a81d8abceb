"""The fault matrix: two actors on one topic's table, one of them held or killed at a named interleaving point, on
the real servers (SeaweedFS S3 + Iceberg REST catalog, etcd, a Spark engine); then the invariants every case ends
with.

A case is `primary@point/action+secondary`:
- the primary (`ingest`, `ingest-audited`: the mapping with `publish: audited`, killed or held around its commit to
  the audit branch and main's fast-forward, `replay`, `move-back`, and maintenance: `compact`, `manifests`,
  `expire`, `orphans`) is a
  real `kafscale-lakehouse` process (actor.py) that reaches `point` and is killed, paused (leases kept) or frozen
  (leases expire while it lives), or whose commit is applied but answered with an error (`unknown`), or answered
  with an error and applied by the catalog only later (`late`: after the run ended and released its leases);
- meanwhile (or, when it was killed, after it) the secondary acts: another run of ours (in this process, a process
  killed at a point of its own, or one held at its own point while the primary goes on), our maintenance, a
  position move or replay, another engine's append, delete (copy-on-write, or merge-on-read position deletes),
  rollback or expiry, or the broker re-cutting or re-uploading a segment;
- then the primary goes on (pause, freeze) and ends; leases expire; settling runs ingest until nothing moves (with
  `publish: audited`, a run refused because of a pending audit it may not publish is followed by the operator's
  `audit drop`, and settling goes on).

The invariants (`check_invariants`), after the two actors and again after settling: the table scans; every file
that any snapshot references exists; every row of the topic is there once, the table's offsets hold exactly the
segments' offsets below them (minus what another engine deleted), a partition stops only at a gap in the log and
then a run says so; the offsets store agrees with the table.

CI runs a deterministic selection, the same on every run of a commit, so that a red CI names a change's own failure:
the cases of the holes and findings, plus one case per primary and point family (before, inside, after its commit),
picked in a fixed order. `KAFSCALE_FAULT_MATRIX=<n>` adds a sample of n drawn with a printed seed
(`KAFSCALE_FAULT_SEED` repeats it); `KAFSCALE_FAULT_MATRIX=full` runs every case.

The upsert primary, whose invariant is an upsert table's (the state per key the log leads to), has its cases in
test_fault_matrix_upsert.py, one or more per point family; the IO manager's downstream writes, whose invariants are
their write mode's (actor `io`, io_run.py), in orchestration/lakehouse/test_fault_matrix_io_manager.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import And, EqualTo, LessThan
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion import IngestFailedError, ingest
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE, ConnectAddress
from kafscale_lakehouse.engine.tables.audit import AuditPendingError
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.storage import ObjectKind
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.faults.actor import POINTS
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, IngestWorld
from kafscale_lakehouse_tests.engine.tables.other_engines import add_position_deletes
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, SEGMENT_RECORDS, records_with_faults

log = logging.getLogger(__name__)

PRIMARIES = tuple(POINTS)
ACTIONS = ("kill", "pause", "freeze", "unknown", "late")
SECONDARY_KILL_POINTS = ("before-commit", "after-commit", "before-forget")
SECONDARY_PAUSE_POINTS = ("after-plan", "before-commit")  # a second run held there while the primary goes on
SECONDARIES = (
    "none", "ingest", *(f"ingest-killed:{p}" for p in SECONDARY_KILL_POINTS),
    *(f"ingest-paused:{p}" for p in SECONDARY_PAUSE_POINTS), "compact", "manifests", "expire",
    "orphans", "replay", "move-back", "foreign-append", "foreign-delete", "foreign-delete-mor", "foreign-rollback",
    "foreign-expire", "recut", "reupload",
)
# The primary ingest reads partition 0's first pending segment after these points; a re-cut must come before the read
# for the old and the new segment to disagree (a re-cut of offsets already landed is retention, not a fault).
POINTS_BEFORE_READ = ("before-lease", "during-cleanup", "after-plan")

PARTITIONS = (0, 1)
INVALID_POSITIONS = sorted(p for p, f in FAULTS.items() if f.coercion_reason)  # of each segment of partition 0
MOVE_BACK_TO = 10  # `offsets reset --to-offset` of partition 0 (its table next offset is 100 when a case starts)
FOREIGN_DELETED = {1: set(range(10))}  # what another engine's delete removes: partition 1, offsets 0..9
PENDING_BASE = 100  # partition 0's first segment no run has read when the case starts (20 records)
RECUT_RECORDS = 12  # the re-cut segment holds PENDING_BASE .. PENDING_BASE + 11; 112..119 are gone from the log
PROCESS_TIMEOUT_SECONDS = 240
NOTHING_LANDED = ": 0 records, snapshot None"  # cli.py's summary of a run that found no record to land
LEASE_HELD = " is held by "  # offsets/errors.py LeaseHeldError: a partition's lease another run holds
SEED_VARIABLE = "KAFSCALE_FAULT_SEED"  # conftest sets one per test run (every pytest-xdist worker draws the same)
AUDIT_REFUSED = "refused, an audit pending: "  # an Outcome's detail when a run refused because of a pending audit


@dataclass(frozen=True)
class Case:
    primary: str
    point: str
    action: str
    secondary: str

    @property
    def id(self) -> str:
        return f"{self.primary}@{self.point}/{self.action}+{self.secondary}"


# The holes, each as a case of the matrix (they run in CI on every commit).
HOLE_CASES = {
    "1a clean-up with a table opened before another run's commit": Case(
        "ingest", "before-lease", "pause", "ingest-killed:before-forget"),
    "1b lease expires between the lease check and a slow commit": Case(
        "ingest", "before-commit", "freeze", "ingest-paused:after-plan"),
    "1c commit applied, answered 5xx": Case("ingest", "inside-commit", "unknown", "ingest"),
    "1c the catalog applies a commit after the run gave up on it, while a second run cleans up": Case(
        "ingest", "inside-commit", "late", "ingest-paused:after-plan"),
    "3 position moved back while an ingestion commits": Case("move-back", "before-lease", "pause", "ingest"),
    "4 segment re-cut between planning and reading": Case("ingest", "after-plan", "pause", "recut"),
    "5 compaction while another engine deletes (merge-on-read)": Case(
        "compact", "after-write", "pause", "foreign-delete-mor"),
    "7 table rolled back under a run": Case("ingest", "after-write", "pause", "foreign-rollback"),
    "7 another engine expires our snapshots": Case("ingest", "after-commit", "kill", "foreign-expire"),
}

# Cases the matrix failed beyond the holes (the bug named, fixed in the commit that says so), and cases of the
# writers' commit guards; they run in CI too.
FOUND_CASES = {
    "a move refused because a run holds the partition was a traceback (ReplayError not an EngineError)": Case(
        "replay", "after-write", "pause", "move-back"),
    "compaction commits to main while an audited run is about to commit to its branch": Case(
        "ingest-audited", "before-commit", "pause", "compact"),
    "an audited commit whose answer is lost while a manifest merge moves main": Case(
        "ingest-audited", "inside-commit", "late", "manifests"),
}


def all_cases() -> list[Case]:
    cases = []
    for primary, points in POINTS.items():
        for point in points:
            for action in ACTIONS:
                if action in ("unknown", "late") and not point.startswith("inside-"):
                    continue
                for secondary in SECONDARIES:
                    if (secondary == "recut" and primary.startswith("ingest")
                            and point not in POINTS_BEFORE_READ):
                        continue
                    if secondary.startswith("ingest-paused:") and action in ("kill", "unknown"):
                        continue  # the primary has ended: nothing to interleave with
                    cases.append(Case(primary, point, action, secondary))
    return cases


@dataclass(frozen=True)
class Selection:
    seed: int
    mode: str
    cases: list[Case]

    def describe(self) -> str:
        return (f"fault matrix: {len(self.cases)} of {len(all_cases())} cases ({self.mode}), seed "
                f"{self.seed} (KAFSCALE_FAULT_SEED={self.seed} repeats it; KAFSCALE_FAULT_MATRIX=full runs all)")


# Points named "after" a step that comes before the primary's commit (or, for orphan removal, before its deletes).
_BEFORE_COMMIT_AFTER_POINTS = ("after-plan", "after-write", "after-rewrite", "after-listing")


def point_family(point: str) -> str:
    """Where a point lies relative to the primary's commit: `before` (leases, clean-up, plan, write), `inside` (the
    catalog call) or `after` (the commit landed: the offsets, the forget, the publish)."""
    if point.startswith("inside-"):
        return "inside"
    if point.startswith("after-") and point not in _BEFORE_COMMIT_AFTER_POINTS:
        return "after"
    return "before"


def covering_cases(everything: list[Case], fixed: list[Case]) -> list[Case]:
    """One case per primary and point family that `fixed` does not cover, picked in a fixed order (by the SHA-256 of
    the case id): the same cases on every run, spread over actions and secondaries."""
    covered = {(c.primary, point_family(c.point)) for c in fixed}
    chosen = []
    for case in sorted(everything, key=lambda c: hashlib.sha256(c.id.encode()).hexdigest()):
        family = (case.primary, point_family(case.point))
        if family not in covered:
            covered.add(family)
            chosen.append(case)
    return chosen


@functools.cache
def selection() -> Selection:
    """The cases this test run runs: the holes' and findings' cases and one per primary and point family (CI's
    deterministic selection), plus a seeded sample of `KAFSCALE_FAULT_MATRIX=<n>`, or all of them (`full`)."""
    seed = int(os.environ.get(SEED_VARIABLE) or time.time_ns() % 1_000_000)
    wanted = os.environ.get("KAFSCALE_FAULT_MATRIX") or "0"
    everything = all_cases()
    if wanted == "full":
        return Selection(seed, "full", everything)
    fixed = list(dict.fromkeys([*HOLE_CASES.values(), *FOUND_CASES.values()]))
    fixed += covering_cases(everything, fixed)
    others = [c for c in everything if c not in fixed]
    sample = random.Random(seed).sample(others, min(int(wanted), len(others)))
    return Selection(seed, f"{len(fixed)} of the holes, findings and every primary's point families, a sample of "
                           f"{len(sample)}", fixed + sample)


def selected_cases(primaries: tuple[str, ...]) -> list[Case]:
    """The selection's cases of these primaries: one test module per group, so pytest-xdist's workers share them."""
    return [case for case in selection().cases if case.primary in primaries]


# ---------------------------------------------------------------------------------------------- the world


@dataclass
class Outcome:
    """What an actor reported: `ok`, or the error it reported (a process: its exit code and stderr's tail)."""

    actor: str
    ok: bool
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.actor}: {'ok' if self.ok else 'failed'} {self.detail[-600:]}".strip()


@dataclass
class FaultWorld:
    world: IngestWorld
    spark: Any
    engine: ConnectAddress
    cli_main: Callable[..., int]
    secondary_pid: int | None = None  # the secondary's process, when it is one
    audited: bool = False  # the mapping publishes audited (the `ingest-audited` primary)
    invalid: dict[int, set[int]] = field(default_factory=dict)  # partition 0: segment base → its invalid offsets
    deleted: dict[int, set[int]] = field(default_factory=dict)  # offsets another engine deleted, per partition
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def topic(self) -> str:
        return self.world.topic

    @property
    def dead_letter_table_name(self) -> str:
        return f"{self.world.table_name}_rejects"

    def config_document(self) -> dict[str, Any]:
        document = self.world.config_document()
        # Our maintenance acts on a young, small table (the defaults wait for days and hundreds of files).
        document["mappings"][0]["maintenance"] = {"max_snapshots": 1, "min_input_files": 2, "manifest_min_count": 2}
        # Records the mapping cannot land (order_id missing, not JSON) go to a dead-letter table.
        document["mappings"][0]["dead_letter_table"] = self.dead_letter_table_name
        if self.audited:
            document["mappings"][0]["publish"] = "audited"
        return document

    def write(self, base: int, count: int) -> None:
        """Partition 0: segments of SEGMENT_RECORDS records with invalid ones among them (zstd); partition 1: pizza
        orders in segments of 20 records, every codec in turn."""
        for offset in range(base, base + count, SEGMENT_RECORDS):
            self.world.write_records(0, offset, records_with_faults(offset))
            self.invalid[offset] = {offset + p for p in INVALID_POSITIONS}
        self.world.write_segments(1, count, base_offset=base, records_per_segment=SEGMENT_RECORDS)

    def prepare(self) -> Path:
        """Two runs landed (4 data files, 2 snapshots; dead letters of partition 0), and 40 records per partition
        pending."""
        config_path = self.world.write_config_file(self.config_document())
        for base, count in ((0, 60), (60, 40)):
            self.write(base, count)
            ingest(self.world.config(self.config_document()), self.spark)
        self.write(PENDING_BASE, 40)
        return config_path

    def invalid_offsets(self) -> set[int]:
        """Partition 0's offsets that are dead letters, in the segments that exist now."""
        return {o for base, offsets in self.invalid.items() if base in self.world.segments[0] for o in offsets}

    # ---- actors ---------------------------------------------------------------------------------------------

    def command(self, primary: str, config_path: Path) -> list[str]:
        config = ["--config", str(config_path)]
        return {
            "ingest": ["ingest", *config, "--once"],
            "ingest-audited": ["ingest", *config, "--once"],
            # Partition 1: a replay refuses a range holding invalid records (it writes no dead letters); from 20:
            # another engine's delete of offsets 0..9 stays deleted.
            "replay": ["offsets", "replay", "--topic", self.topic, "--partition", "1", "--from", "20", "--yes",
                       *config],
            "move-back": ["offsets", "reset", "--topic", self.topic, "--to-offset", str(MOVE_BACK_TO),
                          "--partition", "0", "--yes", *config],
            "compact": ["maintain", *config, "--step", "compact"],
            "manifests": ["maintain", *config, "--step", "manifests"],
            "expire": ["maintain", *config, "--step", "expire"],
            "orphans": ["maintain", *config, "--step", "orphans"],
        }[primary]

    def start(self, actor: str, point: str, action: str, config_path: Path, signal_dir: Path) -> subprocess.Popen:
        signal_dir.mkdir(parents=True, exist_ok=True)
        env = dict(self.world.subprocess_env(), **{SPARK_REMOTE_VARIABLE: self.engine.url})
        args = [sys.executable, "-m", "kafscale_lakehouse_tests.engine.faults.actor", actor, point, action,
                str(signal_dir), "--", *self.command(actor, config_path)]
        return subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def wait_reached(self, process: subprocess.Popen, signal_dir: Path, what: str, *,
                     second_run: bool = False) -> Outcome | None:
        """Until the actor reaches its point. A `second_run` may end before it, and that is its outcome, in two ways:
        refused because another run holds its partitions' leases (every error a held lease, exit 1), or with nothing
        to land because the first run's commit already holds the log's end (exit 0; checked against the table)."""
        deadline = time.monotonic() + PROCESS_TIMEOUT_SECONDS
        while not (signal_dir / "reached").exists():
            if process.poll() is not None:
                _, stderr = process.communicate()
                errors = error_lines(stderr)
                if (second_run and process.returncode == 1 and errors
                        and all(LEASE_HELD in line for line in errors)):
                    return Outcome(what, False, f"refused before its point, leases held: {errors[-1][-400:]}")
                if second_run and process.returncode == 0 and NOTHING_LANDED in stderr:
                    self.assert_log_end_landed(f"{what} landed nothing and ended before its point")
                    return Outcome(what, True, "nothing to land before its point: the table holds the log's end")
                raise AssertionError(f"{what} ended (exit {process.returncode}) before its point:\n{stderr[-4000:]}")
            assert time.monotonic() < deadline, f"{what} did not reach its point in {PROCESS_TIMEOUT_SECONDS}s"
            time.sleep(0.05)
        return None

    def finish(self, process: subprocess.Popen, what: str) -> Outcome:
        try:
            _, stderr = process.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
            raise AssertionError(f"{what} still running after {PROCESS_TIMEOUT_SECONDS}s:\n{stderr[-4000:]}") from None
        if process.returncode == -signal.SIGKILL:
            return Outcome(what, False, "killed")
        errors = error_lines(stderr)
        detail = " | ".join(errors[-3:] or stderr.strip().splitlines()[-1:])
        return Outcome(what, process.returncode == 0, f"exit {process.returncode}: {detail}")

    def run_in_process(self, what: str, action: Callable[[], Any]) -> Outcome:
        try:
            result = action()
        except IngestFailedError as exc:
            refused = isinstance(exc.__cause__, AuditPendingError)  # a pending audit it may not publish
            return Outcome(what, False, f"{AUDIT_REFUSED if refused else ''}{exc}")
        if isinstance(result, int) and result != 0:
            return Outcome(what, False, f"exit {result}")
        return Outcome(what, True)

    def secondary(self, name: str, config_path: Path, signal_dir: Path) -> Outcome:
        """The second actor, to its end."""
        config = ["--config", str(config_path)]
        if name == "none":
            return Outcome(name, True)
        if name == "ingest":
            return self.run_in_process(name, lambda: ingest(self.world.config(self.config_document()), self.spark))
        if name.startswith("ingest-killed:"):
            point = name.partition(":")[2]
            process = self.start("ingest", point, "kill", config_path, signal_dir / "secondary")
            self.secondary_pid = process.pid
            outcome = self.finish(process, name)
            if not (signal_dir / "secondary" / "reached").exists():
                outcome.detail = f"did not reach {point}: {outcome.detail}"  # e.g. refused leases: nothing to kill
            return outcome
        if name in ("compact", "manifests", "expire", "orphans"):
            return self.run_in_process(name, lambda: self.cli_main("maintain", *config, "--step", name))
        if name in ("replay", "move-back"):
            return self.run_in_process(name, lambda: self.cli_main(*self.command(name, config_path)))
        if name.startswith("foreign-"):
            getattr(self, name.replace("-", "_"))(self.world.table())
            return Outcome(name, True)
        if name == "recut":
            self.world.write_segments(0, RECUT_RECORDS, base_offset=PENDING_BASE, records_per_segment=RECUT_RECORDS)
            self.invalid.pop(PENDING_BASE)  # the re-cut segment holds only valid orders
            return Outcome(name, True)
        if name == "reupload":
            segment = self.world.segments[0][PENDING_BASE]
            for kind, path in ((ObjectKind.SEGMENT, segment.kfs_path), (ObjectKind.INDEX, segment.index_path)):
                self.world.put_object(self.world.segment_object_key(0, PENDING_BASE, kind), path.read_bytes())
            return Outcome(name, True)
        raise AssertionError(f"unknown secondary {name!r}")

    # ---- another engine, through pyiceberg -------------------------------------------------------------------

    def foreign_append(self, table: Table) -> None:
        """Rows of a topic of its own (another writer sharing the table)."""
        rows = table.scan(limit=5).to_arrow()
        other = "foreign-topic"
        rows = rows.set_column(rows.schema.get_field_index("topic"), "topic",
                               pa.array([other] * rows.num_rows, rows.schema.field("topic").type))
        record_ids = pc.binary_join_element_wise(other, pc.cast(rows["offset"], pa.string()), ":")
        rows = rows.set_column(rows.schema.get_field_index("record_id"), "record_id",
                               record_ids.cast(rows.schema.field("record_id").type))
        table.append(rows.cast(table.schema().as_arrow()))

    def foreign_delete(self, table: Table) -> None:
        for partition, offsets in FOREIGN_DELETED.items():
            table.delete(And(EqualTo("partition", partition), LessThan("offset", max(offsets) + 1)))
            self.deleted.setdefault(partition, set()).update(offsets)

    def foreign_delete_mor(self, table: Table) -> None:
        """A merge-on-read DELETE (Trino, Spark): a position-delete file for the first 5 rows of a data file that
        holds rows of partition 1 (a compacted file holds both partitions: the rows' own partitions are recorded)."""
        task = next(t for t in table.scan(row_filter=EqualTo("partition", 1)).plan_files() if not t.delete_files)
        rows = pq.read_table(table.io.new_input(task.file.file_path).open(), columns=["partition", "offset"])
        add_position_deletes(table, task.file, list(range(5)))
        for row in rows.slice(0, 5).to_pylist():
            self.deleted.setdefault(row["partition"], set()).add(row["offset"])

    def foreign_rollback(self, table: Table) -> None:
        current = table.current_snapshot()
        assert current is not None and current.parent_snapshot_id is not None
        table.manage_snapshots().rollback_to_snapshot(current.parent_snapshot_id).commit()

    def foreign_expire(self, table: Table) -> None:
        table.maintenance.expire_snapshots().older_than(datetime.now(UTC) + timedelta(seconds=1)).commit()

    # ---- the case ---------------------------------------------------------------------------------------------

    def run(self, case: Case, scratch: Path) -> None:
        self.audited = case.primary == "ingest-audited"
        config_path = self.prepare()
        signal_dir = scratch / "signals"
        self.check_invariants(case, "before the case", settled=True)
        primary = self.start(case.primary, case.point, case.action, config_path, signal_dir)
        self.wait_reached(primary, signal_dir, f"{case.primary} ({case.id})")
        if case.action == "freeze":
            # Frozen, lease keeper included: its leases expire while it lives.
            self.world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 4)
        if case.action == "late":
            self.wait_for_leases(owner_pid=primary.pid)  # the run ended on the lost answer; its commit is held
        if case.action in ("kill", "unknown"):
            self.outcomes.append(self.finish(primary, case.primary))
            self.wait_for_leases()
            self.outcomes.append(self.secondary(case.secondary, config_path, signal_dir))
        elif case.secondary.startswith("ingest-paused:"):
            # The second run is held at its own point while the first goes on (and ends), then goes on itself.
            point = case.secondary.partition(":")[2]
            second = self.start("ingest", point, "pause", config_path, signal_dir / "secondary")
            ended = self.wait_reached(second, signal_dir / "secondary", f"the second ingest ({case.id})",
                                      second_run=True)
            if ended is not None:
                # A primary paused holding its leases refuses the second run; a frozen one that had committed left
                # it nothing to land. Either way it ended before its point (the invariants check what it changed).
                self.outcomes.append(ended)
            self.resume(case, primary, signal_dir)
            if ended is None:
                (signal_dir / "secondary" / "go").write_text("go\n")
                self.outcomes.append(self.finish(second, case.secondary))
        else:
            self.outcomes.append(self.secondary(case.secondary, config_path, signal_dir))
            if case.secondary.startswith("ingest-killed:"):
                self.wait_for_leases(owner_pid=self.secondary_pid)  # the killed run's, before the primary goes on
            self.resume(case, primary, signal_dir)
        self.wait_for_leases()
        self.check_invariants(case, "after both actors", settled=False)
        self.settle(case)
        self.check_invariants(case, "after settling", settled=True)

    def resume(self, case: Case, primary: subprocess.Popen, signal_dir: Path) -> None:
        """The held primary goes on (a late commit is applied, or refused) and ends."""
        if case.action == "freeze":
            os.kill(primary.pid, signal.SIGCONT)
        else:
            (signal_dir / "go").write_text("go\n")
        outcome = self.finish(primary, case.primary)
        if case.action == "late":
            late = "applied" if (signal_dir / "applied").exists() else "refused"
            outcome.detail += f"; its late commit was {late}"
        self.outcomes.append(outcome)

    def assert_log_end_landed(self, what: str) -> None:
        """The table's next offsets are the end of every partition's log (no pending record a run could skip)."""
        log_end = {p: max(s.last_offset for s in segments.values()) + 1 for p, segments in self.world.segments.items()}
        table_next = read_topic_offsets(self.world.table(), self.topic)
        assert table_next == log_end, f"{what}, but the log holds more: table next offsets {table_next}, log {log_end}"

    def wait_for_leases(self, owner_pid: int | None = None) -> None:
        """Until etcd drops the leases of dead actors (every lease, or those of the process `owner_pid`)."""
        if owner_pid is None:
            self.world.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 4)
            return
        marker = f"-{owner_pid}-"  # run.py: a run's lease owner is `<host>-<pid>-<run id>`
        deadline = time.monotonic() + LEASE_TTL_SECONDS * 4
        while any(marker in owner for owner in self.lease_owners()):
            assert time.monotonic() < deadline, f"leases of process {owner_pid} still held: {self.lease_owners()}"
            time.sleep(0.2)

    def lease_owners(self) -> list[str]:
        with EtcdClient([self.world.etcd_endpoint]) as client:
            return [json.loads(e.value)["owner_id"] for e in client.get_prefix(f"{self.world.name}/leases/")]

    def settle(self, case: Case) -> None:
        """Ingest until the table's offsets stop moving (at most 3 runs)."""
        config = self.world.config(self.config_document())
        previous = None
        drop = ["audit", "drop", "--table", self.world.table_name, "--config", str(self.world.root / "lakehouse.yaml")]
        for attempt in range(3):
            outcome = self.run_in_process(f"settling run {attempt + 1}", lambda: ingest(config, self.spark))
            self.outcomes.append(outcome)
            if outcome.detail.startswith(AUDIT_REFUSED):
                # A pending audit the runs may not publish (main moved off it): the operator drops it.
                self.outcomes.append(self.run_in_process("operator: audit drop", lambda: self.cli_main(*drop)))
                continue
            offsets = read_topic_offsets(self.world.table(), self.topic)
            if offsets == previous and outcome.ok:
                return
            previous = offsets

    # ---- the invariants ----------------------------------------------------------------------------------------

    def check_invariants(self, case: Case, when: str, *, settled: bool) -> None:
        context = (f"{case.id} (seed {selection().seed}), {when}; outcomes: "
                   + "; ".join(map(str, self.outcomes)))
        table = self.world.table()
        missing_files = unreachable_files(table)
        assert not missing_files, f"{context}: files referenced by the table's snapshots are gone: {missing_files[:5]}"
        rows = self.world.table_rows(table)  # the scan reads every live data file
        duplicates = sorted(r for r, n in Counter(r[0] for r in rows).items() if n > 1)
        assert not duplicates, f"{context}: records landed twice: {duplicates[:10]}"
        found: dict[int, set[int]] = {}
        for _, partition, offset in rows:
            found.setdefault(partition, set()).add(offset)
        table_next = read_topic_offsets(table, self.topic)
        written = self.world.written_offsets()
        for partition in PARTITIONS:
            log_offsets = written.get(partition, set())
            first_gap = next(o for o in range(max(log_offsets) + 2) if o not in log_offsets)
            position = table_next.get(partition, 0)
            assert position <= first_gap, (
                f"{context}: partition {partition} advanced to {position} past offset {first_gap}, which the log "
                f"no longer holds")
            invalid = self.invalid_offsets() if partition == 0 else set()
            expected = {o for o in log_offsets if o < position} - self.deleted.get(partition, set()) - invalid
            have = found.get(partition, set())
            assert have == expected, (
                f"{context}: partition {partition} at {position}: missing {sorted(expected - have)[:10]}, "
                f"unexpected {sorted(have - expected)[:10]}")
            if settled and self.outcomes:
                end = max(log_offsets) + 1
                if first_gap < end:
                    assert position == first_gap and not self.outcomes[-1].ok, (
                        f"{context}: partition {partition} must stop at the gap {first_gap} with a failed run")
                else:
                    assert position == end, f"{context}: partition {partition} settled at {position}, log end {end}"
        if settled:
            assert self.world.store_next_offsets() == table_next, f"{context}: the offsets store disagrees"
        self.check_dead_letters(context, table_next.get(0, 0), settled=settled)

    def check_dead_letters(self, context: str, position: int, *, settled: bool) -> None:
        """Each dead letter once, only of invalid records; once settled, exactly those below the position. Between
        the actors, dead letters of offsets beyond the position may stay (a move back, a rollback: until read again)
        and a run killed between its commit and its publication has not published yet (the next run does)."""
        table = open_table(load_catalog(catalog_settings(self.world.config(self.config_document()))),
                           self.dead_letter_table_name)
        missing_files = unreachable_files(table)
        assert not missing_files, f"{context}: files referenced by the dead-letter table are gone: {missing_files[:5]}"
        rows = table.scan(selected_fields=("topic", "partition", "offset")).to_arrow().to_pylist()
        offsets = Counter((r["partition"], r["offset"]) for r in rows if r["topic"] == self.topic)
        twice = sorted(k for k, n in offsets.items() if n > 1)
        assert not twice, f"{context}: dead letters twice: {twice[:10]}"
        invalid = self.invalid_offsets()
        assert {o for p, o in offsets if p == 0} <= invalid and all(p == 0 for p, _ in offsets), (
            f"{context}: dead letters of valid records: {sorted(set(offsets) - {(0, o) for o in invalid})[:10]}")
        if settled:
            have = {o for p, o in offsets if p == 0}
            expected = {o for o in invalid if o < position}
            assert have == expected, (f"{context}: dead letters missing {sorted(expected - have)[:10]}, beyond the "
                                      f"position {position}: {sorted(have - expected)[:10]}")


def error_lines(stderr: str) -> list[str]:
    """The lines of an actor's stderr that report an error (its log's ERROR lines, the CLI's `error:` lines)."""
    return [line for line in stderr.splitlines() if " ERROR " in line or line.startswith("error:")]


def unreachable_files(table: Table) -> list[str]:
    """Files that a snapshot of `table` references (manifest lists, manifests, live data and delete files) and
    storage no longer holds."""
    io, missing, seen = table.io, [], set()
    for snapshot in table.metadata.snapshots:
        paths = [snapshot.manifest_list]
        for manifest in snapshot.manifests(io):
            paths.append(manifest.manifest_path)
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            paths.extend(e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=True)
                         if e.status != ManifestEntryStatus.DELETED)
        missing.extend(p for p in paths if not io.new_input(p).exists())
    return sorted(set(missing))
