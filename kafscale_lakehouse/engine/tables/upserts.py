"""Upsert tables (`mappings[].mode: upsert`): one row per key, the latest state, committed exactly once.

pyiceberg 0.12 writes no equality or position deletes (and its scans refuse equality deletes), so an upsert is
copy-on-write: `commit_upsert` takes the data files a run's Spark job wrote (every record of the run's offset ranges,
uncommitted) and
1. keeps, per key (`id_columns`), the run's latest record (`latest_changes`): the highest offset within a Kafka
   partition; a key found in several partitions of one run keeps the record with the latest timestamp, then the
   higher partition. A tombstone (null value) deletes its key; its id comes from the mapped id columns or, when those
   are null (a Debezium tombstone), from the record key read as a JSON object holding them. With change events
   (`ChangeEvents`, `mappings[].cdc`), the mapped columns are coerced here from each event's row image (Debezium's
   `after`; `before`, else the record key, for a delete). Records that are no change event (no or an unknown `op`,
   no `after` object for c/u/r, a value that is no JSON object, a row image without a required column) are told
   apart first (`judge_change_events`): the run dead-letters them or stops their partition before them
   (engine/ingestion/run.py); given to `latest_changes` unjudged, they fail it (`UpsertError`);
2. finds the data files that may hold those keys (`files_to_rewrite`): partition values where the spec buckets or
   copies an id column, then the id columns' lower/upper bounds in the manifests. Files that turn out to hold none
   are left alone; the others are rewritten without the keys' rows;
3. commits one overwrite snapshot (`rewrites.commit_rewrite`) that removes the rewritten files and adds their
   remainders plus the new state, with the topic's offsets moved from `start_offsets` to `end_offsets` and the run's
   id and commit id, as `appends.commit_append` does: every attempt re-checks that no partition moved since the run
   started (`OffsetConflictError`). A crash before the commit leaves the previous state (the files are the run's own
   and the clean-up of ended runs removes them); after it, the next state. Applying the same range again gives the
   same state: the rows of its keys are replaced by the same winners, its deleted keys stay deleted.

If a concurrent commit (compaction) removed a file this upsert rewrites, the rewrite is planned again on the new
state (at most `MAX_PLANS` times). Files with delete files of another engine are refused: rewriting them without
applying the deletes would bring deleted rows back.
"""

from __future__ import annotations

import bisect
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table import FileScanTask, Table
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import PrimitiveType

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.appends import (
    DEFAULT_COMMIT_ATTEMPTS,
    CommitResult,
    CommitRetriesExhaustedError,
    OffsetConflictError,
    first_offset_conflict,
    refuse_changed_spec,
)
from kafscale_lakehouse.engine.tables.commits import (
    CommitOutcomeUnknownError,
    delete_data_files,
    delete_uncommitted,
    find_commit_after_refresh,
)
from kafscale_lakehouse.engine.tables.data_files import SinkJob, write_batches_as_data_files
from kafscale_lakehouse.engine.tables.rewrites import RewriteAbandonedError, commit_rewrite
from kafscale_lakehouse.engine.tables.summary import (
    COMMIT_ID_PROPERTY,
    RUN_ID_PROPERTY,
    is_reserved_property,
    read_committed_offsets,
    read_topic_offsets,
)
from kafscale_lakehouse.schema.coercion import JsonColumnCoercer
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.schema.json_values import NumericTimestampUnit

log = logging.getLogger(__name__)

RECORD_KEY_COLUMN = "key"  # `id_columns: [key]`: the record key (binary) is the row's id
MAX_PLANS = 3  # plans of the rewrite, when a concurrent commit removed files it replaces
# Summary keys of an upsert commit (besides pyiceberg's added/deleted files and records).
UPSERTED_KEYS_PROPERTY = "kafscale.upsert.upserted-keys"
DELETED_KEYS_PROPERTY = "kafscale.upsert.deleted-keys"
REWRITTEN_FILES_PROPERTY = "kafscale.upsert.rewritten-files"
KEYLESS_RECORDS_PROPERTY = "kafscale.upsert.keyless-records"
_ROW = "__kafscale_row"
_DELETE = "__kafscale_delete"
DEBEZIUM_UPSERT_OPS = ("c", "u", "r")  # create, update, read (snapshot); "d" deletes
DEBEZIUM_DELETE_OP = "d"
# Task ids of the files the driver writes (file names only; the Spark tasks' ids are far below).
_DRIVER_TASK_ID = 90_000


