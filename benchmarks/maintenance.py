"""Table-lifecycle benchmarks (issue #10): run cost against history length, compaction, metadata size.

    .venv/bin/python benchmarks/maintenance.py [--snapshots 10,1000,5000] [--small-files 2000] [--commits 5000]
                                              [--unmaintained-commits 1000] [--only run-cost|compaction|metadata]

Embedded set-up (local segment directory, sqlite catalog, local offsets store) in a temporary directory:
1. `run-cost`: a table whose history has N snapshots carrying our offsets (built in one metadata write: the
   snapshots share one real manifest list, the catalog is pointed at the result), then one small `ingest --once`-
   sized run (2 partitions x 200 records, realistic workload); wall time of the run, of its phases
   (`engine/phases.py`) and the size of the metadata.json it read.
2. `compaction`: a landed table plus N small data files (a day of the demo's small commits, added in one commit),
   compacted by `maintenance.compact` while ingestion rounds run next to it in the same Spark application: time,
   files and bytes before/after, commit attempts, ingestion records/s alone and during compaction, and a row count
   check (nothing lost or doubled).
3. `metadata`: N individual commits with the table properties we set at creation (bounded metadata) and snapshot
   expiry every 100 commits (the newest 100 kept), against M commits with pyiceberg's defaults and no expiry: size
   of the metadata folder and of the newest metadata.json, and bytes per retained snapshot.
Prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot, SnapshotLogEntry, Summary
from sqlalchemy import text

from kafscale_lakehouse.apps.workload import write_partition_segments
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.catalog import load_catalog, open_table
from kafscale_lakehouse.engine.ingest import ingest
from kafscale_lakehouse.engine.maintenance import compact, expire_snapshots
from kafscale_lakehouse.engine.phases import phase_listener
from kafscale_lakehouse.engine.snapshot_summary import (
    COMMIT_ID_PROPERTY,
    OFFSETS_PROPERTY_PREFIX,
    PUBLISHED_THROUGH_PROPERTY,
    RUN_ID_PROPERTY,
    format_offsets_property,
    read_topic_offsets,
)
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


def _empty_commits(table, count: int, topic: str) -> None:
    """`count` commits of no file carrying offsets, one at a time (as ingestion commits)."""
    for _ in range(count):
        props = {OFFSETS_PROPERTY_PREFIX + topic: format_offsets_property({0: 0, 1: 0})}
        with table.transaction() as transaction, transaction.update_snapshot(snapshot_properties=props).fast_append():
            pass


def _with_history(catalog, table, count: int):
    """`table` (of the sqlite `catalog`) with a history of `count` snapshots like its current one (an ingestion
    commit), written as one metadata file, 30 s apart and ending now.

    Committing them one by one would cost O(count^2) (every commit writes the whole metadata). The copies share the
    current snapshot's manifest list and summary; each has its own run and commit id and names its parent as the
    snapshot its run's dead letters were published through, as ingestion commits do."""
    template = table.current_snapshot()
    properties = template.summary.additional_properties
    start_ms = template.timestamp_ms - count * 30_000
    snapshots, log_entries, parent = [], [], None
    for i in range(count):
        snapshot_id = 10_000_000 + i
        marks = {RUN_ID_PROPERTY: f"history-{i}", COMMIT_ID_PROPERTY: uuid.uuid4().hex}
        if parent is not None:
            marks[PUBLISHED_THROUGH_PROPERTY] = str(parent)
        snapshot = Snapshot(snapshot_id=snapshot_id, parent_snapshot_id=parent, sequence_number=i + 1,
                            timestamp_ms=start_ms + i * 30_000, manifest_list=template.manifest_list,
                            summary=Summary(template.summary.operation, **{**properties, **marks}),
                            schema_id=template.schema_id)
        snapshots.append(snapshot)
        log_entries.append(SnapshotLogEntry(snapshot_id=snapshot_id, timestamp_ms=snapshot.timestamp_ms))
        parent = snapshot_id
    metadata = table.metadata.model_copy(update={
        "snapshots": snapshots, "snapshot_log": log_entries, "current_snapshot_id": parent,
        "last_sequence_number": count, "metadata_log": [],
        "refs": {"main": SnapshotRef(snapshot_id=parent, snapshot_ref_type=SnapshotRefType.BRANCH)}})
    location = table.metadata_location.rsplit("/", 1)[0] + f"/{uuid.uuid4()}.metadata.json"
    ToOutputFile.table_metadata(metadata, table.io.new_output(location))
    # The sqlite catalog's own row (its register_table cannot overwrite): this history replaces the table's.
    namespace, name = table.name()
    with catalog.engine.begin() as connection:
        connection.execute(text("UPDATE iceberg_tables SET metadata_location = :location WHERE table_namespace = "
                                ":namespace AND table_name = :name"),
                           {"location": location, "namespace": namespace, "name": name})
    return catalog.load_table(table.name())


