"""A merge-on-read delete that another engine (Trino, Spark) commits while a compaction runs must
not be undone by the compaction's commit (Java's `validateNoNewDeletesForDataFiles`)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

import kafscale_lakehouse.engine.maintenance as maintenance
import kafscale_lakehouse.engine.tables.rewrites as table_rewrites
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.maintenance import compact
from kafscale_lakehouse_tests.engine.tables.other_engines import add_position_deletes

pytestmark = pytest.mark.integration

def _record_ids(table: Table) -> list[str]:
    return table.scan(selected_fields=("record_id",)).to_arrow().column("record_id").to_pylist()


def test_compaction_refuses_when_another_engine_deletes_rows_of_its_inputs_meanwhile(embedded_world, spark,
                                                                                      monkeypatch):
    world = embedded_world
    for i in range(2):
        for partition in (0, 1):
            world.write_segments(partition, 40, base_offset=i * 40, records_per_segment=40)
        ingest(world.config(), spark)
    before = world.table()
    rows_before = _record_ids(before)
    real_job = maintenance.run_rewrite_job
    deleted: dict[str, str] = {}

    def job_then_another_engine_deletes(spark_, table, rewrite_id, groups, **kwargs):
        written = real_job(spark_, table, rewrite_id, groups, **kwargs)
        victim = groups[0][0]  # planned without delete files; another engine deletes its first row meanwhile
        first = pq.read_table(table.io.new_input(victim.file_path).open(), columns=["record_id"])
        deleted["record_id"] = first.column("record_id")[0].as_py()
        deleted["delete_file"] = add_position_deletes(world.table(), victim, [0])
        deleted["data_file"] = victim.file_path
        assert deleted["record_id"] not in _record_ids(world.table()), "the delete file applies"
        return written

    monkeypatch.setattr(maintenance, "run_rewrite_job", job_then_another_engine_deletes)
    refused: Exception | None = None
    try:
        compact(spark, world.table(), target_file_size_bytes=64 * 1024 * 1024, min_input_files=2)
    except table_rewrites.RewriteAbandonedError as exc:
        refused = exc

    table = world.table()
    rows_after = _record_ids(table)
    assert deleted["record_id"] not in rows_after, "the row another engine deleted came back"
    assert sorted(rows_after) == sorted(r for r in rows_before if r != deleted["record_id"])
    assert type(refused).__name__ == "DeletesAddedError", refused
    assert deleted["data_file"] in str(refused) and deleted["delete_file"] in str(refused)
    assert not table.current_snapshot().summary.get(maintenance.COMPACTION_PROPERTY), "nothing committed"
    tasks = list(table.scan().plan_files())
    referenced = {t.file.file_path for t in tasks} | {d.file_path for t in tasks for d in t.delete_files}
    assert deleted["delete_file"] in referenced
    assert referenced <= world.table_data_files(table), "every referenced file exists"
    assert world.table_data_files(table) == referenced, "the compaction's own files were deleted"
