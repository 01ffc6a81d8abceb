"""How we commit to a pyiceberg table, and the only module that touches pyiceberg's private API.

- `without_client_retries`: a view of a table whose commits pyiceberg does not retry by itself (our writers re-check
  offsets or re-plan and retry themselves); its transactions are `HistoryIndependentTransaction`s, whose cost does
  not grow with the table's history.
- `commit_settled`: a refused commit's manifests are deleted only once the refreshed table shows it did not land.
- `find_commit_after_refresh` / `delete_uncommitted`: settling an answer that did not say whether a commit landed.
- The other private pyiceberg functions we rely on, under names of ours (`PRIVATE_API`): pyiceberg is pinned
  (pyproject.toml) and `kafscale_lakehouse_tests/engine/tables/test_commits.py` checks each against that version.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

import pyarrow as pa
import pyiceberg.io.pyarrow as _pyiceberg_pyarrow
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import BooleanExpression
from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator, _StrictMetricsEvaluator
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    ArrowProjectionVisitor,
    _check_pyarrow_schema_compatible,
    _determine_partitions,
    _to_requested_schema,
)
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.update import AssertRefSnapshotId, _apply_table_update, _TableMetadataUpdateContext
from pyiceberg.table.update.snapshot import ExpireSnapshots
from pyiceberg.types import ListType
from pyiceberg.utils.datetime import datetime_to_millis

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.summary import find_commit, ref_view

log = logging.getLogger(__name__)


class CommitOutcomeUnknownError(EngineError):
    """The catalog did not say whether the commit landed and the table does not show it; data files are kept."""


def require_refs(transaction: Transaction, refs: Mapping[str, int | None]) -> None:
    """Make the commit of `transaction` require each ref of `refs` at its snapshot (None: the ref must not exist):
    the catalog refuses it (`CommitFailedException`) when another writer moved one since it was read. Call it after
    the transaction's snapshot update is staged: pyiceberg keeps one requirement per type (`Transaction._stage`),
    so a ref requirement staged first would drop the snapshot producer's own on its branch; these are appended."""
    transaction._requirements += tuple(AssertRefSnapshotId.model_validate({"ref": ref, "snapshot-id": snapshot_id})
                                       for ref, snapshot_id in refs.items())


def append_without_client_retries(table: Table, data_files: Sequence[DataFile], properties: dict[str, str], *,
                                  replacing: BooleanExpression | None = None, branch: str = MAIN_BRANCH,
                                  requires: Mapping[str, int | None] | None = None) -> None:
    """One fast append without pyiceberg's client retries (`without_client_retries`: a retry would skip our offset
    re-check), committed with `commit_settled`; on success `table` holds the catalog's new metadata. With
    `replacing`, the rows matching it are deleted in the same commit, before the append (pyiceberg's copy-on-write
    delete, whose snapshots carry `properties` too). `branch` is where the snapshot goes (the audit branch of an
    audited publish, engine/tables/audit.py); the commit requires it still at the head it was built on, and the
    other refs of `requires` at theirs (`require_refs`)."""
    view = without_client_retries(table)
    transaction = view.transaction()
    if replacing is not None:
        with warnings.catch_warnings():  # matching nothing is fine: no snapshot then
            warnings.filterwarnings("ignore", "Delete operation did not match any records")
            transaction.delete(replacing, snapshot_properties=properties, branch=branch)
    with transaction.update_snapshot(snapshot_properties=properties, branch=branch).fast_append() as append:
        for data_file in data_files:
            append.append_data_file(data_file)
    require_refs(transaction, requires or {})
    commit_settled(transaction)
    # The view now holds the catalog's answer to the commit (not the retry override): adopt it, saving a reload.
    table.metadata = view.metadata
    table.metadata_location = view.metadata_location


def committed_snapshot_id(table: Table, branch: str = MAIN_BRANCH) -> int:
    """The head of `branch` (main: the current snapshot) right after one of our commits to it landed (a commit
    always leaves one)."""
    ref = table.metadata.refs.get(branch)
    snapshot_id = table.metadata.current_snapshot_id if branch == MAIN_BRANCH else ref.snapshot_id if ref else None
    if snapshot_id is None:
        raise EngineError(f"table {'.'.join(table.name())}: no snapshot on branch {branch} after a commit that "
                          "landed")
    return snapshot_id


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


