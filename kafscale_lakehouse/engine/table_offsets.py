"""Committed offsets kept in the Iceberg table itself, and the commit protocol (crash leftovers: run_files.py).

The offsets live in our snapshots' summaries (`engine/snapshot_summary.py`: `kafscale.offsets.<topic>`, the next
offset of every partition committed so far); a commit re-reads them from the latest commit of ours
(DESIGN.md, "Exactly-once commit protocol").
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import _apply_table_update, _TableMetadataUpdateContext
from pyiceberg.utils.datetime import datetime_to_millis

from kafscale_lakehouse.engine.catalog import catalog_endpoint, catalog_errors
from kafscale_lakehouse.engine.iceberg_sink import delete_data_files
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.snapshot_summary import (
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


class CommitOutcomeUnknownError(TableOffsetsError):
    """The catalog did not say whether the commit landed and the table does not show it; data files are kept."""


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
) -> CommitResult:
    """Append `data_files` in one snapshot whose summary advances `topic` from `start_offsets` to `end_offsets`.

    Each attempt refreshes the table and re-reads its offsets: if a partition of this batch no longer starts where
    the batch started, another writer got there first → `OffsetConflictError`. A commit refused because an
    unrelated writer committed in between (`CommitFailedException`) is retried with the same data files, at most
    `max_attempts` times. On a refused commit our data files are deleted; on an unknown outcome they are kept
    (they may be referenced) and a later run removes them if they are not (`run_files.clean_ended_runs`).
    `end_offsets[p]` is the next offset to read for partition p. `table` is refreshed on return.
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
        if attempt == 1:
            before_first_attempt = table.metadata.current_snapshot_id
        else:
            # A refused answer does not prove a refused commit: a proxy that retried our POST, or a timeout after
            # the catalog applied it. Our own commit would look like a conflict below and delete live files.
            landed = find_commit(table, commit_id, since=before_first_attempt)
            if landed is not None:
                log.warning("table %s: commit of run %s was answered with an error but landed as snapshot %d",
                            table_name, run_id, landed.snapshot_id)
                committed, snapshot_id = landed.offsets, landed.snapshot_id
                break
        _refuse_changed_spec(table, data_files, paths, run_id)
        committed = read_committed_offsets(table)
        conflict = _first_conflict(committed.get(topic, {}), start_offsets)
        if conflict is not None:
            partition, committed_offset = conflict
            _delete_uncommitted(table, paths, table_name, run_id)
            raise OffsetConflictError(table_name, topic, partition, start_offsets[partition], committed_offset)
        properties = {**offsets_summary_properties(committed, topic, end_offsets), **markers}
        try:
            append_without_client_retries(table, data_files, properties)
            snapshot_id = table.metadata.current_snapshot_id
        except CommitFailedException as exc:
            if attempt >= max_attempts:
                if _find_commit(table, commit_id, before_first_attempt) is not None:
                    continue  # it landed after all: the next pass finds and reports it
                _delete_uncommitted(table, paths, table_name, run_id)
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
            found = _find_commit(table, commit_id, before_first_attempt)
            if found is None:
                raise CommitOutcomeUnknownError(
                    f"table {table_name}: commit of run {run_id} failed with an unknown outcome "
                    f"({type(exc).__name__}); its {len(paths)} data files are kept until the table shows "
                    "whether they are referenced"
                ) from exc
            log.warning("table %s: commit of run %s reported %r but landed", table_name, run_id, exc)
            snapshot_id = found
        break
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


def _refuse_changed_spec(table: Table, data_files: Sequence[DataFile], paths: list[str], run_id: str) -> None:
    """Files carry the partition values of the spec they were written for: under another spec a filtered scan would
    miss their rows. The run's offsets stay where they were, so the next run rewrites them under the new spec."""
    current = table.metadata.default_spec_id
    stale = sorted({spec for spec in map(_written_spec_id, data_files) if spec is not None and spec != current})
    if stale:
        table_name = ".".join(table.name())
        _delete_uncommitted(table, paths, table_name, run_id)
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


def _first_conflict(committed: Mapping[int, int], start_offsets: Mapping[int, int]) -> tuple[int, int] | None:
    """A partition (with its committed offset) that another writer moved; a never-committed partition is free."""
    for partition in sorted(start_offsets):
        if partition in committed and committed[partition] != start_offsets[partition]:
            return partition, committed[partition]
    return None


