"""Data files as the Spark tasks write them (`write_batches_as_data_files`, `RollingDataFiles`): field ids and
statistics, roll-over, partitions, schema checks, a failing task deleting its files."""

from __future__ import annotations

import datetime as dt
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import FileSelector
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

from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import PartitionFieldSpec, open_table
from kafscale_lakehouse.engine.tables.data_files import (
    RequiredColumnNullError,
    SinkJob,
    SinkSchemaError,
    data_file_prefix,
    write_batches_as_data_files,
)
from kafscale_lakehouse.engine.tables.summary import OFFSETS_PROPERTY_PREFIX
from kafscale_lakehouse_tests.engine.tables.helpers import (
    BASE_COLUMNS,
    MAPPED_COLUMNS,
    batch_table,
    start_end,
    write_arrow,
    write_batch,
)

pytestmark = pytest.mark.integration


def _files_under(table, prefix: str) -> list[str]:
    """Data files named `prefix…` that exist in the table's data location (listed, not taken from metadata)."""
    io = PyArrowFileIO(table.io.properties)
    scheme, netloc, path = io.parse_location(f"{table.location()}/data", io.properties)
    infos = io.fs_by_scheme(scheme, netloc).get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(info.path for info in infos if info.is_file and info.base_name.startswith(prefix))


def test_files_have_field_ids_and_stats_and_commit_as_one_snapshot(make_table):
    table = make_table()
    ranges = {0: (0, 40), 1: (100, 130), 2: (7, 27)}
    data_files = write_batch(table, "orders", ranges, run_id="run-a", tasks=4)

    assert len(data_files) == 4  # one file per task at the default target size
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
def test_a_files_size_comes_from_its_writer_not_from_the_object_store(make_table, monkeypatch):
    table = make_table()

    def asked(self):  # a HEAD request of the object store (or a stat of a local file)
        raise AssertionError(f"asked the store for the size of {self.location}")

    output_file_type = type(table.io.new_output(f"{table.location()}/data/probe.parquet"))  # this catalog's FileIO's
    monkeypatch.setattr(output_file_type, "__len__", asked)
    data_files = write_batch(table, "orders", {0: (0, 40), 1: (100, 130)}, run_id="run-size", tasks=2)

    monkeypatch.undo()
    for data_file in data_files:
        assert data_file.file_size_in_bytes == len(table.io.new_input(data_file.file_path))


def test_the_tasks_of_a_process_share_a_file_io_per_settings_and_bucket(make_table):
    first, second = make_table(), make_table()
    jobs = [SinkJob.for_table(table, "run-io", 1 << 20) for table in (first, second)]
    assert jobs[0].file_io() is jobs[1].file_io()
    rotated = SinkJob(jobs[0].table_name, jobs[0].table_metadata_json,
                      {**jobs[0].file_io_properties, "s3.session-token": "rotated"}, "run-io", 1 << 20,
                      jobs[0].data_dir)
    assert rotated.file_io() is not jobs[0].file_io()


def test_target_file_size_rolls_over_to_more_files(make_table):
    table = make_table()
    target = 16 * 1024
    data_files = write_arrow(table, batch_table("t", {0: (0, 3000)}), "run-roll", target_file_size_bytes=target)

    assert len(data_files) > 2
    assert sum(f.record_count for f in data_files) == 3000
    lows = sorted(f.lower_bounds[4] for f in data_files)
    assert len(set(lows)) == len(data_files)  # distinct files, each holding its own slice of offsets
    # The target is on-disk Parquet bytes: every file but the task's last one reached it.
    sizes = [f.file_size_in_bytes for f in sorted(data_files, key=lambda f: f.file_path)]  # names carry the sequence
    assert all(size >= target for size in sizes[:-1]), sizes


@pytest.mark.parametrize("catalog", ["sql", "rest"], indirect=True)
def test_partitioned_table_gets_one_file_per_partition_value(make_table):
    table = make_table(partition_fields=(PartitionFieldSpec("partition"),))
    ranges = {0: (0, 10), 1: (0, 20), 5: (3, 6)}
    data_files = write_batch(table, "t", ranges, run_id="run-p", tasks=1)

    assert sorted((f.partition[0], f.record_count) for f in data_files) == [(0, 10), (1, 20), (5, 3)]
    # In the writer's own directory (run_files.py), then the location provider's partition path.
    assert all(re.search(rf"/data/kafscale-run-p-w[0-9a-f]{{12}}/partition={f.partition[0]}/", f.file_path)
               for f in data_files)
    commit_append(table, data_files, "t", *start_end(ranges), "run-p")
    planned = list(table.scan(row_filter=EqualTo("partition", 5)).plan_files())
    assert len(planned) == 1 and planned[0].file.record_count == 3


