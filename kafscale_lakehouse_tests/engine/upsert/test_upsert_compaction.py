"""Compaction keeps upserts cheap: an upsert table's sort order is its id columns (set by its first upsert), and
compaction sorts the rows it rewrites by it, so the compacted files hold disjoint id ranges and a later upsert of a
few keys rewrites only the files whose bounds hold them (local Spark, sqlite catalog)."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from kafscale_lakehouse.engine.maintenance import compact
from kafscale_lakehouse.engine.tables.data_files import SinkJob, write_batches_as_data_files
from kafscale_lakehouse.engine.tables.upserts import REWRITTEN_FILES_PROPERTY, UpsertKey, commit_upsert
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.schema.columns import Column

COLUMNS = (Column("id", "long", required=True), Column("status", "string"))
RUNS, KEYS_PER_RUN, KEY_SPACE = 12, 400, 1_000_000


@pytest.fixture
def catalog(tmp_path):
    return SqlCatalog("upserts", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")


def upsert(table, run: int, start: int, ids: list[int]) -> None:
    rows = pa.table({
        "record_id": [f"t:0:{start + i}" for i in range(len(ids))],
        "topic": ["t"] * len(ids),
        "partition": pa.array([0] * len(ids), pa.int32()),
        "offset": pa.array(range(start, start + len(ids)), pa.int64()),
        "timestamp_ms": pa.array([0] * len(ids), pa.int64()),
        "key": pa.nulls(len(ids), pa.binary()),
        "value": pa.array([b'{"padding": "%032x"}' % random.getrandbits(128) for _ in ids], pa.binary()),
        "headers": pa.nulls(len(ids), pa.string()),
        "id": pa.array(ids, pa.int64()),
        "status": [f"run-{run}"] * len(ids),
    })
    run_id = f"r{run}"
    files = write_batches_as_data_files(SinkJob.for_table(table, run_id, 1 << 20), rows.to_batches(), 0)
    commit_upsert(table, files, UpsertKey(("id",), COLUMNS), "t", {0: start}, {0: start + len(ids)}, run_id,
                  target_file_size_bytes=1 << 20)


def id_ranges(table) -> list[tuple[int, int]]:
    """(lowest, highest) id of each data file, from its column statistics."""
    field_id = table.schema().find_field("id").field_id

    def bound(raw: bytes) -> int:
        return int.from_bytes(raw, "little", signed=True)
    return sorted((bound(t.file.lower_bounds[field_id]), bound(t.file.upper_bounds[field_id]))
                  for t in table.scan().plan_files())


def test_compaction_of_an_upsert_table_sorts_by_its_ids_so_an_upsert_rewrites_few_files(catalog, spark):
    catalog.create_namespace("n")
    table = catalog.create_table("n.stores", table_schema(COLUMNS))
    rng = random.Random(7)
    ids = rng.sample(range(KEY_SPACE), RUNS * KEYS_PER_RUN)
    for run in range(RUNS):  # each run's new keys span the whole key space: files of wide, overlapping ranges
        upsert(table, run, run * KEYS_PER_RUN, sorted(ids[run * KEYS_PER_RUN:(run + 1) * KEYS_PER_RUN]))
    assert [(f.transform.__class__.__name__, table.schema().find_column_name(f.source_id))
            for f in table.sort_order().fields] == [("IdentityTransform", "id")]
    assert len(id_ranges(table)) == RUNS

    # A target of 4 runs' files: every run's file is small, and all of them make one sorted group of several files.
    target = 4 * max(t.file.file_size_in_bytes for t in table.scan().plan_files())
    result = compact(spark, table, target_file_size_bytes=target, min_input_files=2)
    assert result.files_compacted == RUNS and result.files_written > 2
    ranges = id_ranges(table)
    assert all(high < next_low for (_, high), (next_low, _) in itertools.pairwise(ranges)), ranges
    assert sorted(table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()) == sorted(ids)

    # Three keys that lie in one compacted file: the upsert rewrites that file alone.
    low, high = ranges[len(ranges) // 2]
    inside = sorted(i for i in ids if low <= i <= high)[:3]
    upsert(table, RUNS, RUNS * KEYS_PER_RUN, inside)
    assert table.current_snapshot().summary[REWRITTEN_FILES_PROPERTY] == "1"