class UpsertError(EngineError):
    """An upsert could not be planned (e.g. a file to rewrite has another engine's delete files)."""


@dataclass(frozen=True)
class UpsertKey:
    """What identifies a row: `id_columns` (mapped columns, or the record key alone); `columns` are the mapping's
    mapped columns, whose types read a tombstone's id from its JSON record key."""

    id_columns: tuple[str, ...]
    columns: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        if not self.id_columns:
            raise ValueError("an upsert needs at least one id column")

    @property
    def is_record_key(self) -> bool:
        return self.id_columns == (RECORD_KEY_COLUMN,)


@dataclass(frozen=True)
class Changes:
    """The run's latest record per key: `upserts` (rows to hold), `keys` (every key the run changed, one row each,
    the id columns only: upserted and deleted), and counts."""

    upserts: pa.Table
    keys: pa.Table
    deleted: int
    keyless: int  # tombstones whose id could not be told (no mapped ids, no JSON record key holding them)


def latest_changes(rows: pa.Table | ChangeEventRows, key: UpsertKey, events: ChangeEvents | None = None) -> Changes:
    """Per key, the run's latest record (see the module docstring). Without `events`, pure Arrow (no per-row Python
    except a tombstone's JSON record key); with them, the mapped columns are coerced from each event's row image
    (`judge_change_events`; `UpsertError` names the records that are no change event). `rows` already judged
    (`ChangeEventRows`) are taken as they are, without their `not_events`."""
    ids = list(key.id_columns)
    if isinstance(rows, ChangeEventRows):
        rows, deletes = rows.rows, rows.deletes
    elif events is None:
        deletes = pc.is_null(rows.column("value"))
        rows = _with_tombstone_ids(rows, key)
    else:
        judged = judge_change_events(rows, key, events)
        if judged.not_events.num_rows:
            raise UpsertError(f"{judged.describe_not_events()}; nothing committed, the partitions stay where they "
                              "are until the records or the mapping are fixed")
        rows, deletes = judged.rows, judged.deletes
    rows = rows.append_column(_DELETE, deletes)
    has_id = _all_valid(rows, ids)
    keyless = rows.num_rows - pc.sum(has_id.cast(pa.int64())).as_py() if rows.num_rows else 0
    if keyless:
        rows = rows.filter(has_id)
    # Within a partition the offset orders a key's records; across partitions (a key should live in one) the
    # timestamp does, then the partition, so the choice never depends on how tasks were cut.
    rows = _last_per_group(rows, [*ids, "partition"], ["partition", "offset"])
    rows = _last_per_group(rows, ids, ["timestamp_ms", "partition", "offset"])
    deletes = rows.column(_DELETE)
    upserts = rows.filter(pc.invert(deletes)).drop_columns([_DELETE])
    deleted = rows.num_rows - upserts.num_rows
    return Changes(upserts=upserts, keys=rows.select(ids), deleted=deleted, keyless=keyless)


def _with_tombstone_ids(rows: pa.Table, key: UpsertKey) -> pa.Table:
    """A tombstone has null mapped columns: its mapped ids are read from the record key, a JSON object (Debezium's
    `{"id": 5}`), when it has one."""
    if key.is_record_key or rows.num_rows == 0:
        return rows
    missing = pc.and_(pc.is_null(rows.column("value")), pc.invert(_all_valid(rows, key.id_columns)))
    if not pc.any(missing).as_py():
        return rows
    by_name = {c.name: c for c in key.columns}
    id_columns = [Column(name=name, type=by_name[name].type, required=False) for name in key.id_columns]
    where = np.flatnonzero(missing.to_numpy(zero_copy_only=False))
    from_key = JsonColumnCoercer(id_columns).coerce(rows.column("key").take(pa.array(where)))
    for name in key.id_columns:
        column = rows.column(name).combine_chunks()
        index = rows.schema.get_field_index(name)
        mask = missing.combine_chunks() if isinstance(missing, pa.ChunkedArray) else missing
        filled = pc.replace_with_mask(column, mask, from_key.columns[name].cast(column.type))
        rows = rows.set_column(index, rows.schema.field(index), filled)
    return rows


def _all_valid(rows: pa.Table, names: Iterable[str]) -> pa.BooleanArray:
    valid = pa.array(np.ones(rows.num_rows, dtype=bool))
    for name in names:
        valid = pc.and_(valid, pc.is_valid(rows.column(name)))
    return valid


