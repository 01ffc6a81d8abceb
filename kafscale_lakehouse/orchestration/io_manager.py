"""The PySpark Iceberg IO manager: it stores what downstream assets return, a Spark DataFrame or a pyarrow Table, as
Iceberg tables, and `load_input` reads any table asset (landed or downstream) on the executors.

Downstream assets (`engine.tables.writes`, `engine.spark.writes`): the table is `dagster/table_name` metadata,
else the asset key joined by `.` (`rpc/sauce_daily` -> `rpc.sauce_daily`). `write_mode` metadata is `overwrite`
(default) or `append`; for a partitioned asset an overwrite replaces only the materialized partitions' rows, found
through `partition_expr` metadata (the column of a single partitions definition, or `{dimension: column}` for multi
partitions), as dagster-iceberg does. `write_mode: upsert` with dagster-iceberg's `upsert_options` metadata
(`join_cols`, `when_matched_update_all`, `when_not_matched_insert_all`, both true by default) replaces the rows whose
keys the data holds and inserts the others, rewriting only the data files that hold those keys
(`engine.tables.upserts.upsert_rows`). `partition_spec` metadata (`"day(order_date)"` or a list) partitions a table
created on first write. Snapshot properties name the Dagster run and partitions.

A retried step never appends twice: each write is named by its run, asset and partitions (`kafscale.write-id`,
the same for every attempt of the step in its run), and a run re-executed from a failure retries the writes of its
parent runs whose step did not succeed (up to the first one where it did: re-executing a step that succeeded is
a write of its own). An append finds a commit of those that landed (the step killed or failed after its commit,
before recording it) and commits nothing (engine/tables/writes.py); an overwrite or upsert written again gives the
same table.

`load_input` (`engine.spark.table_source`): the columns of `AssetIn(metadata={"columns": [...]})`, the downstream
partition as a row filter (Kafka partitions of a landed table as `partition IN (...)`; otherwise through
`partition_expr` of the input or the upstream asset), pinned to the `snapshot_id` of the upstream asset's latest
materialization.

`publish: audited` metadata (the IO manager's `publish` config is the default, `direct`): the write goes to the
table's audit branch (`kafscale-audit`, engine/tables/audit.py), not `main`; the materialization says
`published: false` with the `audit_snapshot_id`. The asset's checks in the same run read that snapshot; other readers
(downstream assets, later runs) read `main`. `audited_publish.py` fast-forwards `main` once the run evaluated every
blocking check of the asset (of its definitions, `audit_blocking_checks` in the materialization) with a pass: a run
whose selection left one out (`audit_checks_not_in_run`) leaves the audit pending. Until an audit is settled, a write
to the table refuses, naming the run, the checks that failed or were not evaluated, and the operator commands.

Landed tables are committed by their asset (assets.py), which returns a `MaterializeResult`: nothing reaches
`handle_output`; the IO manager only loads them, for downstream assets.
"""

import json
import logging
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import BooleanExpression
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyspark.sql import DataFrame

from kafscale_lakehouse.engine.spark import read_table, write_arrow, write_dataframe
from kafscale_lakehouse.engine.tables import (
    WRITE_MODES,
    TableWrite,
    TableWriteResult,
    UpsertOptions,
    all_of,
    any_of,
    iceberg_schema_of,
    load_catalog,
    parse_partition_spec,
    time_window_filter,
    values_filter,
)
from kafscale_lakehouse.engine.tables.audit import (
    AUDIT_COMMANDS,
    DEFAULT_AUDIT_BRANCH,
    AuditPendingError,
    pending_audit,
)
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY
from kafscale_lakehouse.orchestration.audited_publish import (
    AUDIT_BRANCH_KEY,
    AUDIT_SNAPSHOT_ID_KEY,
    BLOCKING_CHECKS_KEY,
    CHECKS_NOT_IN_RUN_KEY,
    PUBLISHED_KEY,
    CheckVerdict,
    asset_blocking_checks,
    audited_writes,
    blocking_check_verdict,
    publish_run_audits,
)
from kafscale_lakehouse.orchestration.metadata import (
    PARTITION_ROW_COUNT_KEY,
    SNAPSHOT_ID_KEY,
    TABLE_NAME_KEY,
    TOPIC_KEY,
    column_schema,
    snapshot_id_from_metadata,
)
from kafscale_lakehouse.orchestration.naming import kafka_partition_id, kafka_partition_key
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, SparkResource

