"""Table maintenance that keeps a landed table cheap to read and to write for years, without Dagster.

    summary = maintain_table(spark, table, MaintenanceSettings(), dead_letters=None)

- `apply_bounded_metadata_properties`: `write.metadata.delete-after-commit.enabled=true` and
  `write.metadata.previous-versions-max` (catalog.BOUNDED_METADATA_PROPERTIES) on tables created before they were
  set at creation; a value the table already has is kept (an operator's choice wins).
- `expire_snapshots`: by age (`older_than`) and by count (beyond the newest `max_snapshots`; the newest
  `retain_last` snapshots of the current branch are always kept), through pyiceberg's `ExpireSnapshots`. Never
  expired: every snapshot from the current one back to the newest that carries `kafscale.offsets.<topic>` (reading
  offsets walks this chain; a missing link would hide them), the table's main snapshots whose staged dead letters
  are not yet published (dead_letter.publish_pending_dead_letters walks back to them), and, on a dead-letter table,
  staged snapshots not yet published. Expiry only removes snapshots from the metadata; their files go with
  orphan-file removal.
- `compact`: small data files of each partition are read and rewritten into files of about the target size by one
  Spark job, then committed as one overwrite snapshot that removes the inputs, adds the outputs and carries the
  table's offsets forward (engine/tables/rewrites.py: retried on a concurrent commit, abandoned with its files
  deleted when an input is gone, so nothing is lost or doubled). Ingestion is never blocked: it commits whenever it
  wants; compaction is the one that retries. A table with a sort order (an upsert table: its id columns) has each
  group's rows sorted by it, so an upsert's keys fall in few of the compacted files' bounds.
- `remove_orphan_files`: files under the table's own location, older than `min_age` (3 days, as Iceberg's), that no
  snapshot, manifest list, manifest, metadata file or statistics file of the table references. Refuses to run when
  another table's metadata lies in the same location (a table renamed and recreated there by older versions).
- `rewrite_manifests`: every fast append adds a manifest, so a table's current snapshot holds one per commit since
  the last merge, and every scan plan reads them all. Once there are `manifest_min_count` data manifests, one
  snapshot merges them into manifests of about `manifest_target_size_bytes` (pyiceberg 0.12 has no
  `rewrite_manifests`: its merge append does it, engine/tables/rewrites.py), carrying the offsets forward.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyarrow.fs import FileInfo, FileSelector, FileSystem, FileType
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import SortDirection
from pyiceberg.transforms import IdentityTransform
from pyspark.sql import SparkSession

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.spark.rewrite_job import run_rewrite_job
from kafscale_lakehouse.engine.tables.audit import (
    AUDIT_COMMANDS,
    DEFAULT_AUDIT_BRANCH,
    AuditPendingError,
    pending_audit,
)
from kafscale_lakehouse.engine.tables.catalogs import (
    BOUNDED_METADATA_PROPERTIES,
    CatalogSettings,
    catalog_endpoint,
    catalog_errors,
    load_catalog,
    open_table,
)
from kafscale_lakehouse.engine.tables.commits import (
    CommitOutcomeUnknownError,
    delete_data_files,
    expire_planned_snapshots,
)
from kafscale_lakehouse.engine.tables.dead_letters import (
    StagedDeadLetters,
    open_dead_letter_table,
    settled_staged_ids,
)
from kafscale_lakehouse.engine.tables.rewrites import ManifestMerge, commit_rewrite
from kafscale_lakehouse.engine.tables.summary import (
    SOURCE_TABLE_PROPERTY,
    ancestry,
    is_kafscale_commit,
)

log = logging.getLogger(__name__)

COMPACTION_PROPERTY = "kafscale.compaction"  # on our compaction snapshots: the compaction's id
DEFAULT_ORPHAN_MIN_AGE = timedelta(days=3)
DEFAULT_SNAPSHOT_MAX_AGE = timedelta(days=5)  # Iceberg's history.expire.max-snapshot-age-ms default
DEFAULT_RETAIN_LAST = 1  # Iceberg's history.expire.min-snapshots-to-keep default
EXPIRY_COMMIT_ATTEMPTS = 5  # each refused attempt re-plans on the refreshed table
# Every commit rewrites a metadata.json listing every retained snapshot (~0.9 KB each for ours): at a 30 s cadence
# five days are 14,400 snapshots, a 13 MB file written per commit. Capped so a commit costs what a young table's does.
DEFAULT_MAX_SNAPSHOTS = 1000
DEFAULT_COMMIT_ATTEMPTS = 10


class MaintenanceError(EngineError):
    """Maintenance cannot run safely on this table; the message names the table and why."""


@dataclass(frozen=True)
class MaintenanceSettings:
    snapshot_max_age: timedelta = DEFAULT_SNAPSHOT_MAX_AGE
    retain_last: int = DEFAULT_RETAIN_LAST
    max_snapshots: int | None = DEFAULT_MAX_SNAPSHOTS
    orphan_min_age: timedelta = DEFAULT_ORPHAN_MIN_AGE
    target_file_size_bytes: int = 128 * 1024 * 1024
    # A partition is compacted when it has at least this many files smaller than 3/4 of the target.
    min_input_files: int = 5
    manifest_min_count: int = 100
    manifest_target_size_bytes: int = 8 * 1024 * 1024


@dataclass
class TableFiles:
    data_files: int
    data_bytes: int

    @property
    def average_file_bytes(self) -> int:
        return self.data_bytes // self.data_files if self.data_files else 0


@dataclass
class MaintenanceSummary:
    """What one maintenance run did (the Dagster metadata and the CLI output)."""

    table: str
    before: TableFiles | None = None
    after: TableFiles | None = None
    properties_set: dict[str, str] = field(default_factory=dict)
    snapshots_expired: int = 0
    files_compacted: int = 0
    files_written: int = 0
    compaction_snapshot_id: int | None = None
    manifests_before: int | None = None
    manifests_after: int | None = None
    orphan_files_removed: int = 0
    duration_seconds: float = 0.0
    rewrites_skipped: str | None = None  # why compaction and the manifest rewrite did not run (an audit pending)

    def as_dict(self) -> dict:
        return {
            "table": self.table,
            "data_files_before": self.before.data_files if self.before else None,
            "data_bytes_before": self.before.data_bytes if self.before else None,
            "data_files_after": self.after.data_files if self.after else None,
            "data_bytes_after": self.after.data_bytes if self.after else None,
            "average_file_bytes_after": self.after.average_file_bytes if self.after else None,
            "properties_set": dict(self.properties_set),
            "snapshots_expired": self.snapshots_expired,
            "files_compacted": self.files_compacted,
            "files_written": self.files_written,
            "compaction_snapshot_id": self.compaction_snapshot_id,
            "manifests_before": self.manifests_before,
            "manifests_after": self.manifests_after,
            "orphan_files_removed": self.orphan_files_removed,
            "rewrites_skipped": self.rewrites_skipped,
            "duration_seconds": round(self.duration_seconds, 3),
        }


def maintain_table(spark: SparkSession | None, table: Table, settings: MaintenanceSettings, *,
                   dead_letters: Table | None = None, compaction: bool = True, manifests: bool = True,
                   expiry: bool = True, orphans: bool = True, properties: bool = True,
                   now: datetime | None = None, audit_branch: str = DEFAULT_AUDIT_BRANCH) -> MaintenanceSummary:
    """Properties, compaction, manifest rewrite, snapshot expiry and orphan-file removal, in that order (manifests
    after compaction, which rewrites some; expiry after both so the old snapshots can go; orphan removal last so
    their files can go once old enough). While `audit_branch` holds a snapshot main does not (an audited publish
    pending, engine/tables/audit.py), compaction and the manifest rewrite are skipped, saying so: a snapshot of
    theirs on main would make the audited snapshot's fast-forward impossible. Each of their commit attempts checks
    again and requires the branch unmoved, so an audit committed during the rewrite abandons it the same way.
    Expiry keeps the branch's head and orphan removal the files of every snapshot, the audited one included."""
    started = time.monotonic()
    now = now or datetime.now(UTC)
    summary = MaintenanceSummary(".".join(table.name()))
    summary.before = table_files(table)
    pending = pending_audit(table, audit_branch) if compaction or manifests else None
    if pending is not None:
        summary.rewrites_skipped = (
            f"audit branch {audit_branch} holds snapshot {pending.snapshot_id} of run {pending.run_id} that main "
            "does not: a rewrite on main would make its fast-forward impossible; settle it: "
            f"{AUDIT_COMMANDS.format(table=summary.table)}")
        log.warning("table %s: compaction and manifest rewrite skipped: %s", summary.table, summary.rewrites_skipped)
        compaction = manifests = False
    if properties:
        summary.properties_set = apply_bounded_metadata_properties(table)
    try:
        if compaction:
            if spark is None:
                raise ValueError("compaction needs a Spark session")
            result = compact(spark, table, target_file_size_bytes=settings.target_file_size_bytes,
                             min_input_files=settings.min_input_files, audit_branch=audit_branch)
            summary.files_compacted, summary.files_written = result.files_compacted, result.files_written
            summary.compaction_snapshot_id = result.snapshot_id
        if manifests:
            summary.manifests_before, summary.manifests_after = rewrite_manifests(
                table, min_count=settings.manifest_min_count, target_size_bytes=settings.manifest_target_size_bytes,
                audit_branch=audit_branch)
    except AuditPendingError as exc:  # an audited run committed to the branch during the rewrite
        summary.rewrites_skipped = str(exc)
        log.warning("table %s: rewrite abandoned: %s", summary.table, exc)
    if expiry:
        summary.snapshots_expired = len(expire_snapshots(
            table, older_than=now - settings.snapshot_max_age, retain_last=settings.retain_last,
            max_snapshots=settings.max_snapshots, dead_letters=dead_letters))
    if orphans:
        summary.orphan_files_removed = len(remove_orphan_files(table, older_than=now - settings.orphan_min_age))
    table.refresh()
    summary.after = table_files(table)
    summary.duration_seconds = time.monotonic() - started
    log.info("table %s maintained: %s", summary.table, summary.as_dict())
    return summary


