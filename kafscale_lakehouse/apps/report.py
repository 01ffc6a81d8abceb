"""`kafscale-lakehouse report --table T`: one self-contained HTML page per table for its data owner. This module
reads what the page shows into a `TableReport`; apps/report_html.py renders and writes the page.

What it shows, and where it comes from:
- rows per commit (and invalid records diverted per commit): the table's Iceberg snapshot summaries
  (`added-records`, `kafscale.dead-letter.records`), oldest to newest, at most `MAX_SNAPSHOTS`;
- committed offsets per Kafka partition over time against the broker watermark, and the lag now: the
  `kafscale.offsets.<topic>` summary of each snapshot, and `next_offset` from the offsets store (etcd or local);
- invalid-record samples and the most frequent faults: the newest rows of the dead-letter table;
- check history: asset check evaluations from the Dagster instance at `$DAGSTER_HOME` ("no Dagster instance"
  without one), of the checks the table's asset has (`id_unique` in place of `record_id_unique` on an upsert table).
A source that cannot be read (etcd down, no dead-letter table) is named on the page (`TableReport.notes`) instead of
failing the report. Secrets never reach it: the page names the table, topic, dead-letter table and catalog type only,
never an endpoint or a credential.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.expressions import In
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ADDED_RECORDS

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.connections import (
    catalog_settings,
    etcd_client_from_config,
    offset_store_from_config,
    segment_store_from_config,
)
from kafscale_lakehouse.engine.ingestion import lag, stalled_partitions, with_pattern_topics
from kafscale_lakehouse.engine.tables import (
    CHECK_NAMES,
    ID_UNIQUE,
    RECORD_ID_UNIQUE,
    RUN_ID_PROPERTY,
    ancestry,
    default_dead_letter_table,
    load_catalog,
    parse_commit,
    summary_properties,
    table_asset_path,
)

log = logging.getLogger(__name__)

MAX_SNAPSHOTS = 200
SAMPLE_LIMIT = 20
CHECK_HISTORY_LIMIT = 20
# Dead-letter runs read for samples and fault counts (the newest first), so the report never scans the whole table.
DEAD_LETTER_RUNS = 10
_VALUE_PREVIEW_CHARS = 160
_METADATA_VALUE_CHARS = 200


class ReportError(Exception):
    """The report cannot be made (a table no mapping writes, a table missing from the catalog)."""


@dataclass(frozen=True)
class SnapshotPoint:
    snapshot_id: int
    committed_at: datetime
    run_id: str | None  # None: a snapshot of another engine (compaction, deletes)
    added_records: int
    dead_letters: int  # invalid records the run diverted
    dead_letter_table: str | None  # where it diverted them
    offsets: dict[int, int]  # the topic's next offset per partition after this snapshot (empty: none recorded)
    data_files: int | None = None  # the table's data files after this snapshot (summary `total-data-files`)
    data_bytes: int | None = None  # and their bytes (`total-files-size`)

    @property
    def average_file_bytes(self) -> int | None:
        return self.data_bytes // self.data_files if self.data_files and self.data_bytes is not None else None


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    committed: int | None  # the table's next offset (None: nothing committed)
    watermark: int | None  # the broker's next offset
    segments_end: int | None = None  # without a watermark (a restored topic): where the completed segments end

    @property
    def lag(self) -> int | None:
        return lag(self.watermark if self.watermark is not None else self.segments_end, self.committed)


@dataclass(frozen=True)
class DeadLetterSample:
    record_id: str
    error: str
    schema_path: str | None
    run_id: str
    ingested_at: datetime
    value_preview: str


@dataclass(frozen=True)
class CheckEvaluation:
    check_name: str
    evaluated_at: datetime
    status: str  # SUCCEEDED, FAILED, PLANNED
    passed: bool | None
    severity: str | None
    description: str | None
    metadata: tuple[tuple[str, str], ...]


@dataclass
class TableReport:
    table: str
    topic: str
    catalog_type: str
    generated_at: datetime
    total_records: int | None = None
    snapshots: list[SnapshotPoint] = field(default_factory=list)
    lags: list[PartitionLag] = field(default_factory=list)
    dead_letter_table: str | None = None
    dead_letter_total: int | None = None
    dead_letter_samples: list[DeadLetterSample] = field(default_factory=list)
    faults: list[tuple[str, int]] = field(default_factory=list)  # (schema path or error, count) in the newest runs
    checks: list[CheckEvaluation] | None = None  # None: no Dagster instance
    notes: list[str] = field(default_factory=list)  # what could not be read, and why


def build_table_report(config: LakehouseConfig, table: str, *, dagster_home: str | None) -> TableReport:
    """Everything the page shows, read from the catalog, the offsets store and the Dagster instance."""
    mapping = _mapping_of(config, table)
    report = TableReport(table=table, topic=mapping.topic, catalog_type=config.iceberg.catalog.type,
                         generated_at=datetime.now(UTC))
    catalog = load_catalog(catalog_settings(config))
    if not catalog.table_exists(table):
        raise ReportError(f"table {table} does not exist in the {config.iceberg.catalog.type} catalog yet "
                          "(no run has created it)")
    iceberg_table = catalog.load_table(table)
    _read_snapshots(report, iceberg_table)
    _read_lag(report, config)
    _read_dead_letters(report, catalog, mapping, config)
    _read_check_history(report, dagster_home, _check_names(mapping))
    return report


# ------------------------------------------------------------------------------------------------- reading


def _mapping_of(config: LakehouseConfig, table: str) -> MappingConfig:
    mappings = config.mappings
    if config.pattern_mappings and all(m.table != table for m in mappings):
        mappings = with_pattern_topics(config).config.mappings  # a table of a topic a topic_pattern matches
    for mapping in mappings:
        if mapping.table == table:
            return mapping
    mapped = ", ".join(m.table for m in mappings) or "none"
    raise ReportError(f"no mapping writes table {table!r} (mapped tables: {mapped})")


def _read_snapshots(report: TableReport, table: Table) -> None:
    current = table.current_snapshot()
    if current is not None and current.summary is not None:
        report.total_records = int(current.summary.get("total-records", "0"))
    points: list[SnapshotPoint] = []
    for snapshot in ancestry(table):
        commit = parse_commit(snapshot, table_name=report.table)
        committed_at = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC)
        summary = summary_properties(snapshot)
        files = {"data_files": _int_or_none(summary.get("total-data-files")),
                 "data_bytes": _int_or_none(summary.get("total-files-size"))}
        if commit is None:  # another engine's snapshot (compaction, deletes)
            added = summary.get(ADDED_RECORDS, "0")
            points.append(SnapshotPoint(snapshot.snapshot_id, committed_at, None, int(added), 0, None, {}, **files))
        else:
            points.append(SnapshotPoint(
                snapshot_id=snapshot.snapshot_id, committed_at=committed_at, run_id=commit.run_id,
                added_records=commit.added_records or 0, dead_letters=commit.dead_letter_records or 0,
                dead_letter_table=commit.dead_letter_table, offsets=commit.next_offsets(report.topic), **files))
        if len(points) == MAX_SNAPSHOTS:
            break
    report.snapshots.extend(reversed(points))


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _read_lag(report: TableReport, config: LakehouseConfig) -> None:
    committed = next((s.offsets for s in reversed(report.snapshots) if s.offsets), {})
    etcd = None
    try:
        if config.offsets.backend == "etcd":
            etcd = etcd_client_from_config(config, retry_seconds=5)
        store = offset_store_from_config(config, etcd)
        try:
            watermarks = store.broker_watermarks(report.topic)
        finally:
            store.close()
    except Exception as exc:  # noqa: BLE001 - the page says what is missing instead of failing as a whole
        log.warning("report of %s: broker watermarks unavailable: %s", report.table, exc)
        report.notes.append(f"Lag unavailable: the broker watermarks could not be read ({type(exc).__name__}: {exc}).")
        report.lags = [PartitionLag(p, n, None) for p, n in sorted(committed.items())]
        return
    finally:
        if etcd is not None:
            etcd.close()
    segments_ends = _segments_ends(report, config, committed, watermarks)
    partitions = sorted(set(committed) | set(watermarks) | set(segments_ends))
    report.lags = [PartitionLag(p, committed.get(p), watermarks.get(p), segments_ends.get(p)) for p in partitions]


def _segments_ends(report: TableReport, config: LakehouseConfig, committed: dict[int, int],
                   watermarks: dict[int, int]) -> dict[int, int]:
    """Where the completed segments end of the partitions without a broker watermark (`kafscale-cli restore` writes
    none for a partition it copied no record of): listed from the table's next offset."""
    try:
        store = segment_store_from_config(config)
        without = {p: committed.get(p) for p in {*store.list_partitions(report.topic), *committed}
                   if p not in watermarks}
        return stalled_partitions(store, report.topic, without, listed_whole=without,
                                  grace_seconds=config.processor.orphan_segment_grace_seconds).segments_ends
    except Exception as exc:  # noqa: BLE001 - the page says what is missing instead of failing as a whole
        log.warning("report of %s: segments unavailable: %s", report.table, exc)
        report.notes.append("Lag of the partitions without a broker watermark unavailable: the segments could not "
                            f"be listed ({type(exc).__name__}: {exc}).")
        return {}


