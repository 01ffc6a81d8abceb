"""What the table's asset checks look at, without Dagster: the committed offset history, duplicate record_ids in
offset ranges, and rows beyond the committed offsets. `orchestration/checks.py` turns these into check results.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    NotIn,
    Or,
)
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table

from kafscale_lakehouse.engine.tables.commits import rows_might_match
from kafscale_lakehouse.engine.tables.row_counts import files_added_by
from kafscale_lakehouse.engine.tables.summary import (
    OFFSETS_PROPERTY_PREFIX,
    KafscaleCommit,
    ancestry,
    is_kafscale_commit,
    kafscale_commits,
)
from kafscale_lakehouse.offsets.ranges import OffsetRange

SAMPLE_SIZE = 20
# The checks of a table asset (their evaluations are Dagster's; the report lists their history by these names).
SCHEMA_VALID = "schema_valid"
RECORD_ID_UNIQUE = "record_id_unique"
ID_UNIQUE = "id_unique"  # in place of record_id_unique on upsert tables (mode upsert): one row per key
OFFSETS_CONTIGUOUS = "offsets_contiguous"
FRESHNESS = "freshness"
RETENTION_HEADROOM = "retention_headroom"  # time before retention deletes offsets not landed yet
CHECK_NAMES = (SCHEMA_VALID, RECORD_ID_UNIQUE, OFFSETS_CONTIGUOUS, FRESHNESS, RETENTION_HEADROOM)  # of an append table


def table_asset_path(table: str) -> list[str]:
    """The asset key path of a mapping's table: the identifier split on `.` (`rpc.pizzas` -> `["rpc", "pizzas"]`)."""
    return table.split(".")


def offset_history(table: Table, topic: str) -> list[KafscaleCommit]:
    """Our commits of `topic` in the table's current ancestry, oldest first."""
    return list(kafscale_commits(table, topic))[::-1]


def latest_committed_ranges(table: Table, topic: str) -> tuple[KafscaleCommit | None, dict[int, OffsetRange]]:
    """The offset ranges `[start, end)` per partition of the latest commit of `topic` (for a check run on its own,
    when no run of ours recorded its ranges); a partition's first commit starts at 0."""
    commits = kafscale_commits(table, topic)
    latest = next(commits, None)
    if latest is None:
        return None, {}
    before = next(commits, None)
    before_offsets = before.next_offsets(topic) if before is not None else {}
    return latest, {p: OffsetRange(p, before_offsets.get(p, 0), end)
                    for p, end in latest.next_offsets(topic).items() if before_offsets.get(p) != end}


WHOLE_TABLE = "whole table"  # a check's scope when it reads every data file the table's stats do not prune
NOTHING_TO_SCAN = "nothing: no committed offset ranges"


@dataclass(frozen=True)
class AddedDataFiles:
    """The data files added since `since_snapshot_id`, our commit of the topic before the one checked."""

    since_snapshot_id: int
    files: list[DataFile]

    @property
    def scope(self) -> str:
        return f"files added since snapshot {self.since_snapshot_id} ({len(self.files)} files)"


def new_data_files(table: Table, topic: str, snapshot_id: int) -> AddedDataFiles | None:
    """The data files that can hold rows of the offsets our commit `snapshot_id` of `topic` covers, or rows beyond
    them: those added since our commit of `topic` before it (by it, and by any snapshot since, ours or another
    writer's), read from the manifests those snapshots wrote. So a check costs what was added, not the table's
    history: rows of older files were checked when they were new (the checks run after every commit). None when it
    cannot be told that way (`snapshot_id` is not in the current ancestry, it is the topic's first commit, or a
    snapshot since added delete files): scan the table."""
    snapshots = []
    found = False
    for snapshot in ancestry(table):
        if found and is_kafscale_commit(snapshot, topic):
            since_snapshot_id = snapshot.snapshot_id
            break
        snapshots.append(snapshot)
        found = found or snapshot.snapshot_id == snapshot_id
    else:
        return None  # not found, or no commit of ours before it
    files: list[DataFile] = []
    for snapshot in snapshots:
        added = files_added_by(table, snapshot)  # what older snapshots added was new then
        if added is None:
            return None
        files.extend(added)
    return AddedDataFiles(since_snapshot_id, files)


def _read_files(table: Table, files: Sequence[DataFile], row_filter: BooleanExpression,
                columns: tuple[str, ...]) -> pa.Table:
    """The rows of `files` (no delete files: `new_data_files` gives None when there are) that match `row_filter`.
    A file whose column statistics rule the filter out is not read (pyiceberg's planning rule, which `files` did not
    go through): a run's new files never hold rows beyond the offsets it committed, so that check reads none."""
    might_match = rows_might_match(table.schema(), row_filter)
    schema = table.schema().select(*columns)
    tasks = [FileScanTask(f) for f in files if might_match(f)]
    if not tasks:  # an ArrowScan costs ~1 ms to set up (pyiceberg reads its configuration files again)
        return schema_to_pyarrow(schema, include_field_ids=False).empty_table()
    return ArrowScan(table.metadata, table.io, schema, row_filter).to_table(tasks)


