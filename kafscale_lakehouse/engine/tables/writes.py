"""The table side of downstream writes: the table created on first write, its schema evolved by name, one commit.

A table is created on first write from the data's schema (with the given partition spec); columns the data adds are
added by name, a column may widen (int → long, float → double); any other difference is a `TableWriteSchemaError`
naming the column. `commit_files` makes ONE catalog commit: an append, or a delete of the replaced rows
(`replace_filter`, all rows when None) and the append in one transaction. A commit that loses to a concurrent one
(another partition of the same asset) is retried on the refreshed table with the same data files, so both land.
An answer that does not say whether the commit landed is settled by looking for the commit's id in the table; when
it is not there either the files are kept (`CommitOutcomeUnknownError`: they may be referenced).

Retries. An overwrite and an upsert written again give the same table, but an append would add its rows twice, so
an append names the write it belongs to (`write_id`, in its snapshots' summaries as `kafscale.write-id`) and the
earlier attempts it retries (`retry_of`, e.g. a Dagster step attempted again, or a run re-executed from its failure,
after a commit that landed before the step could record it). Every attempt checks, on the table its commit is built
on, whether a snapshot of the branch's ancestry carries one of those ids; if so that commit stands for this one:
nothing is appended, this attempt's files are deleted and the result names the snapshot found. The commit requires
the branch still at the head it checked, so a commit of an earlier attempt landing in between (an answer lost, the
request applied late) makes it check again rather than append twice.
The data files come from `engine/spark/writes.py` (a Spark job) or from an Arrow table.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema, assign_fresh_schema_ids, promote
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.types import IcebergType, MapType, PrimitiveType

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.audit import ref_view, start_audit_branch
from kafscale_lakehouse.engine.tables.catalogs import (
    PartitionFieldSpec,
    build_partition_spec,
    catalog_endpoint,
    catalog_errors,
)
from kafscale_lakehouse.engine.tables.commits import (
    CommitOutcomeUnknownError,
    arrow_schema_as_iceberg,
    commit_settled,
    require_refs,
    without_client_retries,
)
from kafscale_lakehouse.engine.tables.data_files import (
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    delete_data_files,
)
from kafscale_lakehouse.engine.tables.summary import (
    COMMIT_ID_PROPERTY,
    WRITE_ID_PROPERTY,
    ancestry,
    summary_properties,
)
from kafscale_lakehouse.engine.tables.upserts import UpsertError, UpsertOptions, upsert_rows

log = logging.getLogger(__name__)

WriteMode = Literal["append", "overwrite", "upsert"]
WRITE_MODES: tuple[str, ...] = ("append", "overwrite", "upsert")
DEFAULT_COMMIT_ATTEMPTS = 10
_RETRY_WAIT_SECONDS = 0.2


class TableWriteError(EngineError):
    """Writing to a table failed; the message names the table."""


class TableWriteSchemaError(TableWriteError):
    """The data does not fit the table (a column changed type, a required column is missing); names the column."""


@dataclass(frozen=True)
class TableWrite:
    """What to write where. `replace_filter` (overwrite only): the rows replaced; None replaces the whole table.
    `snapshot_properties` go into both snapshots of the commit (they name the Dagster run and partition).
    `upsert` (mode upsert only): the keys and what to do with matched and unmatched rows (`upserts.UpsertOptions`).
    `branch`: where the commit goes; an audit branch (audited publish, `audit.start_audit_branch`) is set to main's
    head before each attempt and refuses while it holds a pending audit.
    `write_id`: the same for every attempt of this write (e.g. the run, asset and partitions); `retry_of`: the ids
    of earlier writes this one retries. An append finds a landed commit of any of them and appends nothing (see
    the module docstring)."""

    identifier: str
    run_id: str
    mode: WriteMode = "overwrite"
    replace_filter: BooleanExpression | None = None
    partition_fields: Sequence[PartitionFieldSpec] = ()
    table_properties: Mapping[str, str] = field(default_factory=dict)
    snapshot_properties: Mapping[str, str] = field(default_factory=dict)
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES
    commit_attempts: int = DEFAULT_COMMIT_ATTEMPTS
    upsert: UpsertOptions | None = None
    branch: str = MAIN_BRANCH
    write_id: str | None = None
    retry_of: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.mode not in WRITE_MODES:
            raise ValueError(f"table {self.identifier}: write mode {self.mode!r} is not one of {WRITE_MODES}")
        if self.mode == "append" and self.replace_filter is not None:
            raise ValueError(f"table {self.identifier}: an append replaces no rows (replace_filter is for overwrite)")
        if (self.mode == "upsert") != (self.upsert is not None):
            raise ValueError(f"table {self.identifier}: upsert options go with write mode upsert, and only with it")
        if self.upsert is not None and self.branch != MAIN_BRANCH:
            raise ValueError(f"table {self.identifier}: an upsert commits to main only, not to branch {self.branch}")


@dataclass(frozen=True)
class TableWriteResult:
    identifier: str
    snapshot_id: int | None  # None: nothing committed (an empty append)
    rows_written: int
    data_files: int
    table_rows: int | None  # the table's `total-records` after the commit
    location: str
    schema: Schema
    created: bool
    columns_added: tuple[str, ...]
    attempts: int


# ------------------------------------------------------------------------------------------------ schema


def iceberg_schema_of(arrow_schema: pa.Schema) -> Schema:
    """The Iceberg schema of Arrow data, with fresh field ids (nullable fields become optional columns)."""
    converted = arrow_schema_as_iceberg(arrow_schema)
    return assign_fresh_schema_ids(converted)  # converted fields carry no ids yet, so lookups by name would mix up


def prepare_table(catalog: Catalog, write: TableWrite, arrow_schema: pa.Schema) -> tuple[Table, bool, tuple[str, ...]]:
    """The table, created from `arrow_schema` when missing, its schema grown to hold every column of the data.

    Returns (table, created, columns added). Raises `TableWriteSchemaError` naming the column that does not fit."""
    incoming = iceberg_schema_of(arrow_schema)
    endpoint = catalog_endpoint(catalog)
    namespace = Catalog.namespace_from(write.identifier)
    if not namespace:
        raise TableWriteError(f"table identifier {write.identifier!r} needs a namespace (e.g. 'rpc.sauce_daily')")
    created = False
    with catalog_errors(endpoint):
        try:
            table = catalog.load_table(write.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            spec = build_partition_spec(write.identifier, incoming, write.partition_fields)
            catalog.create_namespace_if_not_exists(namespace)
            # If a concurrent writer created it first, this loads theirs and the checks below apply to it.
            table = catalog.create_table_if_not_exists(
                write.identifier, incoming, partition_spec=spec,
                properties={**write.table_properties, TableProperties.WRITE_FILE_FORMAT: "parquet"})
            created = True
            log.info("table %s ready at %s (%d columns, partition spec %s)", write.identifier, table.location(),
                     len(table.schema().fields), table.spec())
    for attempt in range(write.commit_attempts):
        additions, widenings = schema_changes(write.identifier, table.schema(), incoming)
        if not additions and not widenings:
            return table, created, ()
        try:
            with catalog_errors(endpoint), table.update_schema() as update:
                for name, field_type in additions:
                    update.add_column(name, field_type)
                for name, field_type in widenings:
                    update.update_column(name, field_type=field_type)
        except CommitFailedException:
            # A concurrent writer changed the table (maybe the same columns): look again.
            time.sleep(_RETRY_WAIT_SECONDS * (attempt + 1))
            table.refresh()
            continue
        added = tuple(name for name, _ in additions)
        log.info("table %s: added columns %s, widened %s", write.identifier, list(added),
                 [f"{n} to {t}" for n, t in widenings])
        return table, created, added
    raise TableWriteError(f"table {write.identifier}: schema update lost to concurrent updates "
                          f"{write.commit_attempts} times")


def schema_changes(identifier: str, table_schema: Schema, incoming: Schema
                   ) -> tuple[list[tuple[str, IcebergType]], list[tuple[str, PrimitiveType]]]:
    """(columns to add, columns to widen) for data of schema `incoming`, matched by name.

    A column of the table that the data lacks is fine when optional (written as null) and an error when required; a
    column whose type differs must be the same or a promotion either way (int → long, float → double, ...)."""
    additions: list[tuple[str, IcebergType]] = []
    widenings: list[tuple[str, PrimitiveType]] = []
    existing = {f.name: f for f in table_schema.fields}
    for field_ in incoming.fields:
        current = existing.get(field_.name)
        if current is None:
            additions.append((field_.name, field_.field_type))
            continue
        if _same_type(current.field_type, field_.field_type):
            continue
        if _promotes(field_.field_type, current.field_type):
            continue  # narrower data: the writer casts it to the table's type
        if _promotes(current.field_type, field_.field_type) and isinstance(field_.field_type, PrimitiveType):
            widenings.append((field_.name, field_.field_type))
            continue
        raise TableWriteSchemaError(
            f"table {identifier}: column {field_.name!r} is {current.field_type} in the table but "
            f"{field_.field_type} in the data; only widening (int → long, float → double) is allowed: cast the "
            f"column, rename it, or write to a new table")
    names = {f.name for f in incoming.fields}
    missing = [f.name for f in table_schema.fields if f.required and f.name not in names]
    if missing:
        raise TableWriteSchemaError(f"table {identifier}: required columns {missing} are missing from the data")
    return additions, widenings


def _same_type(a: IcebergType, b: IcebergType) -> bool:
    if isinstance(a, PrimitiveType) or isinstance(b, PrimitiveType):
        return a == b
    # Nested types: compare their shape, not the field ids (the data's ids are fresh).
    return _shape(a) == _shape(b)


def _shape(field_type: IcebergType) -> object:
    if isinstance(field_type, PrimitiveType):
        return str(field_type)
    children = getattr(field_type, "fields", None)
    if children is not None:
        return tuple((child.name, _shape(child.field_type)) for child in children)
    if hasattr(field_type, "element_type"):
        return ("list", _shape(field_type.element_type))
    if isinstance(field_type, MapType):
        return ("map", _shape(field_type.key_type), _shape(field_type.value_type))
    raise TypeError(f"unexpected Iceberg type {field_type}")


def _promotes(narrow: IcebergType, wide: IcebergType) -> bool:
    if not isinstance(narrow, PrimitiveType) or not isinstance(wide, PrimitiveType):
        return False
    try:
        return promote(narrow, wide) == wide
    except Exception:  # noqa: BLE001 - pyiceberg raises ResolveError for every non-promotion
        return False


# ------------------------------------------------------------------------------------------------ commit


def commit_files(table: Table, data_files: Sequence[DataFile], write: TableWrite, *, created: bool = False,
                 added: tuple[str, ...] = ()) -> TableWriteResult:
    """One catalog commit: append `data_files`, after deleting the replaced rows for an overwrite. Retried on the
    refreshed table when a concurrent commit wins; data files are deleted when every attempt lost, and kept when the
    outcome is unknown (`CommitOutcomeUnknownError`). An append that finds a landed commit of its write or of one it
    retries (`write_id`, `retry_of`) commits nothing (see the module docstring)."""
    endpoint = catalog_endpoint(table.catalog)
    commit_id = uuid.uuid4().hex
    properties = {**write.snapshot_properties, COMMIT_ID_PROPERTY: commit_id,
                  **({WRITE_ID_PROPERTY: write.write_id} if write.write_id is not None else {})}
    rows = sum(f.record_count for f in data_files)
    if write.upsert is not None:
        return _commit_upsert(table, data_files, write, write.upsert, created=created, added=added)
    if write.mode == "append" and not data_files:
        log.info("table %s: run %s appends no rows, nothing to commit", write.identifier, write.run_id)
        return _result(table, write, None, 0, 0, created, added, 0)
    replace = write.replace_filter if write.replace_filter is not None else AlwaysTrue()
    same_write = write.retry_of | ({write.write_id} if write.write_id is not None else set())
    before_first: int | None = None
    for attempt in range(1, write.commit_attempts + 1):
        try:
            if write.branch != MAIN_BRANCH:
                start_audit_branch(table, write.branch)  # AuditPendingError while it holds a pending audit
            if attempt == 1:
                before_first = ref_view(table, write.branch).metadata.current_snapshot_id
            if write.mode == "append" and same_write:
                landed = _landed_write(ref_view(table, write.branch), same_write)
                if landed is not None:
                    return _adopt(table, write, landed, data_files, created, added, attempt)
            with catalog_errors(endpoint):
                transaction = without_client_retries(table).transaction()
                if write.mode == "overwrite" and ref_view(table, write.branch).current_snapshot() is not None:
                    with warnings.catch_warnings():
                        # A partition materialized for the first time replaces nothing: not worth a warning.
                        warnings.filterwarnings("ignore", "Delete operation did not match any records")
                        transaction.delete(replace, snapshot_properties=properties, branch=write.branch)
                if data_files:
                    with transaction.update_snapshot(snapshot_properties=properties,
                                                     branch=write.branch).fast_append() as append:
                        for data_file in data_files:
                            append.append_data_file(data_file)
                if write.branch != MAIN_BRANCH:  # the audited snapshot must be main's child to be published
                    require_refs(transaction, {MAIN_BRANCH: table.metadata.current_snapshot_id})
                try:
                    committed = commit_settled(transaction)
                    snapshot_id = ref_view(committed, write.branch).metadata.current_snapshot_id
                except CommitFailedException:
                    raise
                except Exception as exc:
                    # No answer, or one that does not say (a 5xx, a timeout): the table tells.
                    snapshot_id = _landed_commit(table, write.branch, commit_id, before_first)
                    if snapshot_id is None:
                        raise CommitOutcomeUnknownError(
                            f"table {write.identifier}: the commit of run {write.run_id} failed with an unknown "
                            f"outcome ({type(exc).__name__}: {exc}); its {len(data_files)} data files are kept "
                            "until the table shows whether they are referenced") from exc
                    log.warning("table %s: the commit of run %s reported %r but landed", write.identifier,
                                write.run_id, exc)
                    committed = table
        except CommitFailedException as exc:
            if attempt == write.commit_attempts:
                failed = delete_data_files(table.io, [f.file_path for f in data_files])
                raise TableWriteError(
                    f"table {write.identifier}: commit of run {write.run_id} lost to concurrent commits {attempt} "
                    f"times; its data files were deleted{f' (except {len(failed)})' if failed else ''}") from exc
            log.warning("table %s: commit of run %s lost to a concurrent commit (attempt %d/%d), retrying",
                        write.identifier, write.run_id, attempt, write.commit_attempts)
            time.sleep(_RETRY_WAIT_SECONDS * attempt)
            with catalog_errors(endpoint):
                table.refresh()
            continue
        table.metadata, table.metadata_location = committed.metadata, committed.metadata_location
        log.info("table %s: run %s committed %s of %d rows in %d data files (snapshot %s on %s, attempt %d)",
                 write.identifier, write.run_id, write.mode, rows, len(data_files), snapshot_id, write.branch,
                 attempt)
        return _result(table, write, snapshot_id, rows, len(data_files), created, added, attempt)
    raise AssertionError("unreachable")


def _landed_write(table: Table, write_ids: frozenset[str] | set[str]) -> int | None:
    """The newest snapshot of the table's current ancestry that a write of `write_ids` committed, or None (the
    summaries are in the loaded metadata: no request)."""
    for snapshot in ancestry(table):
        if summary_properties(snapshot).get(WRITE_ID_PROPERTY) in write_ids:
            return snapshot.snapshot_id
    return None


def _landed_commit(table: Table, branch: str, commit_id: str, since: int | None) -> int | None:
    """After an answer that did not say: the snapshot of `branch` our commit `commit_id` added, looked for in the
    refreshed table back to `since` (the head before the first attempt), or None, also when the catalog cannot be
    read."""
    try:
        table.refresh()
    except Exception:  # the outcome stays unknown
        log.warning("table %s: cannot refresh to check the commit outcome", ".".join(table.name()), exc_info=True)
        return None
    for snapshot in ancestry(ref_view(table, branch)):
        if snapshot.snapshot_id == since:
            return None
        if summary_properties(snapshot).get(COMMIT_ID_PROPERTY) == commit_id:
            return snapshot.snapshot_id
    return None


def _adopt(table: Table, write: TableWrite, snapshot_id: int, data_files: Sequence[DataFile], created: bool,
           added: tuple[str, ...], attempt: int) -> TableWriteResult:
    """An earlier attempt of this append landed in `snapshot_id`: this attempt's files are deleted, nothing is
    committed, and the result names that snapshot."""
    failed = delete_data_files(table.io, [f.file_path for f in data_files])
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    counts = summary_properties(snapshot) if snapshot is not None else {}
    rows = int(counts.get("added-records", 0))
    files = int(counts.get("added-data-files", 0))
    log.warning("table %s: run %s appends nothing: snapshot %d already holds this write (write id %s, committed by "
                "an earlier attempt); %d data files of this attempt deleted%s", write.identifier, write.run_id,
                snapshot_id, counts.get(WRITE_ID_PROPERTY),
                len(data_files) - len(failed), f" ({len(failed)} could not be)" if failed else "")
    return _result(table, write, snapshot_id, rows, files, created, added, attempt)


def _commit_upsert(table: Table, data_files: Sequence[DataFile], write: TableWrite, options: UpsertOptions, *,
                   created: bool, added: tuple[str, ...]) -> TableWriteResult:
    """Copy-on-write upsert by `options.join_cols` (`upserts.upsert_rows`): only files holding matched keys are
    rewritten."""
    try:
        upserted = upsert_rows(table, data_files, options, write.run_id,
                               target_file_size_bytes=write.target_file_size_bytes,
                               snapshot_properties=write.snapshot_properties, max_attempts=write.commit_attempts)
    except UpsertError as exc:
        raise TableWriteError(str(exc)) from exc
    log.info("table %s: run %s upserted %d rows (%d replaced, %d files rewritten) in snapshot %s",
             write.identifier, write.run_id, upserted.rows_written, upserted.rows_replaced, upserted.files_rewritten,
             upserted.snapshot_id)
    return _result(table, write, upserted.snapshot_id, upserted.rows_written, upserted.data_files, created, added,
                   upserted.attempts)


def _result(table: Table, write: TableWrite, snapshot_id: int | None, rows: int, files: int, created: bool,
            added: tuple[str, ...], attempts: int) -> TableWriteResult:
    snapshot = ref_view(table, write.branch).current_snapshot()
    total = snapshot.summary.get("total-records") if snapshot is not None and snapshot.summary else None
    return TableWriteResult(identifier=write.identifier, snapshot_id=snapshot_id, rows_written=rows,
                            data_files=files, table_rows=int(total) if total is not None else 0 if snapshot is None
                            else None, location=table.location(), schema=table.schema(), created=created,
                            columns_added=added, attempts=attempts)

