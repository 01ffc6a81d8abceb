"""CI's selection of fault-matrix cases (matrix.py): the same on every run of a commit, covering every primary's
point families, every case in one of the matrix's test modules."""

from __future__ import annotations

from kafscale_lakehouse_tests.engine.faults import (
    test_fault_matrix,
    test_fault_matrix_maintenance,
    test_fault_matrix_positions,
)
from kafscale_lakehouse_tests.engine.faults.actor import POINTS
from kafscale_lakehouse_tests.engine.faults.matrix import (
    FOUND_CASES,
    HOLE_CASES,
    all_cases,
    covering_cases,
    point_family,
    selection,
)


def test_the_selection_is_the_same_whatever_the_seed(monkeypatch):
    fixed = list(dict.fromkeys([*HOLE_CASES.values(), *FOUND_CASES.values()]))
    first = covering_cases(all_cases(), fixed)
    monkeypatch.setenv("KAFSCALE_FAULT_SEED", "1")
    assert covering_cases(all_cases(), fixed) == first
    assert [c for c in selection().cases if c not in fixed] == first


def test_every_primary_and_point_family_has_a_case_in_a_test_module():
    modules = (test_fault_matrix, test_fault_matrix_positions, test_fault_matrix_maintenance)
    run = [case for module in modules for case in module.CASES]
    assert sorted(run, key=lambda c: c.id) == sorted(selection().cases, key=lambda c: c.id)
    wanted = {(primary, point_family(point)) for primary, points in POINTS.items() for point in points}
    assert {(c.primary, point_family(c.point)) for c in run} == wanted
    assert set(HOLE_CASES.values()) | set(FOUND_CASES.values()) <= set(run)
