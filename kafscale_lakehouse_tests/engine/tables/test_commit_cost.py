"""`commits.HistoryIndependentTransaction`: the commit view's transactions read the staged metadata without
pyiceberg's deep copy of the whole history per read, and stage exactly what pyiceberg stages."""

from __future__ import annotations

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction
from pyiceberg.types import LongType, NestedField

from kafscale_lakehouse.engine.tables.commits import HistoryIndependentTransaction, without_client_retries


def _table(tmp_path, commits: int):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", Schema(NestedField(1, "x", LongType(), required=False)))
    for i in range(commits):
        with table.transaction() as transaction, transaction.update_snapshot(
                snapshot_properties={"n": str(i)}).fast_append():
            pass
    return table


def test_reads_of_the_staged_metadata_match_pyiceberg_without_copying_the_history(tmp_path):
    table = _table(tmp_path, commits=30)
    ours = without_client_retries(table).transaction()
    assert isinstance(ours, HistoryIndependentTransaction)
    assert ours.table_metadata is ours._table.metadata, "nothing staged: the table's own (frozen) metadata"

    theirs = Transaction(without_client_retries(table))
    for transaction in (ours, theirs):
        with transaction.update_snapshot(snapshot_properties={"n": "new"}).fast_append():
            pass
    staged, expected = ours.table_metadata, theirs.table_metadata
    assert staged is ours.table_metadata, "one application per staged state"
    assert len(staged.snapshots) == len(expected.snapshots) == 31
    assert staged.snapshots[:30] == expected.snapshots[:30]
    assert staged.snapshots[-1].summary["n"] == expected.snapshots[-1].summary["n"] == "new"
    assert staged.snapshots[-1].parent_snapshot_id == expected.snapshots[-1].parent_snapshot_id
    assert staged.refs["main"].snapshot_id == staged.snapshots[-1].snapshot_id
    assert staged.last_sequence_number == expected.last_sequence_number == 31
    assert staged.snapshots[0] is table.metadata.snapshots[0], "the history is shared, not copied"

    committed = ours.commit_transaction()
    assert len(committed.metadata.snapshots) == 31
    assert committed.current_snapshot().summary["n"] == "new"
