"""Write a Spark DataFrame (or an Arrow table) to an Iceberg table: the general write path of downstream assets.

    result = write_dataframe(catalog, df, TableWrite("rpc.sauce_daily", mode="overwrite", run_id=run_id,
                                                     replace_filter=window_filter))

The DataFrame is written by one Spark job (`mapInArrow`) whose tasks write Parquet data files on the executors with
the ingestion's rolling writer (`engine/tables/data_files.py`) and return only the `DataFile`s; the driver then
makes ONE catalog commit (`engine/tables/writes.py`: table creation, schema changes, the commit and its retries).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from kafscale_lakehouse.engine.tables.data_files import SinkJob, root_cause, write_batches_as_data_files
from kafscale_lakehouse.engine.tables.run_files import remove_run_files
from kafscale_lakehouse.engine.tables.writes import (
    TableWrite,
    TableWriteError,
    TableWriteResult,
    commit_files,
    prepare_table,
)

_OUTPUT_SCHEMA = "data_files binary"


def write_dataframe(catalog: Catalog, df: DataFrame, write: TableWrite) -> TableWriteResult:
    """Write `df` on the executors, then commit once (see the module docstring)."""
    arrow_schema = to_arrow_schema(df.schema, timezone="UTC")
    table, created, added = prepare_table(catalog, write, arrow_schema)
    sink = SinkJob.for_table(table, write.run_id, write.target_file_size_bytes)
    try:
        rows = df.mapInArrow(_WriteTask(sink), _OUTPUT_SCHEMA).collect()
    except Exception as exc:
        # A failed task deleted its own files; those of finished tasks lie in this write's own directory, which
        # no other write (another asset of the table, an earlier attempt of the step) shares.
        remove_run_files(table, sink.data_dir)
        raise TableWriteError(f"writing data files for table {write.identifier} (run {write.run_id}) failed: "
                              f"{root_cause(exc)}") from exc
    data_files = [f for row in rows for f in pickle.loads(row.data_files)]  # noqa: S301 - our own tasks' output
    return commit_files(table, data_files, write, created=created, added=added)


def write_arrow(catalog: Catalog, data: pa.Table, write: TableWrite) -> TableWriteResult:
    """Write an Arrow table from this process (it is already in memory here), then commit once."""
    table, created, added = prepare_table(catalog, write, data.schema)
    sink = SinkJob.for_table(table, write.run_id, write.target_file_size_bytes)
    data_files = write_batches_as_data_files(sink, data.to_batches(), 0)
    return commit_files(table, data_files, write, created=created, added=added)


@dataclass(frozen=True)
class _WriteTask:
    """One Spark task: its Arrow batches become data files; it returns them pickled (nothing is committed)."""

    sink: SinkJob

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()  # set in every Spark task
        task_id = context.partitionId() if context is not None else 0
        files = write_batches_as_data_files(self.sink, batches, task_id)
        yield pa.RecordBatch.from_pydict({"data_files": [pickle.dumps(files, pickle.HIGHEST_PROTOCOL)]})
