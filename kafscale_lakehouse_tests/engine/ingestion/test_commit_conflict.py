"""Another writer commits to the table between our refresh and our commit: retried, committed, nothing lost."""

from __future__ import annotations

import pyarrow as pa

import kafscale_lakehouse.engine.tables.appends as table_offsets
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY

FOREIGN_TOPIC = "written-by-another-engine"


def foreign_rows(schema: pa.Schema) -> pa.Table:
    row = dict.fromkeys(schema.names)
    row.update(record_id=f"{FOREIGN_TOPIC}:0:0", topic=FOREIGN_TOPIC, partition=0, offset=0, timestamp_ms=0,
               order_id="not-from-kafscale")
    return pa.Table.from_pylist([row], schema=schema)


def test_commit_conflicting_with_another_writer_is_retried(production_world, spark, monkeypatch):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    real_append = table_offsets.append_without_client_retries
    appends = []

    def another_writer_commits_first(table, data_files, properties, **kwargs):
        if not appends:
            # Our attempt has refreshed the table and re-checked the offsets; a plain pyiceberg append lands now.
            other = world.table()
            other.append(foreign_rows(other.schema().as_arrow()))
        appends.append(properties)
        return real_append(table, data_files, properties, **kwargs)

    monkeypatch.setattr(table_offsets, "append_without_client_retries", another_writer_commits_first)
    [result] = ingest(world.config(), spark)

    assert len(appends) == 2, "the first attempt conflicted and was retried"
    assert result.records == 120 and not result.failed
    table = world.assert_exactly_once(runs=1)
    ours, foreign = table.current_snapshot(), table.snapshot_by_id(table.current_snapshot().parent_snapshot_id)
    assert ours.snapshot_id == result.snapshot_id and foreign.summary.get(RUN_ID_PROPERTY) is None
    foreign_ids = [r["record_id"] for r in table.scan(selected_fields=("record_id", "topic")).to_arrow().to_pylist()
                   if r["topic"] == FOREIGN_TOPIC]
    assert foreign_ids == [f"{FOREIGN_TOPIC}:0:0"], "the other writer's row survives our retried commit"
    assert world.table_data_files() == world.referenced_data_files(table), "no data file is left unreferenced"