def _last_per_group(rows: pa.Table, group: list[str], order: list[str]) -> pa.Table:
    """The last row of each `group` in `order`."""
    if rows.num_rows == 0:
        return rows
    ordered = rows.sort_by([(name, "ascending") for name in order])
    ordered = ordered.append_column(_ROW, pa.array(np.arange(ordered.num_rows, dtype=np.int64)))
    last = ordered.select([*group, _ROW]).group_by(group, use_threads=False).aggregate([(_ROW, "max")])
    return ordered.take(last.column(f"{_ROW}_max")).drop_columns([_ROW])  # `_ROW` is the position in `ordered`


@dataclass(frozen=True)
class ChangeEvents:
    """How record values carry changes (`mappings[].cdc`): `debezium` envelopes, or rows with an `op_field` whose
    `delete_ops` delete the key. Timestamps in the row images count `numeric_timestamp_unit`s, as in plain values."""

    format: str  # "debezium" | "op_field"
    op_field: str = "op"
    delete_ops: tuple[str, ...] = (DEBEZIUM_DELETE_OP,)
    numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS


def change_images(values: Sequence[bytes | None], keys: Sequence[bytes | None],
                  events: ChangeEvents) -> tuple[list[bytes | None], list[bool], dict[int, str]]:
    """Per record: the JSON row image its mapped columns come from, whether it deletes its key, and the records that
    are no change event (position -> why). A delete's image is Debezium's `before`, else the record key (a JSON
    object of the ids, `{schema, payload}` unwrapped); a tombstone (null value) is a delete."""
    images: list[bytes | None] = []
    deletes: list[bool] = []
    problems: dict[int, str] = {}
    delete_ops = set(events.delete_ops)
    for position, (value, key) in enumerate(zip(values, keys, strict=True)):
        if value is None:
            images.append(_key_image(key))
            deletes.append(True)
            continue
        try:
            event = json.loads(value)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            problems[position] = "the value is not a JSON object"
            images.append(None)
            deletes.append(False)
            continue
        if events.format == "op_field":
            if event.get(events.op_field) is None:
                problems[position] = f"no {events.op_field!r} field (the operation)"
                images.append(None)
                deletes.append(False)
                continue
            delete = str(event.get(events.op_field)) in delete_ops
            images.append(value)
            deletes.append(delete)
            continue
        if "op" not in event and isinstance(event.get("payload"), dict):  # the JSON converter's schemas.enable
            event = event["payload"]
        op = event.get("op")
        if op in DEBEZIUM_UPSERT_OPS and isinstance(event.get("after"), dict):
            images.append(json.dumps(event["after"]).encode())
            deletes.append(False)
        elif op == DEBEZIUM_DELETE_OP:
            before = event.get("before")
            images.append(json.dumps(before).encode() if isinstance(before, dict) else _key_image(key))
            deletes.append(True)
        else:
            problems[position] = (
                f"Debezium op {op!r} without an `after` object" if op in DEBEZIUM_UPSERT_OPS
                else "no Debezium op" if op is None else f"Debezium op {op!r} is not one of c, u, r, d")
            images.append(None)
            deletes.append(False)
    return images, deletes, problems


def _key_image(key: bytes | None) -> bytes | None:
    """The record key as a JSON object of the ids (Debezium's key, `{schema, payload}` unwrapped), or None."""
    if key is None:
        return None
    try:
        parsed = json.loads(key)
    except ValueError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {"schema", "payload"} and isinstance(parsed["payload"], dict):
        parsed = parsed["payload"]
    return json.dumps(parsed).encode() if isinstance(parsed, dict) else None


@dataclass(frozen=True)
class ChangeEventRows:
    """A cdc run's rows judged (`judge_change_events`): the change events with their mapped columns coerced from
    their row images and which of them delete their key, and the records that are no change event (`not_events`:
    their rows as read, with `NOT_EVENT_REASON_COLUMN` saying why)."""

    rows: pa.Table
    deletes: pa.BooleanArray
    not_events: pa.Table

    def describe_not_events(self, limit: int = 5) -> str:
        """`N records are not change events of the mapping's columns (<record_id>: <why>; ...)`."""
        samples = self.not_events.select(["record_id", NOT_EVENT_REASON_COLUMN]).slice(0, limit).to_pylist()
        return (f"{self.not_events.num_rows} records are not change events of the mapping's columns ("
                + "; ".join(f"{r['record_id']}: {r[NOT_EVENT_REASON_COLUMN]}" for r in samples) + ")")


