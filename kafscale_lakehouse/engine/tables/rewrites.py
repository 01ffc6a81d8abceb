"""Rewriting a table's data files in one snapshot: compaction (engine/maintenance.py) and replay
(engine/ingestion/replay.py).

The new files come from a Spark job (`engine/spark/rewrite_job.py`), optionally without the records of one topic
partition's offset range (`RecordRange`: what a replay replaces). `commit_rewrite` commits one overwrite snapshot
(pyiceberg 0.12 has no `replace` operation) that removes some files and adds others, carrying the offsets of every
topic forward. Each attempt re-reads the table: a concurrent commit makes the catalog refuse ours (pyiceberg's own
retries are off, as for our appends) and we retry on the new state; if a file to remove is gone (another compaction,
a delete), or another engine added a delete file that applies to one (`DeletesAddedError`: committing would bring
its deleted rows back), the rewrite is abandoned (`RewriteAbandonedError`) so nothing is lost, doubled or undeleted.
An answer that does not say whether the commit landed is settled by looking for the rewrite's marker in the table; if
it is not there either, the files are kept (`CommitOutcomeUnknownError`): they may be referenced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.manifest import INITIAL_SEQUENCE_NUMBER, DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.delete_file_index import DeleteFileIndex

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.audit import no_pending_audit
from kafscale_lakehouse.engine.tables.catalogs import catalog_endpoint, catalog_errors
from kafscale_lakehouse.engine.tables.commits import (
    CommitOutcomeUnknownError,
    commit_settled,
    committed_snapshot_id,
    require_refs,
    without_client_retries,
)
from kafscale_lakehouse.engine.tables.summary import (
    OFFSETS_PROPERTY_PREFIX,
    ancestry,
    format_offsets_property,
    read_committed_offsets,
)
from kafscale_lakehouse.offsets.ranges import OffsetRange

log = logging.getLogger(__name__)

class RewriteAbandonedError(EngineError):
    """Files the rewrite replaces were removed by another commit; the rewrite's own files were deleted."""


class DeletesAddedError(RewriteAbandonedError):
    """Another engine (Trino, Spark: merge-on-read) added a delete file that applies to a file the rewrite removes:
    committing would bring the deleted rows back (Java's `validateNoNewDeletesForDataFiles`)."""


class PositionsMovedError(EngineError):
    """A partition's next offset in the refreshed table is not the one the rewrite was planned on; nothing committed."""


@dataclass(frozen=True)
class RecordRange:
    """The records of `offsets` (one Kafka partition) of `topic`, by the base columns every mapped table has."""

    topic: str
    offsets: OffsetRange

    def expression(self) -> BooleanExpression:
        return And(EqualTo("topic", self.topic), EqualTo("partition", self.offsets.partition),
                   GreaterThanOrEqual("offset", self.offsets.start), LessThan("offset", self.offsets.end))

    def __str__(self) -> str:
        return f"topic {self.topic} partition {self.offsets.partition} offsets {self.offsets.start}.." \
               f"{self.offsets.end - 1}"


@dataclass(frozen=True)
class ManifestMerge:
    target_size_bytes: int

    def view_properties(self) -> dict[str, str]:
        return {TableProperties.MANIFEST_MERGE_ENABLED: "true", TableProperties.MANIFEST_MIN_MERGE_COUNT: "2",
                TableProperties.MANIFEST_TARGET_SIZE_BYTES: str(self.target_size_bytes)}


