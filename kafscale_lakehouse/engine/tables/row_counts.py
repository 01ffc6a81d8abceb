"""Exact row counts per value of a column (a landed table's Kafka `partition`) whose cost follows what was added.

    counts = count_rows_by_value(table, "partition", [0, 1], previous={0: RowCount(4_000, snapshot_id)})

A count taken at an earlier snapshot is carried forward when that snapshot is an ancestor of the current one and
every snapshot since is an `append` (per the Iceberg spec: only data files added, none removed): the rows of the
data files those snapshots added are added to it, read from the manifests they wrote. Anything else since (a delete,
an overwrite such as a maintenance rewrite or a replay, delete files, a rollback that left the counted snapshot out
of the ancestry, an expired snapshot) and a value without an earlier count are counted from the current snapshot's
manifests: one plan of the table for all those values. Either way a data file whose statistics bound the column to
one value counts by its record count; any other file is read (that column only).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import In
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.types import NestedField, PrimitiveType

from kafscale_lakehouse.engine.tables.summary import ancestry

# Snapshot summary counters that say files or rows went away, or delete files came (an `append` has none of them).
_REMOVING_COUNTERS = ("deleted-data-files", "deleted-records", "removed-delete-files", "added-delete-files",
                      "added-position-deletes", "added-equality-deletes", "removed-position-deletes",
                      "removed-equality-deletes")


@dataclass(frozen=True)
class RowCount:
    """`rows` of a value at snapshot `snapshot_id` (None: the table had no snapshot)."""

    rows: int
    snapshot_id: int | None


def count_rows_by_value(table: Table, column: str, values: Iterable[int],
                        previous: Mapping[int, RowCount] | None = None) -> dict[int, RowCount]:
    """The rows of each of `values` in `column` at the table's current snapshot: from `previous` plus what the
    appends since added where that holds exactly, else counted from the current snapshot (see the module)."""
    wanted = sorted(set(values))
    current = table.current_snapshot()
    if current is None:
        return {value: RowCount(0, None) for value in wanted}
    field = table.schema().find_field(column)
    counts = _carry_forward(table, field, current, {v: previous[v] for v in wanted if previous and v in previous})
    rest = [value for value in wanted if value not in counts]
    if rest:
        counts.update({value: RowCount(rows, current.snapshot_id)
                       for value, rows in _count_current(table, field, rest).items()})
    return counts


# What a snapshot added never changes: the data files of the latest snapshots read, by (table uuid, snapshot id), so
# a run's row count and its integrity checks read the manifest list and manifests of its commit once, not each.
_ADDED_FILES_CACHED_SNAPSHOTS = 1024
_ADDED_FILES_CACHED_MAX_FILES = 1000  # a larger snapshot (a compaction) is read again when asked again
_added_files: OrderedDict[tuple[str, int], tuple[DataFile, ...] | None] = OrderedDict()
_added_files_lock = threading.Lock()


def files_added_by(table: Table, snapshot: Snapshot) -> tuple[DataFile, ...] | None:
    """The data files `snapshot` added, from the manifests it wrote; None when it wrote a delete manifest."""
    key = (str(table.metadata.table_uuid), snapshot.snapshot_id)
    with _added_files_lock:
        if key in _added_files:
            _added_files.move_to_end(key)
            return _added_files[key]
    files = _read_files_added_by(table, snapshot)
    _cache_added_files(key, files)
    return files


def remember_files_added(table: Table, snapshot_id: int, data_files: Sequence[DataFile]) -> None:
    """Record that our commit `snapshot_id` (a fast append, nothing else) added exactly `data_files`, as its manifests
    say: the run's row counts and checks that follow need not read back what it just wrote."""
    _cache_added_files((str(table.metadata.table_uuid), snapshot_id), tuple(data_files))


def _cache_added_files(key: tuple[str, int], files: tuple[DataFile, ...] | None) -> None:
    if files is not None and len(files) > _ADDED_FILES_CACHED_MAX_FILES:
        return
    with _added_files_lock:
        _added_files[key] = files
        while len(_added_files) > _ADDED_FILES_CACHED_SNAPSHOTS:
            _added_files.popitem(last=False)


