"""Exact row counts per Kafka partition whose cost follows what was added (a landed table's materialization
records `dagster/partition_row_count` after every run, at hundreds of tables a run every few seconds): an earlier
count is carried over the appends since, reading only the manifests they wrote; a delete, a rewrite, a rollback or an
expired counted snapshot make it count again. On a local sqlite catalog and warehouse, no servers needed."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo, LessThan
from pyiceberg.manifest import ManifestFile

from kafscale_lakehouse.engine.tables import RowCount, count_rows_by_value
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse_tests.orchestration.core.test_check_logic import TOPIC, append

PARTITIONS = (0, 1)


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("counts", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("shop")
    return catalog.create_table("shop.orders", table_schema([]))


@pytest.fixture
def manifests_read(monkeypatch) -> Counter[str]:
    reads: Counter[str] = Counter()
    fetch = ManifestFile.fetch_manifest_entry

    def counted(self, io, discard_deleted=True):
        reads[self.manifest_path] += 1
        return fetch(self, io, discard_deleted=discard_deleted)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    return reads


def actual_rows(table, partition: int) -> int:
    return table.scan(row_filter=EqualTo("partition", partition), selected_fields=("partition",)).to_arrow().num_rows


def counts_now(table, previous=None) -> dict[int, int]:
    counts = count_rows_by_value(table, "partition", PARTITIONS, previous)
    assert {c.snapshot_id for c in counts.values()} == {table.current_snapshot().snapshot_id}
    return {p: c.rows for p, c in counts.items()}


def mixed_append(table, rows_per_partition: int, start: int) -> None:
    """Another writer's file holding rows of both partitions (its bounds do not tell a partition's rows)."""
    rows = [{"record_id": f"{TOPIC}:{p}:{o}", "topic": TOPIC, "partition": p, "offset": o, "timestamp_ms": 0,
             "key": None, "value": b"{}", "headers": ""}
            for p in PARTITIONS for o in range(start, start + rows_per_partition)]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))


def test_a_count_is_carried_over_the_appends_since_reading_only_their_manifests(table, manifests_read):
    for n in range(12):  # a long history: a manifest per commit, as fast appends leave it
        append(table, n % 2, range(10 * (n // 2), 10 * (n // 2 + 1)), next_offsets={n % 2: 10 * (n // 2 + 1)})
    counted = count_rows_by_value(table, "partition", PARTITIONS)
    assert {p: c.rows for p, c in counted.items()} == {0: 60, 1: 60}
    assert sum(manifests_read.values()) == 12  # counted from the table: one plan for both partitions
    append(table, 0, range(60, 75), next_offsets={0: 75})
    mixed_append(table, 3, start=100)
    manifests_read.clear()

    carried = counts_now(table, counted)
    assert sum(manifests_read.values()) == 2  # the two appends' manifests, not the table's 14
    assert carried == {0: 78, 1: 63} == {p: actual_rows(table, p) for p in PARTITIONS}


def test_a_count_is_not_carried_over_a_delete_a_rewrite_or_a_rollback(table):
    for n in range(4):
        append(table, n % 2, range(10 * (n // 2), 10 * (n // 2 + 1)), next_offsets={n % 2: 10 * (n // 2 + 1)})
    counted = count_rows_by_value(table, "partition", PARTITIONS)
    assert {p: c.rows for p, c in counted.items()} == {0: 20, 1: 20}

    table.delete(LessThan("offset", 5))  # an operator's delete: rows of both partitions go
    append(table, 0, range(20, 30), next_offsets={0: 30})
    assert counts_now(table, counted) == {0: 25, 1: 15} == {p: actual_rows(table, p) for p in PARTITIONS}

    counted = count_rows_by_value(table, "partition", PARTITIONS)
    rows = table.scan().to_arrow()
    table.overwrite(rows)  # a rewrite: the same rows in new files, the old ones removed
    append(table, 1, range(20, 25), next_offsets={1: 25})
    assert counts_now(table, counted) == {0: 25, 1: 20} == {p: actual_rows(table, p) for p in PARTITIONS}

    counted = count_rows_by_value(table, "partition", PARTITIONS)
    before = table.current_snapshot().parent_snapshot_id
    table.manage_snapshots().rollback_to_snapshot(before).commit()  # the counted snapshot leaves the ancestry
    assert counts_now(table, counted) == {0: 25, 1: 15} == {p: actual_rows(table, p) for p in PARTITIONS}


def test_counts_of_different_snapshots_are_each_carried_from_their_own(table, manifests_read):
    append(table, 0, range(10), next_offsets={0: 10})
    zero = count_rows_by_value(table, "partition", [0])[0]
    append(table, 1, range(7), next_offsets={0: 10, 1: 7})
    one = count_rows_by_value(table, "partition", [1])[1]
    append(table, 0, range(10, 12), next_offsets={0: 12, 1: 7})
    append(table, 1, range(7, 8), next_offsets={0: 12, 1: 8})
    manifests_read.clear()

    carried = counts_now(table, {0: zero, 1: one})
    assert sum(manifests_read.values()) == 3  # the appends after partition 0's count; partition 1's are among them
    assert carried == {0: 12, 1: 8}
    # A count recorded at a snapshot the table no longer has (expired) or no count: counted from the table.
    assert counts_now(table, {0: RowCount(999, 12345)}) == {0: 12, 1: 8}