def commit_rewrite(table: Table, removed: Sequence[DataFile], added: Sequence[DataFile], *, marker: tuple[str, str],
                   what: str, properties: Mapping[str, str] | None = None,
                   check: Callable[[Table], None] | None = None, max_attempts: int = 10,
                   retry_wait_seconds: float = 0.2, merge_manifests: ManifestMerge | None = None,
                   positions: tuple[str, Mapping[int, int]] | None = None,
                   expected: tuple[str, Mapping[int, int | None]] | None = None,
                   audit_branch: str | None = None) -> tuple[int, int]:
    """One overwrite snapshot removing `removed` and adding `added` (see the module docstring); returns its id and
    the attempts it took. `marker` (a summary property unique to this rewrite) finds a commit whose answer was lost;
    `check` runs on the refreshed table before every attempt (it raises to stop). `table` holds the new state.
    `positions` (topic, {partition: next offset}) sets those partitions' offsets instead of carrying them forward.
    `expected` (topic, {partition: next offset or None}) are the positions the rewrite was planned on: every attempt
    re-reads them on the refreshed table and refuses (`PositionsMovedError`, nothing committed) when one moved, so
    rows landed since the plan are never left behind a position moved back (duplicates on the next run).
    `audit_branch`: every attempt refuses (`AuditPendingError`) while that branch holds a snapshot main does not,
    and the commit requires the branch where the attempt saw it (`audit.no_pending_audit`): an audited run
    committing to it during the rewrite makes the rewrite refuse, never the audit unpublishable.

    With `merge_manifests` (and no files), the snapshot instead merges the current snapshot's data manifests into
    manifests of about `target_size_bytes`: pyiceberg's merge append, told by the client-side properties of the
    view alone (the table's own properties are not changed). It adds no file, so it is an `append` of nothing."""
    table_name = ".".join(table.name())
    if merge_manifests is not None and removed:
        raise ValueError("a manifest merge removes no file")
    removed_paths = {f.file_path for f in removed}
    key, value = marker
    before_first_attempt: int | None = None
    for attempt in range(1, max_attempts + 1):
        with catalog_errors(catalog_endpoint(table.catalog)):
            table.refresh()
        if attempt == 1:
            before_first_attempt = table.metadata.current_snapshot_id
        elif (landed := _landed(table, key, value, before_first_attempt)) is not None:
            return landed, attempt
        current = _live_data_sequence_numbers(table, removed_paths) if removed_paths else {}
        gone = removed_paths - current.keys()
        if gone:
            raise RewriteAbandonedError(
                f"table {table_name}: {len(gone)} files that {what} replaces were removed by another commit (e.g. "
                f"{sorted(gone)[0]}); {what} abandoned, its files deleted; run it again")
        if removed_paths and (applying := _applying_delete_file(table, removed, current)) is not None:
            data_file, delete_file = applying
            raise DeletesAddedError(
                f"table {table_name}: {data_file.file_path}, which {what} replaces, has the delete file "
                f"{delete_file.file_path} ({delete_file.content.name.lower()}, added by another engine after it was "
                f"planned); committing would bring the deleted rows back: {what} abandoned, its files deleted; run it "
                "again")
        if check is not None:
            check(table)
        requires = no_pending_audit(table, audit_branch, what) if audit_branch is not None else {}
        committed = dict(read_committed_offsets(table))
        if expected is not None:
            _refuse_moved_positions(table_name, what, committed.get(expected[0], {}), *expected)
        if positions is not None:
            committed[positions[0]] = {**committed.get(positions[0], {}), **positions[1]}
        snapshot_properties = {OFFSETS_PROPERTY_PREFIX + topic: format_offsets_property(offsets)
                               for topic, offsets in committed.items()}
        snapshot_properties.update(properties or {})
        snapshot_properties[key] = value
        try:
            with catalog_errors(catalog_endpoint(table.catalog)):
                view = without_client_retries(table)
                if merge_manifests is not None:
                    view.metadata = view.metadata.model_copy(
                        update={"properties": {**view.metadata.properties, **merge_manifests.view_properties()}})
                transaction = view.transaction()
                update = transaction.update_snapshot(snapshot_properties=snapshot_properties)
                with update.merge_append() if merge_manifests is not None else update.overwrite() as rewrite:
                    for data_file in removed:
                        rewrite.delete_data_file(data_file)  # a manifest merge (merge_append) removes none
                    for data_file in added:
                        rewrite.append_data_file(data_file)
                require_refs(transaction, requires)
                view = commit_settled(transaction)
        except CommitFailedException:
            if attempt == max_attempts:
                raise
            log.info("table %s: %s lost a race with a concurrent commit (attempt %d/%d); retrying", table_name, what,
                     attempt, max_attempts)
            time.sleep(retry_wait_seconds * attempt)
            continue
        except Exception as exc:
            try:
                table.refresh()
                landed = _landed(table, key, value, before_first_attempt)
            except Exception:  # noqa: BLE001 - the catalog cannot tell either
                landed = None
            if landed is None:
                raise CommitOutcomeUnknownError(
                    f"table {table_name}: the commit of {what} failed with an unknown outcome ({type(exc).__name__}: "
                    f"{exc}); its {len(added)} files are kept until the table shows whether they are referenced"
                ) from exc
            log.warning("table %s: the commit of %s reported %r but landed", table_name, what, exc)
            return landed, attempt
        table.metadata, table.metadata_location = view.metadata, view.metadata_location
        return committed_snapshot_id(table), attempt
    raise AssertionError("unreachable")


