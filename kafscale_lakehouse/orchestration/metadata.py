"""Materialization metadata of the tables: what a landed table's asset records per run and per Kafka partition, the
Dagster table keys every table asset carries, and the keys the asset checks and `load_input` read back.

A landed table's run (assets.py) records on every partition's materialization the run's snapshot id, a table of the
Kafka partitions, the committed offset ranges and the invalid records (`run_metadata`), the table's name, URI, column
schema and row count (`table_metadata`), and that partition's own offset range, records, bytes, data files and lag
(`partition_metadata`), and the rows the table holds of that Kafka partition (`dagster/partition_row_count`) with the
snapshot they were counted at (`partition_row_count_snapshot_id`). The count is exact and costs what was added: the
partition's previous materialization's count carried over the appends since (`count_rows_by_value`), counted from
the table's manifests when something else happened since (a delete, a rewrite, a rollback) or none is recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import dagster as dg
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from kafscale_lakehouse.engine.ingestion import IngestResult, PartitionOutcome
from kafscale_lakehouse.engine.tables import RowCount, count_rows_by_value
from kafscale_lakehouse.offsets.ranges import OffsetRange, format_ranges, parse_ranges
from kafscale_lakehouse.orchestration.naming import kafka_partition_key

# Materialization metadata keys that asset checks (checks.py) and `load_input` (io_manager.py) read back.
INVALID_RECORDS_KEY = "invalid_records"
INVALID_SAMPLES_KEY = "invalid_samples"
DEAD_LETTER_TABLE_KEY = "dead_letter_table"
SNAPSHOT_ID_KEY = "snapshot_id"
# `{"<partition>": [start, end]}`: the offsets the run committed (record_id_unique scans them).
COMMITTED_RANGES_KEY = "committed_offset_ranges"
# Definition metadata: the table of an asset (dagster-iceberg's name), and the mark of a landed table (partitions =
# Kafka partition ids).
TABLE_NAME_KEY = "dagster/table_name"
TOPIC_KEY = "kafscale/topic"
PARTITION_ROW_COUNT_KEY = "dagster/partition_row_count"
# The table snapshot `dagster/partition_row_count` counts: the next count starts from it.
ROW_COUNT_SNAPSHOT_KEY = "partition_row_count_snapshot_id"
# `{"snapshot_id": "S", "rows": {"<partition>": rows}}`: the rows of every Kafka partition the table held at snapshot
# S, on each partition's materialization, so the next count starts from the asset's latest materialization alone (one
# event-log read for all the tables of a batch, `row_counts_from`). The snapshot id is a string: the UI shows JSON
# numbers as JavaScript doubles, and a snapshot id (64 bits) would show rounded.
PARTITION_ROW_COUNTS_KEY = "kafscale/partition_row_counts"

TableValue = str | int | float | bool | None  # a cell of a `dg.TableRecord`

_PARTITION_TABLE_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("partition", "int"),
        dg.TableColumn("start_offset", "int", description="next offset before the run"),
        dg.TableColumn("end_offset", "int", description="next offset after the run (exclusive end)"),
        dg.TableColumn("records", "int"),
        dg.TableColumn("value_bytes", "int"),
        dg.TableColumn("data_files", "int"),
        dg.TableColumn("segments", "int"),
        dg.TableColumn("lag", "int", description="broker next offset - end_offset"),
        dg.TableColumn("skipped", "string", description="offsets deleted before ingestion, skipped by allow_gaps"),
        dg.TableColumn("error", "string"),
    ]
)
INVALID_SAMPLES_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("record_id", "string"),
        dg.TableColumn("reason", "string"),
        dg.TableColumn(
            "schema_path", "string", description="the violated JSON Schema keyword (none: a coercion failure)"
        ),
    ]
)


def table_metadata(table: Table, identifier: str) -> dict[str, dg.RawMetadataValue]:
    """The Dagster table metadata keys of the table as it is now: name, URI, column schema, row count."""
    snapshot = table.current_snapshot()
    total = snapshot.summary.get("total-records") if snapshot is not None and snapshot.summary else None
    return {
        TABLE_NAME_KEY: identifier,
        "dagster/column_schema": column_schema(table.schema()),
        "dagster/row_count": int(total) if total is not None else 0,
        "dagster/uri": dg.MetadataValue.path(table.location()),
    }


def column_schema(schema: Schema) -> dg.TableSchemaMetadataValue:
    return dg.MetadataValue.table_schema(
        dg.TableSchema(
            columns=[
                dg.TableColumn(
                    f.name,
                    str(f.field_type),
                    description=f.doc,
                    constraints=dg.TableColumnConstraints(nullable=not f.required),
                )
                for f in schema.fields
            ]
        )
    )


def run_metadata(result: IngestResult) -> dict[str, dg.MetadataValue]:
    """What every partition's materialization of a run carries: snapshot, per-partition table, invalid records."""
    rows = [
        dg.TableRecord(
            {
                "partition": o.partition,
                "start_offset": o.start_offset,
                "end_offset": o.end_offset,
                "records": o.records,
                "value_bytes": o.value_bytes,
                "data_files": o.data_files,
                "segments": o.segments,
                "lag": o.lag,
                "skipped": _skipped_text(o),
                "error": o.error,
            }
        )
        for o in sorted(result.partitions.values(), key=lambda o: o.partition)
    ]
    samples = [
        dg.TableRecord({"record_id": s.record_id, "reason": s.reason, "schema_path": s.schema_path})
        for s in result.invalid_samples
    ]
    lost = (
        {"dead_letters_lost": dg.MetadataValue.md("\n".join(f"- {m}" for m in result.dead_letters_lost))}
        if result.dead_letters_lost
        else {}
    )
    return {
        **lost,
        SNAPSHOT_ID_KEY: dg.MetadataValue.int(result.snapshot_id)
        if result.snapshot_id is not None
        else dg.MetadataValue.null(),
        "kafka_partitions": dg.MetadataValue.table(rows, schema=_PARTITION_TABLE_SCHEMA),
        "records_in_run": dg.MetadataValue.int(result.records),
        COMMITTED_RANGES_KEY: dg.MetadataValue.json(json.loads(format_ranges(result.committed_ranges()))),
        INVALID_RECORDS_KEY: dg.MetadataValue.int(result.invalid_count),
        INVALID_SAMPLES_KEY: dg.MetadataValue.table(samples, schema=INVALID_SAMPLES_SCHEMA),
        DEAD_LETTER_TABLE_KEY: dg.MetadataValue.text(result.dead_letter_table)
        if result.dead_letter_table
        else dg.MetadataValue.null(),
    }


