"""Replay of a Kafka partition's offset range: its rows in the table replaced by the records read again from the
segments, in one commit (an explicit replay never duplicates); and an explicit move of
a partition's position in the table.

    result = replay_range(context, mapping, OffsetRange(partition, start, end))
    moved = move_position(context, mapping, partition, next_offset)

For rows landed wrong (a mapping, LFS or decoding problem fixed since). Under the partition's lease (ingestion of
that partition waits, the others go on), registered as a run (run_files.py) so a crash leaves nothing behind:
1. the range must be landed (`end` at most the table's next offset of the partition) and still in the segments
   (no offset of it deleted by retention or missing);
2. one Spark job reads the range's segments, exactly as ingestion does (`run_ingestion_spark_job`), into new data
   files; a segment that cannot be read, or an invalid record, stops the replay with nothing replaced (a replay
   writes no dead letters);
3. the table's files holding rows of the range: those holding only such rows are removed, the others rewritten
   without them (`spark.rewrite_job.run_rewrite_job`);
4. one overwrite snapshot removes the old files and adds the new ones (`rewrites.commit_rewrite`), carrying the
   offsets of every topic forward unchanged: a replay never moves the table's position.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from pyiceberg.expressions.visitors import ROWS_MUST_MATCH
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from kafscale_lakehouse.config import MappingConfig
from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.ingestion.lfs import lfs_read_settings
from kafscale_lakehouse.engine.ingestion.positions import table_identity
from kafscale_lakehouse.engine.ingestion.run import IngestContext, open_mapping_table
from kafscale_lakehouse.engine.ingestion.segment_reader import segment_run_partitions
from kafscale_lakehouse.engine.ingestion.spark_job import IngestionTaskOutput, run_ingestion_spark_job
from kafscale_lakehouse.engine.ingestion.validation import (
    RecordValidation,
    resolve_record_validation,
    with_registered_schemas,
)
from kafscale_lakehouse.engine.spark.rewrite_job import run_rewrite_job
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.audit import AUDIT_COMMANDS, pending_audit
from kafscale_lakehouse.engine.tables.commits import CommitOutcomeUnknownError, delete_data_files, rows_must_match
from kafscale_lakehouse.engine.tables.rewrites import RecordRange, commit_rewrite
from kafscale_lakehouse.engine.tables.run_files import (
    RunRecord,
    clean_ended_runs,
    forget_run,
    record_commit_attempt,
    register_run,
)
from kafscale_lakehouse.engine.tables.summary import (
    RUN_ID_PROPERTY,
    moved_back_summary_properties,
    read_topic_offsets,
    skipped_summary_properties,
)
from kafscale_lakehouse.offsets import Lease, LeaseHeldError
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.storage import OffsetBeyondSegmentsError, SegmentRef, find_gaps, segments_from

log = logging.getLogger(__name__)

REPLAY_PROPERTY = "kafscale.replay"  # on replay snapshots: `<topic>/<partition>/<start>-<end>` (end exclusive)


class ReplayError(EngineError):
    """The replay cannot run or was stopped; nothing was replaced. The message names the table, range and cause."""


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay would replace: the table's files holding rows of the range."""

    table: str
    records: RecordRange
    table_next_offset: int
    removed_files: tuple[DataFile, ...]  # hold only rows of the range
    rewritten_files: tuple[DataFile, ...]  # hold rows of the range and others

    def describe(self) -> str:
        return (f"table {self.table}: {self.records} (the table's next offset of the partition is "
                f"{self.table_next_offset}); {len(self.removed_files)} data files hold only rows of the range and are "
                f"removed, {len(self.rewritten_files)} hold other rows too and are rewritten without them")


