"""The table stays the source of truth: offsets of ours in the store that the table does not hold stop the partition
with an error naming the table, both sides and the command; `kafscale-lakehouse offsets` settles it either way."""

from __future__ import annotations

import logging

import pytest

from kafscale_lakehouse.connections import catalog_settings, offset_store_from_config
from kafscale_lakehouse.engine.ingestion.positions import reset_from_store, reset_from_table
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets


def land_two_partitions(world, spark) -> None:
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    ingest(world.config(), spark)
    world.assert_exactly_once(runs=1)


def test_a_dropped_and_recreated_table_stops_until_reset_from_the_table_then_lands_everything(
        embedded_world, spark, cli_main, capsys):
    world = embedded_world
    land_two_partitions(world, spark)
    old_uuid = str(world.table().metadata.table_uuid)
    load_catalog(catalog_settings(world.config())).drop_table(world.table_name)

    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)  # creates the table again (create_table_if_missing), then stops
    table = world.table()
    for partition in (0, 1):
        error = failed.value.result.partitions[partition].error
        assert f"table {world.table_name} (uuid {table.metadata.table_uuid}) holds no offsets of topic" in error
        assert f"committed for table {world.table_name} (uuid {old_uuid}), not this one" in error
        assert f"kafscale-lakehouse offsets reset --topic {world.topic} --from-table --yes" in error
    assert world.table_rows(table) == []  # nothing landed mid-topic

    config_path = world.write_config_file()
    capsys.readouterr()
    assert cli_main("offsets", "show", "--config", str(config_path), "--topic", world.topic) == 0
    shown = capsys.readouterr().out
    assert f"offsets belong to {world.table_name} (uuid {old_uuid}, partitions [0, 1])" in shown
    assert "        0            -           80" in shown and "NO" in shown
    assert cli_main("offsets", "reset", "--config", str(config_path), "--topic", world.topic, "--from-table") == 1
    assert world.store_next_offsets() == {0: 80, 1: 40}, "without --yes nothing changes"
    assert cli_main("offsets", "reset", "--config", str(config_path), "--topic", world.topic, "--from-table",
                    "--yes") == 0
    assert world.store_next_offsets() == {}

    [result] = ingest(world.config(), spark)
    assert result.records == 120
    world.assert_exactly_once(runs=1)  # every record again, once, in the new table


def expire_our_offsets_behind_a_foreign_commit(world) -> None:
    """Another engine commits a snapshot without our offsets, then an operator's expiry keeps only that one."""
    table = world.table()
    transaction = table.transaction()
    with transaction.update_snapshot().fast_append():
        pass
    transaction.commit_transaction()
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in world.our_snapshots(table)]).commit()


def test_expired_history_after_a_foreign_commit_stops_until_the_table_takes_the_stores_offsets(embedded_world, spark):
    world = embedded_world
    land_two_partitions(world, spark)
    expire_our_offsets_behind_a_foreign_commit(world)
    table = world.table()
    assert world.our_snapshots(table) == []
    assert read_topic_offsets(table, world.topic) == {}
    world.write_segments(0, 40, base_offset=80, records_per_segment=40)

    with pytest.raises(IngestFailedError, match=r"committed for this table \(uuid"):
        ingest(world.config(), spark)
    assert len(world.table_rows()) == 120, "nothing read again, nothing skipped"

    with offset_store_from_config(world.config()) as store:
        view = reset_from_store(world.table(), world.topic, store)
    assert all(p.agree for p in view.partitions)
    assert read_topic_offsets(world.table(), world.topic) == {0: 80, 1: 40}
    [result] = ingest(world.config(), spark)
    assert result.records == 40
    assert sorted(o for _, p, o in world.table_rows() if p == 0) == list(range(120))


