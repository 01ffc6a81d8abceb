"""The one reader of our snapshot summaries, on a local sqlite Iceberg table (no servers, no Spark)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from kafscale_lakehouse.engine.tables.summary import (
    COMMIT_ID_PROPERTY,
    DEAD_LETTER_RECORDS_PROPERTY,
    DEAD_LETTER_TABLE_PROPERTY,
    OFFSETS_PROPERTY_PREFIX,
    RUN_ID_PROPERTY,
    SKIPPED_PROPERTY_PREFIX,
    WRITE_LATENCY_PROPERTY,
    CorruptOffsetsPropertyError,
    find_commit,
    is_kafscale_commit,
    kafscale_commits,
    latest_commit,
    offsets_summary_properties,
    read_committed_offsets,
    skipped_summary_properties,
)
from kafscale_lakehouse.schema import table_schema


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("summary", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("shop")
    return catalog.create_table("shop.orders", table_schema([]))


def append(table, rows: int, properties: dict[str, str]) -> int:
    arrow_schema = table.schema().as_arrow()
    table.append(pa.Table.from_pylist([{
        "record_id": f"t:0:{i}", "topic": "t", "partition": 0, "offset": i, "timestamp_ms": 0, "key": None,
        "value": b"{}", "headers": "",
    } for i in range(rows)], schema=arrow_schema), snapshot_properties=properties)
    return table.current_snapshot().snapshot_id


def test_a_commit_of_ours_is_parsed_with_every_key(table):
    properties = {**offsets_summary_properties({"other": {3: 7}}, "t", {0: 10, 1: 4}),
                  **skipped_summary_properties("t", {1: (0, 2)}),
                  RUN_ID_PROPERTY: "run-1", COMMIT_ID_PROPERTY: "c-1", WRITE_LATENCY_PROPERTY: "1234",
                  DEAD_LETTER_RECORDS_PROPERTY: "3", DEAD_LETTER_TABLE_PROPERTY: "shop.orders_dead_letters"}
    snapshot_id = append(table, 5, properties)

    [commit] = kafscale_commits(table, "t")
    assert commit.snapshot_id == snapshot_id
    assert commit.offsets == {"t": {0: 10, 1: 4}, "other": {3: 7}}  # other topics are carried forward
    assert commit.next_offsets("t") == {0: 10, 1: 4} and commit.skipped_ranges("t") == {1: (0, 2)}
    assert (commit.run_id, commit.commit_id, commit.write_latency_ms) == ("run-1", "c-1", 1234)
    assert (commit.added_records, commit.dead_letter_records) == (5, 3)
    assert commit.dead_letter_table == "shop.orders_dead_letters"
    assert find_commit(table, "c-1") == commit and find_commit(table, "c-2") is None


def test_other_engines_snapshots_are_not_ours_and_the_latest_of_ours_holds_the_offsets(table):
    append(table, 1, offsets_summary_properties({}, "t", {0: 1}))
    append(table, 1, offsets_summary_properties({"t": {0: 1}}, "t", {0: 2}))
    foreign = append(table, 1, {})  # compaction, a delete, another writer

    assert not is_kafscale_commit(table.snapshot_by_id(foreign))
    assert not is_kafscale_commit(table.snapshot_by_id(foreign), "t")
    assert [c.next_offsets("t") for c in kafscale_commits(table)] == [{0: 2}, {0: 1}]  # newest first
    assert read_committed_offsets(table) == {"t": {0: 2}}
    assert latest_commit(table, "missing-topic") is None


def test_a_corrupt_offsets_map_names_snapshot_and_key_and_a_bad_counter_is_left_out(table, caplog):
    bad = append(table, 1, {OFFSETS_PROPERTY_PREFIX + "t": '{"0": 10}', WRITE_LATENCY_PROPERTY: "fast"})
    with caplog.at_level(logging.WARNING):
        [commit] = kafscale_commits(table)
    assert commit.write_latency_ms is None and "kafscale.write-latency-ms is 'fast'" in caplog.text
    append(table, 1, {OFFSETS_PROPERTY_PREFIX + "t": '{"0": -1}'})
    with pytest.raises(CorruptOffsetsPropertyError, match=f"snapshot {table.current_snapshot().snapshot_id} "
                                                          f"property {OFFSETS_PROPERTY_PREFIX}t"):
        list(kafscale_commits(table))
    assert bad != table.current_snapshot().snapshot_id
    append(table, 1, {OFFSETS_PROPERTY_PREFIX + "t": '{"0": 12}', SKIPPED_PROPERTY_PREFIX + "t": '{"0": 5}'})
    with pytest.raises(CorruptOffsetsPropertyError, match="not a partition → \\[from, to\\) map"):
        latest_commit(table)
