"""The fault matrix (matrix.py) on the real servers, ingestion primaries: each case is two actors on one table, one
of them held or killed at a named interleaving point, and the invariants after both and after settling."""

from __future__ import annotations

import pytest

from kafscale_lakehouse_tests.engine.faults.matrix import FaultWorld, selected_cases

CASES = selected_cases(("ingest", "ingest-audited"))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_case_ends_exactly_once_with_every_referenced_file(case, production_world, spark, spark_engine, cli_main,
                                                          tmp_path):
    FaultWorld(production_world, spark, spark_engine, cli_main).run(case, tmp_path)
