"""`kafscale-lakehouse report --table T`: one self-contained HTML page per table for its data owner.

What it shows, and where it comes from:
- rows per commit (and invalid records diverted per commit): the table's Iceberg snapshot summaries
  (`added-records`, `kafscale.dead-letter.records`), oldest to newest, at most `MAX_SNAPSHOTS`;
- committed offsets per Kafka partition over time against the broker watermark, and the lag now: the
  `kafscale.offsets.<topic>` summary of each snapshot, and `next_offset` from the offsets store (etcd or local);
- invalid-record samples and the most frequent faults: the newest rows of the dead-letter table;
- check history: asset check evaluations from the Dagster instance at `$DAGSTER_HOME` ("no Dagster instance"
  without one).
Charts are inline SVG; the page has no script and loads nothing. A source that cannot be read (etcd down, no
dead-letter table) is named on the page instead of failing the report. Secrets never reach it: the page names the
table, topic, dead-letter table and catalog type only, never an endpoint or a credential.
"""

from __future__ import annotations

import html
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.expressions import In
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ADDED_RECORDS

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.connections import catalog_settings, etcd_client_from_config, offset_store_from_config
from kafscale_lakehouse.engine.ingestion.lag import lag
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.checks import CHECK_NAMES, table_asset_path
from kafscale_lakehouse.engine.tables.dead_letters import default_dead_letter_table
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY, ancestry, parse_commit, summary_properties

log = logging.getLogger(__name__)

MAX_SNAPSHOTS = 200
SAMPLE_LIMIT = 20
CHECK_HISTORY_LIMIT = 20
# Dead-letter runs read for samples and fault counts (the newest first), so the report never scans the whole table.
DEAD_LETTER_RUNS = 10
_VALUE_PREVIEW_CHARS = 160
_METADATA_VALUE_CHARS = 200
_COLORS = ("#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#b7791f", "#4a5568")
_INVALID_COLOR = "#c53030"


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

    @property
    def lag(self) -> int | None:
        return lag(self.watermark, self.committed)


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
    _read_check_history(report, dagster_home)
    return report


def write_table_report(config: LakehouseConfig, table: str, output: Path, *, dagster_home: str | None) -> Path:
    report = build_table_report(config, table, dagster_home=dagster_home)
    output.write_text(render_report_html(report), encoding="utf-8")
    log.info("report of table %s written to %s", table, output)
    return output


# ------------------------------------------------------------------------------------------------- reading


def _mapping_of(config: LakehouseConfig, table: str) -> MappingConfig:
    for mapping in config.mappings:
        if mapping.table == table:
            return mapping
    mapped = ", ".join(m.table for m in config.mappings) or "none"
    raise ReportError(f"no mapping writes table {table!r} (mapped tables: {mapped})")


def _read_snapshots(report: TableReport, table: Table) -> None:
    current = table.current_snapshot()
    if current is not None:
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
        watermarks = {}
    finally:
        if etcd is not None:
            etcd.close()
    partitions = sorted(set(committed) | set(watermarks))
    report.lags = [PartitionLag(p, committed.get(p), watermarks.get(p)) for p in partitions]


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
    report.dead_letter_total = int(current.summary.get("total-records", "0")) if current is not None else 0
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


def _read_check_history(report: TableReport, dagster_home: str | None) -> None:
    if not dagster_home or not Path(dagster_home).is_dir():
        where = "DAGSTER_HOME is not set" if not dagster_home else f"{dagster_home} is not a directory"
        report.notes.append(f"No Dagster instance ({where}): no check history.")
        return
    # Dagster is only needed (and only imported) when there is an instance to read.
    import dagster as dg

    asset_key = dg.AssetKey(table_asset_path(report.table))
    evaluations = []
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        for name in CHECK_NAMES:
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


# ----------------------------------------------------------------------------------------------- rendering


