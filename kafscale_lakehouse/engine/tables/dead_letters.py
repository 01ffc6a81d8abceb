"""The dead-letter table of a mapping, and the commit that puts each invalid record in it exactly once.

Invalid records (a value violating the topic's JSON Schema in lenient mode, or a required column that cannot be
coerced, when a dead-letter table is configured) are kept out of the table but not lost: the Spark tasks that write
the table's data files also write them, with their raw value, error, violated schema path and run id, as data files
of the dead-letter table (`engine/ingestion/rows.DeadLetterFileWriter`, columns `DEAD_LETTER_SCHEMA`).

Order of one run, and what a crash between the steps leaves:
1. Spark job: table data files + dead-letter data files, all uncommitted.
2. `stage_dead_letters`: the dead-letter files become a *staged* snapshot of the dead-letter table: durable and
   referenced (orphan cleanup keeps its files), but on no branch, so no reader sees it.
3. The table commit (`appends.commit_append`) carries `StagedDeadLetters.summary_properties()`: the dead-letter
   table, the staged snapshot id and the record count, next to the new offsets.
4. `publish_dead_letters`: the staged snapshot's files are appended to the dead-letter table's main branch, with the
   run id, the table snapshot and the offset ranges in the summary.
- Crash before 3: the table did not advance, so the next run reads the same offsets and dead-letters them again.
  The first attempt's files are unreferenced (orphan cleanup removes them) or in a staged snapshot nobody publishes.
- Crash between 3 and 4: the table has moved past the invalid records. The next run calls
  `publish_pending_dead_letters` before it commits anything: it finds the table snapshots whose staged dead letters
  are not on the dead-letter table's branch and publishes them.
- Publishing is idempotent per staged snapshot (one per run): it checks the branch first, and commits without
  pyiceberg's client retries so that a concurrent publisher's commit makes it check again instead of appending twice.
- Each table commit records `kafscale.dead-letter.published-through`: the table snapshot through which every staged
  dead letter was published when the run started, so the next run's walk stops there (it costs the snapshots since
  the previous run started, whatever the history). It does not stop at a published one: runs on disjoint partitions
  commit in any order, so an unpublished staged snapshot may lie behind a published one.
- A staged snapshot that is gone before it was published (the dead-letter table dropped and recreated, or its
  snapshots expired, between a run's commit and its publish) cannot be recovered from the dead-letter table: that is
  reported as an error naming the run, the record count and the offset ranges at stake, and recorded as an empty
  snapshot of the dead-letter table (`kafscale.dead-letter.lost-records`), so it is reported once and never wedges
  later runs. The run that finds it fails after its own commit (`PendingDeadLetters.lost`, then
  `IngestResult.dead_letters_lost`); a crash after the marker and before that failure leaves only the log line.

Offsets read again. A position moved back (`offsets reset --to-offset`) or a table rolled back by an operator makes
later runs read offsets whose dead letters are already published. Each dead letter still lands once because a
publication *replaces*: in its one commit it deletes the dead letters of the offsets its staged snapshot covers
(`kafscale.dead-letter.offsets.<topic>`, the run's whole committed range per partition, invalid records or not) and
appends the staged files. Every snapshot of ours on the dead-letter table carries `kafscale.dead-letter.ends.<topic>`,
per partition an offset at or beyond which the table holds no dead letter (a publication raises it to the end of its
range), so the usual forward publication knows without reading a manifest that there is nothing to replace; a table
written before the key scans the topic's offsets once. A run with no invalid records still stages an (empty) snapshot
when the table may hold dead letters of its range, so dead letters of records that are valid now (schema fixed since)
go when their records land. Exactly-once under a crash between the two tables' commits follows from the order of
publications per partition: a run publishes the pending staged snapshots of its table (older ranges) before it
commits, under the leases of its partitions, so for each partition the newest publication of a range is the last one,
and replacing makes it the only one.
So after a move back or a rollback, the dead letters of offsets beyond the table's position stay until those offsets
land again, then are replaced, never doubled. A move back deliberately does not delete them itself: a later rollback
of the table past the move would bring the rows back but not their dead letters (lost in both tables), and nothing
can be lost while publication is the only writer of dead letters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import reduce

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan, Or
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import TOTAL_RECORDS, Snapshot, ancestors_of
from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField, StringType, TimestamptzType

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.catalogs import catalog_endpoint, catalog_errors, open_table
from kafscale_lakehouse.engine.tables.commits import append_without_client_retries, committed_snapshot_id
from kafscale_lakehouse.engine.tables.data_files import SinkJob
from kafscale_lakehouse.engine.tables.summary import (
    DEAD_LETTER_ENDS_PROPERTY_PREFIX,
    DEAD_LETTER_RECORDS_PROPERTY,
    DEAD_LETTER_TABLE_PROPERTY,
    KAFSCALE_PROPERTY_PREFIX,
    LOST_RECORDS_PROPERTY,
    OFFSET_RANGES_PROPERTY_PREFIX,
    PUBLISHED_THROUGH_PROPERTY,
    RUN_ID_PROPERTY,
    SOURCE_SNAPSHOT_PROPERTY,
    SOURCE_TABLE_PROPERTY,
    STAGED_SNAPSHOT_PROPERTY,
    CommittedOffsets,
    ancestry,
    format_offsets_property,
    format_ranges_property,
    parse_commit,
    parse_offsets_property,
    parse_skipped_property,
    summary_properties,
)

log = logging.getLogger(__name__)

DEAD_LETTER_TABLE_SUFFIX = "_dead_letters"
DEFAULT_PUBLISH_ATTEMPTS = 5
_RETRY_WAIT_SECONDS = 0.2


class DeadLetterError(EngineError):
    """A dead-letter table problem; the message names the table (and run)."""


class DeadLetterTableError(DeadLetterError):
    """The dead-letter table exists but cannot hold dead letters (other columns, partitioned)."""


class DeadLetterRecoveryError(DeadLetterError):
    """A run's staged dead letters can no longer be published (their staged snapshot is gone)."""


