"""`kafscale-lakehouse report --table T` of an upsert table (`mode: upsert`): its check history lists `id_unique`, the
blocking check its asset has in place of `record_id_unique`, with each evaluation's result and metadata."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import yaml

from kafscale_lakehouse.apps.report import build_table_report
from kafscale_lakehouse.apps.report_html import render_report_html
from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.engine.tables.checks import ID_UNIQUE
from kafscale_lakehouse.orchestration.naming import table_asset_key
from kafscale_lakehouse_tests.apps.report.conftest import TABLE, ReportWorld, report_world  # noqa: F401 - fixture


def record_id_unique_history(dagster_home: Path) -> None:
    """Two materializations of the table's asset with its id_unique check: failed (a key held twice), then passed."""
    outcomes = iter([(False, 1), (True, 0)])

    @dg.asset(key=table_asset_key(TABLE))
    def stores():
        return None

    @dg.asset_check(asset=stores, name=ID_UNIQUE, blocking=True)
    def id_unique():
        passed, duplicates = next(outcomes)
        return dg.AssetCheckResult(passed=passed, metadata={"duplicate_ids": duplicates})

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for _ in range(2):
            dg.materialize([stores, id_unique], instance=instance, raise_on_error=False)


def test_the_report_of_an_upsert_table_lists_id_unique_and_its_history(report_world: ReportWorld,  # noqa: F811
                                                                        tmp_path):
    document = yaml.safe_load(report_world.config_path.read_text())
    document["mappings"][0].update(mode="upsert", id_columns=["order_id"])
    report_world.config_path.write_text(yaml.safe_dump(document))
    config = load_config(report_world.config_path)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    record_id_unique_history(dagster_home)

    report = build_table_report(config, TABLE, dagster_home=str(dagster_home))
    assert [(e.check_name, e.passed) for e in report.checks or []] == [(ID_UNIQUE, True), (ID_UNIQUE, False)]
    html = render_report_html(report)
    assert re.search(r"id_unique</code>.*passed", html) and "<code>duplicate_ids</code>: 1" in html
