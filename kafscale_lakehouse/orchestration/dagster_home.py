"""`kafscale-lakehouse dagster-home`: a Dagster instance directory (DAGSTER_HOME) for local use, as `make demo`
makes it.

By default its dagster.yaml is the template (the repository's dagster.yaml) as it is: Dagster's own run launcher and
sqlite storage. Two opt-ins for one host landing hundreds of topics (docs/operations-one-host.md, with what each
gains): the kept-connection sqlite storage (`orchestration/sqlite_storage.py`) and the forking run launcher
(`orchestration/forking_launcher.py`). Imports nothing of Dagster: the command stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

STORAGE_MODULE = "kafscale_lakehouse.orchestration.sqlite_storage"
LAUNCHER_MODULE = "kafscale_lakehouse.orchestration.forking_launcher"
STORAGE_KEYS = ("storage", "run_storage", "event_log_storage", "schedule_storage")


def kept_connections_section(base_dir: Path) -> str:
    # base_dir written out: a process that opens the directory without DAGSTER_HOME set
    # (`DagsterInstance.from_config(dir)`) finds its files too.
    return ("# Opt-in (docs/operations-one-host.md): Dagster's sqlite files under $DAGSTER_HOME with their\n"
            "# connections kept open, less CPU per event written. Production: Postgres.\n"
            f"storage:\n  custom:\n    module: {STORAGE_MODULE}\n    class: KeptConnectionsSqliteStorage\n"
            f"    config:\n      base_dir: {json.dumps(str(base_dir.resolve()))}\n")


FORKING_LAUNCHER_SECTION = (
    "# Opt-in (docs/operations-one-host.md): each run's process forked from one that has loaded the code location.\n"
    f"run_launcher:\n  module: {LAUNCHER_MODULE}\n  class: ForkingRunLauncher\n")


class DagsterHomeError(ValueError):
    """An opt-in asked for that the template already decides otherwise."""


def write_dagster_home(dagster_home: Path, template: Path, *, kept_connections: bool = False,
                       forking_launcher: bool = False) -> Path:
    """Make `dagster_home` a Dagster instance directory whose dagster.yaml is `template`, with the opt-ins asked for
    added. An existing dagster.yaml is the operator's and stays as it is. Returns its path."""
    config_path = dagster_home / "dagster.yaml"
    if config_path.exists():
        return config_path
    text = template.read_text(encoding="utf-8").rstrip("\n") + "\n"
    own = yaml.safe_load(text) or {}
    if kept_connections:
        if set(STORAGE_KEYS) & set(own):
            raise DagsterHomeError(f"{template} sets its own storage: the kept-connection storage would replace it "
                                   "(leave out --kept-connections, or remove the template's storage)")
        text += "\n" + kept_connections_section(dagster_home)
    if forking_launcher:
        if "run_launcher" in own:
            raise DagsterHomeError(f"{template} sets its own run_launcher: the forking launcher would replace it "
                                   "(leave out --forking-launcher, or remove the template's run_launcher)")
        text += "\n" + FORKING_LAUNCHER_SECTION
    dagster_home.mkdir(parents=True, exist_ok=True)
    config_path.write_text(text, encoding="utf-8")
    return config_path
