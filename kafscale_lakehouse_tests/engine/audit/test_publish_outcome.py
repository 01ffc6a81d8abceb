"""`publish_audit` when the catalog's answer is lost (a 5xx, a timeout), on the SeaweedFS Iceberg REST catalog: the
table says whether main moved; the error is an `AuditError`, which the run reports, never a stray exception."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitStateUnknownException

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.tables.audit import AuditError, branch_head, publish_audit
from kafscale_lakehouse.engine.tables.catalogs import load_catalog

BRANCH = "kafscale-audit"


@pytest.fixture
def audited_table(production_world):
    """A table whose audit branch holds one snapshot beyond main."""
    world = production_world
    catalog = load_catalog(catalog_settings(world.config()))
    catalog.create_namespace_if_not_exists(world.table_name.split(".")[0])
    table = catalog.create_table(world.table_name, schema=pa.schema([("a", pa.int64())]))
    table.append(pa.table({"a": [1]}))
    table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, BRANCH).commit()
    table.append(pa.table({"a": [2]}), branch=BRANCH)
    return table


@pytest.mark.parametrize("applied", [True, False])
def test_a_lost_answer_is_settled_by_reading_the_table(audited_table, monkeypatch, applied):
    table = audited_table
    audited = branch_head(table, BRANCH)
    real_commit = RestCatalog.commit_table

    def lost_answer(self, table_, requirements, updates):
        if applied:
            real_commit(self, table_, requirements, updates)
        raise CommitStateUnknownException("fault injected: 503")

    monkeypatch.setattr(RestCatalog, "commit_table", lost_answer)
    if applied:
        assert publish_audit(table, BRANCH, audited) is True
        monkeypatch.undo()
        table.refresh()
        assert table.current_snapshot().snapshot_id == audited
    else:
        with pytest.raises(AuditError, match=r"unknown outcome.*next run of the table settles it"):
            publish_audit(table, BRANCH, audited)
        monkeypatch.undo()
        table.refresh()
        assert branch_head(table, BRANCH) == audited and table.current_snapshot().snapshot_id != audited
