"""Copy-on-write upserts (`engine/tables/upserts.py`) against pyiceberg's own `Table.upsert`, on the same data.

    .venv/bin/python benchmarks/upsert.py [--table-rows 1000000,10000000,50000000] [--changes 1000000]
        [--distributions uniform,skewed,recent] [--runs 2] [--buckets 16] [--file-rows 250000] [--pyiceberg-max-rows N]
    .venv/bin/python benchmarks/upsert.py --compaction [--compaction-rows 2000000] [--compaction-appends 40]
        [--compaction-target-bytes 1048576] [--compaction-changes 2000] [--buckets 4]

For each table size a table of `id long, status string, seats int, updated long` is created in a local sqlite
catalog, bucketed `bucket(--buckets, id)` (the spec the README suggests for upsert tables) and loaded in id order
(as a bulk load leaves it), `--file-rows` rows per file and bucket: each file holds one bucket's ids of a narrow id
range. Each run then applies `--changes` changes: `uniform` draws the keys evenly from all ids, `skewed` draws 90%
of them from the newest 1% of the ids (the highest: recent rows change most), `recent` draws all of them from the
newest 100,000 ids (a fixed window: the files touched do not grow with the table); a run keeps one row per key (the
latest), as an ingestion run does. Printed per run: the distinct keys, the seconds of `upsert_rows` (read the run's
rows, find the files that may hold the keys by partition and bounds, rewrite those with the new rows, one commit),
the files rewritten and the table's files, and the same run through pyiceberg's `Table.upsert` on a copy of the
table (skipped above `--pyiceberg-max-rows`: it reads every matching row and builds one `In` of all keys). Numbers
depend on the machine's load: run it on an idle machine.

`--compaction`: what compaction's sort (engine/maintenance.py sorts an upsert table's rows by its id columns, the
table's sort order) saves the next upsert. Two copies of a `bucket(--buckets, id)` table of `--compaction-rows` ids
are loaded by `--compaction-appends` appends of random ids (as ingestion runs of new keys leave a table: every
file spans the whole id range of its bucket), one with the sort order `id` and one without; each is compacted
(`compact`, local Spark, target `--compaction-target-bytes`), then one upsert run of `--compaction-changes` keys of
the newest 1% of the ids (recent rows change most) is applied. Printed per copy: files before and after compaction,
the compaction's seconds, and the upsert's files rewritten (of the files its bounds and buckets may hold) and
seconds.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from kafscale_lakehouse.engine.maintenance import compact
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse.engine.tables.data_files import SinkJob, write_batches_as_data_files
from kafscale_lakehouse.engine.tables.upserts import REWRITTEN_FILES_PROPERTY, UpsertOptions, upsert_rows

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "status", StringType(),
                                                                            required=False),
                NestedField(3, "seats", IntegerType(), required=False), NestedField(4, "updated", LongType(),
                                                                                  required=False))
RECENT_IDS = 100_000  # `recent`: every change falls on the newest 100,000 ids, whatever the table's size
STATUSES = np.array(["open", "closed", "renovating", "busy"])


def rows(ids: np.ndarray, version: int, rng: np.random.Generator) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "status": pa.array(STATUSES[rng.integers(0, len(STATUSES), len(ids))]),
                     "seats": pa.array(rng.integers(0, 300, len(ids)).astype(np.int32)),
                     "updated": pa.array(np.full(len(ids), version, dtype=np.int64))})


def create_table(catalog: SqlCatalog, name: str, table_rows: int, buckets: int, file_rows: int) -> Table:
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(buckets),
                                        name="id_bucket"))
    table = catalog.create_table(name, SCHEMA, partition_spec=spec)
    rng = np.random.default_rng(1)
    job = SinkJob.for_table(table, f"load-{uuid.uuid4().hex[:8]}", 1 << 40)
    files = []
    chunk = file_rows * buckets  # about `file_rows` rows per file and bucket
    for start in range(0, table_rows, chunk):
        ids = np.arange(start, min(start + chunk, table_rows), dtype=np.int64)
        files += write_batches_as_data_files(job, rows(ids, 0, rng).to_batches(), len(files))
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    return table


def change_keys(distribution: str, table_rows: int, changes: int, rng: np.random.Generator) -> np.ndarray:
    if distribution == "uniform":
        drawn = rng.integers(0, table_rows, changes)
    elif distribution == "recent":
        drawn = rng.integers(max(0, table_rows - RECENT_IDS), table_rows, changes)
    else:
        # The newest rows change most (orders in flight, recent sign-ups): 90% of changes fall on the newest 1%.
        hot = max(1, table_rows // 100)
        is_hot = rng.random(changes) < 0.9
        drawn = np.where(is_hot, table_rows - 1 - rng.integers(0, hot, changes), rng.integers(0, table_rows, changes))
    return np.unique(drawn)  # a run keeps the latest change per key


def data_file_count(table: Table) -> int:
    snapshot = table.current_snapshot()
    return int(snapshot.summary["total-data-files"]) if snapshot and snapshot.summary else 0


def append_random_ids(catalog: SqlCatalog, name: str, table_rows: int, buckets: int, appends: int,
                      sort_by_id: bool) -> Table:
    """The table loaded by `appends` appends of random ids (a permutation of 0..table_rows-1 cut in `appends`)."""
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(buckets),
                                        name="id_bucket"))
    table = catalog.create_table(name, SCHEMA, partition_spec=spec)
    if sort_by_id:  # what an upsert table's first upsert sets (engine/tables/upserts.py)
        with table.update_sort_order() as update:
            update.asc("id", IdentityTransform())
    rng = np.random.default_rng(2)
    for number, ids in enumerate(np.array_split(rng.permutation(table_rows).astype(np.int64), appends)):
        job = SinkJob.for_table(table, f"load-{uuid.uuid4().hex[:8]}", 1 << 40)
        files = write_batches_as_data_files(job, rows(np.sort(ids), 0, rng).to_batches(), number)
        with table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
    return table


def compaction_figures(args: argparse.Namespace, catalog: SqlCatalog) -> None:
    spark = get_spark_session("local[2]", ui_enabled=False)
    spark.range(0, 2, 1, 2).mapInArrow(lambda batches: batches, "id long").collect()  # Python workers started
    table_rows = args.compaction_rows
    keys = np.unique(table_rows - 1 - np.random.default_rng(3).integers(0, max(1, table_rows // 100),
                                                                         args.compaction_changes))
    print(f"{'sorted':>6} {'files':>6} {'compacted':>9} {'compact s':>9} {'upsert keys':>11} {'rewritten':>9} "
          f"{'upsert s':>8}")
    for sort_by_id in (False, True):
        table = append_random_ids(catalog, f"bench.compaction_{'sorted' if sort_by_id else 'unsorted'}", table_rows,
                                  args.buckets, args.compaction_appends, sort_by_id)
        files_before = data_file_count(table)
        started = time.monotonic()
        compact(spark, table, target_file_size_bytes=args.compaction_target_bytes, min_input_files=2)
        compaction_seconds = time.monotonic() - started
        files_after = data_file_count(table)
        run_id = f"bench-{uuid.uuid4().hex[:12]}"
        staged = write_batches_as_data_files(SinkJob.for_table(table, run_id, 128 << 20),
                                             rows(keys, 1, np.random.default_rng(4)).to_batches(), 0)
        started = time.monotonic()
        upsert_rows(table, staged, UpsertOptions(("id",)), run_id, target_file_size_bytes=128 << 20)
        upsert_seconds = time.monotonic() - started
        rewritten = table.current_snapshot().summary[REWRITTEN_FILES_PROPERTY]
        print(f"{'yes' if sort_by_id else 'no':>6} {files_before:>6} {files_after:>9} {compaction_seconds:>9.1f} "
              f"{len(keys):>11} {rewritten:>9} {upsert_seconds:>8.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-rows", default="1000000,10000000,50000000")
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--distributions", default="uniform,skewed,recent")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--file-rows", type=int, default=250_000)
    parser.add_argument("--pyiceberg-max-rows", type=int, default=10_000_000)
    parser.add_argument("--compaction", action="store_true", help="files an upsert rewrites after compaction, "
                        "with and without the sort by id (instead of the runs above)")
    parser.add_argument("--compaction-rows", type=int, default=2_000_000)
    parser.add_argument("--compaction-appends", type=int, default=40)
    parser.add_argument("--compaction-target-bytes", type=int, default=1 << 20)
    parser.add_argument("--compaction-changes", type=int, default=2_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="upsert-bench-") as root:
        catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
        catalog.create_namespace("bench")
        if args.compaction:
            compaction_figures(args, catalog)
            return 0
        print(f"{'table rows':>11} {'distribution':>12} {'run':>3} {'keys':>9} {'ours s':>8} {'rewritten':>9} "
              f"{'files':>6} {'pyiceberg s':>11}")
        for table_rows in map(int, args.table_rows.split(",")):
            started = time.monotonic()
            table = create_table(catalog, f"bench.t{table_rows}", table_rows, args.buckets, args.file_rows)
            compare = table_rows <= args.pyiceberg_max_rows
            reference = (create_table(catalog, f"bench.r{table_rows}", table_rows, args.buckets, args.file_rows)
                         if compare else None)
            print(f"# {table_rows} rows loaded in {data_file_count(table)} files "
                  f"({time.monotonic() - started:.1f} s)", flush=True)
            rng = np.random.default_rng(table_rows)
            version = 0
            for distribution in args.distributions.split(","):
                for run in range(1, args.runs + 1):
                    version += 1
                    keys = change_keys(distribution, table_rows, args.changes, rng)
                    changed = rows(keys, version, rng)
                    run_id = f"bench-{uuid.uuid4().hex[:12]}"
                    staged = write_batches_as_data_files(SinkJob.for_table(table, run_id, 128 << 20),
                                                         changed.to_batches(), 0)
                    started = time.monotonic()
                    result = upsert_rows(table, staged, UpsertOptions(("id",)), run_id,
                                         target_file_size_bytes=128 << 20)
                    ours = time.monotonic() - started
                    rewritten = table.current_snapshot().summary[REWRITTEN_FILES_PROPERTY]
                    theirs = "-"
                    if reference is not None:
                        started = time.monotonic()
                        reference.upsert(changed.cast(reference.schema().as_arrow()), join_cols=["id"])
                        theirs = f"{time.monotonic() - started:.1f}"
                    print(f"{table_rows:>11} {distribution:>12} {run:>3} {len(keys):>9} {ours:>8.1f} "
                          f"{rewritten:>9} {data_file_count(table):>6} {theirs:>11}", flush=True)
                    assert result.rows_written == len(keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
