"""Asset checks of a mapping's table, with metadata a data owner can act on (counts, sample record_ids, reasons).

- `schema_valid`: the run's invalid records (JSON Schema / required columns), from its materialization metadata.
- `record_id_unique`: no record_id twice, scanning only the offset ranges the run committed, as its materialization
  metadata records them (a row filter on topic + partition + offset, so pyiceberg skips data files by their
  `offset` min/max statistics).
- `id_unique` (instead of `record_id_unique` on an upsert table, `mode: upsert`): no key of the run's new rows held
  by more than one row of the table.
- `offsets_contiguous`: the `kafscale.offsets.<topic>` history of the table's snapshots never moves back or drops a
  partition, no rows lie at or beyond the committed next offsets, and gaps skipped by `allow_gaps` are reported.
- `freshness`: lag of the table behind the broker watermark (or the completed segments when there is none).
- `retention_headroom`: per partition, how long until the topic's retention deletes a segment not landed yet, and
  how far back the log still reaches (storage/retention.py); warns below `retention_headroom_warn_seconds`, fails
  when offsets not landed are gone or past their retention.
The checks run in the ingest run after the commit; run alone, they look at the table's latest commit of ours.

What the integrity checks read (`integrity_scope`, in their `scope` metadata): the data files added since our commit
before the run's, so their cost follows new data; the whole table when one of them did not pass on its latest
evaluation (until a whole-table scan passes: a problem seen once is looked for again, not forgotten because its file
is no longer new), when none is recorded, and at least every `WHOLE_TABLE_SCAN_INTERVAL_SECONDS`, so a problem no
incremental scan saw is found within that bound.
"""

# No `from __future__ import annotations`: Dagster reads the context and resource parameter annotations at runtime.
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg
from pyiceberg.table import Table

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import PartitionState, lag_and_reference, scan_retention, scan_topic
from kafscale_lakehouse.engine.tables import (
    FRESHNESS,
    ID_UNIQUE,
    OFFSETS_CONTIGUOUS,
    RECORD_ID_UNIQUE,
    RETENTION_HEADROOM,
    SAMPLE_SIZE,
    SCHEMA_VALID,
    WHOLE_TABLE,
    TableNotFoundError,
    check_offset_contiguity,
    find_duplicate_ids,
    find_duplicate_record_ids,
    latest_committed_ranges,
    new_data_files,
)
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.orchestration.assets import scan_topic_now, watch_sources_now
from kafscale_lakehouse.orchestration.metadata import (
    DEAD_LETTER_TABLE_KEY,
    INVALID_RECORDS_KEY,
    INVALID_SAMPLES_SCHEMA,
    committed_ranges_from_metadata,
    invalid_samples_from_metadata,
    snapshot_id_from_metadata,
)
from kafscale_lakehouse.orchestration.naming import table_asset_key
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, OffsetStoreResource, SegmentStoreResource
from kafscale_lakehouse.storage import TopicRetention

if TYPE_CHECKING:
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord

log = logging.getLogger(__name__)

INTEGRITY_CHECKS = (RECORD_ID_UNIQUE, ID_UNIQUE, OFFSETS_CONTIGUOUS)
WHOLE_TABLE_SCAN_INTERVAL_SECONDS = 24 * 3600
LAST_WHOLE_TABLE_SCAN_KEY = "last_whole_table_scan"  # epoch seconds, carried from evaluation to evaluation

# ------------------------------------------------------------------------------------------ scope


@dataclass(frozen=True)
class IntegrityScope:
    """What a table's integrity checks read this time: the whole table (and why), or the files added since our
    commit before the run's. INCREMENTAL when nothing is known (a check evaluated outside Dagster)."""

    whole_table: bool
    reason: str
    last_whole_table_scan: float | None  # epoch seconds, before this evaluation

    def metadata(self, scope: str, now: float) -> "dict[str, dg.RawMetadataValue]":
        """`scope` (what was read, from the scan) and when the table was last read whole, this time included."""
        scanned_whole = scope == WHOLE_TABLE
        last = now if scanned_whole else self.last_whole_table_scan
        return {"scope": scope + (f" ({self.reason})" if scanned_whole and self.reason else ""),
                LAST_WHOLE_TABLE_SCAN_KEY: dg.MetadataValue.timestamp(last) if last is not None
                else dg.MetadataValue.null()}


INCREMENTAL = IntegrityScope(whole_table=False, reason="", last_whole_table_scan=None)


