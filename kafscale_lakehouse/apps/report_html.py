"""The data-owner report as a page: `render_report_html` turns a `TableReport` (apps/report.py) into one
self-contained HTML page, and `write_table_report` builds, renders and writes it (`kafscale-lakehouse report`).

Charts are inline SVG; the page has no script and loads nothing. Every text on it is escaped, and it shows only what
the `TableReport` holds: the table, topic, dead-letter table and catalog type, never an endpoint or a credential.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kafscale_lakehouse.apps.report import DEAD_LETTER_RUNS, CheckEvaluation, TableReport, build_table_report
from kafscale_lakehouse.config import LakehouseConfig

# The report command logs under one name, as it did before its data and its page were two modules.
log = logging.getLogger("kafscale_lakehouse.apps.report")

_COLORS = ("#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#b7791f", "#4a5568")
_INVALID_COLOR = "#c53030"


def write_table_report(config: LakehouseConfig, table: str, output: Path, *, dagster_home: str | None) -> Path:
    """The report of `table` read, rendered and written to `output`; returns `output`."""
    report = build_table_report(config, table, dagster_home=dagster_home)
    output.write_text(render_report_html(report), encoding="utf-8")
    log.info("report of table %s written to %s", table, output)
    return output


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
    points = [(p, p.data_files) for p in report.snapshots if p.data_files is not None]  # (snapshot, data files)
    if not points:
        return ""
    latest = points[-1][0]
    parts = ["<h2>Data files and average file size</h2>",
             _line_chart([("data files", _COLORS[0], [(p.committed_at.timestamp(), files) for p, files in points])],
                         []),
             _line_chart([("average file size (KiB)", _COLORS[1],
                           [(p.committed_at.timestamp(), (p.average_file_bytes or 0) / 1024) for p, _ in points])],
                         []),
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
