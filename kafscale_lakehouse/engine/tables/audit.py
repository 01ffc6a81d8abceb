"""Audited publish (write-audit-publish) of a table: a run commits to the audit branch, the blocking checks run on
that snapshot, and `main` fast-forwards to it only when they pass, so readers of `main` never see rows that fail them.

The audit branch exists only while an audit is under way: a run creates it at `main`'s head, commits to it, checks
its snapshot, and one ref update moves `main` to it and removes the branch (`publish_audit`), requiring that `main`
and the branch are still where the audit found them. So the branch holding a snapshot that `main` does not is the
one sign of an audit pending: a run that failed its checks, or one that stopped between its commit and the
publication. The next run settles it before it reads any offset (`settle_pending_audit`): it checks the snapshot
again and publishes it, or refuses to run, naming the failed check and the operator commands
(`kafscale-lakehouse audit publish|drop --table T`). `main` stays the truth of what readers see and where runs start;
the branch is "what was landed" while an audit is pending (`landed_view`: the sensor reads it, so a failed audit
does not request runs of the same offsets again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.catalogs import catalog_endpoint, catalog_errors
from kafscale_lakehouse.engine.tables.checks import (
    ID_UNIQUE,
    OFFSETS_CONTIGUOUS,
    RECORD_ID_UNIQUE,
    check_offset_contiguity,
    find_duplicate_ids,
    find_duplicate_record_ids,
)
from kafscale_lakehouse.engine.tables.summary import (  # branch_head, ref_view: imported from here too
    RUN_ID_PROPERTY,
    branch_head,
    read_topic_offsets,
    ref_view,
    summary_properties,
)
from kafscale_lakehouse.offsets.ranges import OffsetRange

log = logging.getLogger(__name__)

DEFAULT_AUDIT_BRANCH = "kafscale-audit"
# On the empty snapshot an audited run gives a table without snapshots, so that its branch has a base.
AUDIT_BASE_PROPERTY = "kafscale.audit-base"
AUDIT_COMMANDS = ("kafscale-lakehouse audit publish --table {table} (publish it as it is) or audit drop --table "
                  "{table} (discard it; the next run lands its offsets again)")


class AuditError(EngineError):
    """An audited publish that cannot go on; the message names the table, the snapshot and what to do."""


class AuditPendingError(AuditError):
    """The table's audit branch holds a snapshot `main` does not, which this call may not publish (its checks fail,
    or `main` moved off its base): runs of the table refuse until an operator publishes or drops it."""


class MainMovedError(AuditError):
    """`main` is no longer the base of the audited snapshot (another writer committed to it): fast-forwarding would
    drop that commit, so nothing is published."""


@dataclass(frozen=True)
class AuditFailure:
    check: str
    message: str


@dataclass(frozen=True)
class AuditReport:
    """The blocking checks' results on an audited snapshot, over the offsets it adds to `main`."""

    table: str
    branch: str
    snapshot_id: int
    run_id: str | None
    ranges: dict[int, OffsetRange]  # what the snapshot lands beyond main, per partition
    checks: dict[str, bool] = field(default_factory=dict)  # check name -> passed
    failures: list[AuditFailure] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)  # sample of repeated record ids / keys
    rows_scanned: int = 0

    @property
    def passed(self) -> bool:
        return not self.failures

    def describe_failures(self) -> str:
        return "; ".join(f"check {f.check} failed: {f.message}" for f in self.failures)


@dataclass(frozen=True)
class PendingAudit:
    """The audit branch's head, which `main` does not hold."""

    table: str
    branch: str
    snapshot_id: int
    main_snapshot_id: int | None
    based_on_main: bool  # main's head is the snapshot's parent: the fast-forward moves main by this snapshot alone
    run_id: str | None


def _in_main(table: Table, snapshot_id: int) -> bool:
    return any(s.snapshot_id == snapshot_id for s in _ancestors(table, table.metadata.current_snapshot_id))


def _ancestors(table: Table, snapshot_id: int | None):  # noqa: ANN202
    metadata = table.metadata
    snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    while snapshot is not None:
        yield snapshot
        snapshot = metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None