def default_dead_letter_table(table: str) -> str:
    """`prod.orders` → `prod.orders_dead_letters`."""
    return table + DEAD_LETTER_TABLE_SUFFIX


def mapping_dead_letter_table(schema_mode: str, table: str, configured: str | None) -> str | None:
    """The dead-letter table a mapping landing in `table` uses, the one rule for ingestion (which writes there) and
    maintenance (which keeps the table snapshots naming unpublished staged dead letters there): `lenient` → the
    `configured` one, default `<table>_dead_letters`; `off` → the configured one only; `strict` → none (None:
    invalid records fail the run)."""
    if schema_mode == "lenient":
        return configured or default_dead_letter_table(table)
    if schema_mode == "off":
        return configured
    return None


def open_dead_letter_table(catalog: Catalog, identifier: str) -> Table:
    """The dead-letter table, created when missing (invalid records must never lack a place to go), checked to have
    the dead-letter columns and no partitioning."""
    table = open_table(catalog, identifier, schema=DEAD_LETTER_SCHEMA, create_if_missing=True)
    schema = table.schema()
    problems = []
    for expected in DEAD_LETTER_SCHEMA.fields:
        found = next((f for f in schema.fields if f.name == expected.name), None)
        if found is None:
            problems.append(f"column {expected.name!r} ({expected.field_type}) is missing")
        elif found.field_type != expected.field_type:
            problems.append(f"column {expected.name!r} is {found.field_type}, expected {expected.field_type}")
        elif found.required and not expected.required:
            problems.append(f"column {expected.name!r} is required, expected optional")
    if not table.spec().is_unpartitioned():
        problems.append("it is partitioned; dead-letter tables are written unpartitioned")
    if problems:
        raise DeadLetterTableError(f"dead-letter table {identifier}: " + "; ".join(problems))
    return table


# The dead-letter table: each invalid record with its raw value, why it is invalid and which run held it back.
DEAD_LETTER_SCHEMA = Schema(
    NestedField(1, "record_id", StringType(), required=True),
    NestedField(2, "topic", StringType(), required=True),
    NestedField(3, "partition", IntegerType(), required=True),
    NestedField(4, "offset", LongType(), required=True),
    NestedField(5, "timestamp_ms", LongType(), required=True),
    NestedField(6, "value", BinaryType(), required=False),
    NestedField(7, "error", StringType(), required=True),
    NestedField(8, "schema_path", StringType(), required=False),  # JSON Pointer of the violated schema keyword
    NestedField(9, "run_id", StringType(), required=True),
    NestedField(10, "ingested_at", TimestamptzType(), required=True),
)
DEAD_LETTER_ARROW_SCHEMA = schema_to_pyarrow(DEAD_LETTER_SCHEMA, include_field_ids=False)


