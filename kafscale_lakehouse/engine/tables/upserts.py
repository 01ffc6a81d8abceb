"""Upsert tables (`mappings[].mode: upsert`): one row per key, the latest state, committed exactly once.

pyiceberg 0.12 writes no equality or position deletes (and its scans refuse equality deletes), so an upsert is
copy-on-write: `commit_upsert` takes the data files a run's Spark job wrote (every record of the run's offset ranges,
uncommitted) and
1. keeps, per key (`id_columns`), the run's latest record (`latest_changes`): the highest offset within a Kafka
   partition; a key found in several partitions of one run keeps the record with the greatest `order_column` value
   (`UpsertKey.order_column`; none: a Debezium envelope's `source.ts_ms`, else the latest timestamp), then the
   higher partition. A tombstone (null value)
   deletes its key; its id comes from the mapped id columns or, when those are null (a Debezium tombstone), from the
   record key read as a JSON object holding them. With change events
   (`ChangeEvents`, `mappings[].cdc`), the mapped columns are coerced here from each event's row image (Debezium's
   `after`; `before`, else the record key, for a delete). Records that are no change event (no or an unknown `op`,
   no `after` object for c/u/r, a value that is no JSON object, a row image without a required column) are told
   apart first (`judge_change_events`): the run dead-letters them or stops their partition before them
   (engine/ingestion/run.py); given to `latest_changes` unjudged, they fail it (`UpsertError`);
2. finds the data files that may hold those keys (`files_to_rewrite`): partition values where the spec buckets or
   copies an id column, then the id columns' lower/upper bounds in the manifests. Files that turn out to hold none
   are left alone; the others are rewritten without the keys' rows. With an order (column), a stored row from another
   Kafka partition with a greater (value, partition) than the run's change stays and the change is dropped
   (`KeyOrder`): a late older change never overwrites a newer state, however runs cut the log;
3. commits one overwrite snapshot (`rewrites.commit_rewrite`) that removes the rewritten files and adds their
   remainders plus the new state, with the topic's offsets moved from `start_offsets` to `end_offsets` and the run's
   id and commit id, as `appends.commit_append` does: every attempt re-checks that no partition moved since the run
   started (`OffsetConflictError`). A crash before the commit leaves the previous state (the files are the run's own
   and the clean-up of ended runs removes them); after it, the next state. Applying the same range again gives the
   same state: the rows of its keys are replaced by the same winners, its deleted keys stay deleted.

If a concurrent commit (compaction, another upsert) removed a file this upsert rewrites, or added rows of one of its
keys since the snapshot the plan was made on (`keys_added_since`, checked before every attempt: another run over
other partitions inserting the same key), the rewrite is planned again on the new state (at most `MAX_PLANS`
times). Files with delete files of another engine are refused: rewriting them without applying the deletes would
bring deleted rows back.
"""

from __future__ import annotations

import bisect
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import BinaryType, BooleanType, PrimitiveType

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
    ancestry,
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
SUPERSEDED_CHANGES_PROPERTY = "kafscale.upsert.superseded-changes"  # changes older than the table's rows
_ROW = "__kafscale_row"
_DELETE = "__kafscale_delete"
_IN_PARTITION = "__kafscale_change_partition"
_IN_ORDER = "__kafscale_change_order"
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
    order_column: str | None = None  # `mappings[].order_column`: orders a key's changes across Kafka partitions

    def __post_init__(self) -> None:
        if not self.id_columns:
            raise ValueError("an upsert needs at least one id column")
        if self.order_column is not None and self.order_column in self.id_columns:
            raise ValueError(f"order_column {self.order_column!r} is an id column")

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
    # With an order column: per changed key its winning change's partition and order value (`KeyOrder`)
    order: KeyOrder | None = None