def table_files(table: Table) -> TableFiles:
    """Data files and bytes of the current snapshot (from its summary totals: no manifest is read)."""
    snapshot = table.current_snapshot()
    summary = snapshot.summary if snapshot is not None and snapshot.summary is not None else {}
    return TableFiles(int(summary.get("total-data-files", 0) or 0), int(summary.get("total-files-size", 0) or 0))


# ---- properties ----------------------------------------------------------------------------------------------

def apply_bounded_metadata_properties(table: Table) -> dict[str, str]:
    """Set the properties that keep metadata bounded where the table has none; returns what was set."""
    missing = {k: v for k, v in BOUNDED_METADATA_PROPERTIES.items() if k not in table.properties}
    if missing:
        with catalog_errors(catalog_endpoint(table.catalog)), table.transaction() as transaction:
            transaction.set_properties(missing)
        log.info("table %s: set %s", ".".join(table.name()), missing)
    return missing


# ---- snapshot expiry -----------------------------------------------------------------------------------------

def protected_snapshot_ids(table: Table, dead_letters: Table | None = None) -> set[int]:
    """Snapshots our protocol needs (see the module docstring)."""
    protected: set[int] = set()
    main_chain = list(ancestry(table))
    for snapshot in main_chain:
        protected.add(snapshot.snapshot_id)
        if is_kafscale_commit(snapshot):
            break  # the newest snapshot with offsets: the chain down to it is what reading offsets walks
    if dead_letters is not None:
        published = settled_staged_ids(dead_letters)
        for snapshot in main_chain:
            staged = StagedDeadLetters.from_summary(snapshot)
            if staged is not None and staged.snapshot_id not in published:
                protected.add(snapshot.snapshot_id)
    # On a dead-letter table: staged snapshots (on no branch, naming their source table) not yet published.
    on_branch = {s.snapshot_id for s in ancestry(table)}
    published = settled_staged_ids(table)
    for snapshot in table.metadata.snapshots:
        if (snapshot.snapshot_id not in on_branch and snapshot.summary is not None
                and snapshot.summary.get(SOURCE_TABLE_PROPERTY) and snapshot.snapshot_id not in published):
            protected.add(snapshot.snapshot_id)
    return protected


