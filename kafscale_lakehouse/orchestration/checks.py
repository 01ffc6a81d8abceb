"""Asset checks of a mapping's table, with metadata a data owner can act on (counts, sample record_ids, reasons).

- `schema_valid`: the run's invalid records (JSON Schema / required columns), from its materialization metadata.
- `record_id_unique`: no record_id twice, scanning only the offset ranges the run committed (a row filter on
  topic + partition + offset, so pyiceberg skips data files by their `offset` min/max statistics).
- `offsets_contiguous`: the `kafscale.offsets.<topic>` history of the table's snapshots never moves back or drops a
  partition, no rows lie at or beyond the committed next offsets, and gaps skipped by `allow_gaps` are reported.
- `freshness`: lag of the table behind the broker watermark (or the completed segments when there is none).
The checks run in the ingest run after the commit; run alone, they look at the table's latest commit of ours.
"""

# No `from __future__ import annotations`: Dagster reads the context and resource parameter annotations at runtime.
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

import dagster as dg
import pyarrow.compute as pc
from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan, NotIn, Or
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.catalog import TableNotFoundError
from kafscale_lakehouse.engine.ingest import SKIPPED_PROPERTY_PREFIX
from kafscale_lakehouse.engine.table_offsets import (
    OFFSETS_PROPERTY_PREFIX,
    RUN_ID_PROPERTY,
    CorruptOffsetsPropertyError,
    parse_offsets_property,
)
from kafscale_lakehouse.orchestration.assets import scan_topic_now
from kafscale_lakehouse.orchestration.io_manager import (
    DEAD_LETTER_TABLE_KEY,
    INVALID_RECORDS_KEY,
    INVALID_SAMPLES_SCHEMA,
    invalid_samples_from_metadata,
)
from kafscale_lakehouse.orchestration.naming import table_asset_key
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource, OffsetStoreResource, SegmentStoreResource
from kafscale_lakehouse.orchestration.sensors import PartitionState

SCHEMA_VALID = "schema_valid"
RECORD_ID_UNIQUE = "record_id_unique"
OFFSETS_CONTIGUOUS = "offsets_contiguous"
FRESHNESS = "freshness"
CHECK_NAMES = (SCHEMA_VALID, RECORD_ID_UNIQUE, OFFSETS_CONTIGUOUS, FRESHNESS)
SAMPLE_SIZE = 20


# ------------------------------------------------------------------------------------------ table history


@dataclass(frozen=True)
class OffsetCommit:
    """A snapshot of ours: the topic's next offset per partition after it, and the offsets it skipped."""

    snapshot: Snapshot
    next_offsets: dict[int, int]
    skipped: dict[int, tuple[int, int]]  # partition -> [from, to) deleted before ingestion

    @property
    def run_id(self) -> str | None:
        return self.snapshot.summary.get(RUN_ID_PROPERTY) if self.snapshot.summary is not None else None


def offset_commits(table: Table, topic: str) -> list[OffsetCommit]:
    """The snapshots in the table's current ancestry that carry `kafscale.offsets.<topic>`, oldest first."""
    table_name = ".".join(table.name())
    offsets_key, skipped_key = OFFSETS_PROPERTY_PREFIX + topic, SKIPPED_PROPERTY_PREFIX + topic
    commits = []
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        properties = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if offsets_key not in properties:
            continue
        where = f"table {table_name} snapshot {snapshot.snapshot_id} property {{}}"
        next_offsets = parse_offsets_property(properties[offsets_key], where=where.format(offsets_key))
        commits.append(OffsetCommit(snapshot, next_offsets,
                                    _parse_skipped(properties.get(skipped_key), where.format(skipped_key))))
    return commits[::-1]


def _parse_skipped(value: str | None, where: str) -> dict[int, tuple[int, int]]:
    """`{"0": [10, 40]}` -> `{0: (10, 40)}` (offsets [from, to) skipped); None -> `{}`."""
    if value is None:
        return {}
    try:
        return {int(p): (int(r[0]), int(r[1])) for p, r in json.loads(value).items()}
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise CorruptOffsetsPropertyError(f"{where}: {value!r} is not a partition → [from, to) map ({exc})") from exc


