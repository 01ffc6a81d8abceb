"""Committed offsets kept in the Iceberg table itself, and the commit protocol (crash leftovers: run_files.py).

Each of our snapshots carries, per topic, the summary property `kafscale.offsets.<topic>` = compact JSON
`{"<partition>": <next offset>}` for *every* topic and partition committed so far (carried forward). Snapshots
written by other engines (compaction, deletes) do not carry it, so reading walks back the snapshot ancestry to the
latest snapshot that does (DESIGN.md, "Exactly-once commit protocol").
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from kafscale_lakehouse.engine.catalog import catalog_endpoint, catalog_errors
from kafscale_lakehouse.engine.iceberg_sink import delete_data_files

log = logging.getLogger(__name__)

OFFSETS_PROPERTY_PREFIX = "kafscale.offsets."
RUN_ID_PROPERTY = "kafscale.run-id"
COMMIT_ID_PROPERTY = "kafscale.commit-id"
DEFAULT_COMMIT_ATTEMPTS = 5
DEFAULT_RETRY_WAIT_SECONDS = 0.2

# {topic: {partition: next offset}}
CommittedOffsets = dict[str, dict[int, int]]


class TableOffsetsError(RuntimeError):
    """A problem with the offsets stored in, or committed to, an Iceberg table."""


class CorruptOffsetsPropertyError(TableOffsetsError):
    """A `kafscale.offsets.<topic>` summary property is not a JSON object of partition → offset."""


class OffsetConflictError(TableOffsetsError):
    """Another writer committed offsets of this batch first; our data files were deleted."""

    def __init__(self, table_name: str, topic: str, partition: int, expected_start: int, committed: int):
        self.table_name = table_name
        self.topic = topic
        self.partition = partition
        self.expected_start = expected_start
        self.committed = committed
        super().__init__(
            f"table {table_name}: topic {topic} partition {partition} was committed up to offset {committed} by "
            f"another writer while this batch started at {expected_start}; batch aborted, its data files deleted"
        )


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


def parse_offsets_property(value: str, *, where: str) -> dict[int, int]:
    """`{"0": 1200}` → `{0: 1200}`; `where` names the snapshot and property for the error."""
    try:
        raw = json.loads(value)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        offsets = {int(p): o for p, o in raw.items()}
        if not all(type(o) is int and o >= 0 and p >= 0 for p, o in offsets.items()):
            raise ValueError("partitions and offsets must be non-negative integers")
    except ValueError as exc:
        raise CorruptOffsetsPropertyError(f"{where}: {value!r} is not a partition → offset map ({exc})") from exc
    return offsets


def format_offsets_property(offsets: Mapping[int, int]) -> str:
    """Compact JSON with partitions in numeric order: `{"0":1200,"1":980}`."""
    return json.dumps({str(p): offsets[p] for p in sorted(offsets)}, separators=(",", ":"))


def read_committed_offsets(table: Table) -> CommittedOffsets:
    """Next offsets per topic and partition, from the latest snapshot in the current ancestry that carries any.

    Reads the table object as it is; refresh it first for the catalog's latest state.
    """
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        offsets = _snapshot_offsets(table, snapshot)
        if offsets:
            return offsets
    return {}


def read_topic_offsets(table: Table, topic: str) -> dict[int, int]:
    return read_committed_offsets(table).get(topic, {})


def offsets_summary_properties(committed: CommittedOffsets, topic: str, new_offsets: Mapping[int, int]) -> dict[str, str]:
    """Summary properties for a snapshot that advances `topic` to `new_offsets`, carrying every other map forward.

    For any writer of ours (append, replay) so the latest snapshot always has the full map.
    """
    merged = {t: dict(o) for t, o in committed.items()}
    merged.setdefault(topic, {}).update(new_offsets)
    return {OFFSETS_PROPERTY_PREFIX + t: format_offsets_property(o) for t, o in merged.items()}


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
    while True:
        attempt += 1
        with catalog_errors(catalog_endpoint(table.catalog)):
            table.refresh()
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
            if attempt == max_attempts:
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
            snapshot = _find_commit(table, commit_id)
            if snapshot is None:
                raise CommitOutcomeUnknownError(
                    f"table {table_name}: commit of run {run_id} failed with an unknown outcome "
                    f"({type(exc).__name__}); its {len(paths)} data files are kept until the table shows "
                    "whether they are referenced"
                ) from exc
            log.warning("table %s: commit of run %s reported %r but landed", table_name, run_id, exc)
            snapshot_id = snapshot.snapshot_id
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


def _snapshot_offsets(table: Table, snapshot: Snapshot) -> CommittedOffsets:
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    return {
        key[len(OFFSETS_PROPERTY_PREFIX):]: parse_offsets_property(
            value, where=f"table {'.'.join(table.name())} snapshot {snapshot.snapshot_id} property {key}"
        )
        for key, value in summary.items()
        if key.startswith(OFFSETS_PROPERTY_PREFIX)
    }


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
                f"table {table_name} topic {topic} partition {partition}: offset range {start}..{end_offsets[partition]} "
                "is not a valid range"
            )
    reserved = [k for k in snapshot_properties if k.startswith(OFFSETS_PROPERTY_PREFIX)
                or k in (RUN_ID_PROPERTY, COMMIT_ID_PROPERTY)]
    if reserved:
        raise ValueError(f"snapshot_properties must not set the commit protocol's own keys {reserved}")


def _first_conflict(committed: Mapping[int, int], start_offsets: Mapping[int, int]) -> tuple[int, int] | None:
    """A partition (with its committed offset) that another writer moved; a never-committed partition is free."""
    for partition in sorted(start_offsets):
        if partition in committed and committed[partition] != start_offsets[partition]:
            return partition, committed[partition]
    return None


def append_without_client_retries(table: Table, data_files: Sequence[DataFile], properties: dict[str, str]) -> None:
    """One fast append; on success `table` holds the catalog's new metadata.

    pyiceberg retries a conflicting commit by itself, re-applying the append on the new metadata with the old
    summary: that would skip our offset re-check. The append therefore runs on a view of the table whose
    `commit.retry.num-retries` is 0 (only the client reads it; the catalog commits against its own metadata).
    """
    no_retries = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    view = Table(
        identifier=table.name(),
        metadata=table.metadata.model_copy(update={"properties": no_retries}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )
    with view.transaction() as transaction:
        with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
    # The view now holds the catalog's answer to the commit (not the retry override): adopt it, saving a reload.
    table.metadata = view.metadata
    table.metadata_location = view.metadata_location


def _find_commit(table: Table, commit_id: str) -> Snapshot | None:
    """Our snapshot in the current ancestry after a refresh, or None (also when the catalog cannot be read)."""
    try:
        table.refresh()
    except Exception:  # noqa: BLE001 - the caller reports the original failure
        log.warning("table %s: cannot refresh to check the commit outcome", ".".join(table.name()), exc_info=True)
        return None
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if snapshot.summary is not None and snapshot.summary.get(COMMIT_ID_PROPERTY) == commit_id:
            return snapshot
    return None


def _delete_uncommitted(table: Table, paths: Iterable[str], table_name: str, run_id: str) -> None:
    paths = list(paths)
    failed = delete_data_files(table.io, paths)
    log.warning(
        "table %s: deleted %d uncommitted data files of run %s%s", table_name, len(paths) - len(failed), run_id,
        f" ({len(failed)} could not be deleted; orphan-file removal removes them later)" if failed else "",
    )
