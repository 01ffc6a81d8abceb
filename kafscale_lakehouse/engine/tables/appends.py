"""Committed offsets kept in the Iceberg table itself, and the commit protocol (crash leftovers: run_files.py).

The offsets live in our snapshots' summaries (`engine/tables/summary.py`: `kafscale.offsets.<topic>`, the next
offset of every partition committed so far); a commit re-reads them from the latest commit of ours
(docs/architecture.md, "Commit protocol").
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.audit import AuditPendingError, no_pending_audit, ref_view, start_audit_branch
from kafscale_lakehouse.engine.tables.catalogs import catalog_endpoint, catalog_errors
from kafscale_lakehouse.engine.tables.commits import (
    CommitOutcomeUnknownError,
    append_without_client_retries,
    committed_snapshot_id,
    delete_uncommitted,
    find_commit_after_refresh,
)
from kafscale_lakehouse.engine.tables.row_counts import remember_files_added
from kafscale_lakehouse.engine.tables.summary import (
    COMMIT_ID_PROPERTY,
    RUN_ID_PROPERTY,
    find_commit,
    format_offsets_property,
    is_reserved_property,
    offsets_summary_properties,
    read_committed_offsets,
)

log = logging.getLogger(__name__)

DEFAULT_COMMIT_ATTEMPTS = 5
DEFAULT_RETRY_WAIT_SECONDS = 0.2


class TableOffsetsError(RuntimeError):
    """A problem with the offsets stored in, or committed to, an Iceberg table."""


class OffsetConflictError(TableOffsetsError):
    """Another writer committed offsets of this batch first; our data files were deleted."""

    def __init__(self, table_name: str, topic: str, partition: int, expected_start: int, committed: int) -> None:
        self.table_name = table_name
        self.topic = topic
        self.partition = partition
        self.expected_start = expected_start
        self.committed = committed
        super().__init__(
            f"table {table_name}: topic {topic} partition {partition} was committed up to offset {committed} by "
            f"another writer while this batch started at {expected_start}; batch aborted, its data files deleted"
        )


class TableChangedDuringRunError(TableOffsetsError):
    """The table's partition spec changed after the run wrote its files; our data files were deleted."""


class CommitRetriesExhaustedError(TableOffsetsError):
    """Unrelated concurrent commits kept winning; our data files were deleted."""


@dataclass(frozen=True)
class CommitResult:
    snapshot_id: int
    topic_offsets: dict[int, int]  # the topic's full next-offset map after this commit
    attempts: int
    data_file_count: int
    record_count: int