def _read_dead_letters(report: TableReport, catalog: Catalog, mapping: MappingConfig, config: LakehouseConfig) -> None:
    named = next((p.dead_letter_table for p in reversed(report.snapshots) if p.dead_letter_table), None)
    configured = mapping.dead_letter_table or (default_dead_letter_table(mapping.table)
                                               if config.schema_config.mode == "lenient" else None)
    name = named or configured
    if name is None:
        report.notes.append("No dead-letter table: invalid records fail the run in this mapping's schema mode.")
        return
    report.dead_letter_table = name
    if not catalog.table_exists(name):
        report.notes.append(f"Dead-letter table {name} does not exist yet: no run has diverted an invalid record.")
        report.dead_letter_total = 0
        return
    dead_letters = catalog.load_table(name)
    current = dead_letters.current_snapshot()
    if current is None:
        report.dead_letter_total = 0
    elif current.summary is not None:
        report.dead_letter_total = int(current.summary.get("total-records", "0"))
    runs = []
    for snapshot in ancestry(dead_letters):
        run_id = summary_properties(snapshot).get(RUN_ID_PROPERTY)
        if run_id and run_id not in runs:
            runs.append(run_id)
        if len(runs) == DEAD_LETTER_RUNS:
            break
    if not runs:
        return
    rows = dead_letters.scan(row_filter=In("run_id", runs)).to_arrow().to_pylist()
    rows.sort(key=lambda row: (row["ingested_at"], row["partition"], row["offset"]), reverse=True)
    report.faults = Counter(row["schema_path"] or _fault_of(row["error"]) for row in rows).most_common(10)
    report.dead_letter_samples = [
        DeadLetterSample(record_id=row["record_id"], error=row["error"], schema_path=row["schema_path"],
                         run_id=row["run_id"], ingested_at=row["ingested_at"], value_preview=_preview(row["value"]))
        for row in rows[:SAMPLE_LIMIT]]