def test_reset_from_the_table_with_expired_offsets_but_landed_rows_continues_after_them(embedded_world, spark):
    """Another engine expired the snapshots carrying our offsets, the rows remain; resetting the
    store from the table sets it after the highest landed offset, not back to the oldest segment."""
    world = embedded_world
    land_two_partitions(world, spark)
    expire_our_offsets_behind_a_foreign_commit(world)
    assert read_topic_offsets(world.table(), world.topic) == {} and len(world.table_rows()) == 120

    with offset_store_from_config(world.config()) as store:
        reset_from_table(world.table(), world.topic, store)
    assert world.store_next_offsets() == {0: 80, 1: 40}
    world.write_segments(0, 40, base_offset=80, records_per_segment=40)
    [result] = ingest(world.config(), spark)

    assert result.records == 40
    rows = world.table_rows()
    assert len(rows) == len(set(rows)) == 160, "nothing landed twice"
    assert sorted(o for _, p, o in rows if p == 0) == list(range(120))
    assert sorted(o for _, p, o in rows if p == 1) == list(range(40))
    world.write_segments(1, 40, base_offset=40, records_per_segment=40)  # partition 1 continues later too
    [result] = ingest(world.config(), spark)
    assert result.records == 40
    assert sorted(o for _, p, o in world.table_rows() if p == 1) == list(range(80))
    assert read_topic_offsets(world.table(), world.topic) == {0: 120, 1: 80}


def test_a_second_deployment_landing_the_topic_in_another_table_stops(embedded_world, spark):
    world = embedded_world
    land_two_partitions(world, spark)
    document = world.config_document()
    document["mappings"][0]["table"] = f"{world.table_name}_second"

    with pytest.raises(IngestFailedError, match=rf"committed for table {world.table_name} \(uuid [0-9a-f-]+\), "
                                                 "not this one"):
        ingest(world.config(document), spark)
    world.assert_exactly_once(runs=1)  # the first table and the store are untouched


def test_go_processor_offsets_without_identity_are_still_handed_over(embedded_world, spark, caplog):
    world = embedded_world
    world.write_segments(0, 80, records_per_segment=40)
    with offset_store_from_config(world.config()) as store:  # what the Go processor leaves: offsets, no identity
        lease = store.acquire_lease(world.topic, 0, "go-processor")
        store.commit_offsets([lease], {0: (40, 0)})
        lease.release()
        assert store.table_identity(world.topic) is None
    with caplog.at_level(logging.INFO):
        [result] = ingest(world.config(), spark)
    assert result.records == 40 and "hand-over from the Go processor" in caplog.text
    with offset_store_from_config(world.config()) as store:
        identity = store.table_identity(world.topic)
    assert identity is not None and identity.partitions == (0,)
    assert identity.uuid == str(world.table().metadata.table_uuid)


def test_a_rollback_to_before_our_first_commit_stops_until_reset_from_the_table_then_lands_again(
        embedded_world, spark):
    world = embedded_world
    world.segments_root.mkdir(parents=True, exist_ok=True)
    ingest(world.config(), spark)  # no segments yet: the table is created, nothing landed
    table = world.table()
    transaction = table.transaction()  # another writer's snapshot, before ours
    with transaction.update_snapshot().fast_append():
        pass
    transaction.commit_transaction()
    foreign = world.table().metadata.current_snapshot_id
    land_two_partitions(world, spark)
    world.table().manage_snapshots().rollback_to_snapshot(foreign).commit()
    assert world.table_rows() == [] and read_topic_offsets(world.table(), world.topic) == {}

    with pytest.raises(IngestFailedError, match=r"committed for this table \(uuid") as failed:
        ingest(world.config(), spark)
    assert set(failed.value.result.partitions) == {0, 1}
    assert world.table_rows() == [], "the rolled-back records are neither skipped nor half landed"

    with offset_store_from_config(world.config()) as store:
        reset_from_table(world.table(), world.topic, store)
    [result] = ingest(world.config(), spark)
    assert result.records == 120  # the rolled-back records land again, once
    assert sorted((p, o) for _, p, o in world.table_rows()) == [(0, o) for o in range(80)] + [(1, o) for o in
                                                                                              range(40)]