@dataclass(frozen=True)
class KeyOrder:
    """How a run's change of a key compares with the row the table holds for it (`order_column`): `changes` holds
    per changed key the id columns, the change's Kafka `partition` and its `column` value."""

    column: str  # `SOURCE_TS_MS`: a Debezium table's rows are ordered by the `source.ts_ms` of their raw `value`
    changes: pa.Table

    def stored_rows_winning(self, stored: pa.Table) -> pa.Table:
        """The ids of the keys whose row in `stored` (rows of the table, of one file) wins over the run's change:
        the row comes from another Kafka partition, both order values are set, and (stored value, stored
        partition) is greater than (change's value, change's partition). Within one partition Kafka order
        decides (the run's change is later); a missing order value on either side lets the change apply."""
        ids = [name for name in self.changes.column_names if name not in ("partition", self.column)]
        incoming = self.changes.rename_columns([*ids, _IN_PARTITION, _IN_ORDER])
        from_value = self.column == SOURCE_TS_MS
        joined = stored.select([*ids, "partition", "value" if from_value else self.column]).join(
            incoming, keys=ids, join_type="inner")
        if joined.num_rows == 0:
            return joined.select(ids)
        stored_value = source_ts_ms(joined.column("value")) if from_value else joined.column(self.column)
        value = joined.column(_IN_ORDER).cast(stored_value.type)
        stored_partition, partition = joined.column("partition"), joined.column(_IN_PARTITION)
        wins = pc.and_(pc.not_equal(stored_partition, partition), pc.or_(
            pc.greater(stored_value, value),
            pc.and_(pc.equal(stored_value, value), pc.greater(stored_partition, partition))))
        return joined.filter(pc.fill_null(wins, False)).select(ids)


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
    # Within a partition the offset orders a key's records; across partitions (a key should live in one) the order
    # column does (a missing value counts as the newest: the change applies), else the record timestamp; then the
    # partition, so the choice never depends on how tasks were cut.
    rows = _last_per_group(rows, [*ids, "partition"], ["partition", "offset"])
    order_by = key.order_column
    if order_by is None and events is not None and events.format == "debezium":  # the envelope's source.ts_ms
        order_by = SOURCE_TS_MS
        rows = rows.append_column(SOURCE_TS_MS, source_ts_ms(rows.column("value")))
    across = [order_by, "partition"] if order_by is not None else ["timestamp_ms", "partition"]
    rows = _last_per_group(rows, ids, [*across, "offset"])
    order = None if order_by is None else KeyOrder(order_by, rows.select([*ids, "partition", order_by]))
    if order_by == SOURCE_TS_MS:
        rows = rows.drop_columns([SOURCE_TS_MS])
    deletes = rows.column(_DELETE)
    upserts = rows.filter(pc.invert(deletes)).drop_columns([_DELETE])
    deleted = rows.num_rows - upserts.num_rows
    return Changes(upserts=upserts, keys=rows.select(ids), deleted=deleted, keyless=keyless, order=order)


SOURCE_TS_MS = "__kafscale_source_ts_ms"  # a Debezium change's `source.ts_ms`, read from the raw `value`


def source_ts_ms(values: pa.Array | pa.ChunkedArray) -> pa.Int64Array:
    """Per Debezium envelope (the raw `value`; `{schema, payload}` unwrapped), its `source.ts_ms`: when the change
    happened in the source database (null: no such field, a tombstone, no JSON object)."""
    found: list[int | None] = []
    for value in values.to_pylist():
        event = None
        if value is not None:
            try:
                event = json.loads(value)
            except ValueError:
                event = None
        if isinstance(event, dict) and "op" not in event and isinstance(event.get("payload"), dict):
            event = event["payload"]
        source = event.get("source") if isinstance(event, dict) else None
        ts_ms = source.get("ts_ms") if isinstance(source, dict) else None
        found.append(ts_ms if isinstance(ts_ms, int) and not isinstance(ts_ms, bool) else None)
    return pa.array(found, pa.int64())


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