def test_schema_mismatch_is_refused_before_any_file_is_written(make_table):
    table = make_table()
    rows = batch_table("t", {0: (0, 5)})
    with pytest.raises(SinkSchemaError, match=r"has no columns \['surprise'\]"):
        write_arrow(table, rows.append_column("surprise", rows["offset"]), "run-s")
    with pytest.raises(SinkSchemaError, match="offset"):
        write_arrow(table, rows.drop_columns(["offset"]), "run-s")
    with pytest.raises(SinkSchemaError, match="amount"):
        write_arrow(table, rows.set_column(rows.schema.get_field_index("amount"), "amount", rows["customer"]), "run-s")
    assert _files_under(table, data_file_prefix("run-s")) == []


@pytest.mark.parametrize("catalog", ["sql", "rest"], indirect=True)
def test_a_failing_task_deletes_the_files_it_wrote(make_table):
    table = make_table()
    rows = batch_table("t", {0: (0, 3000)})
    job = SinkJob.for_table(table, "run-f", target_file_size_bytes=16 * 1024)  # several files before the failure
    def null_record_ids_late(batches):
        for batch in batches:
            if batch.column("offset")[0].as_py() >= 2500:
                assert _files_under(table, data_file_prefix("run-f")), "files were written before the failure"
                batch = batch.set_column(0, "record_id", pa.nulls(batch.num_rows, pa.string()))
            yield batch

    with pytest.raises(RequiredColumnNullError, match="required column 'record_id' has 500 null values") as raised:
        write_batches_as_data_files(job, null_record_ids_late(rows.to_batches(max_chunksize=500)), 3)

    assert "Spark partition 3 (run run-f)" in str(raised.value)
    assert _files_under(table, data_file_prefix("run-f")) == []
    assert table.current_snapshot() is None


def test_run_id_must_be_file_name_safe():
    with pytest.raises(ValueError, match="run id 'a/b'"):
        data_file_prefix("a/b")
    assert data_file_prefix("0c5e-run_1.x") == "kafscale-0c5e-run_1.x-"


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_mapped_column_types_round_trip(catalog, namespace):
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "at", TimestamptzType()),
        NestedField(3, "local_at", TimestampType()), NestedField(4, "day", DateType()),
        NestedField(5, "flag", BooleanType()), NestedField(6, "ratio", FloatType()),
    )
    table = open_table(catalog, f"{namespace}.typed", schema=schema, create_if_missing=True)
    at = dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC)
    arrow = pa.table(
        {
            "id": [1, 2],
            "at": pa.array([at, None], pa.timestamp("us", "UTC")),
            "local_at": pa.array([at.replace(tzinfo=None), None], pa.timestamp("us")),
            "day": pa.array([dt.date(2024, 2, 29), None]),
            "flag": [True, None],
            "ratio": pa.array([0.5, None], pa.float32()),
        }
    )

    commit_append(table, write_arrow(table, arrow, "run-t"), "t", {0: 0}, {0: 2}, "run-t")

    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows[0] == {
        "id": 1,
        "at": at,
        "local_at": at.replace(tzinfo=None),
        "day": dt.date(2024, 2, 29),
        "flag": True,
        "ratio": 0.5,
    }
    assert rows[1] == {"id": 2, "at": None, "local_at": None, "day": None, "flag": None, "ratio": None}
    # A task without rows writes no files.
    job = SinkJob.for_table(table, "run-e", target_file_size_bytes=1 << 20)
    assert write_batches_as_data_files(job, [pa.RecordBatch.from_pylist([], schema=arrow.schema)], 0) == []
    assert write_batches_as_data_files(job, [], 1) == []


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_timestamps_labelled_with_another_time_zone_are_stored_as_the_same_instant(catalog, namespace):
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "at", TimestamptzType()))
    table = open_table(catalog, f"{namespace}.zoned", schema=schema, create_if_missing=True)
    at = dt.datetime(2024, 7, 1, 6, 30, tzinfo=dt.UTC)
    # A zone label other than UTC (Spark's `mapInArrow` labels batches with its session time zone) names the same
    # instant; the writer relabels it (the schema check of the driver sees Spark's schema as UTC).
    rows = pa.table(
        {"id": [1], "at": pa.array([at], pa.timestamp("us", "UTC")).cast(pa.timestamp("us", "America/New_York"))}
    )
    job = SinkJob.for_table(table, "run-z", target_file_size_bytes=1 << 20)

    data_files = write_batches_as_data_files(job, rows.to_batches(), 0)

    commit_append(table, data_files, "t", {0: 0}, {0: 1}, "run-z")
    assert table.scan().to_arrow()["at"].to_pylist() == [at]
