"""`kafscale-lakehouse ingest --once` of an upsert mapping, SIGKILLed around its commit (see
engine/ingestion/crash_run.py, which does the same for appends).

    python -m kafscale_lakehouse_tests.engine.upsert.crash_upsert <kill point> --config lakehouse.yaml

Kill points: `before-upsert-commit` (the Spark job wrote the run's files; `commit_upsert` is about to read them),
`after-upsert-commit` (the snapshot is committed, the offsets store not yet written).
"""

from __future__ import annotations

import sys

import kafscale_lakehouse.engine.ingestion.run as ingest
from kafscale_lakehouse.apps import cli
from kafscale_lakehouse_tests.engine.ingestion.crash_run import _die


def _install(point: str) -> None:
    if point not in ("before-upsert-commit", "after-upsert-commit"):
        raise SystemExit(f"unknown kill point {point!r}")
    real_commit_upsert = ingest.commit_upsert

    def commit_upsert(*args, **kwargs):
        if point == "before-upsert-commit":
            _die(point)
        result = real_commit_upsert(*args, **kwargs)
        _die(point)
        return result

    ingest.commit_upsert = commit_upsert


if __name__ == "__main__":
    _install(sys.argv[1])
    sys.exit(cli.main(["ingest", *sys.argv[2:], "--once"]))