def change_images(values: Sequence[bytes | None], keys: Sequence[bytes | None], events: ChangeEvents,
                  order_column: Column | None = None) -> tuple[list[bytes | None], list[bool], dict[int, str]]:
    """Per record: the JSON row image its mapped columns come from, whether it deletes its key, and the records that
    are no change event (position -> why). A delete's image is Debezium's `before`, else the record key (a JSON
    object of the ids, `{schema, payload}` unwrapped); a tombstone (null value) is a delete. A Debezium image without
    `order_column` gets the envelope's `source.ts_ms` (the change's time in the source database) as its value,
    an ISO-8601 UTC time for a `timestamp` column."""
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
            images.append(_with_source_time(event["after"], event, order_column))
            deletes.append(False)
        elif op == DEBEZIUM_DELETE_OP:
            before = event.get("before")
            image = before if isinstance(before, dict) else _key_object(key)
            images.append(None if image is None else _with_source_time(image, event, order_column))
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
    parsed = _key_object(key)
    return json.dumps(parsed).encode() if parsed is not None else None


def _key_object(key: bytes | None) -> dict | None:
    if key is None:
        return None
    try:
        parsed = json.loads(key)
    except ValueError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {"schema", "payload"} and isinstance(parsed["payload"], dict):
        parsed = parsed["payload"]
    return parsed if isinstance(parsed, dict) else None


def _with_source_time(image: dict, event: dict, order_column: Column | None) -> bytes:
    """The row image as JSON, with the envelope's `source.ts_ms` as `order_column` when the image lacks it."""
    source = event.get("source")
    if (order_column is not None and image.get(order_column.name) is None and isinstance(source, dict)
            and isinstance(source.get("ts_ms"), int)):
        ts_ms = source["ts_ms"]
        value: object = ts_ms
        if order_column.type == "timestamp":
            value = datetime.fromtimestamp(ts_ms / 1000, tz=UTC).isoformat()
        image = {**image, order_column.name: value}
    return json.dumps(image).encode()


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
    order_column = next((c for c in key.columns if c.name == key.order_column), None)
    images, deletes, problems = change_images(rows.column("value").to_pylist(), rows.column("key").to_pylist(),
                                              events, order_column if events.format == "debezium" else None)
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
    candidates: list[DataFile] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                raise UpsertError(
                    f"table {'.'.join(table.name())}: delete file {entry.data_file.file_path} (another engine's "
                    "merge-on-read delete) is live; an upsert rewrites files copy-on-write and would bring its "
                    "deleted rows back: compact the table with that engine first")
            continue
        wanted = partition_sets.get(manifest.partition_spec_id, {})
        candidates.extend(entry.data_file for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                          if _may_hold(entry.data_file, wanted, values))
    return candidates


def _may_hold(data_file: DataFile, wanted: Mapping[int, set], values: _KeyValues) -> bool:
    """Whether the file's partition values (`wanted`: per position, the changed keys' values) and bounds allow a
    row of the keys."""
    if any(data_file.partition[position] not in allowed for position, allowed in wanted.items()):
        return False
    return _bounds_may_hold(data_file, values)


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
    superseded: int = 0  # changes not applied: the table's row of the key is newer (`KeyOrder`)