def expire_snapshots(table: Table, *, older_than: datetime, retain_last: int = DEFAULT_RETAIN_LAST,
                     max_snapshots: int | None = None, dead_letters: Table | None = None) -> list[int]:
    """Expire snapshots older than `older_than`, and beyond the newest `max_snapshots` (when given), keeping the
    newest `retain_last` of the current branch, the heads of refs and every protected one; returns the expired ids.

    Through pyiceberg's `ExpireSnapshots` on a `HistoryIndependentTransaction` (`expire_planned_snapshots`):
    pyiceberg's own transaction deep-copies the whole metadata twice per expired id, which on a long history never
    finishes. The commit requires main to be on the snapshot the plan was made on; refused, it re-plans on the
    refreshed table (up to `EXPIRY_COMMIT_ATTEMPTS` times, then `MaintenanceError`)."""
    if retain_last < 1:
        raise ValueError(f"retain_last must be at least 1, got {retain_last}")
    if max_snapshots is not None and max_snapshots < retain_last:
        raise ValueError(f"max_snapshots ({max_snapshots}) must be at least retain_last ({retain_last})")
    cutoff_ms = int(older_than.timestamp() * 1000)
    for attempt in range(1, EXPIRY_COMMIT_ATTEMPTS + 1):
        with catalog_errors(catalog_endpoint(table.catalog)):
            table.refresh()
        keep = protected_snapshot_ids(table, dead_letters)
        keep.update(s.snapshot_id for s in list(ancestry(table))[:retain_last])
        keep.update(ref.snapshot_id for ref in table.metadata.refs.values())
        newest_first = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
        beyond_count = set() if max_snapshots is None else {s.snapshot_id for s in newest_first[max_snapshots:]}
        expired = [s.snapshot_id for s in table.metadata.snapshots
                   if (s.timestamp_ms < cutoff_ms or s.snapshot_id in beyond_count) and s.snapshot_id not in keep]
        if not expired:
            break
        planned_on = table.metadata.current_snapshot_id
        try:
            # Refused when main moved since planning: the plan may remove what the new state needs.
            with catalog_errors(catalog_endpoint(table.catalog)):
                expire_planned_snapshots(table, expired, planned_on=planned_on)
            break
        except CommitFailedException as exc:
            if attempt == EXPIRY_COMMIT_ATTEMPTS:
                raise MaintenanceError(
                    f"table {'.'.join(table.name())}: snapshot expiry was refused {attempt} times by commits "
                    f"landing between its planning and its commit ({exc}); it runs again next time") from exc
            log.info("table %s: a commit landed while expiry was planned on snapshot %s; re-planning (attempt %d)",
                     ".".join(table.name()), planned_on, attempt)
    log.info("table %s: expired %d snapshots (older than %s%s; %d kept: protected, newest, ref heads)",
             ".".join(table.name()), len(expired), older_than.isoformat(),
             "" if max_snapshots is None else f" or beyond the newest {max_snapshots}", len(keep))
    return expired