def expire_planned_snapshots(table: Table, snapshot_ids: Sequence[int], *, planned_on: int | None) -> None:
    """Remove `snapshot_ids` in one commit that requires main to still point at `planned_on`, the snapshot the
    expiry was planned on: a commit landing in between makes the catalog refuse it (`CommitFailedException`, which
    pyiceberg does not retry: no snapshot producer), so the caller re-plans on the refreshed table. On success
    `table` holds the catalog's new metadata."""
    transaction = HistoryIndependentTransaction(table)
    ExpireSnapshots(transaction).by_ids(list(snapshot_ids)).commit()
    require_refs(transaction, {MAIN_BRANCH: planned_on})
    transaction.commit_transaction()


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


def find_commit_after_refresh(table: Table, commit_id: str, since: int | None,
                              branch: str = MAIN_BRANCH) -> int | None:
    """The snapshot id of our commit on `branch` after a refresh (see `summary.find_commit`), or None, also
    when the catalog cannot be read."""
    try:
        table.refresh()
    except Exception:
        log.warning("table %s: cannot refresh to check the commit outcome", ".".join(table.name()), exc_info=True)
        return None
    commit = find_commit(ref_view(table, branch), commit_id, since=since)
    return commit.snapshot_id if commit is not None else None


def delete_uncommitted(table: Table, paths: Iterable[str], table_name: str, run_id: str) -> None:
    paths = list(paths)
    failed = delete_data_files(table.io, paths)
    log.warning(
        "table %s: deleted %d uncommitted data files of run %s%s",
        table_name,
        len(paths) - len(failed),
        run_id,
        f" ({len(failed)} could not be deleted; orphan-file removal removes them later)" if failed else "",
    )


def delete_data_files(io: FileIO, paths: Iterable[str]) -> list[str]:
    """Delete each file, logging (not raising) a failure so one bad path does not keep the others.

    Returns the paths that could not be deleted; a missing file counts as deleted.
    """
    failed = []
    for path in paths:
        try:
            io.delete(path)
        except FileNotFoundError:
            pass
        except Exception:
            log.warning("could not delete data file %s", path, exc_info=True)
            failed.append(path)
    return failed


# ---- pyiceberg's private functions we call, under names of ours ----------------------------------------------------
# The executor-side writer needs what pyiceberg's own `append` does to a batch (partitioning, casting to the file
# schema, the compatibility check); replay needs the strict metrics evaluator ("every row of this file matches").
check_pyarrow_schema_compatible = _check_pyarrow_schema_compatible
determine_partitions = _determine_partitions

to_requested_schema = _to_requested_schema


class _NullListPreservingProjection(ArrowProjectionVisitor):
    """pyiceberg 0.12's projection of Arrow data to a table schema rebuilds a list whose elements are structs from its
    offsets alone (its workaround for apache/arrow#38809), which drops the list's validity: a null list of structs
    (an Avro tombstone's line items) became `[]` when written, and again when read back (scans, compaction,
    replay's rewrites). This puts the list's nulls back."""

    def list(self, list_type: ListType, list_array: pa.Array | None, value_array: pa.Array | None) -> pa.Array | None:
        projected = super().list(list_type, list_array, value_array)
        if (isinstance(projected, pa.ListArray | pa.LargeListArray) and list_array is not None
                and list_array.null_count and projected.null_count != list_array.null_count):
            return type(projected).from_arrays(projected.offsets, projected.values, type=projected.type,
                                               mask=list_array.is_null())
        return projected


# `_to_requested_schema` (our writers) and pyiceberg's readers look the visitor up in their module when they run.
_pyiceberg_pyarrow.ArrowProjectionVisitor = _NullListPreservingProjection  # type: ignore[misc]


def arrow_schema_as_iceberg(arrow_schema: pa.Schema) -> Schema:
    """The Iceberg schema pyiceberg's `Catalog.create_table` makes of an Arrow schema (names, nullability, types)."""
    return Catalog._convert_schema_if_needed(arrow_schema)


def rows_must_match(schema: Schema, expression: BooleanExpression) -> Callable[[DataFile], bool]:
    """Whether the file's column statistics prove that every row matches `expression` (pyiceberg's strict
    metrics evaluator; True only when proven)."""
    return _StrictMetricsEvaluator(schema, expression).eval


def rows_might_match(schema: Schema, expression: BooleanExpression) -> Callable[[DataFile], bool]:
    """Whether the file's column statistics allow a row that matches `expression` (pyiceberg's inclusive metrics
    evaluator, the rule its scan planning prunes files by; False only when ruled out)."""
    return _InclusiveMetricsEvaluator(schema, expression).eval