def _read_files_added_by(table: Table, snapshot: Snapshot) -> tuple[DataFile, ...] | None:
    files: list[DataFile] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue  # written by an earlier snapshot
        if manifest.content != ManifestContent.DATA:
            return None
        files.extend(entry.data_file for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                     if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id)
    return tuple(files)


def _carry_forward(table: Table, field: NestedField, current: Snapshot,
                   previous: Mapping[int, RowCount]) -> dict[int, RowCount]:
    """The values of `previous` whose count can be carried to `current` (see the module), carried. The ancestry is
    walked on the metadata first, so only the manifests of the appends since the oldest carried count are read."""
    waiting = {value: count for value, count in previous.items() if count.snapshot_id is not None}
    since: dict[int, int] = {}  # value -> how many of the newest ancestors (all appends) came after its count
    appends: list[Snapshot] = []
    for snapshot in ancestry(table) if waiting else ():
        for value in [v for v, count in waiting.items() if count.snapshot_id == snapshot.snapshot_id]:
            since[value] = len(appends)
            del waiting[value]
        if not waiting or not _is_pure_append(snapshot):
            break
        appends.append(snapshot)
    if not since:
        return {}
    carried_values = sorted(since)
    added = []
    for snapshot in appends[:max(since.values())]:
        rows = _snapshot_rows(table, field, snapshot, carried_values)
        if rows is None:  # an append that wrote a delete manifest after all: count from the current snapshot
            return {}
        added.append(rows)
    return {value: RowCount(previous[value].rows + sum(rows.get(value, 0) for rows in added[:since[value]]),
                            current.snapshot_id)
            for value in carried_values}


def _is_pure_append(snapshot: Snapshot) -> bool:
    summary = snapshot.summary
    if summary is None or summary.operation != Operation.APPEND:
        return False
    return all(int(summary.get(counter) or 0) == 0 for counter in _REMOVING_COUNTERS)


def _snapshot_rows(table: Table, field: NestedField, snapshot: Snapshot, values: Sequence[int]
                   ) -> Counter[int] | None:
    """Rows of each of `values` in the data files the append `snapshot` added; None when it wrote delete files."""
    files = files_added_by(table, snapshot)
    if files is None:
        return None
    rows: Counter[int] = Counter()
    for data_file in files:
        rows.update(_file_rows(table, field, FileScanTask(data_file), values))
    return rows


def _count_current(table: Table, field: NestedField, values: Sequence[int]) -> dict[int, int]:
    """Rows of each of `values` at the current snapshot: one plan for all of them."""
    totals: Counter[int] = Counter(dict.fromkeys(values, 0))
    scan = table.scan(row_filter=In(field.name, values), selected_fields=(field.name,))
    for task in scan.plan_files():
        totals.update(_file_rows(table, field, task, values))
    return dict(totals)


def _file_rows(table: Table, field: NestedField, task: FileScanTask, values: Sequence[int]) -> dict[int, int]:
    """Rows of each of `values` in the task's file (its delete files applied): from its record count when its
    statistics bound the column to one value, else read."""
    single = _single_value(field, task.file)
    if not task.delete_files and single is not None:
        return {single: task.file.record_count} if single in values else {}
    scan = ArrowScan(table.metadata, table.io, table.schema().select(field.name), In(field.name, values))
    counts: Counter[int] = Counter()
    for batch in scan.to_record_batches([task]):
        column = batch.column(field.name)
        value_counts = pc.value_counts(column)
        counts.update(dict(zip(value_counts.field("values").to_pylist(), value_counts.field("counts").to_pylist(),
                               strict=True)))
    return dict(counts)


def _single_value(field: NestedField, data_file: DataFile) -> int | None:
    """The one value the file's statistics allow in `field` (no nulls), or None when they allow others."""
    lower = (data_file.lower_bounds or {}).get(field.field_id)
    upper = (data_file.upper_bounds or {}).get(field.field_id)
    if lower is None or lower != upper or not isinstance(field.field_type, PrimitiveType):
        return None
    if (data_file.null_value_counts or {}).get(field.field_id):
        return None
    value = from_bytes(field.field_type, lower)
    return value if isinstance(value, int) else None