@dataclass(frozen=True)
class ReplayResult:
    plan: ReplayPlan
    run_id: str
    snapshot_id: int
    rows_removed: int
    rows_added: int
    files_removed: int
    files_added: int
    attempts: int

    def describe(self) -> str:
        return (f"table {self.plan.table}: replayed {self.plan.records} in snapshot {self.snapshot_id} (run "
                f"{self.run_id}): {self.rows_removed} rows removed, {self.rows_added} rows added, "
                f"{self.files_removed} files removed, {self.files_added} added")


def plan_replay(table: Table, records: RecordRange) -> ReplayPlan:
    """The files of `table` holding rows of `records` (by partition values and column statistics); `ReplayError`
    when the range is not landed yet."""
    table_name = ".".join(table.name())
    offsets = records.offsets
    if offsets.start >= offsets.end:
        raise ReplayError(f"table {table_name}: the range {offsets.start}..{offsets.end - 1} of topic {records.topic} "
                          f"partition {offsets.partition} is empty")
    next_offset = read_topic_offsets(table, records.topic).get(offsets.partition)
    if next_offset is None or offsets.end > next_offset:
        landed = "nothing" if next_offset is None else f"offsets up to {next_offset - 1}"
        raise ReplayError(f"table {table_name}: cannot replay {records}: the table holds {landed} of the partition "
                          f"(a replay replaces landed rows; ingestion lands the rest)")
    must_match = rows_must_match(table.schema(), records.expression())
    removed: list[DataFile] = []
    rewritten: list[DataFile] = []
    for task in table.scan(row_filter=records.expression()).plan_files():
        if task.delete_files:
            raise ReplayError(f"table {table_name}: {task.file.file_path} has delete files (written by another "
                              "engine); a replay rewrites data files only. Compact the table with that engine first")
        (removed if must_match(task.file) == ROWS_MUST_MATCH else rewritten).append(task.file)
    return ReplayPlan(table_name, records, next_offset, tuple(removed), tuple(rewritten))


def replay_range(context: IngestContext, mapping: MappingConfig, offsets: OffsetRange, *,
                 run_id: str | None = None) -> ReplayResult:
    """Replace the rows of `offsets` of the mapping's topic with the records read again (see the module docstring)."""
    if mapping.mode == "upsert":
        # The rows of an upsert table are the latest record per key, not the records of an offset range: putting the
        # range's records back would bring superseded and deleted rows back.
        raise ReplayError(f"table {mapping.table} is an upsert table (mappings[].mode upsert): an offset range cannot "
                          "be replayed into it; move the partition back instead (offsets reset --partition P "
                          "--to-offset N), and the next run applies the records from N again")
    topic = mapping.topic
    run_id = run_id or f"replay-{uuid.uuid4().hex}"
    records = RecordRange(topic, offsets)
    validation, table = _open_table(context, mapping)
    table_name = ".".join(table.name())
    lease = _lease(context, table_name, topic, offsets.partition, run_id, f"replay {records}")
    try:
        clean_ended_runs(context.offsets, topic, [table])
        plan = plan_replay(table, records)
        segments = _segments(context, table_name, records)
        record = register_run(context.offsets, [lease], run_id, [table])
        log.info("%s; reading %d segments again (run %s)", plan.describe(), len(segments), run_id)
        try:
            result = _replace(context, mapping, validation, table, plan, segments, lease, record)
        except CommitOutcomeUnknownError:
            raise  # its files may be referenced: the run's record stays, a later run of the topic settles them
        except Exception:
            forget_run(context.offsets, topic, run_id)  # its files are deleted
            raise
        forget_run(context.offsets, topic, run_id)
    finally:
        lease.release()
    log.info("%s", result.describe())
    return result


