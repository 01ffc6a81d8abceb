"""The PySpark Iceberg IO manager of every asset: landed tables, and downstream assets that return a Spark DataFrame
or a pyarrow Table; `load_input` reads any of them on the executors.

Downstream assets (`engine.table_writes`): the table is `dagster/table_name` metadata, else the asset key joined by
`.` (`rpc/sauce_daily` -> `rpc.sauce_daily`). `write_mode` metadata is `overwrite` (default) or `append`; for a
partitioned asset an overwrite replaces only the materialized partitions' rows, found through `partition_expr`
metadata (the column of a single partitions definition, or `{dimension: column}` for multi partitions), as
dagster-iceberg does. `partition_spec` metadata (`"day(order_date)"` or a list) partitions a table created on first
write. Snapshot properties name the Dagster run and partitions.

`load_input` (`engine.table_reads`): the columns of `AssetIn(metadata={"columns": [...]})`, the downstream partition
as a row filter (Kafka partitions of a landed table as `partition IN (...)`; otherwise through `partition_expr` of the
input or the upstream asset), pinned to the `snapshot_id` of the upstream asset's latest materialization.

Landed tables:

`handle_output` runs `engine.ingest.commit_ingest`: one Spark job whose tasks decode the planned segments and write
them as Parquet data files (`engine.spark_ingestion`), then one Iceberg commit re-checks the start offsets, then etcd
offsets; the
run's leases are released on every exit path (as `PreparedIngest.release_leases` does). Each Kafka partition's
materialization
gets its own offset range, records, bytes, data files and lag; all of them carry the run's snapshot id, a
per-partition table and the invalid records. A run that could commit only some partitions records materializations
for those, then fails naming the rest.
"""

import json
import logging
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pyarrow as pa
from pyiceberg.expressions import BooleanExpression, EqualTo, In
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame

from kafscale_lakehouse.engine.ingestion.run import (
    IngestFailedError,
    IngestResult,
    PartitionOutcome,
    PreparedIngest,
    commit_ingest,
)
from kafscale_lakehouse.engine.spark.table_source import count_rows_equal, read_table
from kafscale_lakehouse.engine.spark.writes import write_arrow, write_dataframe
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.filters import (
    all_of,
    any_of,
    parse_partition_spec,
    time_window_filter,
    values_filter,
)
from kafscale_lakehouse.engine.tables.writes import WRITE_MODES, TableWrite, TableWriteResult, iceberg_schema_of
from kafscale_lakehouse.offsets.ranges import OffsetRange, format_ranges, parse_ranges
from kafscale_lakehouse.orchestration.naming import kafka_partition_id, kafka_partition_key
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, SparkResource

log = logging.getLogger(__name__)

# Materialization metadata keys that asset checks read back (checks.py).
INVALID_RECORDS_KEY = "invalid_records"
INVALID_SAMPLES_KEY = "invalid_samples"
DEAD_LETTER_TABLE_KEY = "dead_letter_table"
SNAPSHOT_ID_KEY = "snapshot_id"
# `{"<partition>": [start, end]}`: the offsets the run committed (record_id_unique scans them).
COMMITTED_RANGES_KEY = "committed_offset_ranges"
# Definition metadata the IO manager reads (dagster-iceberg's names where it has one).
TABLE_NAME_KEY = "dagster/table_name"
WRITE_MODE_KEY = "write_mode"
PARTITION_EXPR_KEY = "partition_expr"
PARTITION_SPEC_KEY = "partition_spec"
COLUMNS_KEY = "columns"
TOPIC_KEY = "kafscale/topic"  # marks a landed table (partitions = Kafka partition ids)
# Snapshot summary properties of a downstream write.
DAGSTER_RUN_PROPERTY = "dagster.run-id"
DAGSTER_ASSET_PROPERTY = "dagster.asset-key"
DAGSTER_PARTITIONS_PROPERTY = "dagster.partition-keys"

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