NOT_EVENT_REASON_COLUMN = "not_event_reason"


def judge_change_events(rows: pa.Table, key: UpsertKey, events: ChangeEvents) -> ChangeEventRows:
    """Split a cdc run's `rows` (read from its data files) into change events, their mapped columns coerced from
    their row images, and records that are no change event: no JSON object, no or an unknown op, no `after` for
    c/u/r, or an image without a required column (a delete needs its ids only: the rest of its image may be
    missing, as Debezium's `before` under REPLICA IDENTITY DEFAULT holds the primary key alone). Sorted by record."""
    rows = rows.sort_by([("partition", "ascending"), ("offset", "ascending")])
    images, deletes, problems = change_images(rows.column("value").to_pylist(), rows.column("key").to_pylist(),
                                              events)
    coerced = JsonColumnCoercer(key.columns, numeric_timestamp_unit=events.numeric_timestamp_unit).coerce(
        pa.array(images, pa.binary()))
    reasons = pc.binary_join_element_wise(coerced.invalid_column, coerced.invalid_reason, ": ")
    invalid = pc.and_(coerced.invalid_mask, pc.invert(pa.array(deletes, pa.bool_())))
    for position in np.flatnonzero(invalid.to_numpy(zero_copy_only=False)):
        problems.setdefault(int(position), reasons[position].as_py())
    for column in key.columns:
        if column.name in rows.column_names:
            index = rows.schema.get_field_index(column.name)
            field = rows.schema.field(index)
            rows = rows.set_column(index, field, coerced.columns[column.name].cast(field.type))
    is_event = np.ones(rows.num_rows, dtype=bool)
    is_event[list(problems)] = False
    where = np.flatnonzero(~is_event)
    not_events = rows.take(pa.array(where, pa.int64())).append_column(
        NOT_EVENT_REASON_COLUMN, pa.array([problems[int(p)] for p in where], pa.string()))
    keep = pa.array(is_event)
    return ChangeEventRows(rows.filter(keep), pa.array(deletes, pa.bool_()).filter(keep), not_events)


# ---- which files may hold the keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _KeyValues:
    """Per id column, the changed keys' distinct values, sorted, comparable with decoded bounds."""

    field_ids: dict[str, int]
    types: dict[str, PrimitiveType]
    sorted_values: dict[str, list]
    arrays: dict[str, pa.Array]


def _key_values(table: Table, keys: pa.Table) -> _KeyValues:
    schema = table.schema()
    field_ids: dict[str, int] = {}
    types: dict[str, PrimitiveType] = {}
    sorted_values: dict[str, list] = {}
    arrays: dict[str, pa.Array] = {}
    for name in keys.column_names:
        field = schema.find_field(name)
        if not isinstance(field.field_type, PrimitiveType):  # the config allows primitive columns only
            raise UpsertError(f"table {'.'.join(table.name())}: id column {name!r} is not of a primitive type")
        field_ids[name], types[name] = field.field_id, field.field_type
        column = pc.unique(keys.column(name).combine_chunks())
        arrays[name] = column
        sorted_values[name] = sorted(_comparable(column).to_pylist())
    return _KeyValues(field_ids, types, sorted_values, arrays)


def _comparable(array: pa.Array) -> pa.Array:
    """Values as Iceberg bounds decode (`from_bytes`): timestamps as microseconds, dates as days."""
    if pa.types.is_timestamp(array.type):
        return array.cast(pa.timestamp("us", tz=array.type.tz)).cast(pa.int64())
    if pa.types.is_date32(array.type):
        return array.cast(pa.int32())
    return array


def files_to_rewrite(table: Table, keys: pa.Table) -> list[DataFile]:
    """The current snapshot's data files that may hold a row of `keys` (partition values of bucket/identity
    transforms of id columns, then the id columns' bounds). Raises `UpsertError` when the snapshot has delete files
    (another engine's merge-on-read deletes: rewriting without them would bring deleted rows back)."""
    snapshot = table.current_snapshot()
    if snapshot is None or keys.num_rows == 0:
        return []
    values = _key_values(table, keys)
    partition_sets = _partition_value_sets(table, values)
    candidates = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                raise UpsertError(
                    f"table {'.'.join(table.name())}: delete file {entry.data_file.file_path} (another engine's "
                    "merge-on-read delete) is live; an upsert rewrites files copy-on-write and would bring its "
                    "deleted rows back: compact the table with that engine first")
            continue
        wanted = partition_sets.get(manifest.partition_spec_id, {})
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if any(data_file.partition[position] not in allowed for position, allowed in wanted.items()):
                continue
            if _bounds_may_hold(data_file, values):
                candidates.append(data_file)
    return candidates


