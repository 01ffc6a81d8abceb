"""A `topic_pattern` mapping on the real servers (SeaweedFS S3 + Iceberg REST, etcd, local Spark): a topic created
after the definitions loaded is noticed by the pattern sensor, which asks for a reload of the code location; the
reloaded definitions hold its table asset, and its rows land exactly once."""

from __future__ import annotations

import re
from dataclasses import dataclass

import dagster as dg
import pytest

from kafscale_lakehouse.config import parse_config, resolve_topic_patterns
from kafscale_lakehouse.engine.ingestion import ingest
from kafscale_lakehouse.orchestration.component import build_definitions
from kafscale_lakehouse.orchestration.naming import ingest_job_name, partitions_def_name, table_asset_key
from kafscale_lakehouse.orchestration.topic_patterns import (
    RELOAD_RETRY_SECONDS,
    TOPIC_PATTERN_SENSOR,
    WEBSERVER_URL_ENV_VAR,
    build_topic_pattern_sensor,
)
from kafscale_lakehouse_tests.engine.ingestion.harness import PIZZA_COLUMNS, IngestWorld

pytestmark = pytest.mark.integration

PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


@dataclass
class PatternTopicWorld(IngestWorld):
    """One topic of the pattern, landed in the table its template names."""

    pattern_table: str = ""

    @property
    def table_name(self) -> str:
        return self.pattern_table


def topic_world(tmp_path, unique_prefix, seaweedfs, etcd_server, kind: str) -> PatternTopicWorld:
    topic = f"{kind}.{unique_prefix}"
    table = f"{unique_prefix.replace('-', '_')}.{topic.replace('.', '_dot_').replace('-', '_dash_')}"
    return PatternTopicWorld("production", tmp_path, unique_prefix, topic=topic, seaweedfs=seaweedfs,
                             etcd_endpoint=etcd_server.endpoint, pattern_table=table)


def ingest_run(definitions: dg.Definitions, world: IngestWorld, instance: dg.DagsterInstance,
               partitions: list[int]) -> dg.ExecuteInProcessResult:
    keys = [str(p) for p in partitions]
    known = set(instance.get_dynamic_partitions(partitions_def_name(world.topic)))
    instance.add_dynamic_partitions(partitions_def_name(world.topic), [k for k in keys if k not in known])
    job = definitions.resolve_job_def(ingest_job_name(world.table_name))
    return job.execute_in_process(instance=instance, tags={PARTITION_RANGE_START_TAG: keys[0],
                                                           PARTITION_RANGE_END_TAG: keys[-1]})


def test_a_topic_created_after_loading_is_onboarded_by_a_reload_and_lands_exactly_once(
        tmp_path, unique_prefix, seaweedfs, etcd_server, spark, monkeypatch):
    monkeypatch.delenv(WEBSERVER_URL_ENV_VAR, raising=False)
    orders = topic_world(tmp_path, unique_prefix, seaweedfs, etcd_server, "orders")
    clicks = topic_world(tmp_path, unique_prefix, seaweedfs, etcd_server, "clicks")
    orders.write_segments(0, 60, records_per_segment=30)
    document = orders.config_document()
    namespace = unique_prefix.replace("-", "_")
    document["mappings"] = [{"topic_pattern": rf"(orders|clicks)\.{re.escape(unique_prefix)}",
                             "table": f"{namespace}.{{topic}}", "create_table_if_missing": True,
                             "schema": {"columns": [dict(c) for c in PIZZA_COLUMNS]}}]
    config = parse_config(document, source="<pattern test>", base_dir=tmp_path)
    instance = dg.DagsterInstance.ephemeral()

    loaded = build_definitions(config)
    assert loaded.resolve_assets_def(table_asset_key(orders.table_name)) is not None
    with pytest.raises(Exception, match="clicks"):
        loaded.resolve_assets_def(table_asset_key(clicks.table_name))
    assert ingest_run(loaded, orders, instance, [0]).success
    orders.assert_exactly_once(runs=1)

    # The topic appears while the deployment runs.
    clicks.write_segments(0, 40, records_per_segment=20)
    clicks.write_segments(1, 30, records_per_segment=30)
    pattern_sensor = loaded.resolve_sensor_def(TOPIC_PATTERN_SENSOR)
    waiting = pattern_sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
    assert not waiting.run_requests
    assert f"'{clicks.topic}' (mappings[0].topic_pattern)" in waiting.skip_message
    assert WEBSERVER_URL_ENV_VAR in waiting.skip_message  # no webserver to ask: it says what waits for a reload

    # With a webserver to ask (its GraphQL reload stubbed), the sensor asks once, then waits for the reload.
    reloads: list[str | None] = []
    now = [1_000_000.0]
    loaded_config = resolve_topic_patterns(config, [orders.topic]).config  # what the first definitions were built of
    sensor = build_topic_pattern_sensor(loaded_config, reload=lambda location: reloads.append(location) or "asked",
                                        clock=lambda: now[0])
    first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
    assert reloads == [None] and "asked" in first.skip_message
    now[0] += 10
    second = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    assert reloads == [None] and "waiting for it" in second.skip_message
    now[0] += RELOAD_RETRY_SECONDS
    sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=second.cursor))
    assert reloads == [None, None], "asked again once the retry interval passed without the topic getting an asset"

    # The reload: the code location builds its definitions again and finds the topic.
    reloaded = build_definitions(config)
    assert reloaded.resolve_assets_def(table_asset_key(clicks.table_name)) is not None
    settled = reloaded.resolve_sensor_def(TOPIC_PATTERN_SENSOR).evaluate_tick(
        dg.build_sensor_context(instance=instance))
    assert "has its table asset" in settled.skip_message

    assert ingest_run(reloaded, clicks, instance, [0, 1]).success
    clicks.assert_exactly_once(runs=1)
    assert ingest_run(reloaded, clicks, instance, [0, 1]).success  # nothing new: no commit, no duplicate
    clicks.assert_exactly_once(runs=1)
    orders.assert_exactly_once(runs=1)