def _replace(context: IngestContext, mapping: MappingConfig, validation: RecordValidation, table: Table,
             plan: ReplayPlan, segments: list[SegmentRef], lease: Lease, record: RunRecord) -> ReplayResult:
    """Steps 2 to 4 of the module docstring; on an error the files written are deleted (unless the commit's outcome
    is unknown)."""
    records, offsets, topic, run_id = plan.records, plan.records.offsets, mapping.topic, record.run_id
    target = context.config.processor.target_file_size_bytes
    outputs = run_ingestion_spark_job(
        context.spark, table, run_id, context.store, topic, segment_run_partitions(topic, offsets, segments, target),
        columns=validation.columns, json_schema=validation.json_schema, target_file_size_bytes=target,
        lfs=lfs_read_settings(mapping.lfs, validation.mode),
        numeric_timestamp_unit=mapping.schema_config.timestamp_unit, framed_values=validation.framed_values,
        kafka_timestamp=mapping.kafka_timestamp_column, keys=validation.keys, data_dir=record.tables[0].data_dir)
    read_again = [f for output in outputs for f in output.data_files]
    rewritten: list[DataFile] = []
    try:
        _refuse_incomplete(plan.table, records, outputs)
        removed, rewritten = _without_the_range(context, table, plan, run_id, record.tables[0].data_dir)

        def still_landed(current: Table) -> None:
            context.offsets.confirm_lease(lease)
            next_offset = read_topic_offsets(current, topic).get(offsets.partition)
            if next_offset is None or next_offset < offsets.end:
                raise ReplayError(f"table {plan.table}: the table no longer holds {records} (its next offset is now "
                                  f"{next_offset}: rolled back?); nothing replaced")
            record_commit_attempt(context.offsets, [lease], record, current)  # the commit's base, for clean-up

        snapshot_id, attempts = commit_rewrite(
            table, removed, [*read_again, *rewritten],
            marker=(REPLAY_PROPERTY, f"{topic}/{offsets.partition}/{offsets.start}-{offsets.end}-{run_id}"),
            what=f"the replay of {records}", properties={RUN_ID_PROPERTY: run_id}, check=still_landed,
            audit_branch=_audit_branch(mapping))
    except CommitOutcomeUnknownError:
        raise
    except BaseException:
        delete_data_files(table.io, [f.file_path for f in [*read_again, *rewritten]])
        raise
    return ReplayResult(plan, run_id, snapshot_id, rows_removed=_rows_removed(removed, rewritten),
                        rows_added=sum(f.record_count for f in read_again), files_removed=len(removed),
                        files_added=len(read_again) + len(rewritten), attempts=attempts)


@dataclass(frozen=True)
class PositionMove:
    table: str
    topic: str
    partition: int
    before: int | None  # the table's next offset before (None: it held none of the partition)
    after: int
    snapshot_id: int | None
    rows_removed: int = 0

    def describe(self) -> str:
        before = "none" if self.before is None else self.before
        if self.after == self.before:
            return f"table {self.table}: topic {self.topic} partition {self.partition} is already at {self.after}"
        what = (f"offsets {self.before}..{self.after - 1} are skipped (recorded as kafscale.skipped.{self.topic})"
                if self.before is not None and self.after > self.before else
                f"{self.rows_removed} rows of offsets {self.after}.. removed; the next run lands them again"
                if self.before is not None else "the next run starts there")
        return (f"table {self.table}: topic {self.topic} partition {self.partition} next offset {before} -> "
                f"{self.after} in snapshot {self.snapshot_id}: {what}")