@dataclass(frozen=True)
class DeadLetterTarget:
    """Where a run's tasks write dead-letter data files (pickled into the ingestion job's tasks): the dead-letter
    table's sink job, whose writer directory the run's record names like the table's own (so crash leftovers are
    found by the same cleanup), and `ingested_at_us` (UTC microseconds), the same for every row of a run."""

    sink: SinkJob
    ingested_at_us: int

    def file_io(self) -> FileIO:
        return self.sink.file_io()


def dead_letter_target(table: Table, run_id: str, *, target_file_size_bytes: int,
                       ingested_at: datetime | None = None, data_dir: str | None = None) -> DeadLetterTarget:
    """What the run's Spark tasks need to write dead-letter files of `table` (`ingested_at` defaults to now) into
    `data_dir` (the run's writer directory of the dead-letter table, else a new one)."""
    ingested_at = ingested_at or datetime.now(UTC)
    return DeadLetterTarget(sink=SinkJob.for_table(table, run_id, target_file_size_bytes, data_dir),
                            ingested_at_us=int(ingested_at.timestamp() * 1_000_000))


@dataclass(frozen=True)
class StagedDeadLetters:
    """A run's dead letters staged in `table_name` as snapshot `snapshot_id` (on no branch yet)."""

    table_name: str
    snapshot_id: int
    records: int

    def summary_properties(self) -> dict[str, str]:
        """For the table's commit, so a later run can publish them if this one stops before it does."""
        return {DEAD_LETTER_TABLE_PROPERTY: self.table_name, STAGED_SNAPSHOT_PROPERTY: str(self.snapshot_id),
                DEAD_LETTER_RECORDS_PROPERTY: str(self.records)}

    @classmethod
    def from_summary(cls, snapshot: Snapshot) -> StagedDeadLetters | None:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if STAGED_SNAPSHOT_PROPERTY not in summary:
            return None
        return cls(summary[DEAD_LETTER_TABLE_PROPERTY], int(summary[STAGED_SNAPSHOT_PROPERTY]),
                   int(summary.get(DEAD_LETTER_RECORDS_PROPERTY, "0")))


def stage_dead_letters(table: Table, files: list[DataFile], *, run_id: str, source_table: str, topic: str,
                       offset_ranges: Mapping[int, tuple[int, int]]) -> StagedDeadLetters | None:
    """Step 2: commit `files` as a staged snapshot of the dead-letter `table` (None when there are no files and no
    dead letters of the offsets to replace).

    `offset_ranges`: partition → [start, end) offsets the run commits; its publication replaces the dead letters of
    these offsets. So with no files, a staged snapshot is still made (of no file) when `table` may hold dead letters
    of these offsets (they are read again after a move back or a rollback and are valid now): its publication
    removes them. `table` is the view opened after `publish_pending_dead_letters`: no other run publishes dead letters
    of the run's leased partitions since."""
    if not files and not _may_hold(table, topic, offset_ranges):
        return None
    table_name = ".".join(table.name())
    properties = {RUN_ID_PROPERTY: run_id, SOURCE_TABLE_PROPERTY: source_table,
                  OFFSET_RANGES_PROPERTY_PREFIX + topic: format_ranges_property(offset_ranges)}
    # branch=None: a snapshot no ref points at (Iceberg's "stage only"), invisible until published.
    with (catalog_errors(catalog_endpoint(table.catalog)), table.transaction() as transaction,
          transaction.update_snapshot(snapshot_properties=properties, branch=None).fast_append() as append):
        for data_file in files:
            append.append_data_file(data_file)
        snapshot_id = append.snapshot_id
    staged = StagedDeadLetters(table_name, snapshot_id, sum(f.record_count for f in files))
    log.info("dead-letter table %s: run %s staged %d invalid records of %s in %d files as snapshot %d", table_name,
             run_id, staged.records, source_table, len(files), snapshot_id)
    return staged


