"""The Spark job of a rewrite (compaction, replay): groups of a table's data files read again and written as new files.

One task per group reads its files with pyiceberg's `ArrowScan` (delete files applied) and writes their rows again
with the executor-side writer (`engine/tables/data_files.py`), optionally leaving out the records of a `RecordRange`,
and optionally sorted (`sort_by`: compaction of a table with a sort order; the group's rows are sorted in memory).
The files are returned uncommitted; `engine/tables/rewrites.commit_rewrite` commits them.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, Not
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadataUtil
from pyspark.sql import SparkSession

from kafscale_lakehouse.engine.tables.data_files import RollingDataFiles, SinkJob
from kafscale_lakehouse.engine.tables.rewrites import RecordRange
from kafscale_lakehouse.engine.tables.run_files import remove_run_files

_OUTPUT_SCHEMA = "task_output binary"


@dataclass(frozen=True)
class RewriteTasks:
    """Pickled into the job's closure: each task reads its group's files and writes their rows again (those of
    `without` left out), sorted by `sort_by` ((column, "ascending" | "descending"), nulls last) when given."""

    sink: SinkJob
    groups: tuple[tuple[DataFile, ...], ...]
    without: RecordRange | None = None
    sort_by: tuple[tuple[str, str], ...] = ()

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
            for rows in self._rows(scan, self.groups[task_id]):
                for chunk in writer.checked(rows.to_batches()):
                    writer.write(pa.Table.from_batches([chunk]))
            return writer.close()
        except BaseException:
            writer.discard()
            raise

    def _rows(self, scan: ArrowScan, files: Sequence[DataFile]) -> Iterator[pa.Table]:
        """The group's rows: file by file, or all of them sorted by `sort_by`."""
        if not self.sort_by:
            for data_file in files:
                yield scan.to_table([FileScanTask(data_file)])
            return
        yield pa.concat_tables([scan.to_table([FileScanTask(f)]) for f in files]).sort_by(list(self.sort_by))


def run_rewrite_job(spark: SparkSession, table: Table, rewrite_id: str, groups: Sequence[Sequence[DataFile]], *,
                    target_file_size_bytes: int, without: RecordRange | None = None,
                    sort_by: Sequence[tuple[str, str]] = (), data_dir: str | None = None) -> list[DataFile]:
    """The files of each group rewritten by one Spark task into files of about `target_file_size_bytes`, in the
    rewrite's own writer directory (`data_dir`, a directory a run record names, else a new one), uncommitted. If
    the job fails, what it wrote is deleted."""
    if not groups:
        return []
    sink = SinkJob.for_table(table, rewrite_id, target_file_size_bytes, data_dir)
    tasks = RewriteTasks(sink, tuple(tuple(g) for g in groups), without, tuple(sort_by))
    job = spark.range(0, len(groups), 1, numPartitions=len(groups)).mapInArrow(tasks, _OUTPUT_SCHEMA)
    try:
        return [f for row in job.collect() for f in pickle.loads(row.task_output)]  # noqa: S301 - our own tasks' output
    except Exception:
        remove_run_files(table, sink.data_dir)
        raise