def move_position(context: IngestContext, mapping: MappingConfig, partition: int, next_offset: int, *,
                  dry_run: bool = False, skipping_from: int | None = None) -> PositionMove:
    """Set the table's next offset of `partition` to `next_offset`, in one snapshot, then the offsets store to it.

    Forward: the offsets between are never landed, recorded as skipped (`kafscale.skipped.<topic>`, as allow_gaps
    does). Backward: the table's rows from `next_offset` on are removed in the same commit (files rewritten as a
    replay does), so the next run lands them again, once. A partition the table holds no offsets of starts at
    `next_offset`. With `dry_run`, only what would change (rows are not counted). `skipping_from` (an operator's
    skip of `skipping_from..next_offset - 1`, `offsets skip`): the move is refused unless the table is there (or holds
    none of the partition), and the skip is recorded in both cases."""
    topic = mapping.topic
    _, table = _open_table(context, mapping)
    table_name = ".".join(table.name())
    if next_offset < 0:
        raise ReplayError(f"table {table_name}: next offset {next_offset} of partition {partition} is negative")
    before = read_topic_offsets(table, topic).get(partition)
    if dry_run or before == next_offset:
        return PositionMove(table_name, topic, partition, before, next_offset, None)
    run_id = f"position-{uuid.uuid4().hex}"
    lease = _lease(context, table_name, topic, partition, run_id, f"move partition {partition}")
    try:
        table.refresh()  # a run may have committed the partition before we held its lease
        before = read_topic_offsets(table, topic).get(partition)
        if skipping_from is not None and (before not in (None, skipping_from) or next_offset <= skipping_from):
            raise ReplayError(f"table {table_name}: cannot skip offsets {skipping_from}..{next_offset - 1} of topic "
                              f"{topic} partition {partition}: the table's next offset is now {before}")
        start = before if before is not None else skipping_from  # nothing committed: a skip is still recorded
        if start is None or next_offset > start:
            skipped = {} if start is None else {partition: (start, next_offset)}
            commit = commit_append(table, [], topic, {partition: start if start is not None else next_offset},
                                   {partition: next_offset}, run_id,
                                   snapshot_properties=skipped_summary_properties(topic, skipped),
                                   audit_branch=_audit_branch(mapping))
            move = PositionMove(table_name, topic, partition, start, next_offset, commit.snapshot_id)
        else:
            move = _move_back(context, table, RecordRange(topic, OffsetRange(partition, next_offset, start)), lease,
                              run_id, _audit_branch(mapping))
        now = read_topic_offsets(table, topic)
        context.offsets.repair_offsets([lease], {partition: (now[partition], 0)})
        context.offsets.record_table_identity([lease], table_identity(table, now))
    finally:
        lease.release()
    log.warning("%s", move.describe())
    return move


def _move_back(context: IngestContext, table: Table, records: RecordRange, lease: Lease, run_id: str,
               audit_branch: str | None) -> PositionMove:
    plan = plan_replay(table, records)
    record = register_run(context.offsets, [lease], run_id, [table])
    rewritten: list[DataFile] = []
    try:
        removed, rewritten = _without_the_range(context, table, plan, run_id, record.tables[0].data_dir)

        def holds_lease(current: Table) -> None:
            context.offsets.confirm_lease(lease)
            record_commit_attempt(context.offsets, [lease], record, current)  # the commit's base, for clean-up

        snapshot_id, _ = commit_rewrite(
            table, removed, rewritten, marker=(REPLAY_PROPERTY, f"{records.topic}/{records.offsets.partition}/"
                                                               f"position-{records.offsets.start}-{run_id}"),
            what=f"the removal of {records}", check=holds_lease,
            # Says the move back is deliberate (the offsets_contiguous check accepts exactly this one).
            properties={RUN_ID_PROPERTY: run_id, **moved_back_summary_properties(
                records.topic, {records.offsets.partition: (records.offsets.start, plan.table_next_offset)})},
            positions=(records.topic, {records.offsets.partition: records.offsets.start}),
            expected=(records.topic, {records.offsets.partition: plan.table_next_offset}), audit_branch=audit_branch)
    except CommitOutcomeUnknownError:
        raise
    except BaseException:
        delete_data_files(table.io, [f.file_path for f in rewritten])
        forget_run(context.offsets, records.topic, run_id)
        raise
    forget_run(context.offsets, records.topic, run_id)
    return PositionMove(plan.table, records.topic, records.offsets.partition, plan.table_next_offset,
                        records.offsets.start, snapshot_id, rows_removed=_rows_removed(removed, rewritten))