def publish_dead_letters(table: Table, staged: StagedDeadLetters, *, source_snapshot_id: int,
                         max_attempts: int = DEFAULT_PUBLISH_ATTEMPTS) -> int:
    """Step 4: append the staged snapshot's files to the dead-letter table's branch, unless a snapshot on the branch
    already published it; returns the snapshot id that holds them."""
    table_name = ".".join(table.name())
    endpoint = catalog_endpoint(table.catalog)
    attempt = 0
    while True:
        attempt += 1
        with catalog_errors(endpoint):
            table.refresh()
        published = _published_snapshot(table, staged.snapshot_id)
        if published is not None:
            log.info("dead-letter table %s: staged snapshot %d is already published as %d", table_name,
                     staged.snapshot_id, published.snapshot_id)
            return published.snapshot_id
        staged_snapshot = table.metadata.snapshot_by_id(staged.snapshot_id)
        if staged_snapshot is None:
            raise DeadLetterRecoveryError(
                f"dead-letter table {table_name}: staged snapshot {staged.snapshot_id} holding {staged.records} "
                f"invalid records (table snapshot {source_snapshot_id}) no longer exists (expired?); those records "
                "are in neither table")
        summary = summary_properties(staged_snapshot)
        # The dead letters the table may hold of the staged offsets (read again after a move back or a rollback)
        # are replaced in the same commit; the ends say when there can be none (the usual case: no manifest read).
        ranges = _staged_ranges(table_name, staged_snapshot)
        ends = {topic: dead_letter_ends(table, topic) for topic in ranges}
        replaced = {topic: {p: (start, end) for p, (start, end) in by_partition.items()
                            if start < ends[topic].get(p, 0)} for topic, by_partition in ranges.items()}
        properties = {**{k: v for k, v in summary.items() if k.startswith(KAFSCALE_PROPERTY_PREFIX)},
                      **_ends_properties(table, {topic: {**ends[topic], **{p: max(ends[topic].get(p, 0), end)
                                                                        for p, (_, end) in by_partition.items()}}
                                                 for topic, by_partition in ranges.items()}),
                      STAGED_SNAPSHOT_PROPERTY: str(staged.snapshot_id),
                      SOURCE_SNAPSHOT_PROPERTY: str(source_snapshot_id)}
        try:
            with catalog_errors(endpoint):
                append_without_client_retries(table, _added_files(table, staged_snapshot), properties,
                                              replacing=_rows_of(replaced))
        except CommitFailedException as exc:
            if attempt == max_attempts:
                raise DeadLetterError(f"dead-letter table {table_name}: publishing staged snapshot "
                                      f"{staged.snapshot_id} lost to concurrent commits {attempt} times") from exc
            time.sleep(_RETRY_WAIT_SECONDS * attempt)
            continue
        snapshot_id = committed_snapshot_id(table)
        log.info("dead-letter table %s: published %d invalid records of run %s as snapshot %d%s", table_name,
                 staged.records, summary.get(RUN_ID_PROPERTY), snapshot_id,
                 f", replacing those it held of the offsets {_describe(replaced)}" if _rows_of(replaced) else "")
        return snapshot_id


@dataclass(frozen=True)
class PendingDeadLetters:
    """What `publish_pending_dead_letters` did: dead-letter snapshots published now, staged dead letters found gone
    (one message each, naming the run, the records and the offsets at stake), and the table snapshot through which
    every staged dead letter is now settled (for the next commit's `published_through_properties`)."""

    published: list[int] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    through_snapshot_id: int | None = None

    def published_through_properties(self) -> dict[str, str]:
        if self.through_snapshot_id is None:
            return {}
        return {PUBLISHED_THROUGH_PROPERTY: str(self.through_snapshot_id)}


@timed("pending dead letters")
def publish_pending_dead_letters(table: Table, catalog: Catalog) -> PendingDeadLetters:
    """Publish the staged dead letters of `table`'s snapshots that a stopped run did not publish (oldest first), and
    record those that can no longer be published (`_record_lost`). Call it at the start of every run, before it
    commits.

    Invariant on return: every staged snapshot named by a table snapshot from the current one back to the
    `published-through` snapshot the newest of our commits names (the whole retained history on tables written
    before that marker) is published or recorded lost on its dead-letter table; `through_snapshot_id` says so for
    the next commit. A published snapshot does not end the walk: runs on disjoint partitions commit in any order,
    so an earlier run's unpublished staged snapshot may lie behind a later run's published one.

    Cost: the table snapshots of that window (normally the previous run's commit and what was committed since), and,
    per dead-letter table named in it, one pass over that table's retained main-branch history; both from the
    metadata already loaded, no manifest is read. A crash anywhere leaves the markers as they were: the next run
    walks the same window again and publishing is idempotent per staged snapshot."""
    pending, dead_letter_tables = _unsettled_staged(table, catalog)
    outcome = PendingDeadLetters(through_snapshot_id=table.metadata.current_snapshot_id)
    for snapshot, staged in reversed(pending):
        run_id = summary_properties(snapshot).get(RUN_ID_PROPERTY)
        log.warning("table %s snapshot %d (run %s): its %d invalid records were staged but not published to %s; "
                    "publishing them now", ".".join(table.name()), snapshot.snapshot_id, run_id, staged.records,
                    staged.table_name)
        dead_letter_table = dead_letter_tables[staged.table_name]
        try:
            outcome.published.append(publish_dead_letters(dead_letter_table, staged,
                                                          source_snapshot_id=snapshot.snapshot_id))
        except DeadLetterRecoveryError as exc:
            outcome.lost.append(_record_lost(dead_letter_table, staged, table, snapshot, str(exc)))
    return outcome