def partition_metadata(outcome: PartitionOutcome) -> dict[str, dg.MetadataValue]:
    """One Kafka partition's part of a run, for that partition's materialization."""
    metadata: dict[str, dg.MetadataValue] = {
        "kafka_partition": dg.MetadataValue.int(outcome.partition),
        "offset_range": dg.MetadataValue.text(
            f"[{_offset_text(outcome.start_offset)}, {_offset_text(outcome.end_offset)})"
        ),
        "records": dg.MetadataValue.int(outcome.records),
        "value_bytes": dg.MetadataValue.int(outcome.value_bytes),
        "data_files": dg.MetadataValue.int(outcome.data_files),
        "segments": dg.MetadataValue.int(outcome.segments),
        "lag": dg.MetadataValue.int(outcome.lag) if outcome.lag is not None else dg.MetadataValue.null(),
    }
    for key, value in (("start_offset", outcome.start_offset), ("end_offset", outcome.end_offset)):
        if value is not None:
            metadata[key] = dg.MetadataValue.int(value)
    skipped = _skipped_text(outcome)
    if skipped is not None:
        metadata["skipped_offsets"] = dg.MetadataValue.text(skipped)
    if outcome.error is not None:
        metadata["error"] = dg.MetadataValue.text(outcome.error)
    return metadata


def landed_partition_metadata(outcome: PartitionOutcome, count: RowCount) -> dict[str, dg.MetadataValue]:
    """`partition_metadata` and the rows the table holds of that Kafka partition (`partition_row_counts`)."""
    return {**partition_metadata(outcome), PARTITION_ROW_COUNT_KEY: dg.MetadataValue.int(count.rows),
            ROW_COUNT_SNAPSHOT_KEY: dg.MetadataValue.int(count.snapshot_id) if count.snapshot_id is not None
            else dg.MetadataValue.null()}


def partition_row_counts(instance: dg.DagsterInstance, asset_key: dg.AssetKey, table: Table,
                         partitions: Sequence[int]) -> dict[int, RowCount]:
    """`row_counts_from` the asset's latest materialization, read here."""
    return row_counts_from(instance, asset_key, table, partitions, instance.get_latest_materialization_event(asset_key))