def _read_files(table: Table, files: Sequence[DataFile], columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of `files` in the table's current schema (columns added since are null), or only `columns`."""
    schema = table.schema() if columns is None else table.schema().select(*columns)
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    return scan.to_table([FileScanTask(f) for f in files])


def read_run_rows(table: Table, data_files: Sequence[DataFile]) -> pa.Table:
    """The rows of a run's uncommitted `data_files`, which are deleted once read: an upsert never commits them, it
    writes the new state again, one row per key."""
    try:
        return _read_files(table, data_files)
    finally:
        delete_data_files(table.io, [f.file_path for f in data_files])


def _plan_rewrite(table: Table, keys: pa.Table, new_rows: pa.Table, job: SinkJob,
                  order: KeyOrder | None = None) -> _Rewrite:
    """Read each file that may hold `keys` and write it again without their rows, with the `new_rows` that replace
    rows of it (so a file keeps the narrow key range it had, and the next upsert can skip it by its bounds); files
    holding none of the keys are kept. The new rows of keys no file held are written to files of their own. Rows
    are written in key order. With `order`, a key whose stored row wins over the change (`KeyOrder`) keeps its row
    and the change (upsert or delete) is dropped."""
    ids = list(keys.column_names)
    indexed = new_rows.append_column(_ROW, pa.array(np.arange(new_rows.num_rows, dtype=np.int64)))
    placed = np.zeros(new_rows.num_rows, dtype=bool)
    removed: list[DataFile] = []
    added: list[DataFile] = []
    rows_removed = superseded = held_back = 0
    candidates = files_to_rewrite(table, keys)
    try:
        for number, data_file in enumerate(candidates):
            rows = _read_files(table, [data_file])
            changing = keys
            if order is not None and (winning := order.stored_rows_winning(rows)).num_rows:
                superseded += winning.num_rows
                losing = indexed.join(winning, keys=ids, join_type="left semi").column(_ROW).to_numpy()
                held_back += len(losing)
                placed[losing] = True
                changing = keys.join(winning, keys=ids, join_type="left anti")
            kept = rows.join(changing, keys=ids, join_type="left anti")
            if kept.num_rows == rows.num_rows:
                continue  # the bounds could not exclude it, but it holds none of the keys (or only newer rows)
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
    log.info("table %s: %d of %d candidate files hold changed keys (%d rows replaced or deleted, %d rows added%s)",
             ".".join(table.name()), len(removed), len(candidates), rows_removed, new_rows.num_rows - held_back,
             f"; {superseded} changes older than the table's rows of their keys, not applied" if superseded else "")
    return _Rewrite(removed, added, rows_removed, superseded)


def keys_added_since(table: Table, snapshot_id: int | None, keys: pa.Table) -> pa.Table | None:
    """Which of `keys` rows of data files added to `table` after `snapshot_id` hold (Iceberg's
    `validateNoConflictingData` for a copy-on-write upsert: a concurrent commit that inserted a key this upsert
    planned as new). Reads only the manifests the snapshots since `snapshot_id` added, their entries added by those
    snapshots, and of those only the files whose partition values and bounds may hold a key (`files_to_rewrite`'s
    pruning); of them only the id columns. None when `snapshot_id` is no longer an ancestor of the current snapshot
    (rolled back, expired): nothing can be told, the caller plans again."""
    if keys.num_rows == 0:
        return keys
    since: list = []
    for snapshot in ancestry(table):
        if snapshot.snapshot_id == snapshot_id:
            break
        since.append(snapshot)
    else:
        if snapshot_id is not None:
            return None
    if not since:
        return keys.slice(0, 0)
    values = _key_values(table, keys)
    partition_sets = _partition_value_sets(table, values)
    added: list[DataFile] = []
    for snapshot in since:
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                    continue
                if _may_hold(entry.data_file, partition_sets.get(manifest.partition_spec_id, {}), values):
                    added.append(entry.data_file)
    ids = list(keys.column_names)
    found = [_read_files(table, [f], ids).join(keys, keys=ids, join_type="left semi") for f in added]
    found = [t for t in found if t.num_rows]
    return pa.concat_tables(found).group_by(ids).aggregate([]) if found else keys.slice(0, 0)


class KeysAddedError(RewriteAbandonedError):
    """A commit since the upsert's plan added rows of keys the upsert changes: committing the plan would leave such a
    key twice (or bring back a key it deletes); the upsert plans again on the new state."""


@dataclass(frozen=True)
class _Committed:
    snapshot_id: int
    attempts: int
    rewrite: _Rewrite
    rows_written: int  # the new rows of the plan that committed


def _commit_replacing_keys(table: Table, plan: Callable[[Table], tuple[pa.Table, pa.Table]], watched: pa.Table,
                           job: SinkJob, *, what: str, properties: Mapping[str, str],
                           order: KeyOrder | None = None, check: Callable[[Table], None] | None = None,
                           before_send: Callable[[Table], None] | None = None,
                           positions: tuple[str, Mapping[int, int]] | None = None,
                           max_attempts: int = DEFAULT_COMMIT_ATTEMPTS, empty: bool = True) -> _Committed | None:
    """One overwrite snapshot removing the rows of the keys `plan` returns for the table's state and adding the new
    rows it returns with them (`_plan_rewrite`, with `order`). Every attempt, on the refreshed table, runs `check`,
    then refuses when a commit since the plan added rows of the `watched` keys (`keys_added_since`:
    `KeysAddedError`), then runs `before_send`. Planned again when a concurrent commit removed a file it rewrites,
    added rows of a watched key, or when the table's spec changed since the files were written (at most
    `MAX_PLANS` plans). Without `empty`, a plan that changes nothing commits nothing (None). On failure every file it
    wrote is deleted, except when the outcome is unknown (they may be referenced)."""
    table_name = ".".join(table.name())
    commit_id = uuid.uuid4().hex
    before_first: list[int | None] = []

    for number in range(1, MAX_PLANS + 1):
        planned_on = table.metadata.current_snapshot_id
        keys, new_rows = plan(table)
        if not empty and keys.num_rows == 0 and new_rows.num_rows == 0:
            return None
        rewrite = _plan_rewrite(table, keys, new_rows, job, order)
        added = rewrite.added

        def check_attempt(current: Table, added: list[DataFile] = added, planned_on: int | None = planned_on) -> None:
            if not before_first:
                before_first.append(current.metadata.current_snapshot_id)
            refuse_changed_spec(current, added, [f.file_path for f in added], job.run_id)
            if check is not None:
                check(current)
            found = keys_added_since(current, planned_on, watched)
            if found is None:
                raise KeysAddedError(f"table {table_name}: snapshot {planned_on}, which {what} was planned on, is no "
                                     "longer an ancestor of the current snapshot")
            if found.num_rows:
                raise KeysAddedError(
                    f"table {table_name}: a commit since snapshot {planned_on}, which {what} was planned on, added "
                    f"rows of {found.num_rows} of its keys, e.g. {found.slice(0, 1).to_pylist()[0]}")
            if before_send is not None:
                before_send(current)

        snapshot_properties = {**properties, REWRITTEN_FILES_PROPERTY: str(len(rewrite.removed))}
        if rewrite.superseded:
            snapshot_properties[SUPERSEDED_CHANGES_PROPERTY] = str(rewrite.superseded)
        try:
            snapshot_id, attempts = commit_rewrite(
                table, rewrite.removed, added, marker=(COMMIT_ID_PROPERTY, commit_id), what=what,
                properties=snapshot_properties, check=check_attempt, max_attempts=max_attempts, positions=positions)
        except CommitOutcomeUnknownError:
            raise  # the files may be referenced: kept for the clean-up of ended runs
        except RewriteAbandonedError as exc:
            delete_data_files(table.io, [f.file_path for f in rewrite.added])
            if number == MAX_PLANS:
                raise UpsertError(f"table {table_name}: {what} planned {number} times, concurrent commits kept "
                                  f"changing its keys' rows: {exc}") from exc
            log.info("%s; planning %s again", exc, what)
            continue
        except CommitFailedException as exc:
            landed = find_commit_after_refresh(table, commit_id, before_first[0] if before_first else None)
            if landed is not None:
                return _Committed(landed, max_attempts, rewrite, new_rows.num_rows)
            delete_uncommitted(table, [f.file_path for f in added], table_name, job.run_id)
            raise CommitRetriesExhaustedError(
                f"table {table_name}: {what} lost to concurrent commits {max_attempts} times; data files deleted"
            ) from exc
        except BaseException:
            delete_uncommitted(table, [f.file_path for f in added], table_name, job.run_id)
            raise
        return _Committed(snapshot_id, attempts, rewrite, new_rows.num_rows)
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
    _refuse_unordered_column(table, key)
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

    properties = {
        **(snapshot_properties or {}),
        RUN_ID_PROPERTY: run_id,
        UPSERTED_KEYS_PROPERTY: str(changes.upserts.num_rows),
        DELETED_KEYS_PROPERTY: str(changes.deleted),
    }
    if changes.keyless:
        properties[KEYLESS_RECORDS_PROPERTY] = str(changes.keyless)
    committed = _commit_replacing_keys(table, lambda _current: (changes.keys, changes.upserts), changes.keys, job,
                                       what=f"upsert of run {run_id}", properties=properties, order=changes.order,
                                       check=check, before_send=before_attempt,
                                       positions=(topic, dict(end_offsets)), max_attempts=max_attempts)
    if committed is None:  # `empty` commits: an upsert of a run moves its offsets even when it changes no key
        raise AssertionError("unreachable")
    topic_offsets = read_topic_offsets(table, topic)
    rewrite = committed.rewrite
    log.info("table %s: run %s upserted %d keys and deleted %d in snapshot %d (%d files rewritten), %s offsets %s",
             table_name, run_id, changes.upserts.num_rows, changes.deleted, committed.snapshot_id,
             len(rewrite.removed), topic, topic_offsets)
    return CommitResult(snapshot_id=committed.snapshot_id, topic_offsets=topic_offsets, attempts=committed.attempts,
                        data_file_count=len(rewrite.added), record_count=sum(f.record_count for f in rewrite.added))


def _refuse_unordered_column(table: Table, key: UpsertKey) -> None:
    """`order_column` must be a column of the table of a type that orders (checked here too: a registry mapping's
    columns are only known at run time)."""
    if key.order_column is None:
        return
    field = next((f for f in table.schema().fields if f.name == key.order_column), None)
    if field is None or not isinstance(field.field_type, PrimitiveType) or isinstance(
            field.field_type, BooleanType | BinaryType):
        what = ("is not a column of the table" if field is None
                else f"is of type {field.field_type}, which does not order")
        raise UpsertError(f"table {'.'.join(table.name())}: mappings[].order_column {key.order_column!r} {what}; "
                          "nothing committed")


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
    finally:
        delete_data_files(table.io, [f.file_path for f in data_files])  # read: written again with the rest
    all_keys = rows.select(ids)

    def plan(current: Table) -> tuple[pa.Table, pa.Table]:
        """The keys to replace and the rows to write, for the table's state (which keys it holds)."""
        if options.when_matched_update_all and options.when_not_matched_insert_all:
            return all_keys, rows
        matched = _keys_in_table(current, all_keys)
        if options.when_matched_update_all:
            updating = rows.join(matched, keys=ids, join_type="left semi")
            return updating.select(ids), updating
        if options.when_not_matched_insert_all:  # matched rows stay as they are
            return all_keys.slice(0, 0), rows.join(matched, keys=ids, join_type="left anti")
        return all_keys.slice(0, 0), rows.slice(0, 0)

    if rows.num_rows == 0 or not (options.when_matched_update_all or options.when_not_matched_insert_all):
        return RowsUpserted(None, 0, 0, 0, 0, 0)
    committed = _commit_replacing_keys(table, plan, all_keys, job, what=f"upsert of run {run_id}",
                                       properties=dict(snapshot_properties or {}), max_attempts=max_attempts,
                                       empty=False)
    if committed is None:
        return RowsUpserted(None, 0, 0, 0, 0, 0)
    return RowsUpserted(committed.snapshot_id, committed.rows_written, committed.rewrite.rows_removed,
                        len(committed.rewrite.removed), len(committed.rewrite.added), committed.attempts)


def _keys_in_table(table: Table, keys: pa.Table) -> pa.Table:
    """Which of `keys` the table holds (read from the files that may hold them)."""
    found = [_read_files(table, [f]).select(keys.column_names).join(keys, keys=keys.column_names,
                                                                     join_type="left semi")
             for f in files_to_rewrite(table, keys)]
    if not found:
        return keys.slice(0, 0)
    return pa.concat_tables(found).group_by(keys.column_names).aggregate([])
