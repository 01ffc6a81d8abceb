"""Downstream writes attempted again (engine/tables/writes.py, sqlite and SeaweedFS REST catalogs): an append that
retries a write whose commit landed appends nothing; a commit applied but answered with an error is found by its id."""

from __future__ import annotations

import pyarrow as pa
from pyarrow.fs import FileSelector, FileType
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.io.pyarrow import PyArrowFileIO

from kafscale_lakehouse.engine.spark.writes import write_arrow
from kafscale_lakehouse.engine.tables.summary import WRITE_ID_PROPERTY
from kafscale_lakehouse.engine.tables.writes import TableWrite

ROWS = pa.table({"id": pa.array(range(10), pa.int64()), "label": [f"row-{i}" for i in range(10)]})


def _ids(catalog, identifier: str) -> list[int]:
    return sorted(catalog.load_table(identifier).scan().to_arrow()["id"].to_pylist())


def test_an_append_retrying_a_landed_write_appends_nothing(catalog, namespace):
    identifier = f"{namespace}.appended"
    first = write_arrow(catalog, ROWS, TableWrite(identifier, run_id="run-1", mode="append", write_id="w-1"))
    # The same write attempted again (same id), then a re-execution that retries it (another id, `retry_of`).
    again = write_arrow(catalog, ROWS, TableWrite(identifier, run_id="run-1", mode="append", write_id="w-1"))
    retry = write_arrow(catalog, ROWS, TableWrite(identifier, run_id="run-2", mode="append", write_id="w-2",
                                                  retry_of=frozenset({"w-1"})))

    assert again.snapshot_id == retry.snapshot_id == first.snapshot_id
    assert retry.rows_written == 10
    assert _ids(catalog, identifier) == list(range(10)), "appended once"
    table = catalog.load_table(identifier)
    assert [s.summary[WRITE_ID_PROPERTY] for s in table.snapshots()] == ["w-1"]
    live = {task.file.file_path for task in table.scan().plan_files()}
    assert set(_data_files(table)) == live, "the retries' files are deleted"
    # Another write (a deliberate re-execution of a step that succeeded) appends.
    write_arrow(catalog, ROWS, TableWrite(identifier, run_id="run-3", mode="append", write_id="w-3"))
    assert _ids(catalog, identifier) == sorted([*range(10), *range(10)])


def test_a_commit_applied_but_answered_with_an_error_is_found_by_its_id(catalog, namespace, monkeypatch):
    identifier = f"{namespace}.unanswered"
    write_arrow(catalog, ROWS, TableWrite(identifier, run_id="run-0", mode="overwrite"))
    catalog_class = RestCatalog if isinstance(catalog, RestCatalog) else SqlCatalog
    real = catalog_class.commit_table

    def applied_then_lost(self, table, requirements, updates):
        real(self, table, requirements, updates)
        raise CommitStateUnknownException("the commit was applied, the answer lost (503)")

    monkeypatch.setattr(catalog_class, "commit_table", applied_then_lost)
    result = write_arrow(catalog, ROWS.slice(0, 4), TableWrite(identifier, run_id="run-1", mode="append"))
    monkeypatch.undo()

    assert result.snapshot_id == catalog.load_table(identifier).current_snapshot().snapshot_id
    assert _ids(catalog, identifier) == sorted([*range(10), *range(4)])


def _data_files(table) -> list[str]:
    """Every file under the table's data path."""
    io = table.io if isinstance(table.io, PyArrowFileIO) else PyArrowFileIO(table.io.properties)
    location = table.location().rstrip("/") + "/data"
    scheme, netloc, path = io.parse_location(location, io.properties)
    infos = io.fs_by_scheme(scheme, netloc).get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return [f"{scheme}://{info.path}" for info in infos if info.type == FileType.File]