def run_cost(spark, snapshots: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        topic, name = "bench-orders", "bench.orders"
        config = _config(root, topic, name)
        _ingest_round(root, config, spark, topic, 0, 200)  # the commit the history is made of
        started = time.monotonic()
        table = _with_history(load_catalog(catalog_settings(config)), _table(config), snapshots)
        built = time.monotonic() - started
        assert len(table.metadata.snapshots) == snapshots and read_topic_offsets(table, topic) == {0: 200, 1: 200}
        metadata_bytes = Path(table.metadata_location.removeprefix("file://")).stat().st_size
        phases: dict[str, float] = {}
        with phase_listener(lambda name, seconds: phases.__setitem__(name, phases.get(name, 0.0) + seconds)):
            t0 = time.monotonic()
            records = _ingest_round(root, config, spark, topic, 200, 200)
            elapsed = time.monotonic() - t0
        assert records == 400, records
        return {"benchmark": "run-cost", "snapshots": snapshots, "metadata_json_bytes": metadata_bytes,
                "history_build_seconds": round(built, 2), "run_seconds": round(elapsed, 3),
                "phases_seconds": {k: round(v, 3) for k, v in phases.items()}, "records": records}


def _small_files(table, count: int, rows: int) -> list[str]:
    """`count` Parquet files of `rows` rows each of the table's schema, under its data location."""
    arrow_schema = table.schema().as_arrow()
    paths = []
    for i in range(count):
        columns = {}
        for field in arrow_schema:
            if field.name == "record_id":
                columns[field.name] = pa.array([f"small:9:{i * rows + r}" for r in range(rows)], field.type)
            elif field.name == "topic":
                columns[field.name] = pa.array(["small"] * rows, field.type)
            elif pa.types.is_string(field.type):
                columns[field.name] = pa.array([f"{field.name}-{i}-{r}" for r in range(rows)], field.type)
            elif pa.types.is_binary(field.type):
                columns[field.name] = pa.array([b"x" * 200] * rows, field.type)
            elif pa.types.is_timestamp(field.type):
                columns[field.name] = pa.array([datetime.now(UTC)] * rows, field.type)
            else:
                columns[field.name] = pa.array([i * rows + r for r in range(rows)]).cast(field.type)
        path = f"{table.location()}/data/small/small-{i:05d}.parquet"
        with table.io.new_output(path).create(overwrite=True) as out:
            pq.write_table(pa.table(columns, schema=arrow_schema), out)
        paths.append(path)
    return paths


def _ingest_round(root: Path, config, spark, topic: str, base: int, records: int) -> int:
    for partition in (0, 1):
        write_partition_segments(root / "segments", record_count=records, namespace="bench", topic=topic,
                                 partition=partition, base_offset=base, records_per_segment=max(1, records // 4),
                                 workload="realistic")
    [result] = ingest(config, spark)
    return result.records


def compaction(spark, files: int, *, rounds_alone: int = 3, records_per_round: int = 20_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        topic = "bench-small"
        config = _config(root, topic, "bench.small")
        landed = _ingest_round(root, config, spark, topic, 0, 200)
        base = 200
        table = _table(config)
        t0 = time.monotonic()
        table.add_files(_small_files(table, files, rows=50),
                        snapshot_properties={OFFSETS_PROPERTY_PREFIX + topic: format_offsets_property(
                            read_topic_offsets(table, topic))})
        built = time.monotonic() - t0

        t0 = time.monotonic()
        for _ in range(rounds_alone):
            landed += _ingest_round(root, config, spark, topic, base, records_per_round)
            base += records_per_round
        alone_rate = rounds_alone * 2 * records_per_round / (time.monotonic() - t0)

        table.refresh()
        before = table.current_snapshot().summary
        outcome: dict = {}

        def run() -> None:
            started = time.monotonic()
            outcome["result"] = compact(spark, _table(config), target_file_size_bytes=128 * 1024 * 1024,
                                        min_input_files=2)
            outcome["seconds"] = time.monotonic() - started

        worker = threading.Thread(target=run)
        t0 = time.monotonic()
        worker.start()
        during = 0
        while worker.is_alive():
            during += _ingest_round(root, config, spark, topic, base, records_per_round)
            base += records_per_round
        during_seconds = time.monotonic() - t0
        worker.join()
        landed += during
        result = outcome["result"]
        table.refresh()
        after = table.current_snapshot().summary
        rows = table.scan(selected_fields=("record_id",)).to_arrow().num_rows
        assert rows == landed + files * 50, (rows, landed, files)
        return {"benchmark": "compaction", "small_files": files, "build_seconds": round(built, 1),
                "compaction_seconds": round(outcome["seconds"], 2), "commit_attempts": result.attempts,
                "files_before": int(before["total-data-files"]), "bytes_before": int(before["total-files-size"]),
                "files_after": int(after["total-data-files"]), "bytes_after": int(after["total-files-size"]),
                "files_compacted": result.files_compacted, "files_written": result.files_written,
                "ingest_records_per_second_alone": round(alone_rate),
                "ingest_records_per_second_during_compaction": round(during / during_seconds),
                "ingest_rounds_during_compaction": during // (2 * records_per_round),
                "rows_checked": rows}


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
        snapshots = len(table.metadata.snapshots)
        return {"benchmark": "metadata", "commits": commits, "maintained": maintained,
                "seconds": round(elapsed, 1), "metadata_files": len(files),
                "metadata_folder_bytes": sum(p.stat().st_size for p in files),
                "newest_metadata_json_bytes": newest.stat().st_size, "snapshots": snapshots,
                "metadata_json_bytes_per_snapshot": round(newest.stat().st_size / snapshots)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snapshots", default="10,1000,5000")
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument("--commits", type=int, default=5000)
    parser.add_argument("--unmaintained-commits", type=int, default=1000,
                        help="commits of the comparison without maintenance (its cost grows with the square)")
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
        print(json.dumps(metadata_size(args.commits, maintained=True)), flush=True)
        print(json.dumps(metadata_size(args.unmaintained_commits, maintained=False)), flush=True)


if __name__ == "__main__":
    main()