def _audit_branch(mapping: MappingConfig) -> str | None:
    """The branch whose pending audit a commit to main must not strand (each attempt re-checks it)."""
    return mapping.audit_branch if mapping.publish == "audited" else None


def _open_table(context: IngestContext, mapping: MappingConfig) -> tuple[RecordValidation, Table]:
    validation = resolve_record_validation(context.config, mapping, context.registry)
    table = open_mapping_table(context, mapping, validation.columns, validation.registered_values)
    branch = _audit_branch(mapping)
    pending = pending_audit(table, branch) if branch is not None else None
    if pending is not None:  # a commit to main now would make the audited snapshot's fast-forward impossible
        raise ReplayError(f"table {mapping.table}: audit branch {pending.branch} holds snapshot {pending.snapshot_id} "
                          f"of run {pending.run_id} that main does not; settle it first: "
                          f"{AUDIT_COMMANDS.format(table=mapping.table)}")
    return with_registered_schemas(validation, table, mapping.table), table


def _lease(context: IngestContext, table_name: str, topic: str, partition: int, run_id: str, what: str) -> Lease:
    try:
        return context.offsets.acquire_lease(topic, partition, f"{context.owner_id}-{run_id[:17]}")
    except LeaseHeldError as exc:
        raise ReplayError(f"table {table_name}: cannot {what} while a run holds the partition ({exc}); try again "
                          "when it has committed") from exc


def _without_the_range(context: IngestContext, table: Table, plan: ReplayPlan, run_id: str,
                       data_dir: str) -> tuple[list[DataFile], list[DataFile]]:
    """The files the plan replaces, and the rewrites (uncommitted, into the run's recorded `data_dir`) of those that
    hold other rows too."""
    rewritten = run_rewrite_job(context.spark, table, run_id, [[f] for f in plan.rewritten_files],
                                target_file_size_bytes=context.config.processor.target_file_size_bytes,
                                without=plan.records, data_dir=data_dir)
    return [*plan.removed_files, *plan.rewritten_files], rewritten


def _rows_removed(removed: list[DataFile], rewritten: list[DataFile]) -> int:
    return sum(f.record_count for f in removed) - sum(f.record_count for f in rewritten)


def _segments(context: IngestContext, table_name: str, records: RecordRange) -> list[SegmentRef]:
    offsets = records.offsets
    try:
        listed = segments_from(context.store, records.topic, offsets.partition, offsets.start).segments
    except OffsetBeyondSegmentsError as exc:
        raise ReplayError(f"table {table_name}: cannot replay {records}: {exc}") from exc
    segments = [s for s in listed if s.base_offset < offsets.end]
    gaps = [g for g in find_gaps(segments, next_offset=offsets.start) if g.expected_offset < offsets.end]
    if not segments or gaps or segments[-1].last_offset < offsets.end - 1:
        missing = (f"offsets {gaps[0].expected_offset}..{min(gaps[0].found_offset, offsets.end) - 1} are missing "
                   f"before {gaps[0].kfs_key}" if gaps else "its offsets are not all in completed segments")
        raise ReplayError(f"table {table_name}: cannot replay {records}: {missing} (deleted by retention?); the "
                          "rows in the table are kept as they are")
    return segments


def _refuse_incomplete(table_name: str, records: RecordRange, outputs: list[IngestionTaskOutput]) -> None:
    failure = next((o.failure for o in outputs if o.failure is not None), None)
    if failure is not None:
        raise ReplayError(f"table {table_name}: cannot replay {records}: segment {failure.key} could not be read "
                          f"({failure.error_type}: {failure.message}); nothing replaced")
    invalid = sum(o.source_stats.invalid_count for o in outputs)
    if invalid:
        samples = ", ".join(s.describe() for o in outputs for s in o.source_stats.invalid_samples[:5])
        raise ReplayError(f"table {table_name}: cannot replay {records}: {invalid} records are invalid now "
                          f"({samples}); a replay writes no dead letters, so nothing was replaced")
