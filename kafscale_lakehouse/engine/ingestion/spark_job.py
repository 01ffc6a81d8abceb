"""The Spark job of an ingestion run (`run_ingestion_spark_job`; the Dagster job that runs a whole ingestion is
another thing): each task reads one segment run and writes it as Parquet data files.

A run's records never cross into the JVM. The job is `mapInArrow` over one row per planned `SegmentRunPartition`;
the tasks share one pickled `IngestionTaskSpec` (the opened segment store, which pickles as its settings, the input
partitions, columns, JSON Schema, sink and dead-letter target). A task fetches and decodes its segments, coerces and
validates the values (`segment_reader.read_input_partition`), holds back invalid records (`SourceRowSplitter`,
which writes the dead letters), writes the rest with the sink's file writer
(`data_files.write_batches_as_data_files`) and returns only an `IngestionTaskOutput`, pickled: the `DataFile`s,
its stats, and the `SegmentReadFailure` when a segment could not be read (the rows before it are written; the
driver commits that Kafka partition only below it). Reading through a Spark data source instead would cost an
Arrow → row → Arrow conversion of every record in the JVM: about 3 CPU s per 200k records, as much as all our
Python work (benchmarks/README.md).

Like the sink, nothing is committed here: the caller commits the files (`appends.commit_append`) or deletes
them. A task that fails deletes what it wrote; when the job fails, the files of tasks that had finished are found
in the writers' own directories and deleted.
"""

from __future__ import annotations

import heapq
import logging
import os
import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from kafscale_lakehouse.engine.ingestion.lfs import LfsReadSettings
from kafscale_lakehouse.engine.ingestion.rows import (
    SourceRowSplitter,
    SourceTaskStats,
    framed_source_schema,
    schema_with_kafka_timestamp,
    schema_with_key_columns,
    with_framed_value_columns,
    with_kafka_timestamp,
    with_key_columns,
)
from kafscale_lakehouse.engine.ingestion.segment_reader import (
    SOURCE_STATUS_COLUMNS,
    SegmentReadError,
    SegmentReadFailure,
    SegmentRunPartition,
    read_input_partition,
    source_arrow_schema,
)
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.commits import delete_data_files
from kafscale_lakehouse.engine.tables.data_files import (
    IcebergSinkError,
    SinkJob,
    check_arrow_schema,
    root_cause,
    write_batches_as_data_files,
)
from kafscale_lakehouse.engine.tables.dead_letters import DeadLetterTarget
from kafscale_lakehouse.engine.tables.run_files import remove_run_files
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.schema.json_values import NumericTimestampUnit
from kafscale_lakehouse.schema.validation import CompiledJsonSchema
from kafscale_lakehouse.storage import SegmentStore
from kafscale_lakehouse.value_formats.decoders import value_decoder
from kafscale_lakehouse.value_formats.framed import FramedValueSchemas
from kafscale_lakehouse.value_formats.keys import KeyDecoder, KeyDecoding

log = logging.getLogger(__name__)

_OUTPUT_SCHEMA = "task_output binary"


@dataclass(frozen=True)
class IngestionTaskOutput:
    """What one task wrote: data files of the table (uncommitted) and what it saw of its Kafka partition; `failure`
    when a segment (or a record's LFS blob) could not be read (its files hold only the rows before it)."""

    task_id: int
    data_files: tuple[DataFile, ...]
    source_stats: SourceTaskStats
    failure: SegmentReadFailure | None = None


