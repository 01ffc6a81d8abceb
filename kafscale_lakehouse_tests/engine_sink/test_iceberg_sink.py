"""The Spark Iceberg append sink: data files with field ids and statistics, roll-over, partitions, abort."""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.fs import FileSelector
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    FloatType,
    LongType,
    NestedField,
    TimestampType,
    TimestamptzType,
)
from pyspark import TaskContext
from pyspark.sql import functions as F

from kafscale_lakehouse.engine.catalog import PartitionFieldSpec, open_table
from kafscale_lakehouse.engine.iceberg_sink import (
    IcebergSinkError,
    SinkSchemaError,
    data_file_prefix,
    write_data_files,
)
from kafscale_lakehouse.engine.table_offsets import OFFSETS_PROPERTY_PREFIX, commit_append
from kafscale_lakehouse_tests.engine_sink.helpers import (
    BASE_COLUMNS,
    MAPPED_COLUMNS,
    batch_dataframe,
    start_end,
    write_batch,
)

pytestmark = pytest.mark.integration


def _files_under(table, prefix: str) -> list[str]:
    """Data files named `prefix…` that exist in the table's data location (listed, not taken from metadata)."""
    io = PyArrowFileIO(table.io.properties)
    scheme, netloc, path = io.parse_location(f"{table.location()}/data", io.properties)
    infos = io.fs_by_scheme(scheme, netloc).get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(info.path for info in infos if info.is_file and info.base_name.startswith(prefix))


def test_files_have_field_ids_and_stats_and_commit_as_one_snapshot(spark, make_table):
    table = make_table()
    ranges = {0: (0, 40), 1: (100, 130), 2: (7, 27)}
    data_files = write_batch(spark, table, "orders", ranges, run_id="run-a", slices=4)

    assert len(data_files) == 4  # one file per non-empty Spark partition at the default target size
    assert all(f.file_path.rsplit("/", 1)[1].startswith(data_file_prefix("run-a")) for f in data_files)
    assert sum(f.record_count for f in data_files) == 90
    assert table.current_snapshot() is None  # written, not committed

    for data_file in data_files:
        with table.io.new_input(data_file.file_path).open() as stream:
            parquet_schema = pq.read_schema(stream)
        field_ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in parquet_schema}
        assert field_ids == {name: i for i, name in enumerate(BASE_COLUMNS + MAPPED_COLUMNS, start=1)}
        assert data_file.value_counts[4] == data_file.record_count
        assert data_file.null_value_counts[1] == 0
        assert set(data_file.lower_bounds) >= {1, 2, 3, 4, 5} and set(data_file.upper_bounds) >= {1, 2, 3, 4, 5}

    start, end = start_end(ranges)
    result = commit_append(table, data_files, "orders", start, end, "run-a")

    assert len(table.metadata.snapshots) == 1
    snapshot = table.current_snapshot()
    assert snapshot.snapshot_id == result.snapshot_id
    assert snapshot.summary["added-data-files"] == "4"
    assert snapshot.summary[OFFSETS_PROPERTY_PREFIX + "orders"] == '{"0":40,"1":130,"2":27}'
    rows = table.scan().to_arrow()
    assert rows.num_rows == 90
    assert sorted(rows["record_id"].to_pylist())[:2] == ["orders:0:0", "orders:0:1"]
    # Column statistics prune: the offset bounds of partition 1 rule out files without it.
    assert table.scan(row_filter=EqualTo("offset", 129)).to_arrow()["record_id"].to_pylist() == ["orders:1:129"]


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_target_file_size_rolls_over_to_more_files(spark, make_table):
    table = make_table()
    df = batch_dataframe(spark, "t", {0: (0, 3000)}, slices=1)
    target = 16 * 1024
    data_files = write_data_files(df, table, "run-roll", target_file_size_bytes=target)

    assert len(data_files) > 2
    assert sum(f.record_count for f in data_files) == 3000
    lows = sorted(f.lower_bounds[4] for f in data_files)
    assert len(set(lows)) == len(data_files)  # distinct files, each holding its own slice of offsets
    # The target is on-disk Parquet bytes: every file but the task's last one reached it.
    sizes = [f.file_size_in_bytes for f in sorted(data_files, key=lambda f: f.file_path)]  # names carry the sequence
    assert all(size >= target for size in sizes[:-1]), sizes


@pytest.mark.parametrize("catalog", ["sql", "rest"], indirect=True)
def test_partitioned_table_gets_one_file_per_partition_value(spark, make_table):
    table = make_table(partition_fields=(PartitionFieldSpec("partition"),))
    ranges = {0: (0, 10), 1: (0, 20), 5: (3, 6)}
    data_files = write_batch(spark, table, "t", ranges, run_id="run-p", slices=1)

    assert sorted((f.partition[0], f.record_count) for f in data_files) == [(0, 10), (1, 20), (5, 3)]
    # In the run's own directory (run_files.py), then the location provider's partition path.
    assert all(f"/data/kafscale-run-p/partition={f.partition[0]}/" in f.file_path for f in data_files)
    commit_append(table, data_files, "t", *start_end(ranges), "run-p")
    planned = list(table.scan(row_filter=EqualTo("partition", 5)).plan_files())
    assert len(planned) == 1 and planned[0].file.record_count == 3


