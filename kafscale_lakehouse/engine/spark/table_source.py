"""Read an Iceberg table as a Spark DataFrame on the executors: the `kafscale_iceberg` Python data source.

    df = read_table(spark, table, columns=["store_id", "sauce"], row_filter=window, snapshot_id=upstream_snapshot)

The driver only plans: pyiceberg's `plan_files()` (manifests pruned by the row filter's partition values and column
statistics) gives the `FileScanTask`s, packed into Spark input partitions of up to 128 MB (`pack_scan_tasks`). Each
executor task reads its data files with pyiceberg's `ArrowScan` (delete files applied, the row filter applied to the
rows, the projected columns only) and yields Arrow batches, so no row passes through the driver and its memory does
not grow with the table.

Spark plans a Python data source in a Python worker of the driver, not in the caller's interpreter, so the data
source gets the table's metadata file location and FileIO settings as options and opens a `StaticTable` from
them; the row filter travels pickled (base64). FileIO secrets go under `io.*` keys that Spark's option redaction
(`spark.redaction.regex`: secret|password|token) hides in plans and logs.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, StaticTable, Table
from pyiceberg.table.metadata import TableMetadata
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from kafscale_lakehouse.engine.tables.data_files import file_io_properties, writer_metadata_json

log = logging.getLogger(__name__)

READ_FORMAT = "kafscale_iceberg"
_IO_PREFIX = "io."
_sessions_with_source: weakref.WeakSet[SparkSession] = weakref.WeakSet()


class TableReadError(RuntimeError):
    """A table cannot be read as asked (unknown column, unknown snapshot); the message names the table."""


def read_table(spark: SparkSession, table: Table, *, columns: Sequence[str] | None = None,
               row_filter: BooleanExpression | None = None, snapshot_id: int | None = None) -> DataFrame:
    """A lazy DataFrame of `table` (at `snapshot_id`, else its current snapshot), only `columns` (all when None),
    only the rows matching `row_filter`. Reading happens on the executors when an action runs."""
    name = ".".join(table.name())
    schema = _snapshot_schema(table, snapshot_id)
    if columns is not None:
        unknown = [c for c in columns if c not in schema.column_names]
        if unknown:
            raise TableReadError(f"table {name} has no columns {unknown} (it has {', '.join(schema.column_names)})")
    projected = schema.select(*columns) if columns is not None else schema
    if spark not in _sessions_with_source:
        spark.dataSource.register(IcebergTableSource)
        _sessions_with_source.add(spark)
    options = {
        "table": name,
        "metadata_location": table.metadata_location,
        "columns": json.dumps(list(columns) if columns is not None else None),
        "row_filter": base64.b64encode(pickle.dumps(row_filter or AlwaysTrue())).decode("ascii"),
        "snapshot_id": "" if snapshot_id is None else str(snapshot_id),
    }
    options.update({_IO_PREFIX + k: v for k, v in file_io_properties(table).items()})
    log.info("table %s: reading %s columns at snapshot %s with filter %s on the executors", name,
             "all" if columns is None else list(columns), snapshot_id or "current", row_filter or "none")
    return spark.read.format(READ_FORMAT).schema(spark_schema(projected)).options(**options).load()


def spark_schema(schema: Schema) -> StructType:
    """The Spark schema of Iceberg columns, every column nullable."""
    return from_arrow_schema(_arrow_schema(schema), prefer_timestamp_ntz=True)


def _arrow_schema(schema: Schema) -> pa.Schema:
    """Every field nullable, as Spark declares the columns (`spark_schema`) and checks the batches against."""
    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    return pa.schema([f.with_nullable(True) for f in arrow])


def _snapshot_schema(table: Table, snapshot_id: int | None) -> Schema:
    if snapshot_id is None:
        return table.schema()
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise TableReadError(f"table {'.'.join(table.name())} has no snapshot {snapshot_id} (expired or never "
                             "committed to this table)")
    # Columns are read by the table's current schema (Iceberg's time travel reads with the current schema too).
    return table.schema()


# Spark's own file sources pack small files into input partitions the same way (`spark.sql.files.maxPartitionBytes`,
# `spark.sql.files.openCostInBytes`): a landed table holds many small files until compaction, and a Spark task per
# file would cost more to schedule than to read.
MAX_PARTITION_BYTES = 128 * 1024 * 1024
OPEN_COST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class FileScanPartition(InputPartition):
    """One Spark input partition: data files (each with its delete files) of up to `MAX_PARTITION_BYTES`."""

    index: int
    tasks: tuple[FileScanTask, ...]


def pack_scan_tasks(tasks: list[FileScanTask], max_bytes: int = MAX_PARTITION_BYTES,
                    open_cost: int = OPEN_COST_BYTES) -> list[tuple[FileScanTask, ...]]:
    """`tasks` in groups of at most `max_bytes` (each file counted with `open_cost` more; a larger file alone),
    largest first, so the groups come out about even."""
    groups: list[list[FileScanTask]] = []
    group_bytes = 0
    for task in sorted(tasks, key=lambda t: t.file.file_size_in_bytes, reverse=True):
        size = task.file.file_size_in_bytes + open_cost
        if not groups or group_bytes + size > max_bytes:
            groups.append([])
            group_bytes = 0
        groups[-1].append(task)
        group_bytes += size
    return [tuple(group) for group in groups]


class IcebergTableSource(DataSource):
    """Use `read_table`, which sets the options."""

    @classmethod
    def name(cls) -> str:
        return READ_FORMAT

    def schema(self) -> StructType:
        raise TableReadError(f"{READ_FORMAT}: read through read_table(), which passes the schema")

    def reader(self, schema: StructType) -> IcebergTableReader:
        return IcebergTableReader(dict(self.options))


class IcebergTableReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        missing = {"table", "metadata_location", "columns", "row_filter", "snapshot_id"} - set(options)
        if missing:
            raise TableReadError(f"{READ_FORMAT} data source is missing options {sorted(missing)}; read through "
                                 "read_table()")
        self.table_name = options["table"]
        self.metadata_location = options["metadata_location"]
        self.io_properties = {k[len(_IO_PREFIX):]: v for k, v in options.items() if k.startswith(_IO_PREFIX)}
        self.columns: list[str] | None = json.loads(options["columns"])
        # S301 below is deliberate: the filter was pickled by our own driver into the data source options
        self.row_filter: BooleanExpression = pickle.loads(base64.b64decode(options["row_filter"]))  # noqa: S301
        self.snapshot_id = int(options["snapshot_id"]) if options["snapshot_id"] else None
        table = StaticTable.from_metadata(self.metadata_location, properties=self.io_properties)
        # What executors need to read a file: schema, specs, location, no snapshot history (which only grows).
        self.metadata_json = writer_metadata_json(table)
        self._table: Table | None = table

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_table"] = None  # planning only; executors get the trimmed metadata
        return state

    def partitions(self) -> list[InputPartition]:
        table = self._table or StaticTable.from_metadata(self.metadata_location, properties=self.io_properties)
        scan = table.scan(row_filter=self.row_filter, selected_fields=tuple(self.columns or ("*",)),
                          snapshot_id=self.snapshot_id)
        groups = pack_scan_tasks(list(scan.plan_files()))
        log.info("table %s: %d data files to read (snapshot %s) in %d Spark tasks", self.table_name,
                 sum(map(len, groups)), self.snapshot_id or "current", len(groups))
        # Spark needs at least one partition; an empty one reads nothing.
        return [FileScanPartition(i, group) for i, group in enumerate(groups)] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FileScanPartition):
            return
        metadata: TableMetadata = _parse_metadata(self.metadata_json)
        schema = metadata.schema()
        projected = schema.select(*self.columns) if self.columns is not None else schema
        # Exactly the Arrow schema Spark checks the batches against (plain string/binary, UTC timestamps).
        target = to_arrow_schema(spark_schema(projected), timezone="UTC")
        io = load_file_io(self.io_properties, metadata.location)
        scan = ArrowScan(metadata, io, projected, self.row_filter)
        for batch in scan.to_record_batches(partition.tasks):
            if batch.num_rows:
                yield _conform(batch, target)


def _parse_metadata(metadata_json: str) -> TableMetadata:
    from pyiceberg.table.metadata import TableMetadataUtil

    return TableMetadataUtil.parse_raw(metadata_json)


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` with exactly the declared column types (pyiceberg returns large_string/large_binary)."""
    if batch.schema.equals(target):
        return batch
    columns = [batch.column(f.name).cast(f.type) for f in target]
    return pa.RecordBatch.from_arrays(columns, schema=target)