def committed_ranges(commits: Sequence[OffsetCommit], run_id: str) -> tuple[OffsetCommit | None, dict[int, tuple[int, int]]]:
    """The offset ranges `[start, end)` per partition committed by run `run_id`, or by the latest commit of ours when
    that run committed nothing (a check run on its own)."""
    if not commits:
        return None, {}
    index = next((i for i in range(len(commits) - 1, -1, -1) if commits[i].run_id == run_id), len(commits) - 1)
    before = commits[index - 1].next_offsets if index > 0 else {}
    after = commits[index].next_offsets
    # A partition's first commit starts wherever its first segment did: every offset below its end is in range.
    return commits[index], {p: (before.get(p, 0), end) for p, end in after.items() if before.get(p) != end}


def _and_all(*clauses: BooleanExpression) -> BooleanExpression:
    return reduce(And, clauses)


def _or_all(clauses: Sequence[BooleanExpression]) -> BooleanExpression:
    return reduce(Or, clauses)


# ------------------------------------------------------------------------------------------ evaluations


@dataclass(frozen=True)
class DuplicateScan:
    duplicates: dict[str, int]  # record_id -> occurrences (> 1)
    rows_scanned: int
    files_scanned: int
    files_in_table: int | None


def find_duplicate_record_ids(table: Table, topic: str, ranges: Mapping[int, tuple[int, int]]) -> DuplicateScan:
    """record_ids occurring more than once among the rows of `topic` in `ranges`. A record_id is
    `<topic>:<partition>:<offset>`, so every copy of a record in a range lies in that range."""
    if not ranges:
        return DuplicateScan({}, 0, 0, _files_in_table(table))
    row_filter = _or_all([_and_all(EqualTo("topic", topic), EqualTo("partition", p), GreaterThanOrEqual("offset", start),
                                   LessThan("offset", end)) for p, (start, end) in sorted(ranges.items())])
    scan = table.scan(row_filter=row_filter, selected_fields=("record_id",))
    files_scanned = sum(1 for _ in scan.plan_files())
    record_ids = scan.to_arrow()["record_id"]
    counts = pc.value_counts(record_ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    duplicates = dict(zip(repeated.field("values").to_pylist(), repeated.field("counts").to_pylist()))
    return DuplicateScan(duplicates, len(record_ids), files_scanned, _files_in_table(table))


def _files_in_table(table: Table) -> int | None:
    snapshot = table.current_snapshot()
    total = snapshot.summary.get("total-data-files") if snapshot is not None and snapshot.summary else None
    return int(total) if total is not None else None


def evaluate_record_id_unique(table: Table, topic: str, run_id: str) -> dg.AssetCheckResult:
    commit, ranges = committed_ranges(offset_commits(table, topic), run_id)
    scan = find_duplicate_record_ids(table, topic, ranges)
    extra = sum(count - 1 for count in scan.duplicates.values())
    samples = sorted(scan.duplicates.items())[:SAMPLE_SIZE]
    metadata = {
        "snapshot_id": dg.MetadataValue.int(commit.snapshot.snapshot_id) if commit else dg.MetadataValue.null(),
        "offset_ranges_scanned": dg.MetadataValue.json({str(p): [s, e] for p, (s, e) in sorted(ranges.items())}),
        "rows_scanned": scan.rows_scanned,
        "data_files_scanned": scan.files_scanned,
        "data_files_in_table": scan.files_in_table if scan.files_in_table is not None else dg.MetadataValue.null(),
        "duplicate_record_ids": len(scan.duplicates),
        "duplicate_rows": extra,
        "duplicate_samples": dg.MetadataValue.table(
            [dg.TableRecord({"record_id": r, "occurrences": n}) for r, n in samples],
            schema=dg.TableSchema(columns=[dg.TableColumn("record_id", "string"),
                                           dg.TableColumn("occurrences", "int")])),
    }
    if not scan.duplicates:
        return dg.AssetCheckResult(passed=True, metadata=metadata,
                                   description=f"{scan.rows_scanned} rows in the committed offset ranges, no record_id "
                                               "twice" if ranges else "no commit of this topic to check yet")
    return dg.AssetCheckResult(
        passed=False, metadata=metadata, severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(scan.duplicates)} record_ids occur more than once ({extra} extra rows), e.g. "
                    f"{', '.join(r for r, _ in samples[:5])}: another writer appended rows of these offsets again; "
                    "delete the extra copies (same record_id) from the table")