def _partition_value_sets(table: Table, values: _KeyValues) -> dict[int, dict[int, set]]:
    """Per spec id, per partition field position: the values the changed keys have (bucket/identity of an id
    column); a file whose partition value is not among them holds none of the keys. Only for one id column: with
    several, a field of one column alone cannot exclude a file."""
    if len(values.arrays) != 1:
        return {}
    [(name, array)] = values.arrays.items()
    field_id = values.field_ids[name]
    result: dict[int, dict[int, set]] = {}
    for spec_id, spec in table.specs().items():
        for position, partition_field in enumerate(spec.fields):
            if partition_field.source_id != field_id:
                continue
            transform = partition_field.transform
            if isinstance(transform, BucketTransform):
                transformed = transform.pyarrow_transform(values.types[name])(array)
            elif isinstance(transform, IdentityTransform):
                transformed = _comparable(array)
            else:
                continue
            result.setdefault(spec_id, {})[position] = set(transformed.to_pylist())
    return result


def _bounds_may_hold(data_file: DataFile, values: _KeyValues) -> bool:
    """Whether some changed key's value lies within the file's bounds, for every id column (missing bounds: may)."""
    lower_bounds, upper_bounds = data_file.lower_bounds or {}, data_file.upper_bounds or {}
    for name, field_id in values.field_ids.items():
        lower, upper = lower_bounds.get(field_id), upper_bounds.get(field_id)
        if lower is None or upper is None:
            continue
        low, high = from_bytes(values.types[name], lower), from_bytes(values.types[name], upper)
        keys = values.sorted_values[name]
        at = bisect.bisect_left(keys, low)
        if at == len(keys) or keys[at] > high:
            return False
    return True


# ---- the commit ----------------------------------------------------------------------------------------------------


@dataclass
class _Rewrite:
    removed: list[DataFile]
    added: list[DataFile]
    rows_removed: int


def _read_files(table: Table, files: Sequence[DataFile]) -> pa.Table:
    """The rows of `files` in the table's current schema (columns added since are null)."""
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    return scan.to_table([FileScanTask(f) for f in files])


def read_run_rows(table: Table, data_files: Sequence[DataFile]) -> pa.Table:
    """The rows of a run's uncommitted `data_files`, which are deleted once read: an upsert never commits them, it
    writes the new state again, one row per key."""
    try:
        return _read_files(table, data_files)
    finally:
        delete_data_files(table.io, [f.file_path for f in data_files])


def _plan_rewrite(table: Table, keys: pa.Table, new_rows: pa.Table, job: SinkJob) -> _Rewrite:
    """Read each file that may hold `keys` and write it again without their rows, with the `new_rows` that replace
    rows of it (so a file keeps the narrow key range it had, and the next upsert can skip it by its bounds); files
    holding none of the keys are kept. The new rows of keys no file held are written to files of their own. Rows
    are written in key order."""
    ids = list(keys.column_names)
    indexed = new_rows.append_column(_ROW, pa.array(np.arange(new_rows.num_rows, dtype=np.int64)))
    placed = np.zeros(new_rows.num_rows, dtype=bool)
    removed: list[DataFile] = []
    added: list[DataFile] = []
    rows_removed = 0
    candidates = files_to_rewrite(table, keys)
    try:
        for number, data_file in enumerate(candidates):
            rows = _read_files(table, [data_file])
            kept = rows.join(keys, keys=ids, join_type="left anti")
            if kept.num_rows == rows.num_rows:
                continue  # the bounds could not exclude it, but it holds none of the keys
            removed.append(data_file)
            rows_removed += rows.num_rows - kept.num_rows
            replacing = indexed.join(rows.select(ids), keys=ids, join_type="left semi")
            replacing = replacing.filter(pc.invert(pa.array(placed[replacing.column(_ROW).to_numpy()])))
            placed[replacing.column(_ROW).to_numpy()] = True
            merged = pa.concat_tables([kept, replacing.drop_columns([_ROW]).select(kept.column_names)])
            if merged.num_rows:
                added.extend(write_batches_as_data_files(job, merged.sort_by([(i, "ascending") for i in ids])
                                                         .to_batches(), _DRIVER_TASK_ID + 1 + number))
        rest = indexed.filter(pa.array(~placed)).drop_columns([_ROW])
        if rest.num_rows:
            added.extend(write_batches_as_data_files(job, rest.sort_by([(i, "ascending") for i in ids]).to_batches(),
                                                     _DRIVER_TASK_ID))
    except BaseException:
        delete_data_files(table.io, [f.file_path for f in added])
        raise
    log.info("table %s: %d of %d candidate files hold changed keys (%d rows replaced or deleted, %d rows added)",
             ".".join(table.name()), len(removed), len(candidates), rows_removed, new_rows.num_rows)
    return _Rewrite(removed, added, rows_removed)


