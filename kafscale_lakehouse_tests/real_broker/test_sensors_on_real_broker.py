"""The Dagster path on KafScale's own broker: a sensor tick sees the broker's segments and watermarks, requests a run,
and the run lands what the client was acknowledged; the same with the namespace watch and its `land_tables` runs."""

from __future__ import annotations

import dagster as dg
import pytest

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.engine.ingestion import WatchSources
from kafscale_lakehouse.orchestration.land_tables import LAND_TABLES_JOB
from kafscale_lakehouse.orchestration.namespace_sensor import build_namespace_sensor
from kafscale_lakehouse.orchestration.naming import ingest_job_name, topic_asset_key
from kafscale_lakehouse.orchestration.sensors import build_sensors
from kafscale_lakehouse_tests.orchestration.namespace.test_namespace_sensor import batch_tables
from kafscale_lakehouse_tests.real_broker.clients import produce_all_compressions, records
from kafscale_lakehouse_tests.real_broker.conftest import PARTITIONS

pytestmark = pytest.mark.integration


def evaluate(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
    """One tick; the dynamic partitions it requests are added as the daemon would."""
    result = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def test_sensor_requests_runs_that_land_what_the_broker_acknowledged(broker_world, kafscale_broker):
    world = broker_world()
    config = world.config()
    sources = WatchSources.from_config(config)
    [sensor] = build_sensors(config, sources=lambda: sources)
    job = build_definitions(config).resolve_job_def(ingest_job_name(world.table_name))
    acked = []
    cursor = None
    with dg.instance_for_test() as instance:
        for seed in (2, 3):  # two rounds: the second tick lists only what the broker wrote since the first
            round_acked = produce_all_compressions(world.bootstrap, world.topic, records(100, PARTITIONS, seed=seed))
            acked += round_acked
            tick = evaluate(sensor, instance, cursor)
            [request] = tick.run_requests
            [observation] = tick.asset_events
            assert observation.asset_key == topic_asset_key(world.topic)
            ends = {str(p): 1 + max(a.offset for a in acked if a.partition == p) for p in range(PARTITIONS)}
            assert observation.metadata["broker_next_offset"].value == ends, "the broker's own watermarks"
            assert observation.metadata["lag_by_partition"].value == {  # measured against those watermarks
                str(p): sum(a.partition == p for a in round_acked) for p in range(PARTITIONS)}
            assert job.execute_in_process(instance=instance, tags=request.tags).success
            cursor = tick.cursor
        settled = evaluate(sensor, instance, cursor)
    assert settled.run_requests == []
    world.assert_lands(acked, runs=2)


def test_namespace_watch_lands_every_topic_from_the_broker_watermarks(broker_world, kafscale_broker):
    worlds = [broker_world("orders"), broker_world("payments")]
    document = worlds[0].config_document(watch="namespace", poll_interval_seconds=7)
    document["mappings"] = [world.config_document()["mappings"][0] for world in worlds]
    config = parse_config(document, source="<namespace on the real broker>", base_dir=worlds[0].root)
    sources = WatchSources.from_config(config)
    sensor = build_namespace_sensor(config, sources=lambda: sources)
    job = build_definitions(config).resolve_job_def(LAND_TABLES_JOB)
    acked = {world.topic: [] for world in worlds}
    cursor = None
    with dg.instance_for_test() as instance:
        for seed in (4, 5):
            for world in worlds:
                acked[world.topic] += produce_all_compressions(world.bootstrap, world.topic,
                                                               records(60, PARTITIONS, seed=seed))
            tick = evaluate(sensor, instance, cursor)
            [request] = tick.run_requests
            assert set(batch_tables(request)) == {world.table_name for world in worlds}
            assert job.execute_in_process(instance=instance, run_config=request.run_config,
                                          tags=request.tags).success
            cursor = tick.cursor
        settled = evaluate(sensor, instance, cursor)
    assert settled.run_requests == []
    for world in worlds:
        world.assert_lands(acked[world.topic], runs=2)