# ---- orphan files ----------------------------------------------------------------------------------------------

def referenced_files(table: Table) -> set[str]:
    """Every file (scheme stripped, as pyarrow.fs lists it) the table's metadata references: metadata files,
    manifest lists, manifests, data and delete files of every snapshot, statistics files."""
    io = _pyarrow_io(table)

    def strip(location: str) -> str:
        return io.parse_location(location, io.properties)[2]

    paths = {strip(table.metadata_location)}
    paths.update(strip(entry.metadata_file) for entry in table.metadata.metadata_log)
    paths.update(strip(s.statistics_path) for s in table.metadata.statistics)
    paths.update(strip(s.statistics_path) for s in table.metadata.partition_statistics)
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        paths.add(strip(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            paths.add(strip(manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(strip(entry.data_file.file_path))
    return paths


def remove_orphan_files(table: Table, *, older_than: datetime) -> list[str]:
    """Delete files under the table's own location, modified before `older_than`, that the table does not
    reference; returns the deleted paths. `MaintenanceError` when another table's metadata shares the location."""
    table_name = ".".join(table.name())
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
    io = _pyarrow_io(table)
    scheme, netloc, root = io.parse_location(table.location().rstrip("/"), io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    # List first, then refresh and read the references: a file of a commit that lands before or during the listing
    # is referenced by the refreshed metadata, so it is kept.
    listed = _list_files(fs, root)
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
    referenced = referenced_files(table)
    _refuse_shared_location(table, io, [i.path for i in listed if i.path not in referenced])
    orphans = [info.path for info in listed if info.path not in referenced
               and info.mtime is not None and info.mtime < older_than]
    uris = [f"{scheme}://{path}" for path in orphans]
    failed = set(delete_data_files(io, uris))
    deleted = [uri for uri in uris if uri not in failed]
    log.info("table %s: removed %d orphan files older than %s under %s (%d listed, %d could not be deleted)",
             table_name, len(deleted), older_than.isoformat(), table.location(), len(listed), len(failed))
    return deleted


def _list_files(fs: FileSystem, root: str) -> list[FileInfo]:
    """Every file under `root`: the candidates of orphan removal."""
    return [info for info in fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
            if info.type == FileType.File]


def _refuse_shared_location(table: Table, io: PyArrowFileIO, unreferenced: Sequence[str]) -> None:
    """Unreferenced metadata files of another table UUID mean another table lives here: its files would look
    like our orphans. Every candidate is read (they are few: metadata files the log no longer lists), not a sample:
    the one of another table may be any of them."""
    own_uuid = str(table.metadata.table_uuid)
    for path in [p for p in unreferenced if p.endswith(".metadata.json")]:
        try:
            with io.new_input(path).open() as stream:
                other = TableMetadataUtil.parse_raw(stream.read().decode())
        except Exception:  # noqa: BLE001, S112 - unreadable: not evidence of another table
            continue
        if str(other.table_uuid) != own_uuid:
            raise MaintenanceError(
                f"table {'.'.join(table.name())}: its location {table.location()} also holds table "
                f"{other.table_uuid} ({path}); orphan-file removal would delete that table's files, so it does not "
                "run here. Move one of the tables to a location of its own.")


def _pyarrow_io(table: Table) -> PyArrowFileIO:
    return table.io if isinstance(table.io, PyArrowFileIO) else PyArrowFileIO(table.io.properties)


# ---- compaction ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompactionResult:
    snapshot_id: int | None
    files_compacted: int
    files_written: int
    bytes_before: int
    bytes_after: int
    attempts: int


# A sorted compaction group (a table with a sort order) holds up to this many target file sizes: its task sorts the
# group's rows in memory, and a bigger group writes more files of disjoint sort ranges.
SORTED_GROUP_TARGETS = 4


def compaction_groups(tasks: Sequence[FileScanTask], *, target_file_size_bytes: int,
                      min_input_files: int, max_group_bytes: int | None = None) -> list[list[DataFile]]:
    """Small data files (under 3/4 of the target, without delete files) grouped by spec and partition, in groups
    of about the target size (or `max_group_bytes`); partitions with fewer than `min_input_files` small files are
    left alone."""
    small_limit = target_file_size_bytes * 3 // 4
    group_limit = max_group_bytes or target_file_size_bytes
    by_partition: dict[tuple, list[DataFile]] = {}
    for task in tasks:
        data_file = task.file
        if (task.delete_files or data_file.content != DataFileContent.DATA
                or data_file.file_size_in_bytes >= small_limit):
            continue
        by_partition.setdefault((data_file.spec_id, repr(data_file.partition)), []).append(data_file)
    groups: list[list[DataFile]] = []
    for key in sorted(by_partition):
        files = sorted(by_partition[key], key=lambda f: f.file_path)
        if len(files) < min_input_files:
            continue
        group: list[DataFile] = []
        size = 0
        for data_file in files:
            if group and size + data_file.file_size_in_bytes > group_limit:
                groups.append(group)
                group, size = [], 0
            group.append(data_file)
            size += data_file.file_size_in_bytes
        if len(group) > 1:
            groups.append(group)
    return groups


def compaction_sort_columns(table: Table) -> list[tuple[str, str]]:
    """(column, "ascending" | "descending") of the table's sort order, up to its first field that is not a plain
    column (a transform): what compaction sorts each group by. Upsert tables are sorted by their id columns
    (engine/tables/upserts.py), so compacted files hold narrow id ranges that an upsert skips by their bounds."""
    schema, columns = table.schema(), []
    for sort_field in table.sort_order().fields:
        if not isinstance(sort_field.transform, IdentityTransform):
            break
        columns.append((schema.find_column_name(sort_field.source_id) or "",
                        "ascending" if sort_field.direction == SortDirection.ASC else "descending"))
    return [c for c in columns if c[0]]


def compact(spark: SparkSession, table: Table, *, target_file_size_bytes: int, min_input_files: int = 5,
            max_attempts: int = DEFAULT_COMMIT_ATTEMPTS, retry_wait_seconds: float = 0.2,
            audit_branch: str = DEFAULT_AUDIT_BRANCH) -> CompactionResult:
    """Rewrite small data files into files of about `target_file_size_bytes` (see the module docstring). A table
    with a sort order (`compaction_sort_columns`) has each group's rows sorted by it, in groups of up to
    `SORTED_GROUP_TARGETS` target sizes, so its output files hold disjoint ranges of the sort columns."""
    table_name = ".".join(table.name())
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
    if table.current_snapshot() is None:
        return CompactionResult(None, 0, 0, 0, 0, 0)
    sort_by = compaction_sort_columns(table)
    groups = compaction_groups(list(table.scan().plan_files()), target_file_size_bytes=target_file_size_bytes,
                               min_input_files=min_input_files,
                               max_group_bytes=SORTED_GROUP_TARGETS * target_file_size_bytes if sort_by else None)
    if not groups:
        log.info("table %s: nothing to compact", table_name)
        return CompactionResult(None, 0, 0, 0, 0, 0)
    compaction_id = f"compact-{uuid.uuid4().hex}"
    log.info("table %s: compacting %d files in %d groups (%s)%s", table_name, sum(len(g) for g in groups),
             len(groups), compaction_id, f", sorted by {sort_by}" if sort_by else "")
    written = run_rewrite_job(spark, table, compaction_id, groups, target_file_size_bytes=target_file_size_bytes,
                              sort_by=sort_by)
    inputs = [f for g in groups for f in g]
    try:
        snapshot_id, attempts = commit_rewrite(table, inputs, written, marker=(COMPACTION_PROPERTY, compaction_id),
                                               what=f"compaction {compaction_id}", max_attempts=max_attempts,
                                               retry_wait_seconds=retry_wait_seconds, audit_branch=audit_branch)
    except CommitOutcomeUnknownError:
        raise  # its files may be referenced: orphan-file removal settles them
    except BaseException:
        delete_data_files(table.io, [f.file_path for f in written])
        raise
    result = CompactionResult(snapshot_id, len(inputs), len(written), sum(f.file_size_in_bytes for f in inputs),
                              sum(f.file_size_in_bytes for f in written), attempts)
    log.info("table %s: compaction %s committed snapshot %d: %s", table_name, compaction_id, snapshot_id, result)
    return result


# ---- manifests ------------------------------------------------------------------------------------------------

MANIFEST_REWRITE_PROPERTY = "kafscale.manifest-rewrite"  # on our manifest rewrites: the rewrite's id


def data_manifest_count(table: Table, snapshot: Snapshot | None = None) -> int:
    """Data manifests of `snapshot` (default: the current one)."""
    snapshot = snapshot or table.current_snapshot()
    if snapshot is None:
        return 0
    return sum(1 for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA)


def rewrite_manifests(table: Table, *, min_count: int, target_size_bytes: int,
                      max_attempts: int = DEFAULT_COMMIT_ATTEMPTS,
                      audit_branch: str = DEFAULT_AUDIT_BRANCH) -> tuple[int, int]:
    """Merge the current snapshot's data manifests into manifests of about `target_size_bytes` once there are
    `min_count` of them; returns the data manifests before and after."""
    with catalog_errors(catalog_endpoint(table.catalog)):
        table.refresh()
    before = data_manifest_count(table)
    if before < min_count:
        log.info("table %s: %d data manifests (a rewrite starts at %d)", ".".join(table.name()), before, min_count)
        return before, before
    rewrite_id = f"manifests-{uuid.uuid4().hex}"
    snapshot_id, _ = commit_rewrite(table, [], [], marker=(MANIFEST_REWRITE_PROPERTY, rewrite_id),
                                    what=f"manifest rewrite {rewrite_id}", max_attempts=max_attempts,
                                    merge_manifests=ManifestMerge(target_size_bytes), audit_branch=audit_branch)
    rewrite = table.metadata.snapshot_by_id(snapshot_id)
    parent = table.metadata.snapshot_by_id(rewrite.parent_snapshot_id) if rewrite and rewrite.parent_snapshot_id \
        else None
    before = data_manifest_count(table, parent) if parent is not None else before  # what was merged, after a retry
    after = data_manifest_count(table, rewrite)
    log.info("table %s: %d data manifests merged into %d (%s)", ".".join(table.name()), before, after, rewrite_id)
    return before, after


# ---- per mapping (the CLI and the Dagster job) -----------------------------------------------------------------

MAINTENANCE_STEPS = ("properties", "compact", "manifests", "expire", "orphans")


@dataclass(frozen=True)
class TableMaintenance:
    """What maintaining one mapped table takes (`connections.table_maintenance` builds it from `mappings[]`)."""

    catalog: CatalogSettings
    table: str
    dead_letter_table: str | None  # the one ingestion writes to (dead_letters.mapping_dead_letter_table); None: none
    settings: MaintenanceSettings
    audit_branch: str = DEFAULT_AUDIT_BRANCH  # the mapping's (publish audited): rewrites wait while it is ahead


def maintain_mapping(spark: SparkSession | None, target: TableMaintenance, *,
                     steps: Sequence[str] = MAINTENANCE_STEPS, table: Table | None = None) -> MaintenanceSummary:
    """Maintain the table of `target` (an existing table; nothing is created) with its settings; `table`: the
    caller's loaded copy of it (`maintenance_need` read it), else it is loaded here."""
    unknown = sorted(set(steps) - set(MAINTENANCE_STEPS))
    if unknown:
        raise ValueError(f"unknown maintenance steps {unknown}; expected some of {list(MAINTENANCE_STEPS)}")
    catalog = table.catalog if table is not None else load_catalog(target.catalog)
    table = table if table is not None else open_table(catalog, target.table)
    dead_letters = open_dead_letter_table(catalog, target.dead_letter_table) if target.dead_letter_table else None
    settings = target.settings
    started = time.monotonic()
    summary = MaintenanceSummary(".".join(table.name()))
    summary.before = table_files(table)
    if "properties" in steps:
        summary.properties_set = apply_bounded_metadata_properties(table)
    sub = maintain_table(spark, table, settings, dead_letters=dead_letters, compaction="compact" in steps,
                         manifests="manifests" in steps, expiry="expire" in steps, orphans="orphans" in steps,
                         properties=False, audit_branch=target.audit_branch)
    sub.before, sub.properties_set = summary.before, summary.properties_set
    sub.duration_seconds = time.monotonic() - started
    return sub


# ---- which tables need it (one schedule for many tables) -------------------------------------------------------


@dataclass(frozen=True)
class MaintenanceNeed:
    """What a table's metadata says about its need for maintenance, read from one load of the table: the data files
    added since our last compaction (snapshot summaries), the snapshots expiry would remove by age or count, and the
    data manifests of the current snapshot (its manifest list: one read). `reasons` is empty when none is over its
    threshold (`MaintenanceSettings`); `urgency` orders tables, the most over a threshold first. Files spread over
    more partitions than `min_input_files` each keep a table due without compaction finding a group: a run that
    maintains it finds nothing to compact and the runs stay bounded (`max_tables`)."""

    table: str
    files_since_compaction: int
    average_file_bytes: int
    snapshots: int
    expirable_snapshots: int
    data_manifests: int
    reasons: tuple[str, ...]
    urgency: float

    @property
    def needed(self) -> bool:
        return bool(self.reasons)


def maintenance_need(table: Table, settings: MaintenanceSettings, *, now: datetime | None = None) -> MaintenanceNeed:
    """Whether `table` is over a threshold of `settings` (see `MaintenanceNeed`); reads no data file or manifest."""
    now = now or datetime.now(UTC)
    files = table_files(table)
    added = 0
    for snapshot in ancestry(table):
        summary = snapshot.summary
        if summary is not None and summary.get(COMPACTION_PROPERTY):
            break
        added += int((summary.get("added-data-files") if summary is not None else 0) or 0)
    snapshots = table.metadata.snapshots
    current = table.current_snapshot()
    cutoff_ms = int((now - settings.snapshot_max_age).timestamp() * 1000)
    expirable = 0
    if len(snapshots) > settings.retain_last:
        by_age = sum(1 for s in snapshots
                     if s.timestamp_ms < cutoff_ms and (current is None or s.snapshot_id != current.snapshot_id))
        by_count = len(snapshots) - settings.max_snapshots if settings.max_snapshots is not None else 0
        expirable = max(by_age, by_count, 0)
    manifests = data_manifest_count(table)
    reasons: list[str] = []
    ratios: list[float] = []
    small = files.average_file_bytes < settings.target_file_size_bytes * 3 // 4
    if small and added >= settings.min_input_files:
        reasons.append(f"{added} data files added since the last compaction, averaging {files.average_file_bytes} "
                       f"bytes (compacted from {settings.min_input_files} small files)")
        ratios.append(added / settings.min_input_files)
    if expirable:
        reasons.append(f"{expirable} of {len(snapshots)} snapshots to expire (older than "
                       f"{settings.snapshot_max_age}, or beyond {settings.max_snapshots})")
        ratios.append(1 + expirable / max(settings.max_snapshots or len(snapshots), 1))
    if manifests >= settings.manifest_min_count:
        reasons.append(f"{manifests} data manifests (merged from {settings.manifest_min_count})")
        ratios.append(manifests / settings.manifest_min_count)
    return MaintenanceNeed(".".join(table.name()), added, files.average_file_bytes, len(snapshots), expirable,
                           manifests, tuple(reasons), max(ratios, default=0.0))