@dataclass(frozen=True)
class _Committed:
    snapshot_id: int
    attempts: int
    rewrite: _Rewrite


def _commit_replacing_keys(table: Table, keys: pa.Table, new_rows: pa.Table, job: SinkJob, *,
                           what: str, properties: Mapping[str, str], check: Callable[[Table], None] | None = None,
                           positions: tuple[str, Mapping[int, int]] | None = None,
                           max_attempts: int = DEFAULT_COMMIT_ATTEMPTS) -> _Committed:
    """One overwrite snapshot removing the rows of `keys` and adding `new_rows` (`_plan_rewrite`); planned again
    when a concurrent commit removed a file it rewrites, or when the table's spec changed since the files were
    written. On failure every file it wrote is deleted, except when the outcome is unknown (they may be
    referenced)."""
    table_name = ".".join(table.name())
    commit_id = uuid.uuid4().hex
    before_first: list[int | None] = []

    for plan in range(1, MAX_PLANS + 1):
        rewrite = _plan_rewrite(table, keys, new_rows, job)
        added = rewrite.added

        def check_attempt(current: Table, added: list[DataFile] = added) -> None:
            if not before_first:
                before_first.append(current.metadata.current_snapshot_id)
            refuse_changed_spec(current, added, [f.file_path for f in added], job.run_id)
            if check is not None:
                check(current)

        snapshot_properties = {**properties, REWRITTEN_FILES_PROPERTY: str(len(rewrite.removed))}
        try:
            snapshot_id, attempts = commit_rewrite(
                table, rewrite.removed, added, marker=(COMMIT_ID_PROPERTY, commit_id), what=what,
                properties=snapshot_properties, check=check_attempt, max_attempts=max_attempts, positions=positions)
        except CommitOutcomeUnknownError:
            raise  # the files may be referenced: kept for the clean-up of ended runs
        except RewriteAbandonedError as exc:
            delete_data_files(table.io, [f.file_path for f in rewrite.added])
            if plan == MAX_PLANS:
                raise UpsertError(f"table {table_name}: {what} planned {plan} times, concurrent commits kept "
                                  f"replacing its files: {exc}") from exc
            log.info("%s; planning %s again", exc, what)
            continue
        except CommitFailedException as exc:
            landed = find_commit_after_refresh(table, commit_id, before_first[0] if before_first else None)
            if landed is not None:
                return _Committed(landed, max_attempts, rewrite)
            delete_uncommitted(table, [f.file_path for f in added], table_name, job.run_id)
            raise CommitRetriesExhaustedError(
                f"table {table_name}: {what} lost to concurrent commits {max_attempts} times; data files deleted"
            ) from exc
        except BaseException:
            delete_uncommitted(table, [f.file_path for f in added], table_name, job.run_id)
            raise
        return _Committed(snapshot_id, attempts, rewrite)
    raise AssertionError("unreachable")


