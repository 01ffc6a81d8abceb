"""Table-lifecycle benchmarks: run cost against history length, compaction, metadata size.

    .venv/bin/python benchmarks/maintenance.py [--snapshots 10,1000,5000] [--small-files 2000] [--commits 5000]
                                              [--unmaintained-commits 1000] [--only run-cost|compaction|metadata]

Embedded set-up (local segment directory, sqlite catalog, local offsets store) in a temporary directory:
1. `run-cost`: a table whose history has N snapshots carrying our offsets (built in one metadata write: the
   snapshots share one real manifest list, the catalog is pointed at the result), then one small `ingest --once`-
   sized run (2 partitions x 200 records, realistic workload); wall time of the run, of its phases
   (`engine/phases.py`) and the size of the metadata.json it read.
2. `compaction`: a landed table plus N small data files of 50 rows (written with pyarrow in the Arrow types our
   ingestion writes, added in one `add_files` commit that carries the table's offsets, as a day of the demo's small
   commits would), compacted by `maintenance.compact` in a thread while the main thread runs ingestion rounds
   (2 partitions x 20,000 realistic records each) into the same table in the same Spark application: time, files
   and bytes before/after, commit attempts, ingestion records/s alone and during compaction (of the `ingest` calls
   only; a round's segments are written before its clock starts), and checks that the table then holds every
   record once (row count = distinct record ids = small files' rows + ingested records) and the ingested offsets.
3. `metadata`: N individual commits (through `append_without_client_retries`, as ingestion commits) with the table
   properties we set at creation (bounded metadata) and snapshot expiry every 100 commits (the newest 100 kept),
   against M (`--unmaintained-commits`, default 1,000: its metadata grows with the square) commits with pyiceberg's
   defaults and no expiry: size of the metadata folder (metadata.json files, and manifest lists, which orphan-file
   removal would take for expired snapshots) and of the newest metadata.json, and bytes per retained snapshot.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot, SnapshotLogEntry, Summary
from sqlalchemy import text

from kafscale_lakehouse.apps.workload import write_partition_segments
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.maintenance import MaintenanceSettings, compact, expire_snapshots, remove_orphan_files
from kafscale_lakehouse.engine.phases import phase_listener
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.commits import append_without_client_retries
from kafscale_lakehouse.engine.tables.summary import (
    COMMIT_ID_PROPERTY,
    OFFSETS_PROPERTY_PREFIX,
    PUBLISHED_THROUGH_PROPERTY,
    RUN_ID_PROPERTY,
    format_offsets_property,
    read_topic_offsets,
)
from kafscale_lakehouse.schema import record_arrow_schema, table_schema

log = logging.getLogger("benchmarks.maintenance")
COMMITS_PER_MAINTENANCE_RUN = 120  # maintenance's default hourly schedule at a 30 s commit cadence
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
    """`count` commits of no file carrying offsets, one at a time, through the commit path ingestion commits take
    (`append_without_client_retries`: our commit view, whose transaction does not deep-copy the history per read;
    pyiceberg's own `table.transaction()` costs O(snapshots) per read, ~15 reads per commit)."""
    props = {OFFSETS_PROPERTY_PREFIX + topic: format_offsets_property({0: 0, 1: 0})}
    for _ in range(count):
        append_without_client_retries(table, [], props)


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


def _small_files(table, columns_config, count: int, rows: int) -> list[str]:
    """`count` Parquet files of `rows` rows each, under the table's data location, written with pyarrow in the
    Arrow types our ingestion writes (`record_arrow_schema`: string/binary, not pyiceberg's large_string/
    large_binary: a compaction group mixing both fails, its writer takes the first file's types and refuses the
    other's rows) and without Iceberg field ids (`add_files` maps columns by name). Record ids `small:9:<n>`."""
    arrow_schema = record_arrow_schema(columns_config)
    now = int(time.time() * 1000)
    paths = []
    for i in range(count):
        numbers = list(range(i * rows, (i + 1) * rows))
        columns = {}
        for field in arrow_schema:
            if field.name == "record_id":
                values = [f"small:9:{n}" for n in numbers]
            elif field.name == "topic":
                values = ["small"] * rows
            elif field.name == "timestamp_ms":
                values = [now] * rows
            elif field.name == "headers":
                values = ["[]"] * rows
            elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
                values = [f"{field.name}-{n}" for n in numbers]
            elif pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
                values = [b"x" * 200] * rows
            else:
                values = numbers
            columns[field.name] = pa.array(values, field.type)
        path = f"{table.location()}/data/small/small-{i:05d}.parquet"
        with table.io.new_output(path).create(overwrite=True) as out:
            pq.write_table(pa.table(columns, schema=arrow_schema), out)
        paths.append(path)
    return paths


def _write_round(root: Path, topic: str, base: int, records: int) -> None:
    """Segments of `records` realistic records per partition (0 and 1) from offset `base`."""
    for partition in (0, 1):
        write_partition_segments(root / "segments", record_count=records, namespace="bench", topic=topic,
                                 partition=partition, base_offset=base, records_per_segment=max(1, records // 4),
                                 workload="realistic")


def _ingest_round(root: Path, config, spark, topic: str, base: int, records: int) -> int:
    _write_round(root, topic, base, records)
    [result] = ingest(config, spark)
    return result.records


def _timed_ingest(config, spark) -> tuple[int, float]:
    """One `ingest` of the segments written so far: records and wall seconds (segment writing not included)."""
    started = time.monotonic()
    [result] = ingest(config, spark)
    return result.records, time.monotonic() - started


def compaction(spark, files: int, *, rounds_alone: int = 3, records_per_round: int = 20_000) -> dict:
    """Rates are records per second of `ingest` calls only (the segments of a round are written before its clock
    starts; compaction goes on meanwhile). A round counts as during compaction when it started while compaction ran."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        topic = "bench-small"
        config = _config(root, topic, "bench.small")
        landed = _ingest_round(root, config, spark, topic, 0, 200)
        base = 200
        table = _table(config)
        t0 = time.monotonic()
        paths = _small_files(table, config.mappings[0].columns, files, rows=50)
        written = time.monotonic() - t0
        # Carrying the offsets, as every snapshot of ours does: ingestion reads them from the newest snapshot.
        table.add_files(paths, snapshot_properties={OFFSETS_PROPERTY_PREFIX + topic: format_offsets_property(
            read_topic_offsets(table, topic))})
        built = time.monotonic() - t0

        alone_records, alone_seconds = 0, 0.0
        for _ in range(rounds_alone):
            _write_round(root, topic, base, records_per_round)
            base += records_per_round
            records, seconds = _timed_ingest(config, spark)
            alone_records += records
            alone_seconds += seconds
        landed += alone_records

        table.refresh()
        before = table.current_snapshot().summary
        outcome: dict = {}

        def run() -> None:
            started = time.monotonic()
            try:
                outcome["result"] = compact(spark, _table(config), target_file_size_bytes=128 * 1024 * 1024,
                                            min_input_files=2)
            except BaseException as error:  # reported by the main thread
                outcome["error"] = error
            outcome["seconds"] = time.monotonic() - started

        during_records, during_seconds, during_rounds = 0, 0.0, 0
        _write_round(root, topic, base, records_per_round)
        worker = threading.Thread(target=run)
        worker.start()
        while worker.is_alive():
            base += records_per_round
            records, seconds = _timed_ingest(config, spark)
            during_records += records
            during_seconds += seconds
            during_rounds += 1
            _write_round(root, topic, base, records_per_round)  # the next round's, while compaction goes on
        worker.join()
        if "error" in outcome:
            raise outcome["error"]
        records, _ = _timed_ingest(config, spark)  # the round written last
        base += records_per_round
        landed += during_records + records
        result = outcome["result"]
        table.refresh()
        after = table.current_snapshot().summary
        record_ids = table.scan(selected_fields=("record_id",)).to_arrow().column("record_id")
        rows, distinct = len(record_ids), pc.count_distinct(record_ids).as_py()
        assert rows == distinct == landed + files * 50, (rows, distinct, landed, files)
        offsets = read_topic_offsets(table, topic)
        assert offsets == {0: base, 1: base}, (offsets, base)
        return {"benchmark": "compaction", "small_files": files, "small_files_write_seconds": round(written, 1),
                "build_seconds": round(built, 1),
                "compaction_seconds": round(outcome["seconds"], 2), "commit_attempts": result.attempts,
                "files_before": int(before["total-data-files"]), "bytes_before": int(before["total-files-size"]),
                "files_after": int(after["total-data-files"]), "bytes_after": int(after["total-files-size"]),
                "files_compacted": result.files_compacted, "files_written": result.files_written,
                "bytes_compacted": result.bytes_before, "bytes_written": result.bytes_after,
                "ingest_records_per_second_alone": round(alone_records / alone_seconds),
                "ingest_rounds_alone": rounds_alone,
                "ingest_records_per_second_during_compaction": round(during_records / during_seconds)
                if during_seconds else None,
                "ingest_rounds_during_compaction": during_rounds,
                "ingest_seconds_during_compaction": round(during_seconds, 2),
                "rows_checked": rows, "distinct_record_ids": distinct}


def metadata_size(commits: int, *, maintained: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        properties = {} if maintained else {"write.metadata.delete-after-commit.enabled": "false",
                                            "write.metadata.previous-versions-max": "100000"}
        config = _config(root, "bench-meta", "bench.meta", **properties)
        table = _table(config)
        t0 = time.monotonic()
        defaults = MaintenanceSettings()
        for i in range(commits):
            _empty_commits(table, 1, "bench-meta")
            if maintained and (i + 1) % COMMITS_PER_MAINTENANCE_RUN == 0:  # the default schedule and expiry
                expire_snapshots(table, older_than=datetime.now(UTC) - defaults.snapshot_max_age,
                                 retain_last=defaults.retain_last, max_snapshots=defaults.max_snapshots)
        elapsed = time.monotonic() - t0
        if maintained:  # what the default orphan-file removal deletes once its 3 days have passed
            remove_orphan_files(table, older_than=datetime.now(UTC))
        metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
        files = [p for p in metadata_dir.iterdir() if p.is_file()]
        json_files = [p for p in files if p.name.endswith(".metadata.json")]
        manifest_lists = [p for p in files if p.name.startswith("snap-")]
        newest = Path(table.metadata_location.removeprefix("file://"))
        snapshots = len(table.metadata.snapshots)
        return {"benchmark": "metadata", "commits": commits, "maintained": maintained,
                "seconds": round(elapsed, 1), "metadata_files": len(files),
                "metadata_folder_bytes": sum(p.stat().st_size for p in files),
                "metadata_json_files": len(json_files),
                "metadata_json_files_bytes": sum(p.stat().st_size for p in json_files),
                "manifest_list_files": len(manifest_lists),
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
