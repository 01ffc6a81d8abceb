"""Table-lifecycle benchmarks (issue #10): run cost against history length, compaction, metadata size.

    .venv/bin/python benchmarks/maintenance.py [--snapshots 10,1000,5000] [--small-files 2000] [--commits 5000]

Embedded set-up (local segment directory, sqlite catalog, local offsets store) in a temporary directory:
1. `run-cost`: a table whose history is built quickly (many snapshots carrying our offsets, committed with pyiceberg
   in one transaction), then one small `ingest --once`-sized run (2 partitions x 200 records); wall time of the run
   and of its clean-up phase (`run_files.clean_ended_runs`).
2. `compaction`: a table of N small data files (one pyiceberg transaction of N appends), compacted by
   `maintenance.compact`: time, files and bytes before/after.
3. `metadata`: N individual commits with the default table properties (bounded metadata) and snapshot expiry
   every 100 commits (retain the last 100), against N commits with pyiceberg's defaults and no expiry: size of the
   metadata folder and of the newest metadata.json.
Prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from kafscale_lakehouse.apps.workload import write_partition_segments
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine import ingest as ingest_module
from kafscale_lakehouse.engine.catalog import load_catalog, open_table
from kafscale_lakehouse.engine.ingest import ingest
from kafscale_lakehouse.engine.maintenance import compact, expire_snapshots
from kafscale_lakehouse.engine.snapshot_summary import OFFSETS_PROPERTY_PREFIX, format_offsets_property
from kafscale_lakehouse.engine.spark import get_spark_session
from kafscale_lakehouse.schema import table_schema

log = logging.getLogger("benchmarks.maintenance")
COLUMNS = [{"name": "order_id", "type": "string", "required": True}, {"name": "store_id", "type": "int"}]


def _config(root: Path, topic: str, table: str, **table_properties: str):
    return parse_config({
        "segments": {"local_root": str(root / "segments")}, "s3": {"namespace": "bench"},
        "iceberg": {"catalog": {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}"},
                    "warehouse": str(root / "warehouse")},
        "offsets": {"backend": "local", "local_path": str(root / "offsets.db"), "key_prefix": "bench"},
        "discovery": {"mode": "s3"},
        "mappings": [{"topic": topic, "table": table, "create_table_if_missing": True,
                      "schema": {"columns": COLUMNS}, "table_properties": table_properties}],
    }, source="benchmark")


def _table(config):
    mapping = config.mappings[0]
    return open_table(load_catalog(catalog_settings(config)), mapping.table, create_if_missing=True,
                      schema=table_schema(mapping.columns), properties=mapping.table_properties)


def _empty_commits(table, count: int, topic: str, *, batch: int = 500) -> None:
    """`count` snapshots carrying offsets, `batch` per transaction (one metadata write per batch)."""
    done = 0
    while done < count:
        n = min(batch, count - done)
        with table.transaction() as transaction:
            for _ in range(n):
                props = {OFFSETS_PROPERTY_PREFIX + topic: format_offsets_property({0: 0, 1: 0})}
                with transaction.update_snapshot(snapshot_properties=props).fast_append():
                    pass
        done += n


def run_cost(spark, snapshots: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        topic, name = "bench-orders", "bench.orders"
        config = _config(root, topic, name)
        table = _table(config)
        started = time.monotonic()
        _empty_commits(table, snapshots, topic)
        built = time.monotonic() - started
        for partition in (0, 1):
            write_partition_segments(root / "segments", record_count=200, namespace="bench", topic=topic,
                                     partition=partition, records_per_segment=100)
        cleanup = []
        real = ingest_module.clean_ended_runs

        def timed(*args, **kwargs):
            t0 = time.monotonic()
            try:
                return real(*args, **kwargs)
            finally:
                cleanup.append(time.monotonic() - t0)

        ingest_module.clean_ended_runs = timed
        try:
            t0 = time.monotonic()
            [result] = ingest(config, spark)
            elapsed = time.monotonic() - t0
        finally:
            ingest_module.clean_ended_runs = real
        return {"benchmark": "run-cost", "snapshots": snapshots + 1, "history_build_seconds": round(built, 2),
                "run_seconds": round(elapsed, 3), "cleanup_seconds": round(sum(cleanup), 4),
                "records": result.records}


def compaction(spark, files: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = _config(root, "bench-small", "bench.small")
        table = _table(config)
        arrow_schema = table.schema().as_arrow()
        t0 = time.monotonic()
        with table.transaction() as transaction:
            for i in range(files):
                rows = 50
                columns = {}
                for field in arrow_schema:
                    if pa.types.is_string(field.type):
                        columns[field.name] = pa.array([f"{field.name}-{i}-{r}" for r in range(rows)], field.type)
                    elif pa.types.is_timestamp(field.type):
                        columns[field.name] = pa.array([datetime.now(UTC)] * rows, field.type)
                    else:
                        columns[field.name] = pa.array([i * rows + r for r in range(rows)]).cast(field.type)
                transaction.append(pa.table(columns, schema=arrow_schema))
        built = time.monotonic() - t0
        table.refresh()
        before = table.current_snapshot().summary
        t0 = time.monotonic()
        result = compact(spark, table, target_file_size_bytes=128 * 1024 * 1024, min_input_files=2)
        elapsed = time.monotonic() - t0
        return {"benchmark": "compaction", "build_seconds": round(built, 1), "seconds": round(elapsed, 2),
                "files_before": int(before["total-data-files"]), "bytes_before": int(before["total-files-size"]),
                "files_after": int(table.current_snapshot().summary["total-data-files"]),
                "bytes_after": int(table.current_snapshot().summary["total-files-size"]),
                "files_compacted": result.files_compacted, "files_written": result.files_written}


def metadata_size(commits: int, *, maintained: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        properties = {} if maintained else {"write.metadata.delete-after-commit.enabled": "false",
                                            "write.metadata.previous-versions-max": "100000"}
        config = _config(root, "bench-meta", "bench.meta", **properties)
        table = _table(config)
        t0 = time.monotonic()
        for i in range(commits):
            _empty_commits(table, 1, "bench-meta")
            if maintained and (i + 1) % 100 == 0:
                ancestors = list(table.metadata.snapshots)
                if len(ancestors) > 100:
                    cutoff = sorted(s.timestamp_ms for s in ancestors)[-100]
                    expire_snapshots(table, older_than=datetime.fromtimestamp(cutoff / 1000, UTC),
                                     retain_last=100)
        elapsed = time.monotonic() - t0
        metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
        files = [p for p in metadata_dir.iterdir() if p.is_file()]
        newest = Path(table.metadata_location.removeprefix("file://"))
        return {"benchmark": "metadata", "commits": commits, "maintained": maintained,
                "seconds": round(elapsed, 1), "metadata_files": len(files),
                "metadata_folder_bytes": sum(p.stat().st_size for p in files),
                "newest_metadata_json_bytes": newest.stat().st_size, "snapshots": len(table.metadata.snapshots)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snapshots", default="10,1000,5000")
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument("--commits", type=int, default=5000)
    parser.add_argument("--only", choices=["run-cost", "compaction", "metadata"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spark = get_spark_session("local[2]", {})
    if args.only in (None, "run-cost"):
        run_cost(spark, 1)  # warm-up: Spark's first job pays its start-up
        for count in (int(c) for c in args.snapshots.split(",")):
            print(json.dumps(run_cost(spark, count)), flush=True)
    if args.only in (None, "compaction"):
        print(json.dumps(compaction(spark, args.small_files)), flush=True)
    if args.only in (None, "metadata"):
        for maintained in (True, False):
            print(json.dumps(metadata_size(args.commits, maintained=maintained)), flush=True)


if __name__ == "__main__":
    main()