def _unsettled_staged(table: Table,
                      catalog: Catalog) -> tuple[list[tuple[Snapshot, StagedDeadLetters]], dict[str, Table]]:
    """The snapshots of `_unsettled_window` whose staged snapshot its dead-letter table neither published nor
    recorded lost (newest first), and the dead-letter tables they name (opened, created when missing)."""
    pending: list[tuple[Snapshot, StagedDeadLetters]] = []
    dead_letter_tables: dict[str, Table] = {}
    settled: dict[str, set[int]] = {}
    for snapshot in _unsettled_window(table):
        staged = StagedDeadLetters.from_summary(snapshot)
        if staged is None:
            continue
        if staged.table_name not in dead_letter_tables:
            dead_letter_tables[staged.table_name] = open_dead_letter_table(catalog, staged.table_name)
            settled[staged.table_name] = settled_staged_ids(dead_letter_tables[staged.table_name])
        if staged.snapshot_id not in settled[staged.table_name]:
            pending.append((snapshot, staged))
    return pending, dead_letter_tables


def _unsettled_window(table: Table) -> Iterator[Snapshot]:
    """`table`'s snapshots from the current one back to (not including) the `published-through` snapshot named by
    the newest snapshot carrying one; to the oldest retained one when none does, or when the named one is not an
    ancestor (expired, or the branch was rolled back)."""
    stop_at: int | None = None
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if snapshot.snapshot_id == stop_at:
            return
        yield snapshot
        through = snapshot.summary.get(PUBLISHED_THROUGH_PROPERTY) if snapshot.summary else None
        if through is not None and stop_at is None:
            stop_at = int(through)


def settled_staged_ids(dead_letter_table: Table) -> set[int]:
    """The staged snapshot ids the main branch of `dead_letter_table` names: published (`publish_dead_letters`) or
    recorded lost (`_record_lost`); either way settled for good."""
    return {int(s.summary.additional_properties[STAGED_SNAPSHOT_PROPERTY])
            for s in ancestry(dead_letter_table)
            if s.summary is not None and STAGED_SNAPSHOT_PROPERTY in s.summary.additional_properties}


def _record_lost(dead_letter_table: Table, staged: StagedDeadLetters, table: Table, snapshot: Snapshot,
                 reason: str) -> str:
    """Report staged dead letters that cannot be published, and mark them settled so later runs go on."""
    ranges = _committed_ranges(table, snapshot)
    run_id = summary_properties(snapshot).get(RUN_ID_PROPERTY)
    message = (f"{reason}. Run {run_id} committed table {'.'.join(table.name())} "
               f"snapshot {snapshot.snapshot_id}; its invalid records lie in the offsets "
               f"{ranges or 'of that snapshot'}: replay them to recover them")
    log.error("%s", message)
    properties = {
        STAGED_SNAPSHOT_PROPERTY: str(staged.snapshot_id),
        SOURCE_SNAPSHOT_PROPERTY: str(snapshot.snapshot_id),
        LOST_RECORDS_PROPERTY: str(staged.records),
        SOURCE_TABLE_PROPERTY: ".".join(table.name()),
    }
    with catalog_errors(catalog_endpoint(dead_letter_table.catalog)):
        dead_letter_table.refresh()
        properties.update(_ends_properties(dead_letter_table, {}))
        append_without_client_retries(dead_letter_table, [], properties)
    return message


def _committed_ranges(table: Table, snapshot: Snapshot) -> dict[str, dict[int, list[int]]]:
    """Per topic and partition, [start, end) of the offsets `snapshot` committed (start from the previous commit)."""
    table_name = ".".join(table.name())
    newer = parse_commit(snapshot, table_name=table_name)
    older: CommittedOffsets = {}
    parent = (
        table.metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    )
    for ancestor in ancestors_of(parent, table.metadata):
        commit = parse_commit(ancestor, table_name=table_name)
        if commit is not None:
            older = commit.offsets
            break
    return {
        topic: {
            p: [older.get(topic, {}).get(p, 0), end]
            for p, end in offsets.items()
            if older.get(topic, {}).get(p, 0) != end
        }
        for topic, offsets in (newer.offsets if newer is not None else {}).items()
    }