def test_schema_mismatch_is_refused_before_any_file_is_written(spark, make_table):
    table = make_table()
    df = batch_dataframe(spark, "t", {0: (0, 5)})
    with pytest.raises(SinkSchemaError, match=r"has no columns \['surprise'\]"):
        write_data_files(df.withColumn("surprise", df["offset"]), table, "run-s")
    with pytest.raises(SinkSchemaError, match="offset"):
        write_data_files(df.drop("offset"), table, "run-s")
    with pytest.raises(SinkSchemaError, match="amount"):
        write_data_files(df.withColumn("amount", df["customer"]), table, "run-s")
    assert _files_under(table, data_file_prefix("run-s")) == []


@pytest.mark.parametrize("catalog", ["sql", "rest"], indirect=True)
def test_failed_spark_job_aborts_and_deletes_the_files_of_finished_tasks(spark, make_table):
    table = make_table()
    df = batch_dataframe(spark, "t", {0: (0, 50), 1: (0, 50)}, slices=3)
    schema = df.schema

    def null_record_ids_late_in_last_partition(batches):
        last = TaskContext.get().partitionId() == 2
        for batch in batches:
            if last:
                time.sleep(3)  # let the other tasks finish and write their files first
                batch = batch.set_column(0, "record_id", pa.nulls(batch.num_rows, pa.string()))
            yield batch

    failing = df.mapInArrow(null_record_ids_late_in_last_partition, schema)
    with pytest.raises(IcebergSinkError, match="run-f") as raised:
        write_data_files(failing, table, "run-f")

    assert "required column 'record_id'" in "".join(str(e) for e in _chain(raised.value))
    assert _files_under(table, data_file_prefix("run-f")) == []
    assert table.current_snapshot() is None


def test_run_id_must_be_file_name_safe():
    with pytest.raises(ValueError, match="run id 'a/b'"):
        data_file_prefix("a/b")
    assert data_file_prefix("0c5e-run_1.x") == "kafscale-0c5e-run_1.x-"


def _chain(exc: BaseException):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_mapped_column_types_round_trip(spark, catalog, namespace):
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "at", TimestamptzType()),
        NestedField(3, "local_at", TimestampType()), NestedField(4, "day", DateType()),
        NestedField(5, "flag", BooleanType()), NestedField(6, "ratio", FloatType()),
    )
    table = open_table(catalog, f"{namespace}.typed", schema=schema, create_if_missing=True)
    at = dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.timezone.utc)
    arrow = pa.table({
        "id": [1, 2], "at": pa.array([at, None], pa.timestamp("us", "UTC")),
        "local_at": pa.array([at.replace(tzinfo=None), None], pa.timestamp("us")),
        "day": pa.array([dt.date(2024, 2, 29), None]), "flag": [True, None], "ratio": pa.array([0.5, None], pa.float32()),
    })
    df = spark.createDataFrame(arrow).withColumn("local_at", F.col("local_at").cast("timestamp_ntz"))

    commit_append(table, write_data_files(df, table, "run-t"), "t", {0: 0}, {0: 2}, "run-t")

    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows[0] == {"id": 1, "at": at, "local_at": at.replace(tzinfo=None), "day": dt.date(2024, 2, 29),
                       "flag": True, "ratio": 0.5}
    assert rows[1] == {"id": 2, "at": None, "local_at": None, "day": None, "flag": None, "ratio": None}
    # An empty DataFrame (even one without Spark partitions) writes no files.
    empty = spark.createDataFrame(spark.sparkContext.emptyRDD(), df.schema)
    assert empty.rdd.getNumPartitions() == 0
    assert write_data_files(empty, table, "run-e") == []


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_timestamps_survive_a_non_utc_spark_session_time_zone(spark, catalog, namespace):
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "at", TimestamptzType()))
    table = open_table(catalog, f"{namespace}.zoned", schema=schema, create_if_missing=True)
    at = dt.datetime(2024, 7, 1, 6, 30, tzinfo=dt.timezone.utc)
    df = spark.createDataFrame(pa.table({"id": [1], "at": pa.array([at], pa.timestamp("us", "UTC"))}))
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")  # Spark then labels batches with this zone
    try:
        data_files = write_data_files(df, table, "run-z")
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)

    commit_append(table, data_files, "t", {0: 0}, {0: 1}, "run-z")
    assert table.scan().to_arrow()["at"].to_pylist() == [at]
