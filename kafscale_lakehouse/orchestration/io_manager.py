"""The PySpark IO manager: commits a table asset's prepared batch to Iceberg and loads tables for downstream assets.

`handle_output` runs `engine.ingest.commit_ingest`: one Spark job whose tasks decode the planned segments and write
them as Parquet data files (`engine.spark_ingestion`), then one Iceberg commit re-checks the start offsets, then etcd offsets; the
run's leases are released on every exit path (as `PreparedIngest.release_leases` does). Each Kafka partition's materialization
gets its own offset range, records, bytes, data files and lag; all of them carry the run's snapshot id, a
per-partition table and the invalid records. A run that could commit only some partitions records materializations
for those, then fails naming the rest.
"""

import json
from collections.abc import Mapping

import dagster as dg
from pyiceberg.expressions import AlwaysTrue, BooleanExpression, EqualTo, In
from pyspark.sql import DataFrame

from kafscale_lakehouse.engine.ingest import (
    IngestFailedError,
    IngestResult,
    PartitionOutcome,
    PreparedIngest,
    commit_ingest,
)
from kafscale_lakehouse.offsets.ranges import OffsetRange, format_ranges, parse_ranges
from kafscale_lakehouse.orchestration.naming import kafka_partition_id, kafka_partition_key
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, SparkResource

# Materialization metadata keys that asset checks read back (checks.py).
INVALID_RECORDS_KEY = "invalid_records"
INVALID_SAMPLES_KEY = "invalid_samples"
DEAD_LETTER_TABLE_KEY = "dead_letter_table"
SNAPSHOT_ID_KEY = "snapshot_id"
# `{"<partition>": [start, end]}`: the offsets the run committed (record_id_unique scans them).
COMMITTED_RANGES_KEY = "committed_offset_ranges"

_PARTITION_TABLE_SCHEMA = dg.TableSchema(columns=[
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
])
INVALID_SAMPLES_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("record_id", "string"),
    dg.TableColumn("reason", "string"),
    dg.TableColumn("schema_path", "string", description="the violated JSON Schema keyword (none: a coercion failure)"),
])


class KafscaleIcebergIOManager(dg.ConfigurableIOManager):
    """Stores `PreparedIngest` batches of table assets in Iceberg; loads a table (or some of its Kafka partitions) as
    a Spark DataFrame, read through pyiceberg and Arrow."""

    iceberg_catalog: IcebergCatalogResource
    spark: SparkResource

    def handle_output(self, context: dg.OutputContext, obj: PreparedIngest) -> None:
        if not isinstance(obj, PreparedIngest):
            raise TypeError(f"asset {context.asset_key.to_user_string()}: the Iceberg IO manager stores the "
                            f"PreparedIngest of a table asset, not {type(obj).__name__}")
        try:
            result = commit_ingest(obj)
        except IngestFailedError as exc:
            self._record_partial_commit(context, exc.result)
            raise dg.Failure(description=str(exc), metadata=run_metadata(exc.result)) from exc
        context.add_output_metadata(run_metadata(result))
        for partition_key in context.asset_partition_keys:
            outcome = result.partitions.get(kafka_partition_id(partition_key))
            if outcome is not None:
                context.step_context.add_asset_metadata(partition_metadata(outcome), partition_key=partition_key)
        context.log.info("table %s: run %s committed %d records of topic %s in snapshot %s", result.table,
                         result.run_id, result.records, result.topic, result.snapshot_id)

    def _record_partial_commit(self, context: dg.OutputContext, result: IngestResult) -> None:
        """Materializations for the partitions committed before the run failed on others. Events logged through
        the context are dropped when `handle_output` raises, so they are reported to the instance directly (as
        events outside the run, naming it in `run_id`)."""
        if result.snapshot_id is None:
            return
        shared = {**run_metadata(result), "run_id": dg.MetadataValue.text(result.run_id)}
        for outcome in result.partitions.values():
            if outcome.error is None and outcome.records > 0:
                context.step_context.instance.report_runless_asset_event(dg.AssetMaterialization(
                    asset_key=context.asset_key, partition=kafka_partition_key(outcome.partition),
                    metadata={**shared, **partition_metadata(outcome)}))

    def load_input(self, context: dg.InputContext) -> DataFrame:
        identifier = ".".join(context.asset_key.path)
        table = self.iceberg_catalog.load_table(identifier)
        row_filter: BooleanExpression = AlwaysTrue()
        if context.has_asset_partitions:
            partitions = sorted(kafka_partition_id(key) for key in context.asset_partition_keys)
            row_filter = EqualTo("partition", partitions[0]) if len(partitions) == 1 else In("partition", partitions)
        return self.spark.spark_session.createDataFrame(table.scan(row_filter=row_filter).to_arrow())