@timed("Iceberg upsert commit")
def commit_upsert(
    table: Table,
    data_files: Sequence[DataFile] | ChangeEventRows,
    key: UpsertKey,
    topic: str,
    start_offsets: Mapping[int, int],
    end_offsets: Mapping[int, int],
    run_id: str,
    *,
    target_file_size_bytes: int,
    events: ChangeEvents | None = None,
    max_attempts: int = DEFAULT_COMMIT_ATTEMPTS,
    snapshot_properties: Mapping[str, str] | None = None,
    before_attempt: Callable[[Table], None] | None = None,
    data_dir: str | None = None,
) -> CommitResult:
    """Apply the records of the run's uncommitted `data_files` to `table` as upserts and deletes by `key`, in one
    snapshot that moves `topic` from `start_offsets` to `end_offsets` (see the module docstring). `data_files` are
    deleted once read (they are never committed: the new state is written again, one row per key). Errors as
    `commit_append`'s: `OffsetConflictError`, `CommitRetriesExhaustedError` (files deleted),
    `CommitOutcomeUnknownError` (files kept for the clean-up of ended runs). The new files go into `data_dir`, the
    writer directory the run's record names (else a new one). A cdc run passes its rows judged
    (`read_run_rows`, then `judge_change_events`), its records that are no change event taken care of."""
    table_name = ".".join(table.name())
    reserved = [k for k in (snapshot_properties or {}) if is_reserved_property(k)]
    if reserved:
        raise ValueError(f"snapshot_properties must not set the commit protocol's own keys {reserved}")
    if set(start_offsets) != set(end_offsets):
        raise ValueError(f"table {table_name} topic {topic}: start offsets cover partitions {sorted(start_offsets)} "
                         f"but end offsets cover {sorted(end_offsets)}")
    _suggest_bucketing(table, key)
    _sort_by_id(table, key)
    job = SinkJob.for_table(table, run_id, target_file_size_bytes, data_dir)
    rows = data_files if isinstance(data_files, ChangeEventRows) else read_run_rows(table, data_files)
    changes = latest_changes(rows, key, events)
    if changes.keyless:
        log.warning("table %s: %d tombstones of run %s name no key (no id columns, no JSON record key holding "
                    "them); they delete nothing", table_name, changes.keyless, run_id)

    def check(current: Table) -> None:
        committed = read_committed_offsets(current).get(topic, {})
        conflict = first_offset_conflict(committed, start_offsets)
        if conflict is not None:
            partition, committed_offset = conflict
            raise OffsetConflictError(table_name, topic, partition, start_offsets[partition], committed_offset)
        if before_attempt is not None:
            before_attempt(current)

    properties = {
        **(snapshot_properties or {}),
        RUN_ID_PROPERTY: run_id,
        UPSERTED_KEYS_PROPERTY: str(changes.upserts.num_rows),
        DELETED_KEYS_PROPERTY: str(changes.deleted),
    }
    if changes.keyless:
        properties[KEYLESS_RECORDS_PROPERTY] = str(changes.keyless)
    committed = _commit_replacing_keys(table, changes.keys, changes.upserts, job, what=f"upsert of run {run_id}",
                                       properties=properties, check=check, positions=(topic, dict(end_offsets)),
                                       max_attempts=max_attempts)
    topic_offsets = read_topic_offsets(table, topic)
    rewrite = committed.rewrite
    log.info("table %s: run %s upserted %d keys and deleted %d in snapshot %d (%d files rewritten), %s offsets %s",
             table_name, run_id, changes.upserts.num_rows, changes.deleted, committed.snapshot_id,
             len(rewrite.removed), topic, topic_offsets)
    return CommitResult(snapshot_id=committed.snapshot_id, topic_offsets=topic_offsets, attempts=committed.attempts,
                        data_file_count=len(rewrite.added), record_count=sum(f.record_count for f in rewrite.added))


def _sort_by_id(table: Table, key: UpsertKey) -> None:
    """An upsert table's sort order is its id columns, so compaction (engine/maintenance.py) sorts the rows it
    rewrites by them: compacted files hold narrow id ranges, which an upsert skips by their bounds. Set once, on a
    table without a sort order (an operator's own order is kept); if that commit loses a race, the next run sets it."""
    if not table.sort_order().is_unsorted:
        return
    try:
        with table.update_sort_order() as update:
            for name in key.id_columns:
                update.asc(name, IdentityTransform())
    except CommitFailedException as exc:
        log.warning("table %s: could not set the sort order %s (the next run tries again): %s",
                    ".".join(table.name()), list(key.id_columns), exc)
        return
    log.info("table %s: sort order set to its id columns %s (compaction sorts by them)", ".".join(table.name()),
             list(key.id_columns))


_SUGGESTED: set[str] = set()  # tables told about bucketing, once per process


def _suggest_bucketing(table: Table, key: UpsertKey) -> None:
    """An upsert table not partitioned on its id reads and rewrites every file whose bounds may hold a changed key;
    `bucket[N]` of the id keeps a run to its keys' buckets. Said once per table and process."""
    name = ".".join(table.name())
    if name in _SUGGESTED or key.is_record_key:
        return
    _SUGGESTED.add(name)
    field_ids = {table.schema().find_field(column).field_id for column in key.id_columns}
    if not any(f.source_id in field_ids for f in table.spec().fields):
        log.warning("table %s: an upsert table partitioned by bucket of its id rewrites only the buckets a run's keys "
                    "fall in; consider partition_spec: [{source: %s, transform: bucket[16]}] (about one bucket per "
                    "GB of table) when creating it", name, key.id_columns[0])