def integrity_scope(instance: dg.DagsterInstance, asset_key: dg.AssetKey, now: float | None = None) -> IntegrityScope:
    """The scope of the table's integrity checks from their latest evaluations (one event-log query; a second per
    check only when its latest is planned and not yet evaluated, as in the asset's own run)."""
    return integrity_scopes(instance, [asset_key], now)[asset_key]


def integrity_scopes(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey], now: float | None = None
                     ) -> dict[dg.AssetKey, IntegrityScope]:
    """`integrity_scope` of each table asset, their checks' latest evaluations read in one event-log query (a batch
    of a hundred tables: one query, not one per table on threads that wait for the sqlite connection the run's event
    writes hold)."""
    now = time.time() if now is None else now
    latest = _latest_integrity_evaluations(instance, asset_keys)
    scopes = {}
    for asset_key in asset_keys:
        scope = scopes[asset_key] = _scope_of(latest.get(asset_key, []), now)
        if scope.whole_table:
            log.info("table asset %s: the integrity checks read the whole table: %s", asset_key.to_user_string(),
                     scope.reason)
    return scopes


def _latest_integrity_evaluations(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey]
                                  ) -> dict[dg.AssetKey, list[tuple[str, str, dg.AssetCheckEvaluation | None]]]:
    """Per asset: (check name, run id, its latest evaluation or None) of each integrity check of it ever planned."""
    storage = instance.event_log_storage
    keys = [dg.AssetCheckKey(asset_key, name) for asset_key in asset_keys for name in INTEGRITY_CHECKS]
    latest: dict[dg.AssetKey, list[tuple[str, str, dg.AssetCheckEvaluation | None]]] = {}
    for key, record in storage.get_latest_asset_check_execution_by_key(keys).items():
        # Planned (this run's, or a run that ended before evaluating it): the execution before it.
        records = [record] if _evaluation(record) else storage.get_asset_check_execution_history(key, limit=2)
        evaluated = next(((r, e) for r in records if (e := _evaluation(r)) is not None), (record, None))
        latest.setdefault(key.asset_key, []).append((key.name, evaluated[0].run_id, evaluated[1]))
    return latest


def _evaluation(record: "AssetCheckExecutionRecord") -> dg.AssetCheckEvaluation | None:
    event = record.event.dagster_event if record.event is not None else None
    data = event.event_specific_data if event is not None else None
    return data if isinstance(data, dg.AssetCheckEvaluation) else None


def _scope_of(latest: list[tuple[str, str, dg.AssetCheckEvaluation | None]], now: float) -> IntegrityScope:
    if not latest:
        return IntegrityScope(True, "no earlier evaluation of its integrity checks", None)
    scans = [evaluation.metadata.get(LAST_WHOLE_TABLE_SCAN_KEY) if evaluation is not None else None
             for _, _, evaluation in latest]
    # The oldest of the checks' last whole-table scans; unknown when one of them has none recorded.
    last = min(s.value for s in scans if isinstance(s, dg.TimestampMetadataValue)) \
        if all(isinstance(s, dg.TimestampMetadataValue) for s in scans) else None
    not_passed = [f"{name} did not pass in run {run_id}" if evaluation is not None
                  else f"{name} was not evaluated in run {run_id}"
                  for name, run_id, evaluation in latest if evaluation is None or not evaluation.passed]
    if not_passed:
        return IntegrityScope(True, "; ".join(not_passed), last)
    if last is None:
        return IntegrityScope(True, "no whole-table scan recorded", last)
    if now - last >= WHOLE_TABLE_SCAN_INTERVAL_SECONDS:
        return IntegrityScope(True, f"last whole-table scan {(now - last) / 3600:.0f} h ago", last)
    return IntegrityScope(False, "", last)


# ------------------------------------------------------------------------------------------ evaluations


def run_committed_ranges(table: Table, topic: str, metadata: Mapping[str, dg.MetadataValue] | None
                         ) -> tuple[int | None, dict[int, OffsetRange]]:
    """(snapshot id, ranges) the run recorded in its materialization metadata; when it committed nothing, or a check
    runs with no materialization of ours recorded, the table's latest commit instead."""
    ranges = committed_ranges_from_metadata(metadata) if metadata is not None else None
    if metadata is not None and ranges:
        return snapshot_id_from_metadata(metadata), ranges
    commit, ranges = latest_committed_ranges(table, topic)
    return (commit.snapshot_id if commit is not None else None), ranges


