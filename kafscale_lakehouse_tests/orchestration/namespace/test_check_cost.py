"""What a run's checks read on a table with a long history: the manifests and data files the run's commit (and any
writer since our commit before it) added, not every manifest of the table (hundreds of tables, a commit
each every few seconds, checked after every commit). On a local sqlite catalog and warehouse, no servers needed."""

from __future__ import annotations

from collections import Counter

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestFile

from kafscale_lakehouse.engine.tables import count_rows_by_value
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.orchestration.checks import evaluate_offsets_contiguous, evaluate_record_id_unique
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse_tests.engine.tables.helpers import lakehouse_schema, start_end, write_batch
from kafscale_lakehouse_tests.orchestration.core.test_check_logic import TOPIC, append, committed_run

COMMITS = 12


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("checks", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("shop")
    return catalog.create_table("shop.orders", table_schema([]))


@pytest.fixture
def manifests_read(monkeypatch) -> Counter[str]:
    """Manifest reads by path (pyiceberg's scan planning and our own both go through fetch_manifest_entry)."""
    reads: Counter[str] = Counter()
    fetch = ManifestFile.fetch_manifest_entry

    def counted(self, io, discard_deleted=True):
        reads[self.manifest_path] += 1
        return fetch(self, io, discard_deleted=discard_deleted)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    return reads


def test_the_checks_of_a_run_read_what_it_added_not_the_table_history(table, manifests_read):
    for n in range(COMMITS):  # a long history: a manifest per commit, as fast appends leave it
        append(table, n % 2, range(10 * (n // 2), 10 * (n // 2 + 1)),
               next_offsets={p: 10 * ((n - p) // 2 + 1) for p in (0, 1) if n >= p}, run_id=f"run-{n}")
    run = committed_run(table, f"run-{COMMITS - 1}", [OffsetRange(1, 50, 60)])
    manifests = len(table.current_snapshot().manifests(table.io))
    assert manifests == COMMITS
    manifests_read.clear()

    unique = evaluate_record_id_unique(table, TOPIC, run)
    contiguous = evaluate_offsets_contiguous(table, TOPIC)

    assert unique.passed and contiguous.passed, (unique.description, contiguous.description)
    assert unique.metadata["rows_scanned"].value == 10
    assert unique.metadata["data_files_scanned"].value == 1
    # The one manifest the run's commit wrote, read once for both checks (was: every manifest, once per check; then
    # that manifest once per check).
    assert sum(manifests_read.values()) == 1, manifests_read


def test_a_duplicate_another_writer_added_since_our_previous_commit_is_still_found(table, manifests_read):
    for n in range(4):
        append(table, 0, range(10 * n, 10 * (n + 1)), next_offsets={0: 10 * (n + 1)}, run_id=f"run-{n}")
    append(table, 0, range(45, 46))  # another writer, between our last two commits: a row of the next run's range
    append(table, 0, range(40, 50), next_offsets={0: 50}, run_id="run-4")
    run = committed_run(table, "run-4", [OffsetRange(0, 40, 50)])
    manifests_read.clear()

    unique = evaluate_record_id_unique(table, TOPIC, run)

    assert not unique.passed
    assert [r.data for r in unique.metadata["duplicate_samples"].value.records] == [
        {"record_id": f"{TOPIC}:0:45", "occurrences": 2}]
    assert sum(manifests_read.values()) == 2  # the run's manifest and the other writer's


def test_rows_beyond_the_committed_offsets_added_after_our_commit_are_found(table):
    for n in range(4):
        append(table, 0, range(10 * n, 10 * (n + 1)), next_offsets={0: 10 * (n + 1)}, run_id=f"run-{n}")
    append(table, 0, range(40, 42))  # nobody committed offsets for these: the next run would land them again

    contiguous = evaluate_offsets_contiguous(table, TOPIC)

    assert not contiguous.passed
    assert contiguous.metadata["rows_beyond_committed_samples"].value == [f"{TOPIC}:0:40", f"{TOPIC}:0:41"]


def test_a_commit_of_ours_is_counted_and_checked_without_reading_back_what_it_wrote(tmp_path, manifests_read,
                                                                                    monkeypatch):
    """After `commit_append` the run knows what its snapshot added (its own data files): the row counts and the
    checks read none of its manifests, and only the record_id check opens its data files; the contiguity check rules
    them out by their offset statistics (none holds an offset at or past the committed next offsets)."""
    catalog = SqlCatalog("ours", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", lakehouse_schema())
    for n in range(4):
        ranges = {0: (10 * n, 10 * (n + 1)), 1: (5 * n, 5 * (n + 1))}
        commit_append(table, write_batch(table, TOPIC, ranges, f"run-{n}"), TOPIC, *start_end(ranges), f"run-{n}")
    counted = count_rows_by_value(table, "partition", (0, 1))
    ranges = {0: (40, 50), 1: (20, 25)}
    # A file per Kafka partition, as the Spark job's tasks write them (a task reads one partition's segments).
    files = [f for p, r in ranges.items() for f in write_batch(table, TOPIC, {p: r}, "run-4", tasks=1)]
    commit_append(table, files, TOPIC, *start_end(ranges), "run-4")
    run = committed_run(table, "run-4", [OffsetRange(p, s, e) for p, (s, e) in ranges.items()])
    opened: Counter[str] = Counter()
    new_input = PyArrowFileIO.new_input

    def counted_input(self, location):
        if location.endswith(".parquet"):
            opened[location] += 1
        return new_input(self, location)

    monkeypatch.setattr(PyArrowFileIO, "new_input", counted_input)
    manifests_read.clear()

    rows = count_rows_by_value(table, "partition", (0, 1), previous=counted)
    unique = evaluate_record_id_unique(table, TOPIC, run)
    contiguous = evaluate_offsets_contiguous(table, TOPIC)

    assert {p: c.rows for p, c in rows.items()} == {0: 50, 1: 25}
    assert unique.passed and contiguous.passed, (unique.description, contiguous.description)
    assert unique.metadata["rows_scanned"].value == 15
    assert sum(manifests_read.values()) == 0, manifests_read  # was: the commit's manifest, read back
    assert set(opened) == {f.file_path for f in files}, opened  # was: each file twice, once per check
    assert all(n == 1 for n in opened.values()), opened