# ---- downstream upserts (the IO manager's `write_mode: upsert`) ----------------------------------------------------


@dataclass(frozen=True)
class UpsertOptions:
    """dagster-iceberg's `upsert_options` (pyiceberg's `Table.upsert` arguments): rows of `join_cols` found in the
    table replace theirs when `when_matched_update_all`, the others are inserted when `when_not_matched_insert_all`."""

    join_cols: tuple[str, ...]
    when_matched_update_all: bool = True
    when_not_matched_insert_all: bool = True

    def __post_init__(self) -> None:
        if not self.join_cols:
            raise ValueError("upsert_options.join_cols must name at least one column")


@dataclass(frozen=True)
class RowsUpserted:
    snapshot_id: int | None  # None: nothing to commit
    rows_written: int
    rows_replaced: int
    files_rewritten: int
    data_files: int
    attempts: int


def upsert_rows(table: Table, data_files: Sequence[DataFile], options: UpsertOptions, run_id: str, *,
                target_file_size_bytes: int, snapshot_properties: Mapping[str, str] | None = None,
                max_attempts: int = DEFAULT_COMMIT_ATTEMPTS) -> RowsUpserted:
    """Upsert the rows of the uncommitted `data_files` (a downstream write's) into `table` by `options.join_cols`, in
    one overwrite snapshot that rewrites only the files holding matched keys. Like pyiceberg's `Table.upsert`, the
    rows must not repeat a key (`UpsertError` names one). `data_files` are deleted once read."""
    table_name = ".".join(table.name())
    ids = list(options.join_cols)
    job = SinkJob.for_table(table, run_id, target_file_size_bytes)
    try:
        rows = _read_files(table, data_files)
        missing = [name for name in ids if name not in rows.column_names]
        if missing:
            raise UpsertError(f"table {table_name}: upsert_options.join_cols {missing} are not columns of the table")
        counts = rows.select(ids).group_by(ids).aggregate([([], "count_all")])
        repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
        if repeated.num_rows:
            raise UpsertError(f"table {table_name}: the rows to upsert repeat {repeated.num_rows} keys of {ids}, e.g. "
                              f"{repeated.select(ids).slice(0, 1).to_pylist()[0]}; an upsert takes one row per key")
        if not _all_valid(rows, ids).to_numpy(zero_copy_only=False).all():
            raise UpsertError(f"table {table_name}: rows to upsert have null values in join_cols {ids}")
        keys = rows.select(ids)
        if not (options.when_matched_update_all and options.when_not_matched_insert_all):
            matched = _keys_in_table(table, keys)
            if options.when_matched_update_all:
                rows = rows.join(matched, keys=ids, join_type="left semi")
            else:
                rows = rows.join(matched, keys=ids, join_type="left anti") if options.when_not_matched_insert_all \
                    else rows.slice(0, 0)
                keys = keys.slice(0, 0)  # matched rows stay as they are
            if options.when_matched_update_all:
                keys = rows.select(ids)
    finally:
        delete_data_files(table.io, [f.file_path for f in data_files])  # read: written again with the rest
    if rows.num_rows == 0 and keys.num_rows == 0:
        return RowsUpserted(None, 0, 0, 0, 0, 0)
    committed = _commit_replacing_keys(table, keys, rows, job, what=f"upsert of run {run_id}",
                                       properties=dict(snapshot_properties or {}), max_attempts=max_attempts)
    return RowsUpserted(committed.snapshot_id, rows.num_rows, committed.rewrite.rows_removed,
                        len(committed.rewrite.removed), len(committed.rewrite.added), committed.attempts)


def _keys_in_table(table: Table, keys: pa.Table) -> pa.Table:
    """Which of `keys` the table holds (read from the files that may hold them)."""
    found = [_read_files(table, [f]).select(keys.column_names).join(keys, keys=keys.column_names,
                                                                     join_type="left semi")
             for f in files_to_rewrite(table, keys)]
    if not found:
        return keys.slice(0, 0)
    return pa.concat_tables(found).group_by(keys.column_names).aggregate([])