def evaluate_record_id_unique(table: Table, topic: str, metadata: Mapping[str, dg.MetadataValue] | None,
                              scope: IntegrityScope = INCREMENTAL) -> dg.AssetCheckResult:
    snapshot_id, ranges = run_committed_ranges(table, topic, metadata)
    # The files added since our commit before the run's (the run's own among them), not the table's history.
    added = (new_data_files(table, topic, snapshot_id)
             if snapshot_id is not None and ranges and not scope.whole_table else None)
    scan = find_duplicate_record_ids(table, topic, ranges, added)
    extra = sum(count - 1 for count in scan.duplicates.values())
    samples = sorted(scan.duplicates.items())[:SAMPLE_SIZE]
    result_metadata: dict[str, dg.RawMetadataValue] = {
        "snapshot_id": dg.MetadataValue.int(snapshot_id) if snapshot_id is not None else dg.MetadataValue.null(),
        "offset_ranges_scanned": dg.MetadataValue.json({str(p): [r.start, r.end] for p, r in sorted(ranges.items())}),
        "rows_scanned": scan.rows_scanned,
        "data_files_scanned": scan.files_scanned,
        "data_files_in_table": scan.files_in_table if scan.files_in_table is not None else dg.MetadataValue.null(),
        "duplicate_record_ids": len(scan.duplicates),
        "duplicate_rows": extra,
        "duplicate_samples": dg.MetadataValue.table(
            [dg.TableRecord({"record_id": r, "occurrences": n}) for r, n in samples],
            schema=dg.TableSchema(columns=[dg.TableColumn("record_id", "string"),
                                           dg.TableColumn("occurrences", "int")])),
        **scope.metadata(scan.scope, time.time()),
    }
    if not scan.duplicates:
        return dg.AssetCheckResult(passed=True, metadata=result_metadata,
                                   description=f"{scan.rows_scanned} rows in the committed offset ranges, no record_id "
                                               "twice" if ranges else "no commit of this topic to check yet")
    return dg.AssetCheckResult(
        passed=False, metadata=result_metadata, severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(scan.duplicates)} record_ids occur more than once ({extra} extra rows), e.g. "
                    f"{', '.join(r for r, _ in samples[:5])}: another writer appended rows of these offsets again; "
                    "delete the extra copies (same record_id) from the table")


def evaluate_id_unique(table: Table, topic: str, id_columns: list[str], metadata: Mapping[str, dg.MetadataValue] | None,
                       scope: IntegrityScope = INCREMENTAL) -> dg.AssetCheckResult:
    snapshot_id, ranges = run_committed_ranges(table, topic, metadata)
    scan = find_duplicate_ids(table, topic, id_columns, ranges)
    extra = sum(count - 1 for count in scan.duplicates.values())
    samples = sorted(scan.duplicates.items())[:SAMPLE_SIZE]
    key_name = "|".join(id_columns)
    result_metadata: dict[str, dg.RawMetadataValue] = {
        "snapshot_id": dg.MetadataValue.int(snapshot_id) if snapshot_id is not None else dg.MetadataValue.null(),
        "id_columns": dg.MetadataValue.json(id_columns),
        "offset_ranges_scanned": dg.MetadataValue.json({str(p): [r.start, r.end] for p, r in sorted(ranges.items())}),
        "rows_scanned": scan.rows_scanned,
        "data_files_scanned": scan.files_scanned,
        "duplicate_ids": len(scan.duplicates),
        "duplicate_rows": extra,
        "duplicate_samples": dg.MetadataValue.table(
            [dg.TableRecord({"id": k, "rows": n}) for k, n in samples],
            schema=dg.TableSchema(columns=[dg.TableColumn("id", "string"), dg.TableColumn("rows", "int")])),
        **scope.metadata(scan.scope, time.time()),  # find_duplicate_ids reads the table's files (pruned by stats)
    }
    if not scan.duplicates:
        return dg.AssetCheckResult(passed=True, metadata=result_metadata,
                                   description=f"the keys the run landed ({key_name}) have one row each"
                                   if ranges else "no commit of this topic to check yet")
    return dg.AssetCheckResult(
        passed=False, metadata=result_metadata, severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(scan.duplicates)} keys ({key_name}) have more than one row ({extra} extra rows), e.g. "
                    f"{', '.join(k for k, _ in samples[:5])}: another writer added rows of these keys; delete the "
                    "rows that are not the latest")