def _live_data_sequence_numbers(table: Table, paths: set[str]) -> dict[str, int]:
    """The data sequence numbers of the files of `paths` the current snapshot still holds."""
    snapshot = table.current_snapshot()
    found: dict[str, int] = {}
    if snapshot is None:
        return found
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.file_path in paths:
                found[entry.data_file.file_path] = entry.sequence_number or INITIAL_SEQUENCE_NUMBER
    return found


def _applying_delete_file(table: Table, removed: Sequence[DataFile],
                          sequence_numbers: Mapping[str, int]) -> tuple[DataFile, DataFile] | None:
    """A live delete file of the current snapshot that can apply to one of `removed` (whose data sequence numbers
    are `sequence_numbers`), with that file; None when there is none. Position deletes are matched as pyiceberg's
    scans match them (partition, referenced file, bounds on `file_path`, sequence numbers); an equality delete
    counts when it is newer than the file and global or in the file's partition. The rewrite was planned without
    files that had delete files, so any found here came since."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return None
    positions = DeleteFileIndex()
    equality: list[tuple[int, DataFile]] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                equality.append((entry.sequence_number or INITIAL_SEQUENCE_NUMBER, entry.data_file))
            else:
                positions.add_delete_file(entry, partition_key=entry.data_file.partition)
    specs = table.specs()
    for data_file in removed:
        sequence_number = sequence_numbers[data_file.file_path]
        applying = positions.for_data_file(sequence_number, data_file, partition_key=data_file.partition)
        if applying:
            return data_file, min(applying, key=lambda f: f.file_path)
        for delete_sequence_number, delete_file in equality:
            spec = specs.get(delete_file.spec_id)
            same_partition = delete_file.spec_id == data_file.spec_id and delete_file.partition == data_file.partition
            if delete_sequence_number > sequence_number and (
                    spec is None or spec.is_unpartitioned() or same_partition):
                return data_file, delete_file
    return None


def _refuse_moved_positions(table_name: str, what: str, committed: Mapping[int, int], topic: str,
                            expected: Mapping[int, int | None]) -> None:
    for partition, offset in sorted(expected.items()):
        if committed.get(partition) != offset:
            raise PositionsMovedError(
                f"table {table_name}: {what} was planned with topic {topic} partition {partition} at next offset "
                f"{offset}, but the table is now at {committed.get(partition)} (another commit landed since); "
                "nothing committed, run it again")


def _landed(table: Table, key: str, value: str, since: int | None) -> int | None:
    """The snapshot committed after `since` whose summary has `key` = `value`, or None."""
    for snapshot in ancestry(table):
        if snapshot.snapshot_id == since:
            return None
        if snapshot.summary is not None and snapshot.summary.get(key) == value:
            return snapshot.snapshot_id
    return None