def run_metadata(result: IngestResult) -> dict[str, dg.MetadataValue]:
    """What every partition's materialization of a run carries: snapshot, per-partition table, invalid records."""
    rows = [dg.TableRecord({
        "partition": o.partition, "start_offset": o.start_offset, "end_offset": o.end_offset, "records": o.records,
        "value_bytes": o.value_bytes, "data_files": o.data_files, "segments": o.segments, "lag": o.lag,
        "skipped": _skipped_text(o), "error": o.error,
    }) for o in sorted(result.partitions.values(), key=lambda o: o.partition)]
    samples = [dg.TableRecord({"record_id": s.record_id, "reason": s.reason, "schema_path": s.schema_path})
               for s in result.invalid_samples]
    lost = ({"dead_letters_lost": dg.MetadataValue.md("\n".join(f"- {m}" for m in result.dead_letters_lost))}
            if result.dead_letters_lost else {})
    return {
        **lost,
        SNAPSHOT_ID_KEY: dg.MetadataValue.int(result.snapshot_id) if result.snapshot_id is not None
        else dg.MetadataValue.null(),
        "kafka_partitions": dg.MetadataValue.table(rows, schema=_PARTITION_TABLE_SCHEMA),
        "records_in_run": dg.MetadataValue.int(result.records),
        COMMITTED_RANGES_KEY: dg.MetadataValue.json(json.loads(format_ranges(result.committed_ranges()))),
        INVALID_RECORDS_KEY: dg.MetadataValue.int(result.invalid_count),
        INVALID_SAMPLES_KEY: dg.MetadataValue.table(samples, schema=INVALID_SAMPLES_SCHEMA),
        DEAD_LETTER_TABLE_KEY: dg.MetadataValue.text(result.dead_letter_table) if result.dead_letter_table
        else dg.MetadataValue.null(),
    }


def partition_metadata(outcome: PartitionOutcome) -> dict[str, dg.MetadataValue]:
    """One Kafka partition's part of a run, for that partition's materialization."""
    metadata: dict[str, dg.MetadataValue] = {
        "kafka_partition": dg.MetadataValue.int(outcome.partition),
        "offset_range": dg.MetadataValue.text(f"[{_offset_text(outcome.start_offset)}, "
                                              f"{_offset_text(outcome.end_offset)})"),
        "records": dg.MetadataValue.int(outcome.records),
        "value_bytes": dg.MetadataValue.int(outcome.value_bytes),
        "data_files": dg.MetadataValue.int(outcome.data_files),
        "segments": dg.MetadataValue.int(outcome.segments),
        "lag": dg.MetadataValue.int(outcome.lag) if outcome.lag is not None else dg.MetadataValue.null(),
    }
    for key, value in (("start_offset", outcome.start_offset), ("end_offset", outcome.end_offset)):
        if value is not None:
            metadata[key] = dg.MetadataValue.int(value)
    if outcome.skipped is not None:
        metadata["skipped_offsets"] = dg.MetadataValue.text(_skipped_text(outcome))
    if outcome.error is not None:
        metadata["error"] = dg.MetadataValue.text(outcome.error)
    return metadata


def invalid_samples_from_metadata(metadata: Mapping[str, dg.MetadataValue]) -> list[dict[str, str | None]]:
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


def _offset_text(offset: int | None) -> str:
    return "earliest" if offset is None else str(offset)


def _skipped_text(outcome: PartitionOutcome) -> str | None:
    return None if outcome.skipped is None else f"{outcome.skipped.start}..{outcome.skipped.end - 1}"