def evaluate_offsets_contiguous(table: Table, topic: str, scope: IntegrityScope = INCREMENTAL) -> dg.AssetCheckResult:
    contiguity = check_offset_contiguity(table, topic, whole_table=scope.whole_table)
    problems = contiguity.problems
    metadata: dict[str, dg.RawMetadataValue] = {
        "commits_checked": contiguity.commits_checked,
        "next_offsets": dg.MetadataValue.json({str(p): o for p, o in sorted(contiguity.next_offsets.items())}),
        "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none"),
        "rows_beyond_committed_samples": dg.MetadataValue.json(contiguity.rows_beyond_committed[:SAMPLE_SIZE]),
        "skipped_gaps": dg.MetadataValue.json([{"snapshot_id": g.snapshot_id, "partition": g.range.partition,
                                                "offsets": [g.range.start, g.range.end - 1]}
                                               for g in contiguity.skipped]),
        "moved_back": dg.MetadataValue.json([{"snapshot_id": m.snapshot_id, "run_id": m.run_id,
                                              "partition": m.range.partition, "from": m.range.end,
                                              "to": m.range.start}
                                             for m in contiguity.moved_back]),
        **scope.metadata(contiguity.scope, time.time()),
    }
    if problems:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
                                   description="; ".join(problems))
    if contiguity.latest_skipped:
        gaps = ", ".join(f"partition {r.partition} offsets {r.start}..{r.end - 1}" for r in contiguity.latest_skipped)
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description=f"the latest commit skipped offsets deleted before ingestion "
                                               f"(allow_gaps): {gaps}; those records are not in the table")
    moves = ", ".join(f"snapshot {m.snapshot_id} moved partition {m.range.partition} back from {m.range.end} to "
                      f"{m.range.start} (run {m.run_id})" for m in contiguity.moved_back)
    return dg.AssetCheckResult(passed=True, metadata=metadata,
                               description=f"{contiguity.commits_checked} commits, each partition's offsets only "
                                           "move forward" + (f", except deliberate moves back recorded by `offsets "
                                                             f"reset --to-offset`: {moves}" if moves else ""))


def evaluate_freshness(states: Mapping[int, PartitionState], max_lag_records: int,
                       table_error: str | None = None) -> dg.AssetCheckResult:
    """Lag per partition from its committed next offset: the table's where it holds the partition (`scan_topic`), so
    a table rolled back behind the offsets store shows its lag, and fails (ERROR) whatever the threshold: rows the
    store says landed are missing. `table_error`: the table could not be read (fails)."""
    lags = {p: lag_and_reference(s.log_end, s.segments_end, s.next_offset) for p, s in sorted(states.items())}
    behind = {p: lag for p, (lag, _) in lags.items() if lag > max_lag_records}
    rows = [dg.TableRecord({"partition": p, "lag": lag, "measured_against": against,
                            "committed_next_offset": states[p].next_offset, "broker_next_offset": states[p].log_end})
            for p, (lag, against) in lags.items()]
    metadata: dict[str, dg.RawMetadataValue] = {
        "max_lag": max((lag for lag, _ in lags.values()), default=0),
        "max_lag_threshold": max_lag_records,
        "lag_by_partition": dg.MetadataValue.table(rows, schema=dg.TableSchema(columns=[
            dg.TableColumn("partition", "int"), dg.TableColumn("lag", "int"),
            dg.TableColumn("measured_against", "string"), dg.TableColumn("committed_next_offset", "int"),
            dg.TableColumn("broker_next_offset", "int")])),
    }
    disagree = {str(p): {"store": s.store_next_offset, "table": s.table_next_offset}
                for p, s in sorted(states.items()) if s.offsets_disagree}
    if disagree:
        metadata["offsets_disagree"] = dg.MetadataValue.json(disagree)
    if table_error is not None:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description=f"{table_error}: the lag cannot be trusted")
    rolled_back = {p: s for p, s in sorted(states.items()) if s.table_behind_store}
    if rolled_back:
        sides = ", ".join(f"partition {p}: table next offset {s.table_next_offset}, store {s.store_next_offset}"
                          for p, s in rolled_back.items())
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
            description=f"the table lacks offsets the offsets store says landed ({sides}): it was rolled back or "
                        "its commits were undone; the sensor requests a run that lands them again")
    if behind:
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
            description=f"partitions {sorted(behind)} are more than {max_lag_records} records behind "
                        f"({', '.join(f'{p}: {lag}' for p, lag in behind.items())}); check that ingest runs succeed "
                        "and keep up (processor.max_bytes_per_run, Spark resources)")
    return dg.AssetCheckResult(passed=True, metadata=metadata,
                               description=f"every partition within {max_lag_records} records of the broker")