class KafscaleIcebergIOManager(dg.ConfigurableIOManager):
    """Stores what an asset returns in Iceberg (a landed table's `PreparedIngest`, a Spark DataFrame, a pyarrow
    Table) and loads tables as Spark DataFrames read on the executors."""

    iceberg_catalog: IcebergCatalogResource
    spark: SparkResource
    target_file_size_bytes: int = 128 << 20

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        if isinstance(obj, PreparedIngest):
            self._commit_ingest(context, obj)
        elif isinstance(obj, (DataFrame, pa.Table)):
            self._write_table(context, obj)
        else:
            raise TypeError(
                f"asset {context.asset_key.to_user_string()}: the Iceberg IO manager stores a Spark "
                f"DataFrame, a pyarrow Table or a landed table's PreparedIngest, not "
                f"{type(obj).__name__}"
            )

    def _commit_ingest(self, context: dg.OutputContext, obj: PreparedIngest) -> None:
        try:
            result = commit_ingest(obj)
        except IngestFailedError as exc:
            self._record_partial_commit(context, exc.result)
            raise dg.Failure(description=str(exc), metadata=run_metadata(exc.result)) from exc
        table = self.iceberg_catalog.load_table(result.table)
        context.add_output_metadata({**run_metadata(result), **table_metadata(table, result.table)})
        for partition_key in context.asset_partition_keys:
            outcome = result.partitions.get(kafka_partition_id(partition_key))
            if outcome is not None:
                rows = count_rows_equal(table, "partition", outcome.partition)
                context.step_context.add_asset_metadata(
                    {**partition_metadata(outcome), "dagster/partition_row_count": rows}, partition_key=partition_key
                )
        context.log.info(
            "table %s: run %s committed %d records of topic %s in snapshot %s",
            result.table,
            result.run_id,
            result.records,
            result.topic,
            result.snapshot_id,
        )

    def _write_table(self, context: dg.OutputContext, obj: DataFrame | pa.Table) -> None:
        metadata = plain_metadata(context.definition_metadata)
        identifier = table_identifier(context.asset_key, metadata)
        mode = metadata.get(WRITE_MODE_KEY, "overwrite")
        if mode not in WRITE_MODES:
            raise ValueError(
                f"asset {context.asset_key.to_user_string()}: metadata {WRITE_MODE_KEY}={mode!r} is "
                f"not one of {WRITE_MODES}"
            )
        arrow_schema = obj.schema if isinstance(obj, pa.Table) else _spark_arrow_schema(obj)
        replace = None
        if mode == "overwrite" and context.has_asset_partitions:
            replace = partition_row_filter(
                context,
                iceberg_schema_of(arrow_schema),
                metadata.get(PARTITION_EXPR_KEY),
                f"asset {context.asset_key.to_user_string()}",
            )
        partition_keys = list(context.asset_partition_keys) if context.has_asset_partitions else []
        write = TableWrite(
            identifier=identifier,
            run_id=context.run_id,
            mode=mode,
            replace_filter=replace,
            partition_fields=parse_partition_spec(metadata[PARTITION_SPEC_KEY])
            if PARTITION_SPEC_KEY in metadata
            else (),
            snapshot_properties={
                DAGSTER_RUN_PROPERTY: context.run_id,
                DAGSTER_ASSET_PROPERTY: context.asset_key.to_user_string(),
                **({DAGSTER_PARTITIONS_PROPERTY: json.dumps(partition_keys)} if partition_keys else {}),
            },
            target_file_size_bytes=self.target_file_size_bytes,
        )
        catalog = load_catalog(self.iceberg_catalog.settings())
        result = write_arrow(catalog, obj, write) if isinstance(obj, pa.Table) else write_dataframe(catalog, obj, write)
        context.add_output_metadata(write_metadata(result, mode, partition_scoped=replace is not None))
        context.log.info(
            "table %s: %s of %d rows committed in snapshot %s",
            identifier,
            mode,
            result.rows_written,
            result.snapshot_id,
        )

    def _record_partial_commit(self, context: dg.OutputContext, result: IngestResult) -> None:
        """Materializations for the partitions committed before the run failed on others. Events logged through
        the context are dropped when `handle_output` raises, so they are reported to the instance directly (as
        events outside the run, naming it in `run_id`)."""
        if result.snapshot_id is None:
            return
        shared = {**run_metadata(result), "run_id": dg.MetadataValue.text(result.run_id)}
        for outcome in result.partitions.values():
            if outcome.error is None and outcome.records > 0:
                context.step_context.instance.report_runless_asset_event(
                    dg.AssetMaterialization(
                        asset_key=context.asset_key,
                        partition=kafka_partition_key(outcome.partition),
                        metadata={**shared, **partition_metadata(outcome)},
                    )
                )

    def load_input(self, context: dg.InputContext) -> DataFrame:
        upstream = context.upstream_output
        upstream_metadata = plain_metadata(upstream.definition_metadata if upstream is not None else None)
        identifier = table_identifier(context.asset_key, upstream_metadata)
        table = self.iceberg_catalog.load_table(identifier)
        input_metadata = plain_metadata(context.definition_metadata)
        columns = input_metadata.get(COLUMNS_KEY)
        row_filter: BooleanExpression | None = None
        if context.has_asset_partitions:
            what = f"input {context.asset_key.to_user_string()}"
            if TOPIC_KEY in upstream_metadata:
                partitions = sorted(kafka_partition_id(key) for key in context.asset_partition_keys)
                row_filter = (
                    EqualTo("partition", partitions[0]) if len(partitions) == 1 else In("partition", partitions)
                )
            else:
                expr = input_metadata.get(PARTITION_EXPR_KEY, upstream_metadata.get(PARTITION_EXPR_KEY))
                row_filter = partition_row_filter(context, table.schema(), expr, what)
        elif PARTITION_EXPR_KEY in input_metadata and context.step_context.has_partitions:
            # An unpartitioned upstream read by a partitioned asset: the downstream partition is the filter.
            row_filter = run_partition_filter(context, table.schema(), input_metadata[PARTITION_EXPR_KEY])
        snapshot_id = upstream_snapshot_id(context, table)
        return read_table(
            self.spark.spark_session, table, columns=columns, row_filter=row_filter, snapshot_id=snapshot_id
        )