def append_without_client_retries(table: Table, data_files: Sequence[DataFile], properties: dict[str, str]) -> None:
    """One fast append without pyiceberg's client retries (`without_client_retries`: a retry would skip our offset
    re-check), committed with `commit_settled`; on success `table` holds the catalog's new metadata."""
    view = without_client_retries(table)
    transaction = view.transaction()
    with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
        for data_file in data_files:
            append.append_data_file(data_file)
    commit_settled(transaction)
    # The view now holds the catalog's answer to the commit (not the retry override): adopt it, saving a reload.
    table.metadata = view.metadata
    table.metadata_location = view.metadata_location


def without_client_retries(table: Table) -> Table:
    """A view of `table` whose commits pyiceberg does not retry by itself. pyiceberg re-applies a conflicting commit
    on the new metadata with the old summary and the old plan: our writers re-check offsets or re-plan deletes and
    retry themselves. Only the client reads the property; the catalog commits against its own metadata. Its
    transactions are `HistoryIndependentTransaction`s."""
    no_retries = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    return _CommitView(
        identifier=table.name(),
        metadata=table.metadata.model_copy(update={"properties": no_retries}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )


class HistoryIndependentTransaction(Transaction):
    """A pyiceberg transaction whose commit does not cost more as the table's history grows.

    pyiceberg 0.12 recomputes `Transaction.table_metadata` on every read: it replays the staged updates and then
    deep-copies the whole metadata, every snapshot included, and a commit reads it about 15 times (8.9 s per commit
    with 5,000 snapshots, measured with benchmarks/maintenance.py; upstream apache/iceberg-python#3784, not in a
    release). Here the staged updates are applied as pyiceberg applies them, without the defensive deep copy (the
    metadata models are frozen and every update builds new ones), once per state: the result is kept while the
    table's metadata and the staged updates are the same objects (`_updates` is a tuple, rebound on every change).
    The catalog is sent the updates, as before; only the client's reading of them changes."""

    _metadata_cache: tuple[TableMetadata, tuple, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if not updates:
            return base
        cached = self._metadata_cache
        if cached is not None and cached[0] is base and cached[1] is updates:
            return cached[2]
        context = _TableMetadataUpdateContext()
        result = base
        for update in updates:
            result = _apply_table_update(update, result, context)
        if context.has_changes() and result.last_updated_ms == base.last_updated_ms:
            result = result.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
        result.spec().check_compatible(result.schema())
        result.sort_order().check_compatible(result.schema())
        self._metadata_cache = (base, updates, result)
        return result


class _CommitView(Table):
    def transaction(self) -> Transaction:
        return HistoryIndependentTransaction(self)


def commit_settled(transaction: Transaction) -> Table:
    """`transaction.commit_transaction()` for a transaction of a `without_client_retries` view.

    With its retries off, pyiceberg skips its check that a refused commit did not land after all (a proxy that
    retried our POST answers 409 for a commit it applied) and deletes the manifests the landed snapshot references.
    So those manifests are deleted here, and only once the refreshed table shows the snapshots absent; a commit
    found landed returns normally. Returns the view with the catalog's metadata.
    """
    producers = list(transaction._snapshot_producers)
    for producer in producers:
        producer._clean_all_uncommitted = _keep_until_outcome_known  # type: ignore[method-assign]
    try:
        return transaction.commit_transaction()
    except CommitFailedException:
        view = transaction._table
        view.refresh()
        if not producers or not all(view.metadata.snapshot_by_id(p._snapshot_id) for p in producers):
            for producer in producers:
                type(producer)._clean_all_uncommitted(producer)
            raise
        log.warning("table %s: a commit answered as refused had landed (a retried request?)", ".".join(view.name()))
        return view


def _keep_until_outcome_known() -> None:
    """Stands in for pyiceberg's clean-up of a refused commit until the table shows it did not land."""


def _find_commit(table: Table, commit_id: str, since: int | None) -> int | None:
    """The snapshot id of our commit after a refresh (see `snapshot_summary.find_commit`), or None, also when the
    catalog cannot be read."""
    try:
        table.refresh()
    except Exception:
        log.warning("table %s: cannot refresh to check the commit outcome", ".".join(table.name()), exc_info=True)
        return None
    commit = find_commit(table, commit_id, since=since)
    return commit.snapshot_id if commit is not None else None


def _delete_uncommitted(table: Table, paths: Iterable[str], table_name: str, run_id: str) -> None:
    paths = list(paths)
    failed = delete_data_files(table.io, paths)
    log.warning(
        "table %s: deleted %d uncommitted data files of run %s%s",
        table_name,
        len(paths) - len(failed),
        run_id,
        f" ({len(failed)} could not be deleted; orphan-file removal removes them later)" if failed else "",
    )
