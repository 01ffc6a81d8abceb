"""Rewriting a table's data files in one snapshot: compaction (engine/maintenance.py) and replay (engine/replay.py).

`run_rewrite_job` reads groups of data files in a Spark job (one task per group) and writes their rows again with
the sink's `RollingDataFiles`, optionally without the records of one topic partition's offset range (`RecordRange`:
what a replay replaces). `commit_rewrite` commits one overwrite snapshot (pyiceberg 0.12 has no `replace`
operation) that removes some files and adds others, carrying the offsets of every topic forward. Each attempt
re-reads the table: a concurrent commit makes the catalog refuse ours (pyiceberg's own retries are off, as for our
appends) and we retry on the new state; if a file to remove is gone (another compaction, a delete), the rewrite is
abandoned (`RewriteAbandonedError`) so nothing is lost or doubled. An answer that does not say whether the commit
landed is settled by looking for the rewrite's marker in the table; if it is not there either, the files are kept
(`CommitOutcomeUnknownError`): they may be referenced.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan, Not
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table, TableProperties
from pyiceberg.table.metadata import TableMetadataUtil
from pyspark.sql import SparkSession

from kafscale_lakehouse.engine.catalog import catalog_endpoint, catalog_errors
from kafscale_lakehouse.engine.iceberg_sink import RollingDataFiles, SinkJob
from kafscale_lakehouse.engine.run_files import remove_run_files, run_table
from kafscale_lakehouse.engine.snapshot_summary import (
    OFFSETS_PROPERTY_PREFIX,
    ancestry,
    format_offsets_property,
    read_committed_offsets,
)
from kafscale_lakehouse.engine.table_offsets import CommitOutcomeUnknownError, commit_settled, without_client_retries
from kafscale_lakehouse.offsets.ranges import OffsetRange

log = logging.getLogger(__name__)

_OUTPUT_SCHEMA = "task_output binary"


class RewriteAbandonedError(RuntimeError):
    """Files the rewrite replaces were removed by another commit; the rewrite's own files were deleted."""


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
class RewriteTasks:
    """Pickled into the job's closure: each task reads its group's files and writes their rows again (those of
    `without` left out)."""

    sink: SinkJob
    groups: tuple[tuple[DataFile, ...], ...]
    without: RecordRange | None = None

    def __call__(self, task_ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in task_ids:
            for task_id in batch.column(0).to_pylist():
                files = self.rewrite(task_id)
                yield pa.RecordBatch.from_pydict({"task_output": [pickle.dumps(files, pickle.HIGHEST_PROTOCOL)]})

    def rewrite(self, task_id: int) -> list[DataFile]:
        metadata = TableMetadataUtil.parse_raw(self.sink.table_metadata_json)
        row_filter = AlwaysTrue() if self.without is None else Not(self.without.expression())
        scan = ArrowScan(metadata, self.sink.file_io(), metadata.schema(), row_filter)
        writer = RollingDataFiles(self.sink, task_id)
        try:
            for data_file in self.groups[task_id]:
                rows = scan.to_table([FileScanTask(data_file)])
                for chunk in writer.checked(rows.to_batches()):
                    writer.write(pa.Table.from_batches([chunk]))
            return writer.close()
        except BaseException:
            writer.discard()
            raise


def run_rewrite_job(spark: SparkSession, table: Table, rewrite_id: str, groups: Sequence[Sequence[DataFile]], *,
                    target_file_size_bytes: int, without: RecordRange | None = None) -> list[DataFile]:
    """The files of each group rewritten by one Spark task into files of about `target_file_size_bytes`, in the
    rewrite's own directory (`run_files.run_table`), uncommitted. If the job fails, what it wrote is deleted."""
    if not groups:
        return []
    sink = SinkJob.for_table(table, rewrite_id, target_file_size_bytes)
    tasks = RewriteTasks(sink, tuple(tuple(g) for g in groups), without)
    job = spark.range(0, len(groups), 1, numPartitions=len(groups)).mapInArrow(tasks, _OUTPUT_SCHEMA)
    try:
        return [f for row in job.collect() for f in pickle.loads(row.task_output)]  # noqa: S301 - our own tasks' output
    except Exception:
        remove_run_files(table, run_table(table, rewrite_id).data_dir)
        raise


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
                   positions: tuple[str, Mapping[int, int]] | None = None) -> tuple[int, int]:
    """One overwrite snapshot removing `removed` and adding `added` (see the module docstring); returns its id and
    the attempts it took. `marker` (a summary property unique to this rewrite) finds a commit whose answer was lost;
    `check` runs on the refreshed table before every attempt (it raises to stop). `table` holds the new state.
    `positions` (topic, {partition: next offset}) sets those partitions' offsets instead of carrying them forward.

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
        current = {task.file.file_path for task in table.scan().plan_files()} if removed_paths else set()
        gone = removed_paths - current
        if gone:
            raise RewriteAbandonedError(
                f"table {table_name}: {len(gone)} files that {what} replaces were removed by another commit (e.g. "
                f"{sorted(gone)[0]}); {what} abandoned, its files deleted; run it again")
        if check is not None:
            check(table)
        committed = dict(read_committed_offsets(table))
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
                        rewrite.delete_data_file(data_file)  # type: ignore[union-attr]
                    for data_file in added:
                        rewrite.append_data_file(data_file)
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
        return table.metadata.current_snapshot_id, attempt
    raise AssertionError("unreachable")


def _landed(table: Table, key: str, value: str, since: int | None) -> int | None:
    """The snapshot committed after `since` whose summary has `key` = `value`, or None."""
    for snapshot in ancestry(table):
        if snapshot.snapshot_id == since:
            return None
        if snapshot.summary is not None and snapshot.summary.get(key) == value:
            return snapshot.snapshot_id
    return None