def evaluate_retention_headroom(retention: TopicRetention | None, error: str | None = None, *,
                                warn_seconds: float) -> dg.AssetCheckResult:
    """Fails (ERROR) when offsets not landed are gone from the log or past the topic's retention; warns when a
    partition's headroom is below `warn_seconds` or the retention cannot be read (`error`)."""
    if retention is None:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=f"{error}: the retention headroom is unknown")
    policy = retention.policy
    rows = [dg.TableRecord({
        "partition": p, "headroom_seconds": _rounded(r.headroom_seconds), "headroom_bytes": r.headroom_bytes,
        "log_start_offset": r.log_start_offset, "replay_window_seconds": _rounded(r.replay_window_seconds),
        "replay_window_records": r.replay_window_records, "at_risk_segment": r.at_risk_key})
        for p, r in sorted(retention.partitions.items())]
    metadata: dict[str, dg.RawMetadataValue] = {
        "retention_ms": policy.retention_ms, "retention_bytes": policy.retention_bytes,
        "headroom_warn_seconds": warn_seconds,
        "retention_by_partition": dg.MetadataValue.table(rows, schema=dg.TableSchema(columns=[
            dg.TableColumn("partition", "int"), dg.TableColumn("headroom_seconds", "float"),
            dg.TableColumn("headroom_bytes", "int"), dg.TableColumn("log_start_offset", "int"),
            dg.TableColumn("replay_window_seconds", "float"), dg.TableColumn("replay_window_records", "int"),
            dg.TableColumn("at_risk_segment", "string")])),
    }
    if retention.min_headroom_seconds is not None:
        metadata["min_headroom_seconds"] = _rounded(retention.min_headroom_seconds)
    gaps = retention.gaps
    if gaps:
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
            description="; ".join(f"partition {p}: {gap}" for p, gap in gaps.items()) + " (those records are lost "
                        "to the table unless retention is raised before the next pass; `offsets skip` records a "
                        "gap that is accepted)")
    short = {p: r for p, r in sorted(retention.partitions.items()) if r.headroom_below(warn_seconds)}
    if short:
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
            description=f"{policy.describe()}: partitions {sorted(short)} have less than {warn_seconds:.0f} s before "
                        "retention deletes records not landed ("
                        + ", ".join(f"{p}: {r.headroom_seconds:.0f} s" for p, r in short.items())
                        + "); land faster or raise retention.ms")
    return dg.AssetCheckResult(passed=True, metadata=metadata,
                               description=f"{policy.describe()}: no record not landed within {warn_seconds:.0f} s "
                                           "of retention")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def evaluate_schema_valid(metadata: Mapping[str, dg.MetadataValue] | None,
                          schema_mode: str) -> dg.AssetCheckResult:
    if metadata is None:
        return dg.AssetCheckResult(passed=True, description="no materialization yet: nothing was validated",
                                   metadata={"schema_mode": schema_mode})
    invalid_value = metadata.get(INVALID_RECORDS_KEY)
    invalid = (invalid_value.value or 0) if isinstance(invalid_value, dg.IntMetadataValue) else 0
    samples = invalid_samples_from_metadata(metadata)
    # Where the run put them (lenient mode has a default dead-letter table, which the mapping need not name).
    dead_letter_value = metadata.get(DEAD_LETTER_TABLE_KEY)
    dead_letter_table = dead_letter_value.value if isinstance(dead_letter_value, dg.TextMetadataValue) else None
    result_metadata: dict[str, dg.RawMetadataValue] = {
        "schema_mode": schema_mode,
        "invalid_records": invalid,
        "invalid_samples": dg.MetadataValue.table([dg.TableRecord(s) for s in samples], schema=INVALID_SAMPLES_SCHEMA),
        "dead_letter_table": dead_letter_table or dg.MetadataValue.null(),
    }
    if invalid == 0:
        return dg.AssetCheckResult(passed=True, metadata=result_metadata,
                                   description="every record of the run was valid")
    where = f"in dead-letter table {dead_letter_table}" if dead_letter_table else "not committed"
    reasons = "; ".join(
        f"{s['record_id']}: {s['reason']}" + (f" (schema {s['schema_path']})" if s.get("schema_path") else "")
        for s in samples[:3]
    )
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=result_metadata,
        description=f"{invalid} invalid records ({where}), e.g. {reasons}",
    )


