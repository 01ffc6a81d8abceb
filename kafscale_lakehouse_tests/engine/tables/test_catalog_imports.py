"""The sql catalog's SQLAlchemy loads only for a sql catalog (the fixed cost of a run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, CatalogUnavailableError, load_catalog


def test_ingest_imports_do_not_load_sqlalchemy():
    """What `kafscale-lakehouse ingest --once` imports before it reads its config; a REST deployment never needs
    SQLAlchemy (about 0.3 s of every process start on the 2-core machine)."""
    code = ("import sys, kafscale_lakehouse.apps.cli, kafscale_lakehouse.config, kafscale_lakehouse.engine.ingestion, "
            "kafscale_lakehouse.engine.spark; print(sorted(m for m in sys.modules if m.startswith('sqlalchemy'))[:3])")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]", completed.stdout


def test_sql_catalog_database_failure_is_a_catalog_error_naming_the_uri(tmp_path):
    """The lazily imported SQLAlchemy's errors are still turned into the catalog's own error."""
    uri = f"sqlite:///{tmp_path}/no-such-dir/catalog.db"
    with pytest.raises(CatalogUnavailableError, match=r"sql catalog at sqlite:///.*no-such-dir/catalog\.db failed"):
        load_catalog(CatalogSettings(type="sql", uri=uri, warehouse=str(tmp_path / "warehouse")))