# ------------------------------------------------------------------------------------------ duplicates


@dataclass(frozen=True)
class DuplicateScan:
    duplicates: dict[str, int]  # record_id -> occurrences (> 1)
    rows_scanned: int
    files_scanned: int
    files_in_table: int | None
    scope: str = WHOLE_TABLE  # what was read: WHOLE_TABLE or AddedDataFiles.scope


def find_duplicate_record_ids(table: Table, topic: str, ranges: Mapping[int, OffsetRange],
                              added: AddedDataFiles | None = None) -> DuplicateScan:
    """record_ids occurring more than once among the rows of `topic` in `ranges`. A record_id is
    `<topic>:<partition>:<offset>`, so every copy of a record in a range lies in that range. `added`: only those
    files can hold rows of `ranges` (`new_data_files`); None: the table's files, pruned by their statistics."""
    if not ranges:
        return DuplicateScan({}, 0, 0, _files_in_table(table), NOTHING_TO_SCAN)
    row_filter = _or_all([_and_all(EqualTo("topic", topic), EqualTo("partition", r.partition),
                                   GreaterThanOrEqual("offset", r.start), LessThan("offset", r.end))
                          for _, r in sorted(ranges.items())])
    if added is not None:
        files_scanned = len(added.files)
        record_ids = _read_files(table, added.files, row_filter, ("record_id",))["record_id"]
    else:
        scan = table.scan(row_filter=row_filter, selected_fields=("record_id",))
        files_scanned = sum(1 for _ in scan.plan_files())
        record_ids = scan.to_arrow()["record_id"]
    counts = pc.value_counts(record_ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    duplicates = dict(zip(repeated.field("values").to_pylist(), repeated.field("counts").to_pylist(), strict=False))
    return DuplicateScan(duplicates, len(record_ids), files_scanned, _files_in_table(table),
                         added.scope if added is not None else WHOLE_TABLE)


def find_duplicate_ids(table: Table, topic: str, id_columns: Sequence[str],
                       ranges: Mapping[int, OffsetRange]) -> DuplicateScan:
    """Keys of an upsert table held by more than one row, among the keys of the rows `topic` landed in `ranges`
    (the run's new state): a key the run changed whose old row was not removed shows up here. Keys are shown as
    their id values joined by `|`. With one id column the table scan is filtered on the keys, so pyiceberg skips
    files by partition and bounds (up to its limit of literals)."""
    if not ranges:
        return DuplicateScan({}, 0, 0, _files_in_table(table), NOTHING_TO_SCAN)
    ids = tuple(id_columns)
    row_filter = _or_all([_and_all(EqualTo("topic", topic), EqualTo("partition", r.partition),
                                   GreaterThanOrEqual("offset", r.start), LessThan("offset", r.end))
                          for _, r in sorted(ranges.items())])
    landed = table.scan(row_filter=row_filter, selected_fields=ids).to_arrow()
    if landed.num_rows == 0:
        return DuplicateScan({}, 0, 0, _files_in_table(table))
    keys_filter: BooleanExpression = AlwaysTrue()
    if len(ids) == 1:
        keys_filter = In(ids[0], set(pc.unique(landed.column(ids[0])).to_pylist()))
    scan = table.scan(row_filter=keys_filter, selected_fields=ids)
    files_scanned = sum(1 for _ in scan.plan_files())
    rows = scan.to_arrow().join(landed.group_by(list(ids)).aggregate([]), keys=list(ids), join_type="inner")
    counts = rows.group_by(list(ids)).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    # Only the repeated keys are turned into Python values (a few, when any).
    duplicates = {"|".join(map(str, (row[name] for name in ids))): row["count_all"] for row in repeated.to_pylist()}
    return DuplicateScan(duplicates, rows.num_rows, files_scanned, _files_in_table(table))


def _files_in_table(table: Table) -> int | None:
    snapshot = table.current_snapshot()
    total = snapshot.summary.get("total-data-files") if snapshot is not None and snapshot.summary else None
    return int(total) if total is not None else None


# ------------------------------------------------------------------------------------------ contiguity


@dataclass(frozen=True)
class SkippedGap:
    snapshot_id: int
    range: OffsetRange  # offsets deleted before ingestion, skipped by allow_gaps


@dataclass(frozen=True)
class MovedBack:
    snapshot_id: int
    run_id: str | None
    range: OffsetRange  # [to, from): the move set the next offset from `from` back to `to`, removing those rows


@dataclass(frozen=True)
class OffsetContiguity:
    commits_checked: int
    next_offsets: dict[int, int]  # the latest committed next offset per partition
    problems: list[str]  # offsets moved back or dropped, rows beyond the committed offsets
    rows_beyond_committed: list[str]  # sample record_ids
    skipped: list[SkippedGap]  # every gap skipped, oldest first
    latest_skipped: list[OffsetRange]  # the gaps the latest commit skipped
    moved_back: list[MovedBack]  # deliberate moves back (`offsets reset --to-offset`), oldest first
    scope: str = WHOLE_TABLE  # where rows beyond were looked for: WHOLE_TABLE or AddedDataFiles.scope


def check_offset_contiguity(table: Table, topic: str, *, whole_table: bool = False) -> OffsetContiguity:
    """The `kafscale.offsets.<topic>` history never moves back or drops a partition, and no rows lie at or beyond
    the committed next offsets. A move back is accepted only when its commit records exactly that move
    (`kafscale.moved-back.<topic>`: a position moved back on purpose, its rows removed in the same commit).
    Rows beyond are looked for in the files added since our commit before the latest (`new_data_files`), or in
    every file with `whole_table`."""
    commits = offset_history(table, topic)
    problems: list[str] = []
    moved_back: list[MovedBack] = []
    previous: dict[int, int] = {}
    for commit in commits:
        next_offsets = commit.next_offsets(topic)
        for partition, before in sorted(previous.items()):
            after = next_offsets.get(partition)
            if after is None:
                problems.append(f"snapshot {commit.snapshot_id} dropped partition {partition} (next offset {before}) "
                                f"from {OFFSETS_PROPERTY_PREFIX}{topic}")
            elif after < before and commit.moved_back_ranges(topic).get(partition) == (after, before):
                moved_back.append(MovedBack(commit.snapshot_id, commit.run_id, OffsetRange(partition, after, before)))
            elif after < before:
                problems.append(f"snapshot {commit.snapshot_id} moved partition {partition} back from {before} to "
                                f"{after}: offsets {after}..{before - 1} may be committed twice")
        previous = {**previous, **next_offsets}
    added = new_data_files(table, topic, commits[-1].snapshot_id) if commits and not whole_table else None
    beyond = rows_beyond_committed(table, topic, previous, added.files if added is not None else None)
    if beyond:
        problems.append(f"{len(beyond)} rows lie at or beyond the committed next offsets (the next run ingests those "
                        f"offsets again), e.g. {', '.join(beyond[:5])}")
    skipped = [SkippedGap(c.snapshot_id, OffsetRange(p, *r)) for c in commits
               for p, r in sorted(c.skipped_ranges(topic).items())]
    latest_skipped = [OffsetRange(p, *r) for c in commits[-1:] for p, r in sorted(c.skipped_ranges(topic).items())]
    return OffsetContiguity(len(commits), previous, problems, beyond, skipped, latest_skipped, moved_back,
                            added.scope if added is not None else WHOLE_TABLE)


def rows_beyond_committed(table: Table, topic: str, next_offsets: Mapping[int, int],
                          files: Sequence[DataFile] | None = None) -> list[str]:
    """record_ids of rows at or past a partition's next offset, or of partitions without one (pruned by stats).
    `files`: only those can hold such rows (`new_data_files`); None: the table's files."""
    if table.current_snapshot() is None:
        return []
    clauses: list[BooleanExpression] = [_and_all(EqualTo("partition", p), GreaterThanOrEqual("offset", o))
                                        for p, o in sorted(next_offsets.items())]
    clauses.append(_not_in_integers("partition", next_offsets) if next_offsets else EqualTo("topic", topic))
    row_filter = And(EqualTo("topic", topic), _or_all(clauses))
    if files is not None:
        rows = _read_files(table, files, row_filter, ("record_id",)).slice(0, SAMPLE_SIZE)
    else:
        rows = table.scan(row_filter=row_filter, selected_fields=("record_id",), limit=SAMPLE_SIZE).to_arrow()
    return sorted(rows["record_id"].to_pylist())


def _not_in_integers(column: str, values: Iterable[int]) -> BooleanExpression:
    """`column NOT IN values` for an integer column, written as ranges and the holes between them: the same rows, but
    files can be ruled out by their statistics (pyiceberg never prunes on NOT IN)."""
    ordered = sorted(set(values))
    low, high = ordered[0], ordered[-1]
    clauses: list[BooleanExpression] = [LessThan(column, low), GreaterThan(column, high)]
    holes = sorted(set(range(low, high + 1)) - set(ordered)) if high - low < 10_000 else None
    if holes is None:  # sparse values far apart: too many holes to list
        return NotIn(column, ordered)
    if holes:
        clauses.append(In(column, holes))
    return _or_all(clauses)


def _and_all(*clauses: BooleanExpression) -> BooleanExpression:
    return reduce(And, clauses)


def _or_all(clauses: Sequence[BooleanExpression]) -> BooleanExpression:
    return reduce(Or, clauses)