# ------------------------------------------------------------------------------------------ definitions


def _run_materialization_metadata(
    context: dg.AssetCheckExecutionContext, asset_key: dg.AssetKey
) -> Mapping[str, dg.MetadataValue] | None:
    """Metadata of this run's materialization of the asset, else of its latest materialization."""
    records = context.instance.get_records_for_run(
        context.run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, ascending=False
    ).records
    for record in records:
        materialization = record.event_log_entry.asset_materialization
        if materialization is not None and materialization.asset_key == asset_key:
            return materialization.metadata
    latest = context.instance.get_latest_materialization_event(asset_key)
    return latest.asset_materialization.metadata if latest is not None and latest.asset_materialization else None


def _table_or_none(catalog: IcebergCatalogResource, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except TableNotFoundError:
        return None


def build_table_checks(config: LakehouseConfig, mapping: MappingConfig) -> list[dg.AssetChecksDefinition]:
    """The four checks of a mapping's table asset."""
    max_lag_records = mapping.freshness_max_lag_records
    asset_key = table_asset_key(mapping.table)
    topic, table_name = mapping.topic, mapping.table
    no_table = dg.AssetCheckResult(passed=True, description=f"table {table_name} does not exist yet")

    @dg.asset_check(
        asset=asset_key,
        name=SCHEMA_VALID,
        blocking=True,
        description="Records of the run that failed validation (schema.mode) or a required column.",
    )
    def schema_valid(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        return evaluate_schema_valid(_run_materialization_metadata(context, asset_key), config.schema_config.mode)

    upsert = mapping.mode == "upsert"

    @dg.asset_check(
        asset=asset_key,
        name=ID_UNIQUE if upsert else RECORD_ID_UNIQUE,
        blocking=True,
        description=f"One row per key ({', '.join(mapping.id_columns)}) among the keys the run landed."
        if upsert else "No record_id twice in the offset ranges the run committed (pruned by offset stats).",
    )
    def record_id_unique(
        context: dg.AssetCheckExecutionContext, iceberg_catalog: IcebergCatalogResource
    ) -> dg.AssetCheckResult:
        table = _table_or_none(iceberg_catalog, table_name)
        if table is None:
            return no_table
        metadata = _run_materialization_metadata(context, asset_key)
        scope = integrity_scope(context.instance, asset_key)
        if upsert:
            return evaluate_id_unique(table, topic, list(mapping.id_columns), metadata, scope)
        return evaluate_record_id_unique(table, topic, metadata, scope)

    @dg.asset_check(
        asset=asset_key,
        name=OFFSETS_CONTIGUOUS,
        blocking=True,
        description="Committed offsets only move forward, no rows beyond them; skipped gaps reported.",
    )
    def offsets_contiguous(context: dg.AssetCheckExecutionContext,
                           iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
        table = _table_or_none(iceberg_catalog, table_name)
        if table is None:
            return no_table
        return evaluate_offsets_contiguous(table, topic, integrity_scope(context.instance, asset_key))

    @dg.asset_check(
        asset=asset_key,
        name=FRESHNESS,
        description=f"Lag behind the broker watermark; warns above {max_lag_records} records.",
    )
    def freshness(segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,
                  iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
        # The table's offsets win over the store's: after a rollback of the table its lag shows.
        scan = scan_topic_now(config, mapping, segment_store, offset_store, iceberg_catalog, lag_only=True)
        return evaluate_freshness(scan.partitions, max_lag_records, scan.table_error)

    warn_seconds = mapping.retention_headroom_warn_seconds

    @dg.asset_check(
        asset=asset_key,
        name=RETENTION_HEADROOM,
        description=f"Time before the topic's retention deletes records not landed yet, and how far back the log "
                    f"reaches; warns below {warn_seconds} s, fails when records not landed are gone.",
    )
    def retention_headroom(segment_store: SegmentStoreResource, offset_store: OffsetStoreResource,
                           iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
        sources = watch_sources_now(config, segment_store, offset_store, iceberg_catalog)
        scan = scan_topic(sources, topic, table=table_name, lag_only=True)
        return evaluate_retention_headroom(*scan_retention(sources, topic, scan), warn_seconds=warn_seconds)

    if mapping.publish == "audited":  # the asset evaluates these on the audited snapshot (assets.audited_check_specs)
        return [schema_valid, freshness, retention_headroom]
    return [schema_valid, record_id_unique, offsets_contiguous, freshness, retention_headroom]