@timed("Iceberg commit")
def commit_append(
    table: Table,
    data_files: Sequence[DataFile],
    topic: str,
    start_offsets: Mapping[int, int],
    end_offsets: Mapping[int, int],
    run_id: str,
    *,
    max_attempts: int = DEFAULT_COMMIT_ATTEMPTS,
    retry_wait_seconds: float = DEFAULT_RETRY_WAIT_SECONDS,
    snapshot_properties: Mapping[str, str] | None = None,
    before_attempt: Callable[[Table], None] | None = None,
    branch: str = MAIN_BRANCH,
    audit_branch: str | None = None,
) -> CommitResult:
    """Append `data_files` in one snapshot whose summary advances `topic` from `start_offsets` to `end_offsets`.

    Each attempt refreshes the table and re-reads its offsets: if a partition of this batch no longer starts where
    the batch started, another writer got there first → `OffsetConflictError`. A commit refused because an
    unrelated writer committed in between (`CommitFailedException`) is retried with the same data files, at most
    `max_attempts` times. On a refused commit our data files are deleted; on an unknown outcome they are kept
    (they may be referenced) and a later run removes them if they are not (`run_files.clean_ended_runs`).
    `end_offsets[p]` is the next offset to read for partition p. `table` is refreshed on return.
    `before_attempt` runs on the refreshed table right before each commit is sent (the run records the snapshot the
    commit is built on, `run_files.record_commit_attempt`); when it raises, nothing more is sent and the files are
    kept for the clean-up of ended runs.
    `branch` is where the snapshot goes: an audited publish commits to its audit branch, set to main's head before
    each attempt (`audit.start_audit_branch`: `AuditPendingError` when it holds a snapshot main does not), the
    offsets are re-checked as of that branch, and the commit requires main still at that head, so that the audited
    snapshot is always main's child (a commit to main in between makes it retry on the new head).
    `audit_branch` (a commit to main of an audited table): each attempt refuses (`AuditPendingError`, files
    deleted) while that branch holds a snapshot main does not, and requires the branch unmoved
    (`audit.no_pending_audit`).
    """
    table_name = ".".join(table.name())
    _check_offset_ranges(table_name, topic, start_offsets, end_offsets, run_id, snapshot_properties or {})
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    commit_id = uuid.uuid4().hex
    markers = {**(snapshot_properties or {}), RUN_ID_PROPERTY: run_id, COMMIT_ID_PROPERTY: commit_id}
    paths = [f.file_path for f in data_files]

    attempt = 0
    before_first_attempt: int | None = None
    while True:
        attempt += 1
        with catalog_errors(catalog_endpoint(table.catalog)):
            table.refresh()
        view = ref_view(table, branch)  # the table as of the branch the commit goes to
        if attempt == 1:
            before_first_attempt = view.metadata.current_snapshot_id
        else:
            # A refused answer does not prove a refused commit: a proxy that retried our POST, or a timeout after
            # the catalog applied it. Our own commit would look like a conflict below and delete live files.
            landed = find_commit(view, commit_id, since=before_first_attempt)
            if landed is not None:
                log.warning("table %s: commit of run %s was answered with an error but landed as snapshot %d",
                            table_name, run_id, landed.snapshot_id)
                committed, snapshot_id = landed.offsets, landed.snapshot_id
                break
        requires: dict[str, int | None] = {}
        if branch != MAIN_BRANCH:
            # Each attempt builds on main's head as it is now (a compaction may have moved it): the fast-forward
            # to the audited snapshot requires main to be its parent (audit.publish_audit), so the commit
            # requires main to stay there.
            start_audit_branch(table, branch)
            view = ref_view(table, branch)
            requires[MAIN_BRANCH] = table.metadata.current_snapshot_id
            if attempt == 1:
                before_first_attempt = view.metadata.current_snapshot_id
        elif audit_branch is not None:
            try:
                requires.update(no_pending_audit(table, audit_branch, f"the commit of run {run_id}"))
            except AuditPendingError:
                delete_uncommitted(table, paths, table_name, run_id)
                raise
        refuse_changed_spec(table, data_files, paths, run_id)
        committed = read_committed_offsets(view)
        conflict = first_offset_conflict(committed.get(topic, {}), start_offsets)
        if conflict is not None:
            partition, committed_offset = conflict
            delete_uncommitted(table, paths, table_name, run_id)
            raise OffsetConflictError(table_name, topic, partition, start_offsets[partition], committed_offset)
        properties = {**offsets_summary_properties(committed, topic, end_offsets), **markers}
        if before_attempt is not None:
            before_attempt(table)
        try:
            append_without_client_retries(table, data_files, properties, branch=branch, requires=requires)
            snapshot_id = committed_snapshot_id(table, branch)
        except CommitFailedException as exc:
            if attempt >= max_attempts:
                if find_commit_after_refresh(table, commit_id, before_first_attempt, branch) is not None:
                    continue  # it landed after all: the next pass finds and reports it
                delete_uncommitted(table, paths, table_name, run_id)
                raise CommitRetriesExhaustedError(
                    f"table {table_name}: commit of run {run_id} lost to concurrent commits {attempt} times; "
                    "data files deleted"
                ) from exc
            log.warning(
                "table %s: commit of run %s conflicted with a concurrent commit (attempt %d/%d), retrying",
                table_name, run_id, attempt, max_attempts,
            )
            time.sleep(retry_wait_seconds * attempt)
            continue
        except Exception as exc:
            found = find_commit_after_refresh(table, commit_id, before_first_attempt, branch)
            if found is None:
                raise CommitOutcomeUnknownError(
                    f"table {table_name}: commit of run {run_id} failed with an unknown outcome "
                    f"({type(exc).__name__}); its {len(paths)} data files are kept until the table shows "
                    "whether they are referenced"
                ) from exc
            log.warning("table %s: commit of run %s reported %r but landed", table_name, run_id, exc)
            snapshot_id = found
        break
    remember_files_added(table, snapshot_id, data_files)
    topic_offsets = {**committed.get(topic, {}), **end_offsets}
    log.info(
        "table %s: run %s committed snapshot %d with %d data files, %s offsets %s",
        table_name, run_id, snapshot_id, len(data_files), topic, format_offsets_property(topic_offsets),
    )
    return CommitResult(
        snapshot_id=snapshot_id,
        topic_offsets=topic_offsets,
        attempts=attempt,
        data_file_count=len(data_files),
        record_count=sum(f.record_count for f in data_files),
    )




def _check_offset_ranges(
    table_name: str,
    topic: str,
    start_offsets: Mapping[int, int],
    end_offsets: Mapping[int, int],
    run_id: str,
    snapshot_properties: Mapping[str, str],
) -> None:
    if set(start_offsets) != set(end_offsets):
        raise ValueError(
            f"table {table_name} topic {topic}: start offsets cover partitions {sorted(start_offsets)} but end "
            f"offsets cover {sorted(end_offsets)}"
        )
    for partition, start in start_offsets.items():
        if not 0 <= start <= end_offsets[partition]:
            raise ValueError(
                f"table {table_name} topic {topic} partition {partition}: offset range "
                f"{start}..{end_offsets[partition]} "
                "is not a valid range"
            )
    reserved = [k for k in snapshot_properties if is_reserved_property(k)]
    if reserved:
        raise ValueError(f"snapshot_properties must not set the commit protocol's own keys {reserved}")


def refuse_changed_spec(table: Table, data_files: Sequence[DataFile], paths: list[str], run_id: str) -> None:
    """Files carry the partition values of the spec they were written for: under another spec a filtered scan would
    miss their rows. The run's offsets stay where they were, so the next run rewrites them under the new spec."""
    current = table.metadata.default_spec_id
    stale = sorted({spec for spec in map(_written_spec_id, data_files) if spec is not None and spec != current})
    if stale:
        table_name = ".".join(table.name())
        delete_uncommitted(table, paths, table_name, run_id)
        raise TableChangedDuringRunError(
            f"table {table_name}: its partition spec changed to spec {current} ({table.spec()}) while run {run_id} "
            f"wrote its data files for spec {', '.join(map(str, stale))}; nothing committed, the files are deleted "
            "and the next run writes the same offsets under the new spec"
        )


def _written_spec_id(data_file: DataFile) -> int | None:
    try:
        return data_file.spec_id
    except AttributeError:  # a file written by a writer that did not record it
        return None


def first_offset_conflict(committed: Mapping[int, int], start_offsets: Mapping[int, int]) -> tuple[int, int] | None:
    """A partition (with its committed offset) that another writer moved; a never-committed partition is free."""
    for partition in sorted(start_offsets):
        if partition in committed and committed[partition] != start_offsets[partition]:
            return partition, committed[partition]
    return None
