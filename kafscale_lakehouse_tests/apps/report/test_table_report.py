"""`kafscale-lakehouse report --table T`: the page a data owner gets for a small table with history."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import dagster as dg

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.apps.report import build_table_report
from kafscale_lakehouse.apps.report_html import render_report_html
from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.connections import catalog_settings, segment_store_from_config
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.orchestration.naming import table_asset_key
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse_tests.apps.report.conftest import (
    CATALOG_PASSWORD,
    COLUMNS,
    DEAD_LETTERS,
    REGISTRY_PASSWORD,
    TABLE,
    TOPIC,
    ReportWorld,
)


class _Page(HTMLParser):
    """The page's tags and visible text (what a reader sees, without markup)."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.text_parts: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes.extend(attrs)

    def handle_data(self, data):
        self.text_parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.text_parts).split())


def record_check_history(dagster_home: Path) -> None:
    """Two materializations of the table's asset with its checks, as runs of the Dagster definitions leave them."""
    outcomes = iter([(False, 3), (True, 0)])

    @dg.asset(key=table_asset_key(TABLE))
    def pizzas():
        return None

    @dg.asset_check(asset=pizzas, name="schema_valid")
    def schema_valid():
        passed, invalid = next(outcomes)
        return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.WARN,
                                   metadata={"invalid": invalid, "sample_record_ids": [f"{TOPIC}:0:30"]})

    @dg.asset_check(asset=pizzas, name="record_id_unique")
    def record_id_unique():
        return dg.AssetCheckResult(passed=True, metadata={"duplicates": 0})

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for _ in range(2):
            assert dg.materialize([pizzas, schema_valid, record_id_unique], instance=instance).success


def test_the_report_shows_rows_lag_dead_letters_and_check_history(report_world: ReportWorld, tmp_path):
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    record_check_history(dagster_home)

    html = render_report_html(build_table_report(report_world.config, TABLE, dagster_home=str(dagster_home)))
    page = _Page(html)

    text = page.text
    assert f"{TABLE} KafScale topic {TOPIC} · sql catalog" in text
    assert "rows in the table 67" in text  # 30 + 20 + 17 rows in two commits
    assert "invalid records diverted 3" in text and "lag now (records) 30" in text
    # Lag per partition: committed next offsets 50 and 20 against broker watermarks 80 and 20.
    assert "0 50 80 30" in text and "1 20 20 0" in text
    # Rows per commit: one bar per commit, the second with its diverted records stacked on top.
    assert "run run-one: 50 rows appended" in html and "run run-two: 17 rows appended" in html
    assert "run run-two: 3 invalid records diverted" in html
    # Invalid records: each sample with its record_id, error and schema path; faults counted by schema path.
    for index, (schema_path, error) in enumerate(DEAD_LETTERS):
        assert f"{TOPIC}:0:{30 + index} {error} {schema_path}" in text
    assert "#/properties/store_id/type: 2" in html and "#/required: 1" in html
    # Check history from the Dagster instance: newest first, with the metadata a data owner acts on.
    assert re.search(r"schema_valid passed .*schema_valid failed \(warn\)", text)
    assert "<code>invalid</code>: 3" in html
    assert f"<code>sample_record_ids</code>: [&quot;{TOPIC}:0:30&quot;]" in html
    assert "record_id_unique passed" in text


def test_the_page_is_self_contained_and_carries_no_secret(report_world: ReportWorld):
    html = render_report_html(build_table_report(report_world.config, TABLE, dagster_home=None))
    page = _Page(html)

    assert page.tags.count("svg") >= 3, "charts are inline SVG"
    assert not {"script", "link", "img", "iframe", "object"} & set(page.tags)
    assert not [value for name, value in page.attributes if name in ("src", "href")]
    assert re.findall(r"https?://[^\s\"'<]+", html) == ["http://www.w3.org/2000/svg"] * html.count("xmlns=")
    for secret in (REGISTRY_PASSWORD, CATALOG_PASSWORD, "registry.invalid", "catalog.db"):
        assert secret not in html
    assert "No Dagster instance (DAGSTER_HOME is not set)" in page.text


def test_text_from_the_data_is_escaped(report_world: ReportWorld):
    report = build_table_report(report_world.config, TABLE, dagster_home=None)
    report.dead_letter_samples[0] = report.dead_letter_samples[0].__class__(
        record_id="<script>alert(1)</script>", error="a & b", schema_path=None, run_id="r",
        ingested_at=report.generated_at, value_preview='{"x": "</td>"}')

    html = render_report_html(report)

    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a &amp; b" in html and "&lt;/td&gt;" in html


def test_the_cli_writes_the_report_and_names_a_table_no_mapping_writes(report_world: ReportWorld, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    output = tmp_path / "out" / "pizzas.html"
    output.parent.mkdir()

    status = cli.main(["report", "--table", TABLE, "--config", str(report_world.config_path), "--output", str(output)])

    assert status == 0 and f"report of {TABLE} written to {output}" in capsys.readouterr().out
    assert "<svg" in output.read_text()
    missing = cli.main(["report", "--table", "rpt.nope", "--config", str(report_world.config_path),
                        "--output", str(output)])
    assert missing == 2
    assert f"no mapping writes table 'rpt.nope' (mapped tables: {TABLE})" in capsys.readouterr().err


def test_a_source_that_cannot_be_read_is_named_on_the_page(report_world: ReportWorld):
    report_world.config.offsets.local_path.unlink()
    report_world.config.offsets.local_path.mkdir()  # a directory where the sqlite file should be

    report = build_table_report(report_world.config, TABLE, dagster_home=None)

    [note] = [n for n in report.notes if n.startswith("Lag unavailable")]
    assert "broker watermarks could not be read" in note
    assert [lag.watermark for lag in report.lags] == [None, None]
    assert "lag now (records) unknown" in _Page(render_report_html(report)).text


def test_a_table_without_commits_gets_a_page_saying_so(report_world: ReportWorld):
    config = report_world.config
    config.mappings.append(config.mappings[0].model_copy(update={"topic": "quiet-topic", "table": "rpt.quiet"}))
    open_table(load_catalog(catalog_settings(config)), "rpt.quiet", schema=table_schema(COLUMNS),
               create_if_missing=True)

    text = _Page(render_report_html(build_table_report(config, "rpt.quiet", dagster_home=None))).text

    assert "rows in the table unknown" in text and "No commit yet." in text
    assert "Dead-letter table rpt.quiet_dead_letters does not exist yet" in text


def test_a_partition_without_a_broker_watermark_has_its_lag_against_the_completed_segments(
        report_world: ReportWorld):
    """A partition of a restored topic: `kafscale-cli restore` wrote its segments but no `next_offset`."""
    segment = encode_segment(pizza_orders(0, 40, partition=2), base_offset=0)
    segment_store_from_config(report_world.config).write_segment(TOPIC, 2, 0, segment.kfs, segment.index)

    report = build_table_report(report_world.config, TABLE, dagster_home=None)

    assert {lag.partition: (lag.watermark, lag.lag) for lag in report.lags} == {0: (80, 30), 1: (20, 0), 2: (None, 40)}
    assert "lag now (records) 70" in _Page(render_report_html(report)).text