def evaluate_offsets_contiguous(table: Table, topic: str) -> dg.AssetCheckResult:
    commits = offset_commits(table, topic)
    problems: list[str] = []
    previous: dict[int, int] = {}
    for commit in commits:
        snapshot_id = commit.snapshot.snapshot_id
        for partition, before in sorted(previous.items()):
            after = commit.next_offsets.get(partition)
            if after is None:
                problems.append(f"snapshot {snapshot_id} dropped partition {partition} (next offset {before}) from "
                                f"{OFFSETS_PROPERTY_PREFIX}{topic}")
            elif after < before:
                problems.append(f"snapshot {snapshot_id} moved partition {partition} back from {before} to {after}: "
                                f"offsets {after}..{before - 1} may be committed twice")
        previous = {**previous, **commit.next_offsets}
    beyond = _rows_beyond_committed(table, topic, previous)
    if beyond:
        problems.append(f"{len(beyond)} rows lie at or beyond the committed next offsets (the next run ingests those "
                        f"offsets again), e.g. {', '.join(beyond[:5])}")
    skipped = [(c.snapshot.snapshot_id, p, r) for c in commits for p, r in sorted(c.skipped.items())]
    latest_skipped = [(p, r) for c in commits[-1:] for p, r in sorted(c.skipped.items())]
    metadata = {
        "commits_checked": len(commits),
        "next_offsets": dg.MetadataValue.json({str(p): o for p, o in sorted(previous.items())}),
        "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none"),
        "rows_beyond_committed_samples": dg.MetadataValue.json(beyond[:SAMPLE_SIZE]),
        "skipped_gaps": dg.MetadataValue.json([{"snapshot_id": s, "partition": p, "offsets": [r[0], r[1] - 1]}
                                               for s, p, r in skipped]),
    }
    if problems:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
                                   description="; ".join(problems))
    if latest_skipped:
        gaps = ", ".join(f"partition {p} offsets {r[0]}..{r[1] - 1}" for p, r in latest_skipped)
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description=f"the latest commit skipped offsets deleted before ingestion "
                                               f"(allow_gaps): {gaps}; those records are not in the table")
    return dg.AssetCheckResult(passed=True, metadata=metadata,
                               description=f"{len(commits)} commits, each partition's offsets only move forward")


def _rows_beyond_committed(table: Table, topic: str, next_offsets: Mapping[int, int]) -> list[str]:
    """record_ids of rows at or past a partition's next offset, or of partitions without one (pruned by stats)."""
    if table.current_snapshot() is None:
        return []
    clauses: list[BooleanExpression] = [_and_all(EqualTo("partition", p), GreaterThanOrEqual("offset", o))
                                        for p, o in sorted(next_offsets.items())]
    clauses.append(NotIn("partition", sorted(next_offsets)) if next_offsets else EqualTo("topic", topic))
    row_filter = And(EqualTo("topic", topic), _or_all(clauses))
    rows = table.scan(row_filter=row_filter, selected_fields=("record_id",), limit=SAMPLE_SIZE).to_arrow()
    return sorted(rows["record_id"].to_pylist())


def partition_lag(state: PartitionState) -> tuple[int, str]:
    """Records not yet in the table and what they are measured against."""
    if state.lag is not None:
        return state.lag, "broker watermark"
    return max(0, (state.completed_end or state.committed_next) - state.committed_next), "completed segments"


def evaluate_freshness(states: Mapping[int, PartitionState], max_lag_records: int) -> dg.AssetCheckResult:
    lags = {p: partition_lag(s) for p, s in sorted(states.items())}
    behind = {p: lag for p, (lag, _) in lags.items() if lag > max_lag_records}
    rows = [dg.TableRecord({"partition": p, "lag": lag, "measured_against": against,
                            "committed_next_offset": states[p].committed_next, "broker_next_offset": states[p].broker_next})
            for p, (lag, against) in lags.items()]
    metadata = {
        "max_lag": max((lag for lag, _ in lags.values()), default=0),
        "max_lag_threshold": max_lag_records,
        "lag_by_partition": dg.MetadataValue.table(rows, schema=dg.TableSchema(columns=[
            dg.TableColumn("partition", "int"), dg.TableColumn("lag", "int"),
            dg.TableColumn("measured_against", "string"), dg.TableColumn("committed_next_offset", "int"),
            dg.TableColumn("broker_next_offset", "int")])),
    }
    if behind:
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
            description=f"partitions {sorted(behind)} are more than {max_lag_records} records behind "
                        f"({', '.join(f'{p}: {lag}' for p, lag in behind.items())}); check that ingest runs succeed "
                        "and keep up (processor.max_bytes_per_run, Spark resources)")
    return dg.AssetCheckResult(passed=True, metadata=metadata,
                               description=f"every partition within {max_lag_records} records of the broker")