log = logging.getLogger(__name__)

# Definition metadata the IO manager reads (dagster-iceberg's names where it has one; TABLE_NAME_KEY, and TOPIC_KEY
# marking a landed table, are in metadata.py).
WRITE_MODE_KEY = "write_mode"
PARTITION_EXPR_KEY = "partition_expr"
PARTITION_SPEC_KEY = "partition_spec"
UPSERT_OPTIONS_KEY = "upsert_options"
COLUMNS_KEY = "columns"
PUBLISH_KEY = "publish"
PUBLISH_MODES = ("direct", "audited")
# Snapshot summary properties of a downstream write.
DAGSTER_RUN_PROPERTY = "dagster.run-id"
DAGSTER_ASSET_PROPERTY = "dagster.asset-key"
DAGSTER_PARTITIONS_PROPERTY = "dagster.partition-keys"


class KafscaleIcebergIOManager(dg.ConfigurableIOManager):
    """Stores what a downstream asset returns in Iceberg (a Spark DataFrame or a pyarrow Table) and loads tables,
    landed or downstream, as Spark DataFrames read on the executors."""

    iceberg_catalog: IcebergCatalogResource
    spark: SparkResource
    target_file_size_bytes: int = 128 << 20
    publish: str = "direct"  # `audited`: writes go to the audit branch (`publish` metadata overrides it per asset)

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        if not isinstance(obj, (DataFrame, pa.Table)):
            raise TypeError(
                f"asset {context.asset_key.to_user_string()}: the Iceberg IO manager stores a Spark "
                f"DataFrame or a pyarrow Table, not {type(obj).__name__}"
            )
        self._write_table(context, obj)

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
        what = f"asset {context.asset_key.to_user_string()}"
        upsert = upsert_options(metadata, mode, what)
        audited = publish_mode(metadata, self.publish, what) == "audited"
        if audited and upsert is not None:
            raise ValueError(f"{what}: {PUBLISH_KEY}=audited is not supported with {WRITE_MODE_KEY}=upsert")
        write_id, retry_of = write_ids(context, partition_keys)
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
                # The run a pending audit names (audit.pending_audit reads it).
                **({RUN_ID_PROPERTY: context.run_id} if audited else {}),
            },
            target_file_size_bytes=self.target_file_size_bytes,
            upsert=upsert,
            branch=DEFAULT_AUDIT_BRANCH if audited else MAIN_BRANCH,
            write_id=write_id,
            retry_of=retry_of,
        )
        catalog = load_catalog(self.iceberg_catalog.settings())
        if audited:
            settle_earlier_audit(context.step_context.instance, catalog, identifier, what)
        result = write_arrow(catalog, obj, write) if isinstance(obj, pa.Table) else write_dataframe(catalog, obj, write)
        output_metadata = write_metadata(result, mode, partition_scoped=replace is not None)
        if audited:
            # Not yet what main holds: readers pinned to the materialization's snapshot_id would read unchecked rows.
            output_metadata[SNAPSHOT_ID_KEY] = dg.MetadataValue.null()
            blocking, not_in_run = asset_blocking_checks(context.step_context.job_def, context.asset_key)
            output_metadata.update({
                PUBLISHED_KEY: False,
                AUDIT_BRANCH_KEY: DEFAULT_AUDIT_BRANCH,
                AUDIT_SNAPSHOT_ID_KEY: dg.MetadataValue.int(result.snapshot_id) if result.snapshot_id is not None
                else dg.MetadataValue.null(),
                BLOCKING_CHECKS_KEY: dg.MetadataValue.json(blocking),
                CHECKS_NOT_IN_RUN_KEY: dg.MetadataValue.json(not_in_run),
            })
            if not_in_run:  # the run cannot publish it: said now, in the step's log
                context.log.warning("table %s: %s", identifier,
                                    CheckVerdict(not_evaluated=tuple(not_in_run)).describe(context.run_id, identifier))
        context.add_output_metadata(output_metadata)
        context.log.info(
            "table %s: %s of %d rows committed in snapshot %s%s",
            identifier,
            mode,
            result.rows_written,
            result.snapshot_id,
            f" on audit branch {DEFAULT_AUDIT_BRANCH} (main unchanged until its checks pass)" if audited else "",
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
                row_filter = values_filter(table.schema(), "partition", [kafka_partition_key(p) for p in partitions],
                                           what=what)
            else:
                expr = input_metadata.get(PARTITION_EXPR_KEY, upstream_metadata.get(PARTITION_EXPR_KEY))
                row_filter = partition_row_filter(context, table.schema(), expr, what)
        elif PARTITION_EXPR_KEY in input_metadata and context.step_context.has_partitions:
            # An unpartitioned upstream read by a partitioned asset: the downstream partition is the filter.
            row_filter = run_partition_filter(context, table.schema(), input_metadata[PARTITION_EXPR_KEY])
        snapshot_id = audit_snapshot_for_check(context, table)
        if snapshot_id is None:
            snapshot_id = upstream_snapshot_id(context, table)
        return read_table(
            self.spark.spark_session, table, columns=columns, row_filter=row_filter, snapshot_id=snapshot_id
        )


def write_ids(context: dg.OutputContext, partition_keys: list[str]) -> tuple[str, frozenset[str]]:
    """The id of this write (its run, asset and partitions: the same for every attempt of the step in this run),
    and those of the writes it retries: the same step's in the parent runs it was re-executed from, up to the first
    of them where the step succeeded."""
    step = context.step_context
    asset = context.asset_key.to_user_string()

    def write_id(run_id: str) -> str:
        return json.dumps([run_id, asset, partition_keys])

    retried = set()
    parent_id = step.dagster_run.parent_run_id
    while parent_id is not None:
        records = step.instance.get_records_for_run(parent_id, of_type=dg.DagsterEventType.STEP_SUCCESS).records
        if any(record.event_log_entry.step_key == context.step_key for record in records):
            break
        retried.add(write_id(parent_id))
        parent = step.instance.get_run_by_id(parent_id)
        parent_id = parent.parent_run_id if parent is not None else None
    return write_id(context.run_id), frozenset(retried)


def plain_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Definition metadata with `MetadataValue`s unwrapped (`MetadataValue.text("append")` -> `"append"`)."""
    return {k: v.value if isinstance(v, dg.MetadataValue) else v for k, v in (metadata or {}).items()}


def publish_mode(metadata: Mapping[str, Any], default: str, what: str) -> str:
    """`publish` metadata of an output (`direct` or `audited`), else the IO manager's `publish` config."""
    mode = metadata.get(PUBLISH_KEY, default)
    if mode not in PUBLISH_MODES:
        raise ValueError(f"{what}: {PUBLISH_KEY}={mode!r} (metadata, or the IO manager's config) is not one of "
                         f"{PUBLISH_MODES}")
    return str(mode)


def settle_earlier_audit(instance: dg.DagsterInstance, catalog: Catalog, identifier: str, what: str) -> None:
    """Before an audited write: an audit an earlier run left pending on the table is published when that run
    succeeded and evaluated every blocking check of its asset with a pass (the sensor had not ticked yet);
    otherwise the write refuses, naming the run, its status, the checks that failed or were not evaluated, and the
    operator commands (such an audit stays until an operator publishes or drops it)."""
    if not catalog.table_exists(identifier):
        return
    table = catalog.load_table(identifier)
    pending = pending_audit(table, DEFAULT_AUDIT_BRANCH)
    if pending is None:
        return
    if pending.run_id is not None and publish_run_audits(instance, pending.run_id, catalog):
        return
    run = instance.get_run_by_id(pending.run_id) if pending.run_id is not None else None
    held = ""
    if run is not None and run.status == dg.DagsterRunStatus.SUCCESS:
        writes = [w for w in audited_writes(instance, run.run_id) if w.snapshot_id == pending.snapshot_id]
        held = "".join(f" ({verdict.reasons(run.run_id)})" for verdict in
                       (blocking_check_verdict(instance, run.run_id, write) for write in writes) if not verdict.passed)
    raise AuditPendingError(
        f"{what}: table {identifier}: audit branch {DEFAULT_AUDIT_BRANCH} holds snapshot {pending.snapshot_id} of run "
        f"{pending.run_id} ({run.status.value if run is not None else 'not a run of this instance'}) that main does "
        f"not{held}; main fast-forwards to it only when that run succeeded and evaluated every blocking check of the "
        f"asset with a pass, else settle it: {AUDIT_COMMANDS.format(table=identifier)}")


def audit_snapshot_for_check(context: dg.InputContext, table: Table) -> int | None:
    """For an asset check's input: the audit snapshot of the checked asset's materialization in this same run
    (`published: false`), so the check sees what it gates. None for other readers (they read main)."""
    step = context.step_context
    layer = step.job_def.asset_layer
    outputs = [output.name for output in step.step.step_outputs]
    if not step.is_asset_check_step or any(layer.get_asset_key_for_node_output(step.node_handle, name)
                                           for name in outputs):
        return None  # the step materializes assets (a downstream asset, or a multi-asset): it reads main
    run_id = step.run_id
    records = context.instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    audited = [
        m for m in (r.event_log_entry.asset_materialization for r in records)
        if m is not None and m.asset_key == context.asset_key and PUBLISHED_KEY in m.metadata
        and m.metadata[PUBLISHED_KEY].value is False
    ]
    if not audited:
        return None
    value = audited[-1].metadata.get(AUDIT_SNAPSHOT_ID_KEY)
    snapshot_id = value.value if value is not None else None
    if not isinstance(snapshot_id, int) or table.metadata.snapshot_by_id(snapshot_id) is None:
        raise ValueError(f"input {context.asset_key.to_user_string()}: the audit snapshot {snapshot_id} of run "
                         f"{run_id} is not in table {'.'.join(table.name())} (dropped?)")
    context.log.info("table %s: the check reads audit snapshot %d of this run", ".".join(table.name()), snapshot_id)
    return snapshot_id


def upsert_options(metadata: Mapping[str, Any], mode: str, what: str) -> UpsertOptions | None:
    """dagster-iceberg's `upsert_options` metadata of a `write_mode: upsert` output; errors name the key."""
    options = metadata.get(UPSERT_OPTIONS_KEY)
    if mode != "upsert":
        if options is not None:
            raise ValueError(f"{what}: metadata {UPSERT_OPTIONS_KEY} is only used with {WRITE_MODE_KEY}=upsert")
        return None
    if not isinstance(options, Mapping):
        raise ValueError(f"{what}: {WRITE_MODE_KEY}=upsert needs metadata {UPSERT_OPTIONS_KEY} "
                         "{'join_cols': [...], 'when_matched_update_all': bool, 'when_not_matched_insert_all': bool}")
    unknown = sorted(set(options) - {"join_cols", "when_matched_update_all", "when_not_matched_insert_all"})
    if unknown:
        raise ValueError(f"{what}: metadata {UPSERT_OPTIONS_KEY} has unknown keys {unknown}")
    join_cols = options.get("join_cols")
    if isinstance(join_cols, str) or not join_cols or not all(isinstance(c, str) for c in join_cols):
        raise ValueError(f"{what}: metadata {UPSERT_OPTIONS_KEY}.join_cols must be a non-empty list of column names, "
                         f"got {join_cols!r}")
    flags = {}
    for name in ("when_matched_update_all", "when_not_matched_insert_all"):
        flags[name] = options.get(name, True)
        if not isinstance(flags[name], bool):
            raise ValueError(f"{what}: metadata {UPSERT_OPTIONS_KEY}.{name} must be true or false, got "
                             f"{flags[name]!r}")
    return UpsertOptions(tuple(join_cols), **flags)


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
    if partitions_def is None:
        raise ValueError(f"{what}: the run materializes no partitions to filter by")
    if not isinstance(partition_expr, str) or isinstance(partitions_def, dg.MultiPartitionsDefinition):
        raise ValueError(
            f"{what}: filtering an unpartitioned upstream by a multi-partitioned asset is not supported; "
            "drop partition_expr from the input and filter in the asset"
        )
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        window = step.partition_time_window
        return time_window_filter(schema, partition_expr, window.start, window.end, what=what)
    with dg.partition_loading_context(dynamic_partitions_store=step.instance):
        keys = partitions_def.get_partition_keys_in_range(step.partition_key_range)
    return values_filter(schema, partition_expr, keys, what=what)


def upstream_snapshot_id(context: dg.InputContext, table: Table) -> int | None:
    """The `snapshot_id` of the upstream asset's latest materialization, when it is still in the table."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    materialization = event.asset_materialization if event is not None else None
    snapshot_id = snapshot_id_from_metadata(materialization.metadata) if materialization is not None else None
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


def write_metadata(result: TableWriteResult, mode: str, *, partition_scoped: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        TABLE_NAME_KEY: result.identifier,
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
        metadata[PARTITION_ROW_COUNT_KEY] = result.rows_written
    if result.columns_added:
        metadata["columns_added"] = dg.MetadataValue.json(list(result.columns_added))
    return metadata


def _spark_arrow_schema(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, timezone="UTC")