@dataclass(frozen=True)
class IngestionTaskSpec:
    """Everything the tasks of one ingestion Spark job need, pickled once into the job's closure."""

    store: SegmentStore  # pickles as its settings; each task opens its own client
    input_partitions: tuple[SegmentRunPartition, ...]
    columns: tuple[Column, ...]
    json_schema: CompiledJsonSchema | None  # validate every value against it (pickles as its document)
    sink: SinkJob
    dead_letters: DeadLetterTarget | None
    lfs: LfsReadSettings | None = None  # what to do with LFS envelope records (mappings[].lfs)
    numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS  # mappings[].schema
    # a registry value format (avro, protobuf, json_schema): decode the values into the table's value columns
    framed_values: FramedValueSchemas | None = None
    kafka_timestamp: bool = False  # mappings[].kafka_timestamp_column: add the record timestamp as a timestamptz
    keys: KeyDecoding | None = None  # mappings[].key_format other than raw: decode the keys into key columns

    def __call__(self, task_ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in task_ids:
            for task_id in batch.column(0).to_pylist():
                output = self.run_task(task_id)
                yield pa.RecordBatch.from_pydict({"task_output": [pickle.dumps(output, pickle.HIGHEST_PROTOCOL)]})

    def run_task(self, task_id: int) -> IngestionTaskOutput:
        """Read input partition `task_id` and write its valid rows (and its dead letters) as data files."""
        failures: list[SegmentReadFailure] = []
        splitter = SourceRowSplitter(self.dead_letters, task_id)
        partition = self.input_partitions[task_id]
        batches = read_input_partition(self.store, partition, self.columns, self.json_schema, self.lfs,
                                       splitter.stats.lfs, numeric_timestamp_unit=self.numeric_timestamp_unit)
        if self.framed_values is not None:  # the columns come from the values' registered schemas, not from JSON
            batches = with_framed_value_columns(batches, value_decoder(self.framed_values), partition,
                                              invalid_stops=self.dead_letters is None)
        if self.keys is not None:
            batches = with_key_columns(batches, KeyDecoder(self.keys), partition,
                                       invalid_stops=self.dead_letters is None)
        if self.kafka_timestamp:
            batches = with_kafka_timestamp(batches)
        records = _until_failure(batches, failures)
        try:
            data_files = write_batches_as_data_files(self.sink, splitter.rows_to_write(records), task_id)
        except BaseException:
            splitter.discard_dead_letters()
            raise
        return IngestionTaskOutput(task_id, tuple(data_files), splitter.stats, failures[0] if failures else None)


def _until_failure(batches: Iterator[pa.RecordBatch], failures: list[SegmentReadFailure]) -> Iterator[pa.RecordBatch]:
    """`batches` up to a segment that cannot be read, whose failure is appended to `failures` instead of raised."""
    try:
        yield from batches
    except SegmentReadError as exc:
        failures.append(exc.failure)


def ingestion_task_spec(table: Table, run_id: str, store: SegmentStore, topic: str,
                        input_partitions: Sequence[SegmentRunPartition], *, columns: Sequence[Column],
                        json_schema: CompiledJsonSchema | None, target_file_size_bytes: int,
                        dead_letters: tuple[Table, DeadLetterTarget] | None = None,
                        lfs: LfsReadSettings | None = None,
                        numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS,
                        framed_values: FramedValueSchemas | None = None, kafka_timestamp: bool = False,
                        keys: KeyDecoding | None = None, data_dir: str | None = None) -> IngestionTaskSpec:
    """The tasks of one table's share of an ingestion Spark job (one per input partition), after checking that what
    they write fits the table (`run_ingestion_spark_job`'s arguments). `data_dir`: the table's writer directory
    that the run's record names (else a new one)."""
    sink = SinkJob.for_table(table, run_id, target_file_size_bytes, data_dir)
    written = (source_arrow_schema(columns, validated=json_schema is not None) if framed_values is None
               else framed_source_schema(framed_values))
    if keys is not None:
        written = schema_with_key_columns(written, keys)
    if kafka_timestamp:
        written = schema_with_kafka_timestamp(written)
    check_arrow_schema(pa.schema([f for f in written if f.name not in SOURCE_STATUS_COLUMNS]), table,
                       what=f"records of topic {topic}")
    return IngestionTaskSpec(store, tuple(input_partitions), tuple(columns), json_schema, sink,
                             dead_letters[1] if dead_letters else None, lfs, numeric_timestamp_unit, framed_values,
                             kafka_timestamp, keys)


@timed("Spark job (read, decode, write Parquet)")
def run_ingestion_spark_job(spark: SparkSession, table: Table, run_id: str, store: SegmentStore, topic: str,
                            input_partitions: Sequence[SegmentRunPartition], *, columns: Sequence[Column],
                            json_schema: CompiledJsonSchema | None, target_file_size_bytes: int,
                            dead_letters: tuple[Table, DeadLetterTarget] | None = None,
                            lfs: LfsReadSettings | None = None,
                            numeric_timestamp_unit: NumericTimestampUnit = NumericTimestampUnit.MICROS,
                            framed_values: FramedValueSchemas | None = None, kafka_timestamp: bool = False,
                            keys: KeyDecoding | None = None,
                            data_dir: str | None = None) -> list[IngestionTaskOutput]:
    """Read `input_partitions` and write them as data files of `table` (and invalid records as data files of the
    dead-letter table), one Spark task per input partition; returns each task's output, nothing committed.

    Raises `IcebergSinkError` naming the table when the job fails, after deleting what its tasks wrote.
    """
    tasks = ingestion_task_spec(table, run_id, store, topic, input_partitions, columns=columns,
                                json_schema=json_schema, target_file_size_bytes=target_file_size_bytes,
                                dead_letters=dead_letters, lfs=lfs, numeric_timestamp_unit=numeric_timestamp_unit,
                                framed_values=framed_values, kafka_timestamp=kafka_timestamp, keys=keys,
                                data_dir=data_dir)
    if not input_partitions:
        return []
    sink = tasks.sink
    count = len(input_partitions)
    log.info("table %s run %s: one Spark job of %d tasks over %d segments (%d bytes)", sink.table_name, run_id, count,
             sum(len(p.segments) for p in input_partitions),
             sum(s.kfs_size for p in input_partitions for s in p.segments))
    job = spark.range(0, count, 1, numPartitions=count).mapInArrow(tasks, _OUTPUT_SCHEMA)
    try:
        rows = job.collect()
    except Exception as exc:
        # Failed tasks deleted their own files; those of finished tasks are in the writers' own directories.
        _remove_written(table, tasks, dead_letters[0] if dead_letters is not None else None)
        raise IcebergSinkError(f"writing data files for table {sink.table_name} (run {run_id}) failed: "
                               f"{root_cause(exc)}") from exc
    outputs = sorted((pickle.loads(row.task_output) for row in rows),  # noqa: S301 - our own task results
                     key=lambda o: o.task_id)
    data_files = [f for o in outputs for f in o.data_files]
    log.info("table %s run %s: %d data files written (%d rows, %d bytes), not yet committed", sink.table_name, run_id,
             len(data_files), sum(f.record_count for f in data_files), sum(f.file_size_in_bytes for f in data_files))
    return outputs


def _remove_written(table: Table, tasks: IngestionTaskSpec, dead_letters: Table | None) -> None:
    """Delete what the tasks of a failed job wrote: their writers' directories, which nothing committed. A directory
    that cannot be cleaned (its storage fails too) is logged and left to the clean-up of ended runs, so that the
    job's own error is the one raised."""
    written = [(table, tasks.sink.data_dir)]
    if tasks.dead_letters is not None and dead_letters is not None:
        written.append((dead_letters, tasks.dead_letters.sink.data_dir))
    for owner, data_dir in written:
        try:
            remove_run_files(owner, data_dir)
        except Exception as exc:  # noqa: BLE001 - the job's failure is what the caller reports
            log.warning("table %s: could not delete the files of the failed job in %s (%s); the clean-up of ended "
                        "runs or orphan-file removal takes them", ".".join(owner.name()), data_dir, exc)


@dataclass(frozen=True)
class BatchTableJob:
    """One table's share of a batch's Spark job: its tasks (`ingestion_task_spec`), and the tables they write into
    (cleaned up after a failed job)."""

    table: Table
    tasks: IngestionTaskSpec
    dead_letters: Table | None = None


@dataclass(frozen=True)
class _BatchTasks:
    """The tasks of several tables in one Spark job. Our task `i` is task `index[i][1]` of share `index[i][0]`; Spark
    task `g` runs our tasks `groups[g]` one after another and returns one output each (so each output still covers
    one Kafka partition). A Spark task costs far more than reading a small segment run (scheduling, the Python
    worker round trip: ~0.5 s against ~0.1 s on 2 busy cores), so a batch of many small tables packs its tasks."""

    shares: tuple[IngestionTaskSpec, ...]
    index: tuple[tuple[int, int], ...]
    groups: tuple[tuple[int, ...], ...]
    # Per group, how many of its runs read and write at once: their time is mostly S3 round trips (a GET, a PUT),
    # so a group of small runs overlaps them; a group over the byte budget runs one at a time (bounded memory).
    threads: tuple[int, ...] = ()

    def __call__(self, group_ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in group_ids:
            for group in batch.column(0).to_pylist():
                outputs = self._run_group(self.groups[group], self.threads[group] if self.threads else 1)
                yield pa.RecordBatch.from_pydict({
                    "share": [share for share, _ in outputs],
                    "task_output": [pickle.dumps(output, pickle.HIGHEST_PROTOCOL) for _, output in outputs]})

    def _run_group(self, tasks: Sequence[int], threads: int = 1) -> list[tuple[int, IngestionTaskOutput]]:
        """Our tasks of one Spark task, on up to `threads` threads; when one fails, the files the others of this
        attempt wrote are deleted before the error propagates (a task that fails leaves nothing behind, as each of
        ours does alone)."""
        outputs: list[tuple[int, IngestionTaskOutput]] = []
        try:
            if threads <= 1 or len(tasks) <= 1:
                outputs.extend(self._run_one(task) for task in tasks)
            else:
                failure: BaseException | None = None
                with ThreadPoolExecutor(min(threads, len(tasks)), thread_name_prefix="segment-run") as pool:
                    for future in [pool.submit(self._run_one, task) for task in tasks]:
                        try:
                            outputs.append(future.result())
                        except BaseException as exc:  # noqa: BLE001 - raised below, after every run has ended
                            failure = failure or exc
                if failure is not None:
                    raise failure
        except BaseException:
            for share, output in outputs:
                spec = self.shares[share]
                delete_data_files(spec.sink.file_io(), [f.file_path for f in output.data_files])
                if spec.dead_letters is not None:
                    delete_data_files(spec.dead_letters.file_io(),
                                      [f.file_path for f in output.source_stats.dead_letter_files])
            raise
        return outputs

    def _run_one(self, task: int) -> tuple[int, IngestionTaskOutput]:
        share, task_id = self.index[task]
        return share, self.shares[share].run_task(task_id)


# How many small segment runs of one packed Spark task read and write at once (`_BatchTasks.threads`).
PACKED_RUN_THREADS = 4

_BATCH_OUTPUT_SCHEMA = "share long, task_output binary"  # pyarrow makes a Python int an int64


def pack_tasks(sizes: Sequence[int], *, slots: int, max_bytes: int) -> tuple[tuple[int, ...], ...]:
    """Our tasks (`sizes`: the segment bytes each reads) packed into Spark tasks: as few as keep every one of the
    engine's `slots` busy and each under `max_bytes` (a task over it alone), the largest first into the least
    loaded (so a big table's tasks spread and small ones fill the gaps). Groups and their tasks in task order."""
    if not sizes:
        return ()
    count = min(len(sizes), max(slots, -(-sum(sizes) // max(1, max_bytes))))
    loads = [(0, g) for g in range(count)]  # (bytes, group): a heap, the least loaded first
    groups: list[list[int]] = [[] for _ in range(count)]
    for task in sorted(range(len(sizes)), key=lambda t: -sizes[t]):
        load, group = heapq.heappop(loads)
        groups[group].append(task)
        heapq.heappush(loads, (load + sizes[task], group))
    return tuple(sorted(tuple(sorted(group)) for group in groups if group))


def engine_slots(spark: SparkSession) -> int:
    """How many tasks the Spark engine runs at once: `spark.default.parallelism` when set, else the cores of a local
    master (`local[N]`, `local[*]`: this machine's), else the executors' cores; 2 when it cannot tell."""
    conf = spark.conf
    parallelism = conf.get("spark.default.parallelism", None)
    if parallelism:
        return max(1, int(parallelism))
    master = conf.get("spark.master", None) or ""
    if master.startswith("local"):
        threads = master[len("local["):].split(",")[0].rstrip("]") if "[" in master else "1"
        return max(1, os.cpu_count() or 1) if threads == "*" else max(1, int(threads))
    instances, cores = conf.get("spark.executor.instances", None), conf.get("spark.executor.cores", None)
    if instances and cores:
        return max(1, int(instances) * int(cores))
    return 2


@timed("Spark job of a batch of tables (read, decode, write Parquet)")
def run_batch_spark_job(spark: SparkSession, run_id: str,
                        jobs: Sequence[BatchTableJob]) -> list[list[IngestionTaskOutput]]:
    """ONE Spark job over the tasks of every table of `jobs` (a run that lands many tables), packed into Spark tasks
    by bytes (`pack_tasks`: up to `processor.target_file_size_bytes` each, at least one per slot of the engine);
    returns each table's task outputs, as `run_ingestion_spark_job` does for one, nothing committed. Raises
    `IcebergSinkError` naming the tables when the job fails, after deleting what its tasks wrote (each table's run
    directory)."""
    index = tuple((share, task) for share, job in enumerate(jobs) for task in range(len(job.tasks.input_partitions)))
    outputs: list[list[IngestionTaskOutput]] = [[] for _ in jobs]
    if not index:
        return outputs
    names = ", ".join(job.tasks.sink.table_name for job in jobs)
    sizes = [sum(s.kfs_size for s in jobs[share].tasks.input_partitions[task].segments) for share, task in index]
    max_bytes = max(job.tasks.sink.target_file_size_bytes for job in jobs)
    groups = pack_tasks(sizes, slots=engine_slots(spark), max_bytes=max_bytes)
    log.info("tables %s run %s: one Spark job of %d tasks over %d segment runs (%d segments, %d bytes)", names,
             run_id, len(groups), len(index), sum(len(p.segments) for job in jobs for p in job.tasks.input_partitions),
             sum(sizes))
    threads = tuple(PACKED_RUN_THREADS if sum(sizes[t] for t in group) <= max_bytes else 1 for group in groups)
    tasks = _BatchTasks(tuple(job.tasks for job in jobs), index, groups, threads)
    frame = spark.range(0, len(groups), 1, numPartitions=len(groups)).mapInArrow(tasks, _BATCH_OUTPUT_SCHEMA)
    try:
        rows = frame.collect()
    except Exception as exc:
        for job in jobs:
            _remove_written(job.table, job.tasks, job.dead_letters)
        raise IcebergSinkError(f"writing data files for tables {names} (run {run_id}) failed: "
                               f"{root_cause(exc)}") from exc
    for row in rows:
        outputs[row.share].append(pickle.loads(row.task_output))  # noqa: S301 - our own task results
    return [sorted(share, key=lambda o: o.task_id) for share in outputs]


@dataclass(frozen=True)
class DeadLetterFiles:
    """A run's dead-letter files split like its data files: `keep` those of offsets the run commits."""

    keep: list[DataFile] = field(default_factory=list)
    drop: list[DataFile] = field(default_factory=list)
    records: dict[int, int] = field(default_factory=dict)  # per Kafka partition, in `keep`


def split_dead_letter_files(messages: Iterable[IngestionTaskOutput], ends: Mapping[int, int]) -> DeadLetterFiles:
    """Keep a task's dead-letter files when its Kafka partition commits (`ends`: partition → next offset after the
    commit, committing partitions only) and its records lie below that end; drop the rest.

    A task reads one Kafka partition, and a partition stops at a segment boundary, so a task's records are either
    all below the partition's end or all at or beyond it.
    """
    split = DeadLetterFiles()
    for message in messages:
        stats = message.source_stats
        if not stats.dead_letter_files:
            continue
        [partition] = stats.invalid_first_offset  # one Kafka partition per task
        if partition in ends and stats.invalid_first_offset[partition] < ends[partition]:
            split.keep.extend(stats.dead_letter_files)
            split.records[partition] = split.records.get(partition, 0) + stats.invalid_by_partition[partition]
        else:
            split.drop.extend(stats.dead_letter_files)
    return split