def evaluate_schema_valid(metadata: Mapping[str, dg.MetadataValue] | None,
                          schema_mode: str) -> dg.AssetCheckResult:
    if metadata is None:
        return dg.AssetCheckResult(passed=True, description="no materialization yet: nothing was validated",
                                   metadata={"schema_mode": schema_mode})
    invalid_value = metadata.get(INVALID_RECORDS_KEY)
    invalid = int(invalid_value.value) if isinstance(invalid_value, dg.IntMetadataValue) else 0
    samples = invalid_samples_from_metadata(metadata)
    # Where the run put them (lenient mode has a default dead-letter table, which the mapping need not name).
    dead_letter_value = metadata.get(DEAD_LETTER_TABLE_KEY)
    dead_letter_table = dead_letter_value.value if isinstance(dead_letter_value, dg.TextMetadataValue) else None
    result_metadata = {
        "schema_mode": schema_mode,
        "invalid_records": invalid,
        "invalid_samples": dg.MetadataValue.table([dg.TableRecord(s) for s in samples], schema=INVALID_SAMPLES_SCHEMA),
        "dead_letter_table": dead_letter_table or dg.MetadataValue.null(),
    }
    if invalid == 0:
        return dg.AssetCheckResult(passed=True, metadata=result_metadata,
                                   description="every record of the run was valid")
    where = f"in dead-letter table {dead_letter_table}" if dead_letter_table else "not committed"
    reasons = "; ".join(f"{s['record_id']}: {s['reason']}" + (f" (schema {s['schema_path']})" if s.get("schema_path") else "")
                        for s in samples[:3])
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=result_metadata,
                               description=f"{invalid} invalid records ({where}), e.g. {reasons}")


# ------------------------------------------------------------------------------------------ definitions


def _run_materialization_metadata(context: dg.AssetCheckExecutionContext,
                                   asset_key: dg.AssetKey) -> Mapping[str, dg.MetadataValue] | None:
    """Metadata of this run's materialization of the asset, else of its latest materialization."""
    records = context.instance.get_records_for_run(
        context.run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, ascending=False).records
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

    @dg.asset_check(asset=asset_key, name=SCHEMA_VALID, blocking=True,
                    description="Records of the run that failed validation (schema.mode) or a required column.")
    def schema_valid(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        return evaluate_schema_valid(_run_materialization_metadata(context, asset_key),
                                     config.schema_config.mode)

    @dg.asset_check(asset=asset_key, name=RECORD_ID_UNIQUE, blocking=True,
                    description="No record_id twice in the offset ranges the run committed (pruned by offset stats).")
    def record_id_unique(context: dg.AssetCheckExecutionContext,
                         iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
        table = _table_or_none(iceberg_catalog, table_name)
        return no_table if table is None else evaluate_record_id_unique(table, topic, context.run.run_id)

    @dg.asset_check(asset=asset_key, name=OFFSETS_CONTIGUOUS, blocking=True,
                    description="Committed offsets only move forward, no rows beyond them; skipped gaps reported.")
    def offsets_contiguous(iceberg_catalog: IcebergCatalogResource) -> dg.AssetCheckResult:
        table = _table_or_none(iceberg_catalog, table_name)
        return no_table if table is None else evaluate_offsets_contiguous(table, topic)

    @dg.asset_check(asset=asset_key, name=FRESHNESS,
                    description=f"Lag behind the broker watermark; warns above {max_lag_records} records.")
    def freshness(segment_store: SegmentStoreResource, offset_store: OffsetStoreResource) -> dg.AssetCheckResult:
        scan = scan_topic_now(config, topic, segment_store, offset_store)
        return evaluate_freshness(scan.partitions, max_lag_records)

    return [schema_valid, record_id_unique, offsets_contiguous, freshness]