def _fault_of(error: str) -> str:
    """A coercion or parse error without a schema path, without the record-specific part after the first colon."""
    head, _, _ = error.partition(":")
    return head if head else error


def _preview(value: bytes | None) -> str:
    if value is None:
        return "(null)"
    text = value.decode("utf-8", errors="replace")
    return text if len(text) <= _VALUE_PREVIEW_CHARS else text[:_VALUE_PREVIEW_CHARS - 1] + "…"


def _check_names(mapping: MappingConfig) -> tuple[str, ...]:
    """The checks of the mapping's table asset (orchestration/checks.py): an upsert table's one row per key is
    `id_unique`, not `record_id_unique`."""
    if mapping.mode != "upsert":
        return CHECK_NAMES
    return tuple(ID_UNIQUE if name == RECORD_ID_UNIQUE else name for name in CHECK_NAMES)


def _read_check_history(report: TableReport, dagster_home: str | None, check_names: tuple[str, ...]) -> None:
    if not dagster_home or not Path(dagster_home).is_dir():
        where = "DAGSTER_HOME is not set" if not dagster_home else f"{dagster_home} is not a directory"
        report.notes.append(f"No Dagster instance ({where}): no check history.")
        return
    # Dagster is only needed (and only imported) when there is an instance to read.
    import dagster as dg

    asset_key = dg.AssetKey(table_asset_path(report.table))
    evaluations: list[CheckEvaluation] = []
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        for name in check_names:
            records = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(asset_key, name), limit=CHECK_HISTORY_LIMIT)
            evaluations.extend(_check_evaluation(name, record) for record in records)
    report.checks = sorted(evaluations, key=lambda e: e.evaluated_at, reverse=True)


def _check_evaluation(name: str, record: Any) -> CheckEvaluation:
    evaluation = record.evaluation
    metadata = tuple((key, _metadata_text(value)) for key, value in (evaluation.metadata if evaluation else {}).items())
    return CheckEvaluation(
        check_name=name, evaluated_at=datetime.fromtimestamp(record.create_timestamp, UTC),
        status=record.status.value, passed=evaluation.passed if evaluation else None,
        severity=evaluation.severity.value if evaluation else None,
        description=evaluation.description if evaluation else None, metadata=metadata)


def _metadata_text(value: Any) -> str:
    raw = getattr(value, "value", value)
    if hasattr(raw, "records"):  # a table: json would iterate Dagster's TableRecord tuples, which refuse it
        raw = [getattr(record, "data", record) for record in raw.records]
    text = raw if isinstance(raw, str) else json.dumps(raw, default=str, sort_keys=True)
    return text if len(text) <= _METADATA_VALUE_CHARS else text[:_METADATA_VALUE_CHARS - 1] + "…"
