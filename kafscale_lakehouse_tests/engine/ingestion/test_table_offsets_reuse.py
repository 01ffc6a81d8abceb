"""When a scan may reuse a table's offsets instead of loading the table (`TableOffsetsReader.read_reusing`): pure
logic over what the last load found and the offsets store's offsets, with the catalog load counted (at 200
topics every batch's tables were loaded again on the tick after it)."""

from __future__ import annotations

from kafscale_lakehouse.engine.ingestion import TableOffsetsReader

MAX_AGE = 60.0


class CountedLoads(TableOffsetsReader):
    """The table's offsets are `self.table`; each `read` is a catalog load, counted."""

    def __init__(self, table: dict[int, int] | None) -> None:
        self.now = 1000.0
        super().__init__(settings=None, clock=lambda: self.now)  # type: ignore[arg-type] - read never connects
        self.table, self.loads = table, 0

    def read(self, table: str, topic: str) -> dict[int, int] | None:
        self.loads += 1
        return None if self.table is None else dict(self.table)

    def scan(self, store: dict[int, int | None]) -> dict[int, int] | None:
        return self.read_reusing("db.orders", "orders", store, MAX_AGE)


def test_a_table_in_step_with_the_store_follows_the_store_forward_without_a_load():
    reader = CountedLoads({0: 100, 1: 40})
    assert reader.scan({0: 100, 1: 40}) == {0: 100, 1: 40} and reader.loads == 1
    assert reader.scan({0: 100, 1: 40}) == {0: 100, 1: 40} and reader.loads == 1  # nothing moved

    reader.table = {0: 150, 1: 40, 2: 10}  # our run committed the table, then wrote the store
    assert reader.scan({0: 150, 1: 40, 2: 10}) == {0: 150, 1: 40, 2: 10}
    assert reader.loads == 1
    reader.table = {0: 170, 1: 40, 2: 10}
    assert reader.scan({0: 170, 1: 40, 2: 10}) == {0: 170, 1: 40, 2: 10} and reader.loads == 1

    reader.now += MAX_AGE  # past the reuse age: loaded, so a table changed behind the store's back is seen
    reader.table = {0: 120, 1: 40, 2: 10}  # an operator rolled it back
    assert reader.scan({0: 170, 1: 40, 2: 10}) == {0: 120, 1: 40, 2: 10} and reader.loads == 2


def test_a_store_that_went_back_or_a_table_out_of_step_is_loaded_again():
    reader = CountedLoads({0: 100})
    reader.scan({0: 100})
    reader.table = {0: 60}  # a position moved back: the table first, then the store
    assert reader.scan({0: 60}) == {0: 60} and reader.loads == 2  # the store went back: loaded

    reader.table = {0: 30}  # rolled back behind the store's back, and seen by a load (out of step with the store)
    reader.now += MAX_AGE
    assert reader.scan({0: 60}) == {0: 30} and reader.loads == 3
    reader.table = {0: 80}  # the run that repairs and lands it
    assert reader.scan({0: 80}) == {0: 80} and reader.loads == 4  # out of step before: loaded, not followed

    missing = CountedLoads(None)  # no table yet: the store moving is loaded every time
    missing.scan({0: 10})
    missing.scan({0: 20})
    assert missing.loads == 2
