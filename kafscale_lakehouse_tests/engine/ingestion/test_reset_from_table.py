"""`offsets reset --from-table` resets every partition the table holds offsets of, also those the offsets store holds
nothing of (its keys lost or wiped) and those no discovery finds any more (their segments deleted by retention)."""

from __future__ import annotations

from kafscale_lakehouse.connections import etcd_client_from_config, offset_store_from_config
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse.etcd import EtcdClient


def test_partitions_only_the_table_knows_are_reset_too(production_world, spark, cli_main, capsys):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)
    world.write_segments(1, 40, records_per_segment=40)
    world.write_segments(2, 40, records_per_segment=40)
    ingest(world.config(), spark)
    world.assert_exactly_once(runs=1)
    with EtcdClient([world.etcd_endpoint]) as client:  # the store lost partition 1's offsets
        client.delete(f"{world.name}/offsets/{world.topic}/1")
    world.delete_segment(2, 0)  # retention removed partition 2's only segment: discovery no longer finds it
    assert world.store_next_offsets() == {0: 80, 2: 40}

    config_path = world.write_config_file()
    assert cli_main("offsets", "reset", "--config", str(config_path), "--topic", world.topic, "--from-table",
                    "--yes") == 0
    assert world.store_next_offsets() == {0: 80, 1: 40, 2: 40} == read_topic_offsets(world.table(), world.topic)
    config = world.config()
    etcd = etcd_client_from_config(config)
    with offset_store_from_config(config, etcd) as store:
        identity = store.table_identity(world.topic)
    etcd.close()
    assert identity is not None and identity.partitions == (0, 1, 2)