def pending_audit(table: Table, branch: str) -> PendingAudit | None:
    """The audit pending on `table` (as the table object is: refresh it first), or None: no branch, or a branch
    whose head `main` already holds (created by a run that stopped before committing)."""
    head = branch_head(table, branch)
    if head is None or _in_main(table, head):
        return None
    main = table.metadata.current_snapshot_id
    snapshot = table.metadata.snapshot_by_id(head)
    # Only main at the audited snapshot's parent: a main rolled back to an older ancestor would otherwise be
    # fast-forwarded over the rolled-back commit, undoing the rollback.
    based = snapshot is not None and snapshot.parent_snapshot_id == main
    run_id = summary_properties(snapshot).get(RUN_ID_PROPERTY) if snapshot is not None else None
    return PendingAudit(".".join(table.name()), branch, head, main, based, run_id)


def no_pending_audit(table: Table, branch: str, what: str) -> dict[str, int | None]:
    """In each attempt of a commit to `main` (`what`), on the refreshed `table`: `AuditPendingError` when `branch`
    holds a snapshot main does not (a snapshot on main now would make its fast-forward impossible); else the
    requirement the commit must carry (`commits.require_refs`): the branch still where it is now (None: absent).
    An audited commit landing in between then makes the catalog refuse this one, and its next attempt refuses
    here, instead of wedging the table."""
    pending = pending_audit(table, branch)
    if pending is not None:
        table_name = ".".join(table.name())
        raise AuditPendingError(
            f"table {table_name}: {what} refused: audit branch {branch} holds snapshot {pending.snapshot_id} of run "
            f"{pending.run_id} that main does not, and a commit to main would make its fast-forward impossible; "
            f"settle it first: {AUDIT_COMMANDS.format(table=table_name)}")
    return {branch: branch_head(table, branch)}


def landed_view(table: Table, branch: str) -> Table:
    """What was landed: the audit branch while an audit is pending on it (ahead of main), else `table` itself."""
    return ref_view(table, branch) if pending_audit(table, branch) is not None else table


def start_audit_branch(table: Table, branch: str) -> None:
    """Before an audited commit: the branch at `main`'s head. Created when missing; a branch `main` already holds
    (left by a run that stopped before committing) is moved to `main`'s head; a pending audit raises
    `AuditPendingError` (settle it first: `settle_pending_audit`). Each ref update requires the branch to be where
    it was read, so two runs cannot both start it."""
    table_name = ".".join(table.name())
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
        pending = pending_audit(table, branch)
        if pending is not None:
            raise AuditPendingError(
                f"table {table_name}: audit branch {branch} holds snapshot {pending.snapshot_id} of run "
                f"{pending.run_id} that main does not; settle it first: {AUDIT_COMMANDS.format(table=table_name)}")
        main = table.metadata.current_snapshot_id
        if main is None:
            # Iceberg's REST catalogs refuse a branch of a table without snapshots ("can only be written to the
            # main branch"): main gets an empty snapshot, no rows and no offsets, to branch from.
            with table.transaction() as transaction, transaction.update_snapshot(
                    snapshot_properties={AUDIT_BASE_PROPERTY: branch}).fast_append():
                pass
            main = table.metadata.current_snapshot_id
        head = branch_head(table, branch)
        if main is None or head == main:
            return
        # Requires the branch where it was read (absent, or at a snapshot main holds).
        table.manage_snapshots().create_branch(main, branch).commit()


