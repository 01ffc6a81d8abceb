"""`dagster/partition_row_count` of a landed table's materializations, in `land_tables` runs on the real servers and
a real Dagster instance: each run's count costs what the run added (the manifests a run reads do not grow
with the table's history), and the count stays exact when an operator deletes rows or maintenance rewrites the files
between runs."""

from __future__ import annotations

from collections import Counter

import dagster as dg
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from pyiceberg.expressions import And, EqualTo, LessThan
from pyiceberg.manifest import ManifestFile

from kafscale_lakehouse.engine.maintenance import compact
from kafscale_lakehouse.orchestration.metadata import (
    PARTITION_ROW_COUNT_KEY,
    PARTITION_ROW_COUNTS_KEY,
    ROW_COUNT_SNAPSHOT_KEY,
)
from kafscale_lakehouse.orchestration.naming import table_asset_key

PARTITIONS = (0, 1)
RECORDS = 20  # per partition and run, one segment each


def recorded_counts(instance: dg.DagsterInstance, table: str) -> dict[int, tuple[int, int]]:
    """`{partition: (rows, counted snapshot)}` of each partition's latest materialization."""
    counts = {}
    for partition in PARTITIONS:
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=table_asset_key(table), asset_partitions=[str(partition)]),
            limit=1).records
        metadata = record.asset_materialization.metadata
        counts[partition] = (metadata[PARTITION_ROW_COUNT_KEY].value, metadata[ROW_COUNT_SNAPSHOT_KEY].value)
    return counts


def test_partition_row_counts_read_what_each_run_added_and_stay_exact_after_a_delete_and_a_compaction(
        namespace_world, spark, monkeypatch):
    world = namespace_world
    orders = world.topics["orders"]
    sources = world.sources()
    manifests_read: Counter[str] = Counter()
    fetch = ManifestFile.fetch_manifest_entry

    def counted(self, io, discard_deleted=True):
        manifests_read[self.manifest_path] += 1
        return fetch(self, io, discard_deleted=discard_deleted)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    partition_reads: list[dg.AssetKey] = []  # event-log reads of each partition's latest materialization
    latest_by_partition = SqlEventLogStorage.get_latest_storage_id_by_partition

    def counted_partition_read(self, asset_key, *args, **kwargs):
        partition_reads.append(asset_key)
        return latest_by_partition(self, asset_key, *args, **kwargs)

    monkeypatch.setattr(SqlEventLogStorage, "get_latest_storage_id_by_partition", counted_partition_read)
    partition_reads_per_run: list[int] = []
    cursor: str | None = None
    written = 0

    def land_a_run() -> int:
        """A segment per partition, the watch's tick and the land_tables run it requests; the manifests it read."""
        nonlocal cursor, written
        for partition in PARTITIONS:
            orders.write_segments(partition, RECORDS, records_per_segment=RECORDS, base_offset=written)
        written += RECORDS
        tick = world.tick(sources, cursor)
        cursor = tick.cursor
        [request] = tick.run_requests
        manifests_read.clear()
        partition_reads.clear()
        assert world.land(request).success
        partition_reads_per_run.append(len(partition_reads))
        return sum(manifests_read.values())

    def assert_counts_exact() -> None:
        table = orders.table()
        actual = {p: table.scan(row_filter=EqualTo("partition", p), selected_fields=("partition",)).to_arrow()
                  .num_rows for p in PARTITIONS}
        assert recorded_counts(world.instance, orders.table_name) == {
            p: (actual[p], table.current_snapshot().snapshot_id) for p in PARTITIONS}
        latest = world.instance.get_latest_materialization_event(table_asset_key(orders.table_name))
        assert latest.asset_materialization.metadata[PARTITION_ROW_COUNTS_KEY].value == {
            "snapshot_id": str(table.current_snapshot().snapshot_id), "rows": {str(p): actual[p] for p in PARTITIONS}}

    reads = [land_a_run() for _ in range(5)]
    assert_counts_exact()
    # The previous counts come from the asset's latest materialization (every partition's count, read with the
    # batch's other tables'), not from each partition's latest: only the first run, with none, looks for those.
    assert partition_reads_per_run == [1, 0, 0, 0, 0], partition_reads_per_run
    assert recorded_counts(world.instance, orders.table_name)[0][0] == 5 * RECORDS
    # Flat as the history grows (a manifest per run): none; the run's commit knows the data files its snapshot added
    # (`row_counts.remember_files_added`), so neither its count nor its two integrity checks read its manifest (they
    # read it once, before; a whole-table count read every manifest once per Kafka partition: 2 more per run).
    assert reads[2] == reads[3] == reads[4] == 0, reads

    # The batch's one read of its tables' latest materializations fails: each table reads its partitions' own.
    with monkeypatch.context() as failing:
        def unavailable(self, asset_keys):
            raise RuntimeError("event log unavailable")

        failing.setattr(dg.DagsterInstance, "get_latest_materialization_events", unavailable)
        land_a_run()
    assert partition_reads_per_run[-1] == 1
    assert_counts_exact()

    # An operator deletes rows of partition 0 between runs: the next count is taken from the table again.
    orders.table().delete(And(EqualTo("partition", 0), LessThan("offset", 10)))
    land_a_run()
    assert_counts_exact()
    assert recorded_counts(world.instance, orders.table_name)[0][0] == 7 * RECORDS - 10

    # Maintenance rewrites the small files into one (an overwrite snapshot): counted again, the same rows.
    assert compact(spark, orders.table(), target_file_size_bytes=64 * 1024 * 1024, min_input_files=2).snapshot_id
    land_a_run()
    assert_counts_exact()
    # And carried over the appends again after it.
    assert land_a_run() == reads[4]
    assert_counts_exact()
    assert partition_reads_per_run[6:] == [0, 0, 0], partition_reads_per_run
    assert recorded_counts(world.instance, orders.table_name) == {
        0: (9 * RECORDS - 10, orders.table().current_snapshot().snapshot_id),
        1: (9 * RECORDS, orders.table().current_snapshot().snapshot_id)}
