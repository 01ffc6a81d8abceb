"""`kafscale-lakehouse dagster-home` (what `make demo` runs): the repository's dagster.yaml as it is, Dagster's own run
launcher and sqlite storage, unless an opt-in for one host of hundreds of topics is asked for."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from kafscale_lakehouse.apps.cli import main
from kafscale_lakehouse.orchestration.dagster_home import write_dagster_home

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = REPO_ROOT / "dagster.yaml"


def _instance_classes(home: Path) -> tuple[str, str]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return type(instance.run_launcher).__name__, type(instance.event_log_storage).__name__


def test_the_demos_instance_is_dagsters_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert main(["dagster-home", str(home), "--template", str(TEMPLATE)]) == 0  # as `make demo`
    assert (home / "dagster.yaml").read_text() == TEMPLATE.read_text()
    assert _instance_classes(home) == ("DefaultRunLauncher", "SqliteEventLogStorage")


def test_the_opt_ins_add_the_forking_launcher_and_the_kept_connections(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    assert main(["dagster-home", str(home), "--template", str(TEMPLATE), "--kept-connections",
                 "--forking-launcher"]) == 0
    written = yaml.safe_load((home / "dagster.yaml").read_text())
    assert {key: value for key, value in written.items() if key not in ("storage", "run_launcher")} == \
        yaml.safe_load(TEMPLATE.read_text())
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # the storage's base_dir is written out
    assert _instance_classes(home) == ("ForkingRunLauncher", "KeptConnectionsEventLogStorage")


def test_an_existing_config_is_the_operators(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    write_dagster_home(home, TEMPLATE, kept_connections=True, forking_launcher=True)
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


def test_an_opt_in_the_template_decides_otherwise_is_refused_naming_both(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]):
    template = tmp_path / "postgres.yaml"
    template.write_text("storage:\n  postgres:\n    postgres_url: postgresql://dagster@db/dagster\n")
    assert main(["dagster-home", str(tmp_path / "other"), "--template", str(template), "--kept-connections"]) == 2
    assert f"error: {template} sets its own storage" in capsys.readouterr().err
    assert not (tmp_path / "other" / "dagster.yaml").exists()
    write_dagster_home(tmp_path / "other", template)  # without the opt-in: the template as it is
    assert yaml.safe_load((tmp_path / "other" / "dagster.yaml").read_text()) == yaml.safe_load(template.read_text())
