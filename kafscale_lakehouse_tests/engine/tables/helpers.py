"""Helpers for the engine/tables tests: the table schema, batches of Kafka-like rows, catalog settings, and writing
data files as the Spark tasks do."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import BinaryType, DoubleType, IntegerType, LongType, NestedField, StringType

from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings
from kafscale_lakehouse.engine.tables.data_files import (
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    SinkJob,
    check_arrow_schema,
    write_batches_as_data_files,
)
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, SECRET_KEY, TABLE_BUCKET

BASE_COLUMNS = ["record_id", "topic", "partition", "offset", "timestamp_ms", "key", "value", "headers"]
MAPPED_COLUMNS = ["amount", "customer"]


def lakehouse_schema() -> Schema:
    """Base columns (ids 1-8, docs/kafscale-format.md §8) followed by two mapped columns."""
    return Schema(
        NestedField(1, "record_id", StringType(), required=True),
        NestedField(2, "topic", StringType(), required=True),
        NestedField(3, "partition", IntegerType(), required=True),
        NestedField(4, "offset", LongType(), required=True),
        NestedField(5, "timestamp_ms", LongType(), required=True),
        NestedField(6, "key", BinaryType(), required=False),
        NestedField(7, "value", BinaryType(), required=False),
        NestedField(8, "headers", StringType(), required=False),
        NestedField(9, "amount", DoubleType(), required=False),
        NestedField(10, "customer", StringType(), required=False),
    )


def rest_settings(seaweedfs, **overrides) -> CatalogSettings:
    values = {
        "type": "rest", "uri": seaweedfs.rest_uri, "warehouse": f"s3://{TABLE_BUCKET}", "username": ACCESS_KEY,
        "password": SECRET_KEY, "s3_endpoint": seaweedfs.s3_endpoint, "s3_region": REGION, "s3_path_style": True,
        "s3_access_key_id": ACCESS_KEY, "s3_secret_access_key": SECRET_KEY,
    }
    values.update(overrides)
    return CatalogSettings(**values)


def batch_table(topic: str, ranges: dict[int, tuple[int, int]]) -> pa.Table:
    """Rows with the base and mapped columns for offsets [start, end) of each Kafka partition."""
    rows = {name: [] for name in BASE_COLUMNS + MAPPED_COLUMNS}
    for partition, (start, end) in sorted(ranges.items()):
        for offset in range(start, end):
            rows["record_id"].append(f"{topic}:{partition}:{offset}")
            rows["topic"].append(topic)
            rows["partition"].append(partition)
            rows["offset"].append(offset)
            rows["timestamp_ms"].append(1_700_000_000_000 + offset)
            rows["key"].append(None if offset % 5 == 0 else f"k{offset}".encode())
            rows["value"].append(f'{{"amount": {offset}}}'.encode())
            rows["headers"].append("")
            rows["amount"].append(offset * 1.5)
            rows["customer"].append(None if offset % 3 == 0 else f"c{offset % 7}")
    return pa.table(rows, schema=pa.schema([
        ("record_id", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()), ("key", pa.binary()), ("value", pa.binary()), ("headers", pa.string()),
        ("amount", pa.float64()), ("customer", pa.string()),
    ]))


def write_arrow(table: Table, rows: pa.Table, run_id: str, *, tasks: int = 1,
                target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES,
                data_dir: str | None = None) -> list[DataFile]:
    """Data files (uncommitted) for `rows`, written as a Spark job's tasks write them: the schema checked once, then
    `tasks` contiguous slices, each by `write_batches_as_data_files` under its own task id."""
    check_arrow_schema(rows.schema, table)
    job = SinkJob.for_table(table, run_id, target_file_size_bytes, data_dir)
    per_task = -(-rows.num_rows // tasks) if rows.num_rows else 0
    return [data_file for task_id in range(tasks) if per_task
            for data_file in write_batches_as_data_files(job, rows.slice(task_id * per_task, per_task).to_batches(),
                                                         task_id)]


def write_batch(table: Table, topic: str, ranges: dict[int, tuple[int, int]], run_id: str, tasks: int = 2,
                data_dir: str | None = None):
    """Data files (uncommitted) for a batch of Kafka-like rows, written by `tasks` tasks (into `data_dir`, else a
    new writer directory)."""
    return write_arrow(table, batch_table(topic, ranges), run_id, tasks=tasks, data_dir=data_dir)


def start_end(ranges: dict[int, tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
    return {p: s for p, (s, _) in ranges.items()}, {p: e for p, (_, e) in ranges.items()}