def test_ingest_lands_every_topic_a_pattern_matches_and_an_explicit_mapping_wins(
        tmp_path, unique_prefix, seaweedfs, etcd_server, spark):
    """`ingest` (what `kafscale-lakehouse ingest --once` and its polling loop run) resolves the patterns itself."""
    orders = topic_world(tmp_path, unique_prefix, seaweedfs, etcd_server, "orders")
    clicks = topic_world(tmp_path, unique_prefix, seaweedfs, etcd_server, "clicks")
    orders.write_segments(0, 40, records_per_segment=20)
    clicks.write_segments(0, 30, records_per_segment=30)
    namespace = unique_prefix.replace("-", "_")
    clicks.pattern_table = f"{namespace}.explicit_clicks"
    document = orders.config_document()
    document["mappings"] = [
        {"topic_pattern": rf"(orders|clicks)\.{re.escape(unique_prefix)}", "table": f"{namespace}.{{topic}}",
         "create_table_if_missing": True, "schema": {"columns": [dict(c) for c in PIZZA_COLUMNS]}},
        {"topic": clicks.topic, "table": clicks.pattern_table, "create_table_if_missing": True},
    ]
    config = parse_config(document, source="<pattern ingest test>", base_dir=tmp_path)

    results = ingest(config, spark)

    assert sorted((r.topic, r.table, r.records) for r in results) == sorted(
        [(orders.topic, orders.table_name, 40), (clicks.topic, clicks.pattern_table, 30)])
    orders.assert_exactly_once(runs=1)
    clicks.assert_exactly_once(runs=1)
    assert ingest(config, spark, topics=[orders.topic])[0].records == 0  # nothing new: nothing lands twice
    orders.assert_exactly_once(runs=1)


def test_the_cli_finds_a_pattern_mapped_table(tmp_path, unique_prefix, capsys):
    """`kafscale-lakehouse maintain --table` (and the `offsets` commands) resolve the patterns like `ingest`."""
    from kafscale_lakehouse.apps.cli import CommandError, run_maintain
    from kafscale_lakehouse.connections import catalog_settings
    from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
    from kafscale_lakehouse.schema import table_schema

    world = IngestWorld("embedded", tmp_path, unique_prefix, topic=f"orders-{unique_prefix}")
    world.write_segments(0, 10, records_per_segment=10)
    document = world.config_document()
    table = f"{unique_prefix.replace('-', '_')}.{{topic}}"
    document["mappings"] = [{"topic_pattern": "orders-.*", "table": table}]
    config_path = world.write_config_file(document)
    resolved = table.replace("{topic}", world.topic.replace("-", "_dash_"))
    open_table(load_catalog(catalog_settings(world.config(document))), resolved, schema=table_schema([]),
               create_if_missing=True)

    assert run_maintain(str(config_path), tables=[resolved], steps=["properties"]) == 0
    assert f'"table": "{resolved}"' in capsys.readouterr().out
    with pytest.raises(CommandError, match="no mapping lands in table"):
        run_maintain(str(config_path), tables=["other.table"], steps=["properties"])
