"""The Spark job of an ingestion run: each task reads one segment run and writes it as Parquet data files.

A run's records never cross into the JVM. The job is `mapInArrow` over one row per planned `SegmentRunPartition`;
its task fetches and decodes the segments, coerces and validates the values (`kafscale_source.read_input_partition`),
holds back error markers and invalid records (`SourceRowSplitter`, which writes the dead letters), writes the rest
with the sink's file writer (`iceberg_sink.write_batches_as_data_files`) and returns only the `DataFile`s and its
stats, pickled. Going through the `kafscale` source and the Iceberg sink as two Spark data sources costs an Arrow →
row → Arrow conversion of every record in the JVM: about 3 CPU s per 200k records, as much as all our Python work
(benchmarks/README.md).

Like the sink, nothing is committed here: the caller commits the files (`table_offsets.commit_append`) or deletes
them. A task that fails deletes what it wrote; when the job fails, the files of tasks that had finished are found
by the run's file name prefix and deleted.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from kafscale_lakehouse.engine.iceberg_sink import (
    IcebergSinkError,
    SinkJob,
    check_arrow_schema,
    data_file_prefix,
    root_cause,
    write_batches_as_data_files,
)
from kafscale_lakehouse.engine.kafscale_source import (
    SOURCE_STATUS_COLUMNS,
    KafscaleReadOptions,
    SegmentRunPartition,
    read_input_partition,
    source_arrow_schema,
)
from kafscale_lakehouse.engine.source_rows import DeadLetterTarget, SourceRowSplitter, SourceTaskStats
from kafscale_lakehouse.engine.table_offsets import cleanup_uncommitted_files

log = logging.getLogger(__name__)

_OUTPUT_SCHEMA = "task_output binary"


@dataclass(frozen=True)
class IngestTaskOutput:
    """What one task wrote: data files of the table (uncommitted) and what it saw of its Kafka partition."""

    task_id: int
    data_files: tuple[DataFile, ...]
    source_stats: SourceTaskStats


@dataclass(frozen=True)
class _IngestTasks:
    """Everything a task needs, pickled once into the job's closure (read options travel as their string form)."""

    read_options: dict[str, str]
    input_partitions: tuple[SegmentRunPartition, ...]
    sink: SinkJob
    dead_letters: DeadLetterTarget | None

    def __call__(self, task_ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        read_options = KafscaleReadOptions.from_options(self.read_options)
        store = read_options.store.open()
        for batch in task_ids:
            for task_id in batch.column(0).to_pylist():
                output = self._run(store, read_options, task_id)
                yield pa.RecordBatch.from_pydict({"task_output": [pickle.dumps(output, pickle.HIGHEST_PROTOCOL)]})

    def _run(self, store, read_options: KafscaleReadOptions, task_id: int) -> IngestTaskOutput:
        partition = self.input_partitions[task_id]
        splitter = SourceRowSplitter(self.dead_letters, task_id)
        records = read_input_partition(store, partition, read_options.columns, read_options.on_segment_error,
                                       read_options.json_schema, read_options.lfs, splitter.stats.lfs)
        try:
            data_files = write_batches_as_data_files(self.sink, splitter.rows_to_write(records), task_id)
        except BaseException:
            splitter.discard_dead_letters()
            raise
        return IngestTaskOutput(task_id, tuple(data_files), splitter.stats)


def run_ingest_job(spark: SparkSession, table: Table, run_id: str, read_options: KafscaleReadOptions,
                   input_partitions: Sequence[SegmentRunPartition], *, target_file_size_bytes: int,
                   dead_letters: tuple[Table, DeadLetterTarget] | None = None) -> list[IngestTaskOutput]:
    """Read `input_partitions` and write them as data files of `table` (and invalid records as data files of the
    dead-letter table), one Spark task per input partition; returns each task's output, nothing committed.

    Raises `IcebergSinkError` naming the table when the job fails, after deleting what its tasks wrote.
    """
    sink = SinkJob.for_table(table, run_id, target_file_size_bytes)
    written = source_arrow_schema(read_options.columns, validated=read_options.json_schema is not None)
    check_arrow_schema(pa.schema([f for f in written if f.name not in SOURCE_STATUS_COLUMNS]), table,
                       what=f"records of topic {read_options.topic}")
    if not input_partitions:
        return []
    tasks = _IngestTasks(read_options.to_options(), tuple(input_partitions), sink,
                         dead_letters[1] if dead_letters else None)
    count = len(input_partitions)
    log.info("table %s run %s: one Spark job of %d tasks over %d segments (%d bytes)", sink.table_name, run_id, count,
             sum(len(p.segments) for p in input_partitions),
             sum(s.kfs_size for p in input_partitions for s in p.segments))
    job = spark.range(0, count, 1, numPartitions=count).mapInArrow(tasks, _OUTPUT_SCHEMA)
    try:
        rows = job.collect()
    except Exception as exc:
        # Failed tasks deleted their own files; those of finished tasks are only known by name.
        prefix = data_file_prefix(run_id)
        cleanup_uncommitted_files(table, prefix)
        if dead_letters is not None:
            cleanup_uncommitted_files(dead_letters[0], prefix)
        raise IcebergSinkError(f"writing data files for table {sink.table_name} (run {run_id}) failed: "
                               f"{root_cause(exc)}") from exc
    outputs = sorted((pickle.loads(row.task_output) for row in rows), key=lambda o: o.task_id)
    data_files = [f for o in outputs for f in o.data_files]
    log.info("table %s run %s: %d data files written (%d rows, %d bytes), not yet committed", sink.table_name, run_id,
             len(data_files), sum(f.record_count for f in data_files), sum(f.file_size_in_bytes for f in data_files))
    return outputs