def audit_snapshot(table: Table, branch: str, topic: str, *, id_columns: Sequence[str] = ()) -> AuditReport:
    """The blocking checks on the audit branch's head, over the offsets it lands beyond `main`: `record_id_unique`
    (an upsert table's `id_unique` when `id_columns` are given) and `offsets_contiguous` (the same functions the
    Dagster checks call, on the branch). `schema_valid` blocks no snapshot: in `strict` mode a run with an invalid
    record fails before it commits, and in `lenient` mode invalid records go to the dead-letter table."""
    table_name = ".".join(table.name())
    head = branch_head(table, branch)
    if head is None:
        raise AuditError(f"table {table_name}: no audit branch {branch} to audit")
    view = ref_view(table, branch)
    before = read_topic_offsets(table, topic)
    after = read_topic_offsets(view, topic)
    ranges = {p: OffsetRange(p, before.get(p, 0), end) for p, end in sorted(after.items())
              if before.get(p, 0) < end}
    snapshot = table.metadata.snapshot_by_id(head)
    run_id = summary_properties(snapshot).get(RUN_ID_PROPERTY) if snapshot is not None else None
    checks: dict[str, bool] = {}
    failures: list[AuditFailure] = []
    if id_columns:
        unique_check, scan = ID_UNIQUE, find_duplicate_ids(view, topic, id_columns, ranges)
    else:
        unique_check, scan = RECORD_ID_UNIQUE, find_duplicate_record_ids(view, topic, ranges)
    checks[unique_check] = not scan.duplicates
    if scan.duplicates:
        sample = ", ".join(f"{k} x{n}" for k, n in sorted(scan.duplicates.items())[:5])
        failures.append(AuditFailure(unique_check, f"{len(scan.duplicates)} ids occur more than once in offsets "
                                                   f"{_describe_ranges(ranges)}, e.g. {sample}"))
    contiguity = check_offset_contiguity(view, topic)
    checks[OFFSETS_CONTIGUOUS] = not contiguity.problems
    if contiguity.problems:
        failures.append(AuditFailure(OFFSETS_CONTIGUOUS, "; ".join(contiguity.problems)))
    report = AuditReport(table_name, branch, head, run_id, ranges, checks, failures,
                         dict(sorted(scan.duplicates.items())[:20]), scan.rows_scanned)
    log.info("table %s: audit of snapshot %d (run %s, branch %s) over %s: %s", table_name, head, run_id, branch,
             _describe_ranges(ranges), "passed" if report.passed else report.describe_failures())
    return report


def publish_audit(table: Table, branch: str, snapshot_id: int) -> bool:
    """Fast-forward `main` to `snapshot_id`, the audit branch's head, and remove the branch, in one ref update that
    requires both refs to be where they were read. True when this call published it; False when `main` already
    held it (another process published it). `MainMovedError` when `main` moved off the snapshot's base: nothing
    changes, the branch keeps the snapshot. `table` holds the catalog's new metadata on return."""
    table_name = ".".join(table.name())
    for attempt in (1, 2):
        with catalog_errors(catalog_endpoint(table.catalog)):
            table.refresh()
        if _in_main(table, snapshot_id):
            if branch_head(table, branch) == snapshot_id:
                _remove_branch_if_at(table, branch, snapshot_id)
            return False
        head = branch_head(table, branch)
        if head != snapshot_id:
            raise AuditError(f"table {table_name}: audit branch {branch} is at snapshot {head}, not at the audited "
                             f"snapshot {snapshot_id}; nothing published")
        pending = pending_audit(table, branch)
        if pending is not None and not pending.based_on_main:
            raise MainMovedError(
                f"table {table_name}: main moved to snapshot {pending.main_snapshot_id} (another writer committed) "
                f"while snapshot {snapshot_id} of run {pending.run_id} was audited on branch {branch}; a "
                "fast-forward would drop that commit, so nothing is published and the branch keeps the snapshot: "
                f"{AUDIT_COMMANDS.format(table=table_name)}")
        try:
            with catalog_errors(catalog_endpoint(table.catalog)), table.manage_snapshots() as manage:
                # Requires main and the branch where they were read (pyiceberg's AssertRefSnapshotId per ref).
                manage.set_current_snapshot(snapshot_id=snapshot_id)
                manage.remove_branch(branch)
        except CommitFailedException as exc:
            if attempt == 2:
                raise AuditError(f"table {table_name}: publishing snapshot {snapshot_id} (branch {branch}) was "
                                 "refused twice, a ref moving each time; nothing published") from exc
            log.warning("table %s: publishing snapshot %d was refused (a ref moved); reading the table again",
                        table_name, snapshot_id)
            continue
        except Exception as exc:  # the answer is lost (a 5xx, a timeout): the table tells whether it landed
            if _published_after_all(table, snapshot_id):
                log.warning("table %s: publishing snapshot %d answered %r but main holds it", table_name,
                            snapshot_id, exc)
                return True
            raise AuditError(f"table {table_name}: publishing snapshot {snapshot_id} (branch {branch}) failed with "
                             f"an unknown outcome ({type(exc).__name__}); the next run of the table settles it") \
                from exc
        log.info("table %s: main fast-forwarded to audited snapshot %d, branch %s removed", table_name, snapshot_id,
                 branch)
        return True
    raise AssertionError("unreachable")