def _published_snapshot(table: Table, staged_snapshot_id: int) -> Snapshot | None:
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if snapshot.summary is not None and snapshot.summary.get(STAGED_SNAPSHOT_PROPERTY) == str(staged_snapshot_id):
            return snapshot
    return None


def _added_files(table: Table, snapshot: Snapshot) -> list[DataFile]:
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id
    ]


# ------------------------------------------------------------------------------------------ offsets read again


def dead_letter_ends(table: Table, topic: str) -> dict[int, int]:
    """Per partition of `topic`, an offset at or beyond which the dead-letter `table` holds no dead letter of it
    (absent: none of the partition): `kafscale.dead-letter.ends.<topic>` of the newest snapshot of ours carrying
    the ends map; when it has none for the topic (a table written before the key existed), one scan of the
    topic's `partition` and `offset` columns, once: the next publication records it."""
    known = _known_ends(table, topic)
    if known is not None:
        return known
    rows = table.scan(row_filter=EqualTo("topic", topic), selected_fields=("partition", "offset")).to_arrow()
    ends: dict[int, int] = {}
    for partition, offset in zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True):
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def _known_ends(table: Table, topic: str) -> dict[int, int] | None:
    """The recorded ends of `topic` (`dead_letter_ends`), None when not recorded; a table without rows has none."""
    current = table.current_snapshot()
    if current is None or (current.summary is not None and current.summary.get(TOTAL_RECORDS) == "0"):
        return {}
    carried = _carried_ends(table)
    value = carried.get(DEAD_LETTER_ENDS_PROPERTY_PREFIX + topic)
    if value is None:
        return None
    return parse_offsets_property(value, where=f"dead-letter table {'.'.join(table.name())} property "
                                               f"{DEAD_LETTER_ENDS_PROPERTY_PREFIX + topic}")


def _carried_ends(table: Table) -> dict[str, str]:
    """Every topic's ends property of the newest snapshot on the branch carrying any (each of ours carries all)."""
    for snapshot in ancestry(table):
        ends = {k: v for k, v in summary_properties(snapshot).items()
                if k.startswith(DEAD_LETTER_ENDS_PROPERTY_PREFIX)}
        if ends:
            return ends
    return {}


def _ends_properties(table: Table, new_ends: Mapping[str, Mapping[int, int]]) -> dict[str, str]:
    """The ends properties of our next snapshot of `table`: every topic's as carried, those of `new_ends` replaced
    (a topic's whole map)."""
    properties = dict(_carried_ends(table))
    for topic, ends in new_ends.items():
        properties[DEAD_LETTER_ENDS_PROPERTY_PREFIX + topic] = format_offsets_property(ends)
    return properties


def _may_hold(table: Table, topic: str, offset_ranges: Mapping[int, tuple[int, int]]) -> bool:
    """Whether the dead-letter `table` may hold dead letters of `offset_ranges` (unknown ends: it may)."""
    ends = _known_ends(table, topic)
    return ends is None or any(start < ends.get(p, 0) for p, (start, _) in offset_ranges.items())


def _staged_ranges(table_name: str, snapshot: Snapshot) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic, the [start, end) offsets per partition whose dead letters the staged `snapshot` holds."""
    return {key[len(OFFSET_RANGES_PROPERTY_PREFIX):]: parse_skipped_property(
                value, where=f"dead-letter table {table_name} snapshot {snapshot.snapshot_id} property {key}")
            for key, value in summary_properties(snapshot).items() if key.startswith(OFFSET_RANGES_PROPERTY_PREFIX)}


def _rows_of(ranges: Mapping[str, Mapping[int, tuple[int, int]]]) -> BooleanExpression | None:
    """The dead letters of these offsets ([start, end) per topic and partition); None when there are none."""
    clauses: list[BooleanExpression] = [
        reduce(And, [EqualTo("topic", topic), EqualTo("partition", partition), GreaterThanOrEqual("offset", start),
                     LessThan("offset", end)])
        for topic, by_partition in sorted(ranges.items()) for partition, (start, end) in sorted(by_partition.items())]
    return reduce(Or, clauses) if clauses else None


def _describe(ranges: Mapping[str, Mapping[int, tuple[int, int]]]) -> str:
    return ", ".join(f"{topic} partition {p} {start}..{end - 1}" for topic, by_partition in sorted(ranges.items())
                     for p, (start, end) in sorted(by_partition.items()))