def plain_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Definition metadata with `MetadataValue`s unwrapped (`MetadataValue.text("append")` -> `"append"`)."""
    return {k: v.value if isinstance(v, dg.MetadataValue) else v for k, v in (metadata or {}).items()}


def table_identifier(asset_key: dg.AssetKey, metadata: Mapping[str, Any]) -> str:
    """`dagster/table_name` metadata, else the asset key joined by `.` (it needs a namespace: two parts or more)."""
    name = metadata.get(TABLE_NAME_KEY)
    if name is not None:
        return str(name)
    if len(asset_key.path) < 2:
        raise ValueError(
            f"asset {asset_key.to_user_string()}: its table needs a namespace; give the asset a key "
            f"prefix (key_prefix=['rpc']) or {TABLE_NAME_KEY} metadata ('rpc.{asset_key.path[-1]}')"
        )
    return ".".join(asset_key.path)


def partition_row_filter(
    context: dg.InputContext | dg.OutputContext, schema: Schema, partition_expr: Any, what: str
) -> BooleanExpression:
    """The rows of the context's partitions: a time window through the `partition_expr` column, static keys as
    `column IN (keys)`, multi partitions per dimension (`partition_expr` = `{dimension: column}`)."""
    partitions_def = context.asset_partitions_def
    if partition_expr is None:
        raise ValueError(
            f"{what} is partitioned: set metadata {PARTITION_EXPR_KEY!r} to the column its partitions "
            "map to (for multi partitions, a mapping of dimension name to column)"
        )
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        if not isinstance(partition_expr, Mapping):
            raise ValueError(
                f"{what}: {PARTITION_EXPR_KEY} must map each dimension "
                f"({', '.join(d.name for d in partitions_def.partitions_defs)}) to a column"
            )
        clauses = []
        for key in context.asset_partition_keys:
            parts = partitions_def.get_partition_key_from_str(key).keys_by_dimension
            dimension_clauses = []
            for dimension in partitions_def.partitions_defs:
                column = partition_expr.get(dimension.name)
                if column is None:
                    continue  # a dimension without a column is not part of the filter
                dimension_def = dimension.partitions_def
                if isinstance(dimension_def, dg.TimeWindowPartitionsDefinition):
                    window = dimension_def.time_window_for_partition_key(parts[dimension.name])
                    dimension_clauses.append(time_window_filter(schema, column, window.start, window.end, what=what))
                else:
                    dimension_clauses.append(values_filter(schema, column, [parts[dimension.name]], what=what))
            if not dimension_clauses:
                raise ValueError(
                    f"{what}: {PARTITION_EXPR_KEY} names no dimension of "
                    f"{[d.name for d in partitions_def.partitions_defs]}"
                )
            clauses.append(all_of(dimension_clauses))
        return any_of(clauses)
    if not isinstance(partition_expr, str):
        raise ValueError(f"{what}: {PARTITION_EXPR_KEY} must be a column name, got {partition_expr!r}")
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        window = context.asset_partitions_time_window
        return time_window_filter(schema, partition_expr, window.start, window.end, what=what)
    return values_filter(schema, partition_expr, list(context.asset_partition_keys), what=what)


def run_partition_filter(context: dg.InputContext, schema: Schema, partition_expr: Any) -> BooleanExpression:
    """The rows of the partitions the run materializes, for an input whose upstream has no partitions."""
    step = context.step_context
    partitions_def = step.run_partitions_def
    what = f"input {context.asset_key.to_user_string()} ({PARTITION_EXPR_KEY} {partition_expr!r})"
    if not isinstance(partition_expr, str) or isinstance(partitions_def, dg.MultiPartitionsDefinition):
        raise ValueError(
            f"{what}: filtering an unpartitioned upstream by a multi-partitioned asset is not supported; "
            "drop partition_expr from the input and filter in the asset"
        )
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        window = step.partition_time_window
        return time_window_filter(schema, partition_expr, window.start, window.end, what=what)
    keys = partitions_def.get_partition_keys_in_range(step.partition_key_range, dynamic_partitions_store=step.instance)
    return values_filter(schema, partition_expr, keys, what=what)


def upstream_snapshot_id(context: dg.InputContext, table: Table) -> int | None:
    """The `snapshot_id` of the upstream asset's latest materialization, when it is still in the table."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    materialization = event.asset_materialization if event is not None else None
    value = materialization.metadata.get(SNAPSHOT_ID_KEY) if materialization is not None else None
    snapshot_id = value.value if isinstance(value, dg.IntMetadataValue) else None
    if snapshot_id is None:
        return None
    if table.metadata.snapshot_by_id(snapshot_id) is None:
        context.log.warning(
            "table %s: snapshot %s of the latest materialization of %s is no longer in the table "
            "(expired); reading the current snapshot",
            ".".join(table.name()),
            snapshot_id,
            context.asset_key.to_user_string(),
        )
        return None
    return snapshot_id


