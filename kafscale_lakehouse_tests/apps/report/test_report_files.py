"""The report's data-file section: file count and average file size over time (pure rendering)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kafscale_lakehouse.apps.report import SnapshotPoint, TableReport
from kafscale_lakehouse.apps.report_html import render_report_html


def _point(minute: int, files: int | None, size: int | None) -> SnapshotPoint:
    return SnapshotPoint(snapshot_id=minute, committed_at=datetime(2026, 1, 1, tzinfo=UTC)
                         + timedelta(minutes=minute), run_id=f"r{minute}", added_records=1, dead_letters=0,
                         dead_letter_table=None, offsets={0: minute}, data_files=files, data_bytes=size)


def test_file_count_and_average_size_over_time_are_shown():
    report = TableReport("rpc.pizzas", "pizzas", "sql", datetime.now(UTC),
                         snapshots=[_point(1, 10, 10_240), _point(2, 20, 20_480), _point(3, 2, 20_480)])
    html = render_report_html(report)
    assert "Data files and average file size" in html
    assert "Now: 2 data files, average 10,240 bytes." in html
    assert "average file size (KiB)" in html


def test_no_file_section_without_file_totals():
    report = TableReport("rpc.pizzas", "pizzas", "sql", datetime.now(UTC), snapshots=[_point(1, None, None)])
    assert "Data files and average file size" not in render_report_html(report)