def audited_snapshot_state(table: Table, branch: str, snapshot_id: int) -> str:
    """Where a run's audited snapshot is now (the table refreshed): `published` (main holds it: another run settled
    it while this one was held), `pending` (the branch's head, beyond main), or `gone` (dropped by an operator, or
    the branch moved on)."""
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
    if _in_main(table, snapshot_id):
        return "published"
    return "pending" if branch_head(table, branch) == snapshot_id else "gone"


def _published_after_all(table: Table, snapshot_id: int) -> bool:
    try:
        table.refresh()
    except Exception:  # unreadable now: not known to be published
        log.warning("table %s: cannot refresh to check the publication", ".".join(table.name()), exc_info=True)
        return False
    return _in_main(table, snapshot_id)


def _remove_branch_if_at(table: Table, branch: str, snapshot_id: int) -> None:
    try:
        table.manage_snapshots().remove_branch(branch).commit()
    except CommitFailedException:
        log.info("table %s: branch %s moved from snapshot %d before it was removed; left", ".".join(table.name()),
                 branch, snapshot_id)


def drop_audit(table: Table, branch: str) -> int | None:
    """Discard the pending audit: remove the branch (requiring it still at the head read). Returns the dropped
    snapshot id (None when nothing was pending; a branch `main` already holds is removed too). The snapshot's data
    files are left to orphan-file removal; `main`, and so where the next run starts, is unchanged."""
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
        head = branch_head(table, branch)
        if head is None:
            return None
        pending = pending_audit(table, branch)
        table.manage_snapshots().remove_branch(branch).commit()
    log.warning("table %s: audit branch %s at snapshot %d dropped%s", ".".join(table.name()), branch, head,
                f" (run {pending.run_id}'s offsets land again)" if pending is not None else "")
    return head if pending is not None else None


def settle_pending_audit(table: Table, branch: str, topic: str, *,
                         id_columns: Sequence[str] = ()) -> AuditReport | None:
    """At the start of an audited run, before any offset is read: an audit left pending (a run stopped between its
    commit and the publication, or its checks failed) is checked again and published when it passes, so the range
    lands once; when it fails, or `main` moved off its base, `AuditPendingError` names the check and the operator
    commands. None when nothing was pending."""
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
    pending = pending_audit(table, branch)
    if pending is None:
        return None
    table_name = pending.table
    commands = AUDIT_COMMANDS.format(table=table_name)
    if not pending.based_on_main:
        raise AuditPendingError(
            f"table {table_name}: audit branch {branch} holds snapshot {pending.snapshot_id} of run {pending.run_id}, "
            f"but main moved to snapshot {pending.main_snapshot_id} since (another writer committed): it cannot be "
            f"fast-forwarded; {commands}")
    report = audit_snapshot(table, branch, topic, id_columns=id_columns)
    if not report.passed:
        raise AuditPendingError(
            f"table {table_name}: snapshot {pending.snapshot_id} of run {pending.run_id} on audit branch {branch} is "
            f"not published: {report.describe_failures()}; runs of this table refuse until it is settled: {commands}")
    publish_audit(table, branch, pending.snapshot_id)
    log.warning("table %s: published snapshot %d of run %s, left pending on branch %s (its checks pass now)",
                table_name, pending.snapshot_id, pending.run_id, branch)
    return report


def _describe_ranges(ranges: dict[int, OffsetRange]) -> str:
    return ", ".join(f"partition {p} {r.start}..{r.end}" for p, r in sorted(ranges.items())) or "(none)"