def row_counts_from(instance: dg.DagsterInstance, asset_key: dg.AssetKey, table: Table, partitions: Sequence[int],
                    latest: dg.EventLogEntry | None) -> dict[int, RowCount]:
    """The rows `table` (a landed table, as it is now) holds of each Kafka partition of `partitions` and of those
    `latest` (the asset's latest materialization) counted: its counts carried forward when that holds exactly, else
    counted (`count_rows_by_value`). A materialization without `PARTITION_ROW_COUNTS_KEY` (recorded before it
    existed): each partition's latest count, read from the event log (`recorded_row_counts`)."""
    previous = _row_counts_of(latest)
    if previous is None:
        previous = recorded_row_counts(instance, asset_key, partitions)
    return count_rows_by_value(table, "partition", sorted({*partitions, *previous}), previous=previous)


def row_counts_metadata(counts: Mapping[int, RowCount]) -> dict[str, dg.MetadataValue]:
    """`PARTITION_ROW_COUNTS_KEY` of `counts` (`row_counts_from`'s: all at the table's current snapshot)."""
    snapshots = {count.snapshot_id for count in counts.values()}
    if len(snapshots) != 1:
        return {}
    snapshot_id = snapshots.pop()
    return {PARTITION_ROW_COUNTS_KEY: dg.MetadataValue.json(
        {"snapshot_id": None if snapshot_id is None else str(snapshot_id),
         "rows": {str(p): count.rows for p, count in sorted(counts.items())}})}


def _row_counts_of(entry: dg.EventLogEntry | None) -> dict[int, RowCount] | None:
    materialization = entry.asset_materialization if entry is not None else None
    value = materialization.metadata.get(PARTITION_ROW_COUNTS_KEY) if materialization is not None else None
    if not isinstance(value, dg.JsonMetadataValue) or not isinstance(value.value, dict):
        return None
    snapshot_id, rows = value.value.get("snapshot_id"), value.value.get("rows")
    if not isinstance(rows, dict) or not (snapshot_id is None or (isinstance(snapshot_id, str)
                                                                   and snapshot_id.lstrip("-").isdigit())) \
            or not all(isinstance(n, int) and str(p).isdigit() for p, n in rows.items()):
        return None  # not ours to trust: count as if there were none
    return {int(p): RowCount(n, None if snapshot_id is None else int(snapshot_id)) for p, n in rows.items()}


def recorded_row_counts(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                        partitions: Sequence[int]) -> dict[int, RowCount]:
    """The row count and its snapshot of each partition's latest materialization that records both (two event-log
    queries for all the partitions)."""
    keys = {kafka_partition_key(p): p for p in partitions}
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, partitions=set(keys))
    if not latest:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=list(latest.values())), limit=len(latest)).records
    counts = {}
    for record in records:
        materialization = record.asset_materialization
        if materialization is None or materialization.partition not in keys:
            continue
        rows = materialization.metadata.get(PARTITION_ROW_COUNT_KEY)
        snapshot = materialization.metadata.get(ROW_COUNT_SNAPSHOT_KEY)
        if isinstance(rows, dg.IntMetadataValue) and isinstance(snapshot, dg.IntMetadataValue) \
                and rows.value is not None and snapshot.value is not None:
            counts[keys[materialization.partition]] = RowCount(rows.value, snapshot.value)
    return counts


def invalid_samples_from_metadata(metadata: Mapping[str, dg.MetadataValue]) -> list[dict[str, TableValue]]:
    """The `{record_id, reason, schema_path}` samples `run_metadata` stored."""
    value = metadata.get(INVALID_SAMPLES_KEY)
    if not isinstance(value, dg.TableMetadataValue):
        return []
    return [dict(record.data) for record in value.records]


def committed_ranges_from_metadata(metadata: Mapping[str, dg.MetadataValue]) -> dict[int, OffsetRange] | None:
    """The ranges `run_metadata` stored; None when the metadata has none (not a materialization of ours)."""
    value = metadata.get(COMMITTED_RANGES_KEY)
    if not isinstance(value, dg.JsonMetadataValue):
        return None
    return parse_ranges(json.dumps(value.value), where=f"materialization metadata {COMMITTED_RANGES_KEY}")


def snapshot_id_from_metadata(metadata: Mapping[str, dg.MetadataValue]) -> int | None:
    """The snapshot id `run_metadata` (or a downstream write) stored; None when there is none."""
    value = metadata.get(SNAPSHOT_ID_KEY)
    return value.value if isinstance(value, dg.IntMetadataValue) else None


def _offset_text(offset: int | None) -> str:
    return "earliest" if offset is None else str(offset)


def _skipped_text(outcome: PartitionOutcome) -> str | None:
    return None if outcome.skipped is None else f"{outcome.skipped.start}..{outcome.skipped.end - 1}"