def table_metadata(table: Table, identifier: str) -> dict[str, Any]:
    """The Dagster table metadata keys of the table as it is now: name, URI, column schema, row count."""
    snapshot = table.current_snapshot()
    total = snapshot.summary.get("total-records") if snapshot is not None and snapshot.summary else None
    return {
        "dagster/table_name": identifier,
        "dagster/column_schema": column_schema(table.schema()),
        "dagster/row_count": int(total) if total is not None else 0,
        "dagster/uri": dg.MetadataValue.path(table.location()),
    }


def write_metadata(result: TableWriteResult, mode: str, *, partition_scoped: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "dagster/table_name": result.identifier,
        "dagster/column_schema": column_schema(result.schema),
        "dagster/row_count": result.table_rows if result.table_rows is not None else dg.MetadataValue.null(),
        "dagster/uri": dg.MetadataValue.path(result.location),
        SNAPSHOT_ID_KEY: dg.MetadataValue.int(result.snapshot_id)
        if result.snapshot_id is not None
        else dg.MetadataValue.null(),
        WRITE_MODE_KEY: mode,
        "rows_written": result.rows_written,
        "data_files": result.data_files,
        "commit_attempts": result.attempts,
    }
    if partition_scoped:
        # A partition-scoped overwrite leaves exactly the rows written in the partition.
        metadata["dagster/partition_row_count"] = result.rows_written
    if result.columns_added:
        metadata["columns_added"] = dg.MetadataValue.json(list(result.columns_added))
    return metadata


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


def _spark_arrow_schema(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, timezone="UTC")


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
