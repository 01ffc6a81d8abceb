"""How the namespace watch splits a tick's pending tables over the free `land_tables` run slots (`pack_batches`): pure
logic over candidates, no servers (batches that overlap)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kafscale_lakehouse.orchestration.namespace_sensor import (
    MIN_TABLES_PER_BATCH_RUN,
    _Candidate,
    batch_tables_cap,
    pack_batches,
)

GIB = 1 << 30


def candidate(number: int, *, since: float | None = None, pending_bytes: int = 1000, attempt: int = 1,
              last_requested: float = 0.0) -> _Candidate:
    mapping: Any = SimpleNamespace(table=f"fanout.t{number:03d}")
    return _Candidate(mapping, {}, pending_bytes, attempt, float(number) if since is None else since, last_requested)


def tables(batches: list[list[_Candidate]]) -> list[list[str]]:
    return [[c.mapping.table for c in batch] for batch in batches]


def test_pending_tables_are_spread_over_the_free_slots_in_even_disjoint_runs():
    candidates = [candidate(n) for n in range(200)]
    batches = pack_batches(reversed(candidates), GIB, 4, batch_tables_cap(200, 4))
    assert [len(b) for b in batches] == [50, 50, 50, 50]
    assert sorted(t for batch in tables(batches) for t in batch) == [c.mapping.table for c in candidates]
    # The four longest waiting open the four runs.
    assert [batch[0] for batch in tables(batches)] == ["fanout.t000", "fanout.t001", "fanout.t002", "fanout.t003"]

    # Three slots taken: one run, of the 50 longest waiting (the others wait for the next slot).
    [run] = pack_batches(candidates, GIB, 1, batch_tables_cap(200, 4))
    assert [c.mapping.table for c in run] == [c.mapping.table for c in candidates[:50]]
    assert pack_batches(candidates, GIB, 0, batch_tables_cap(200, 4)) == []


def test_a_few_tables_stay_one_run_and_more_take_a_run_per_ten():
    cap = batch_tables_cap(200, 4)
    assert MIN_TABLES_PER_BATCH_RUN == 10
    assert [len(b) for b in pack_batches([candidate(n) for n in range(9)], GIB, 4, cap)] == [9]
    assert [len(b) for b in pack_batches([candidate(n) for n in range(10)], GIB, 4, cap)] == [10]
    assert [len(b) for b in pack_batches([candidate(n) for n in range(25)], GIB, 4, cap)] == [9, 8, 8]
    assert [len(b) for b in pack_batches([candidate(n) for n in range(40)], GIB, 4, cap)] == [10, 10, 10, 10]
    # Ten topics in all: one run of the ten even with four slots free.
    assert batch_tables_cap(10, 4) == MIN_TABLES_PER_BATCH_RUN
    assert [len(b) for b in pack_batches([candidate(n) for n in range(10)], GIB, 4, batch_tables_cap(10, 4))] == [10]


def test_the_byte_budget_needs_more_runs_and_a_table_that_fits_nowhere_holds_back_the_newer_ones():
    cap = batch_tables_cap(200, 4)
    # Four tables of 0.6 GiB: a run each although they are fewer than ten.
    big = [candidate(n, pending_bytes=6 * GIB // 10) for n in range(4)]
    assert tables(pack_batches(big, GIB, 4, cap)) == [[t.mapping.table] for t in big]
    # Two slots: the two longest waiting; the third waits, and so does the small newer one behind it.
    small = candidate(9, pending_bytes=10)
    assert tables(pack_batches([*big[:3], small], GIB, 2, cap)) == [["fanout.t000"], ["fanout.t001"]]


def test_a_table_that_just_landed_goes_after_one_that_waited_as_long_and_was_never_requested():
    landed = candidate(1, since=1000.0, last_requested=1000.0)
    waiting = candidate(2, since=1000.0)
    [run] = pack_batches([landed, waiting], GIB, 1, 1)
    assert tables([run]) == [["fanout.t002"]]


def test_retried_tables_keep_their_halves_each_a_slot_and_share_the_slots_by_waiting_time():
    fresh = [candidate(n, since=100.0 + n) for n in range(30)]
    again = [candidate(50 + n, since=10.0 + n, attempt=2) for n in range(4)]
    batches = pack_batches([*fresh, *again], GIB, 4, batch_tables_cap(200, 4))
    # Attempt 2: two halves, never with the first attempts; the first attempts take the two slots left.
    assert tables(batches)[:2] == [["fanout.t050", "fanout.t052"], ["fanout.t051", "fanout.t053"]]
    assert [len(b) for b in batches[2:]] == [15, 15]
    assert all(c.attempt == 1 for batch in batches[2:] for c in batch)

    # One slot: the half with the longest waiting table.
    assert tables(pack_batches([*fresh, *again], GIB, 1, batch_tables_cap(200, 4))) == [
        ["fanout.t050", "fanout.t052"]]