def render_report_html(report: TableReport) -> str:
    """The whole page: inline CSS and SVG, no script, every text escaped."""
    sections = [_summary_section(report), _notes_section(report), _rows_section(report), _lag_section(report),
                _files_section(report), _checks_section(report), _dead_letters_section(report)]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(report.table)} — KafScale lakehouse report</title><style>{_CSS}</style></head>"
            f"<body><main>{''.join(s for s in sections if s)}</main></body></html>\n")


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1a202c;background:#f7fafc;margin:0}
main{max-width:1000px;margin:0 auto;padding:24px}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.2em;margin:28px 0 8px;border-bottom:1px solid #e2e8f0}
.sub{color:#4a5568;margin:0 0 16px}.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:1.4em}
.note{background:#fffaf0;border-left:4px solid #dd6b20;padding:6px 10px;margin:6px 0}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.9em}
th,td{border:1px solid #e2e8f0;padding:4px 6px;text-align:left;vertical-align:top}th{background:#edf2f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:.95em}
.passed{color:#276749}.failed{color:#c53030}.legend span{margin-right:14px}
svg{background:#fff;border:1px solid #e2e8f0;border-radius:6px;margin:6px 0}
"""


def _summary_section(report: TableReport) -> str:
    lags = [lag.lag for lag in report.lags if lag.lag is not None]
    cards = [("rows in the table", _count(report.total_records)), ("commits shown", str(len(report.snapshots))),
             ("invalid records diverted", _count(report.dead_letter_total)),
             ("lag now (records)", _count(sum(lags)) if lags else "unknown")]
    card_html = "".join(f'<div class="card">{_e(label)}<b>{_e(value)}</b></div>' for label, value in cards)
    return (f"<h1>{_e(report.table)}</h1><p class=\"sub\">KafScale topic <code>{_e(report.topic)}</code> · "
            f"{_e(report.catalog_type)} catalog · generated {_e(_time(report.generated_at))}</p>"
            f'<div class="cards">{card_html}</div>')


def _notes_section(report: TableReport) -> str:
    return "".join(f'<p class="note">{_e(note)}</p>' for note in report.notes)


def _rows_section(report: TableReport) -> str:
    if not report.snapshots:
        return "<h2>Rows per commit</h2><p>No commit yet.</p>"
    labels = [f"snapshot {p.snapshot_id} at {_time(p.committed_at)}" + (f", run {p.run_id}" if p.run_id else
                                                                          " (not an ingest run)")
              for p in report.snapshots]
    chart = _stacked_bars(labels, [("rows appended", _COLORS[0], [p.added_records for p in report.snapshots]),
                                   ("invalid records diverted", _INVALID_COLOR,
                                    [p.dead_letters for p in report.snapshots])],
                          (_time(report.snapshots[0].committed_at), _time(report.snapshots[-1].committed_at)))
    return f"<h2>Rows per commit</h2>{chart}"


def _lag_section(report: TableReport) -> str:
    series = []
    for index, partition in enumerate(sorted({p for s in report.snapshots for p in s.offsets})):
        points = [(s.committed_at.timestamp(), s.offsets[partition])
                  for s in report.snapshots if partition in s.offsets]
        series.append((f"partition {partition}", _COLORS[index % len(_COLORS)], points))
    guides = [(f"partition {lag.partition} broker watermark", lag.watermark) for lag in report.lags
              if lag.watermark is not None]
    parts = ["<h2>Committed offsets against the broker watermark</h2>"]
    if series:
        parts.append(_line_chart(series, guides))
    rows = "".join(f'<tr><td class="num">{lag.partition}</td><td class="num">{_count(lag.committed)}</td>'
                   f'<td class="num">{_count(lag.watermark)}</td><td class="num">{_count(lag.lag)}</td></tr>'
                   for lag in report.lags)
    if rows:
        parts.append("<table><tr><th>Kafka partition</th><th>next offset in the table</th>"
                     f"<th>broker next offset</th><th>lag (records)</th></tr>{rows}</table>")
        parts.append(_horizontal_bars([(f"partition {lag.partition}", lag.lag) for lag in report.lags
                                       if lag.lag is not None], _COLORS[1]))
    elif not series:
        parts.append("<p>No offsets committed and no broker watermark yet.</p>")
    return "".join(parts)


def _files_section(report: TableReport) -> str:
    """Data files and their average size over time: what compaction (engine/maintenance.py) keeps in check."""
    points = [p for p in report.snapshots if p.data_files is not None]
    if not points:
        return ""
    latest = points[-1]
    parts = ["<h2>Data files and average file size</h2>",
             _line_chart([("data files", _COLORS[0], [(p.committed_at.timestamp(), p.data_files) for p in points])],
                         []),
             _line_chart([("average file size (KiB)", _COLORS[1],
                           [(p.committed_at.timestamp(), (p.average_file_bytes or 0) / 1024) for p in points])], []),
             f"<p>Now: {_count(latest.data_files)} data files, average {_count(latest.average_file_bytes)} bytes.</p>"]
    return "".join(parts)


def _checks_section(report: TableReport) -> str:
    if report.checks is None:
        return "<h2>Check history</h2><p>No Dagster instance: check history is not available.</p>"
    if not report.checks:
        return "<h2>Check history</h2><p>The Dagster instance has no check evaluations for this table yet.</p>"
    strips = []
    for name in dict.fromkeys(e.check_name for e in report.checks):
        history = [e for e in reversed(report.checks) if e.check_name == name]  # oldest first
        strips.append(f"<tr><td><code>{_e(name)}</code></td><td>{_status_strip(history)}</td>"
                      f"<td>{_status_text(history[-1])}</td></tr>")
    rows = []
    for e in report.checks:
        metadata = "<br>".join(f"<code>{_e(k)}</code>: {_e(v)}" for k, v in e.metadata)
        rows.append(f"<tr><td>{_e(_time(e.evaluated_at))}</td><td><code>{_e(e.check_name)}</code></td>"
                    f"<td>{_status_text(e)}</td><td>{_e(e.severity if e.passed is False else '')}</td>"
                    f"<td>{_e(e.description or '')}{'<br>' if e.description and metadata else ''}{metadata}</td></tr>")
    return ("<h2>Check history</h2><table><tr><th>check</th><th>evaluations, oldest to newest</th><th>latest</th></tr>"
            f"{''.join(strips)}</table><h3>Evaluations</h3><table><tr><th>time</th><th>check</th><th>result</th>"
            f"<th>severity</th><th>details</th></tr>{''.join(rows)}</table>")


def _dead_letters_section(report: TableReport) -> str:
    if report.dead_letter_table is None:
        return ""
    parts = [f"<h2>Invalid records</h2><p>Dead-letter table <code>{_e(report.dead_letter_table)}</code>: "
             f"{_e(_count(report.dead_letter_total))} records in total.</p>"]
    if report.faults:
        parts.append(f"<h3>Most frequent faults (newest {DEAD_LETTER_RUNS} runs)</h3>")
        parts.append(_horizontal_bars(report.faults, _INVALID_COLOR))
    if report.dead_letter_samples:
        rows = "".join(
            f"<tr><td><code>{_e(s.record_id)}</code></td><td>{_e(s.error)}</td><td><code>{_e(s.schema_path or '')}"
            f"</code></td><td><code>{_e(s.value_preview)}</code></td><td>{_e(_time(s.ingested_at))}<br>"
            f"<code>{_e(s.run_id)}</code></td></tr>" for s in report.dead_letter_samples)
        parts.append(f"<h3>Samples (newest {len(report.dead_letter_samples)})</h3><table><tr><th>record_id</th>"
                     f"<th>error</th><th>schema path</th><th>value</th><th>ingested (run)</th></tr>{rows}</table>")
    return "".join(parts)


# ------------------------------------------------------------------------------------------------------ SVG

_WIDTH, _HEIGHT = 940, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 16, 40


def _stacked_bars(labels: Sequence[str], stacks: Sequence[tuple[str, str, Sequence[int]]],
                  x_labels: tuple[str, str]) -> str:
    totals = [sum(values[i] for _, _, values in stacks) for i in range(len(labels))]
    top = max(max(totals, default=0), 1)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    slot = plot_w / len(labels)
    bar_w = max(1.0, slot * 0.8)
    shapes = [_y_axis(top, plot_h)]
    for i, label in enumerate(labels):
        x, base = _LEFT + i * slot + (slot - bar_w) / 2, 0
        for name, color, values in stacks:
            if values[i]:
                h = values[i] / top * plot_h
                y = _TOP + plot_h - (base + values[i]) / top * plot_h
                shapes.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{color}">'
                              f"<title>{_e(label)}: {values[i]:,} {_e(name)}</title></rect>")
                base += values[i]
    shapes.append(_x_labels(*x_labels))
    return _svg("".join(shapes), [(name, color) for name, color, _ in stacks])


def _line_chart(series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]],
                guides: Sequence[tuple[str, float]]) -> str:
    xs = [x for _, _, points in series for x, _ in points]
    ys = [y for _, _, points in series for _, y in points] + [y for _, y in guides]
    x0, x1 = min(xs), max(xs)
    top = max(max(ys, default=0), 1)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        return (_LEFT + (0.5 if x1 == x0 else (x - x0) / (x1 - x0)) * plot_w, _TOP + plot_h - y / top * plot_h)

    shapes = [_y_axis(top, plot_h)]
    for name, value in guides:
        y = _TOP + plot_h - value / top * plot_h
        shapes.append(f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#a0aec0" '
                      f'stroke-dasharray="5,4"><title>{_e(name)}: {value:,}</title></line>')
    for name, color, points in series:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in (at(x, y) for x, y in points))
        shapes.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2">'
                      f"<title>{_e(name)}</title></polyline>")
        for x, y in points:
            px, py = at(x, y)
            shapes.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}">'
                          f"<title>{_e(name)}: next offset {y:,} at {_e(_time(_from_epoch(x)))}</title></circle>")
    shapes.append(_x_labels(_time(_from_epoch(x0)), _time(_from_epoch(x1))))
    legend = [(name, color) for name, color, _ in series] + ([("broker watermark", "#a0aec0")] if guides else [])
    return _svg("".join(shapes), legend)


def _horizontal_bars(items: Sequence[tuple[str, int]], color: str) -> str:
    if not items:
        return ""
    row_h, label_w, width = 22, 320, _WIDTH
    top = max(max(value for _, value in items), 1)
    height = row_h * len(items) + 10
    shapes = []
    for i, (label, value) in enumerate(items):
        y = 5 + i * row_h
        w = value / top * (width - label_w - 80)
        shapes.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">'
                      f"{_e(_clip(label))}</text>"
                      f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{color}">'
                      f"<title>{_e(label)}: {value:,}</title></rect>"
                      f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{value:,}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
            f"{''.join(shapes)}</svg>")


def _status_strip(history: Sequence[CheckEvaluation]) -> str:
    cells = []
    for i, e in enumerate(history):
        color = "#a0aec0" if e.passed is None else ("#38a169" if e.passed else _INVALID_COLOR)
        cells.append(f'<rect x="{i * 14}" y="0" width="12" height="16" rx="2" fill="{color}">'
                     f"<title>{_e(_time(e.evaluated_at))}: {_e(_status_label(e))}</title></rect>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(14 * len(history), 14)}" height="16" role="img" '
            f'style="border:0;margin:0;background:none">{"".join(cells)}</svg>')


def _svg(body: str, legend: Sequence[tuple[str, str]]) -> str:
    keys = "".join(f'<span><svg width="12" height="12" style="border:0;margin:0"><rect width="12" height="12" '
                   f'fill="{color}"/></svg> {_e(name)}</span>' for name, color in legend)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" role="img">{body}</svg>'
            f'<div class="legend">{keys}</div>')


def _y_axis(top: float, plot_h: float) -> str:
    parts = [f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{_TOP + plot_h}" stroke="#4a5568"/>',
             f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{_TOP + plot_h}" y2="{_TOP + plot_h}" stroke="#4a5568"/>']
    for fraction in (0, 0.5, 1):
        y = _TOP + plot_h - fraction * plot_h
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
                     f"{_short_number(top * fraction)}</text>")
    return "".join(parts)


def _x_labels(first: str, last: str) -> str:
    y = _HEIGHT - _BOTTOM + 18
    return (f'<text x="{_LEFT}" y="{y}" font-size="11">{_e(first)}</text>'
            f'<text x="{_WIDTH - _RIGHT}" y="{y}" font-size="11" text-anchor="end">{_e(last)}</text>')


# ------------------------------------------------------------------------------------------------- helpers


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _count(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _short_number(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _clip(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _status_label(evaluation: CheckEvaluation) -> str:
    if evaluation.passed is None:
        return evaluation.status.lower()
    return "passed" if evaluation.passed else f"failed ({(evaluation.severity or 'error').lower()})"


def _status_text(evaluation: CheckEvaluation) -> str:
    css = "" if evaluation.passed is None else ("passed" if evaluation.passed else "failed")
    return f'<span class="{css}">{_e(_status_label(evaluation))}</span>'
