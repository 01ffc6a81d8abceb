"""Which snapshots the table counters come from, and that they never go down when snapshots expire (a real
embedded sqlite catalog and local offsets store; no server needed)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.connections import catalog_settings, offset_store_from_config
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.engine.tables.summary import (
    DEAD_LETTER_RECORDS_PROPERTY,
    OFFSETS_PROPERTY_PREFIX,
    RUN_ID_PROPERTY,
    WATERMARK_TIMESTAMP_PROPERTY,
    WRITE_LATENCY_PROPERTY,
)
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.support.leases import held_leases


@pytest.fixture
def world(tmp_path, unique_prefix) -> IngestWorld:
    return IngestWorld("embedded", tmp_path, unique_prefix, f"orders-{unique_prefix}")


@pytest.fixture
def config(world) -> LakehouseConfig:
    return world.config()


@pytest.fixture
def table(world, config):
    catalog = load_catalog(catalog_settings(config))
    catalog.create_namespace_if_not_exists(world.table_name.split(".")[0])
    return catalog.create_table(world.table_name, schema=pa.schema([("order_id", pa.string())]))


@pytest.fixture
def registry(config):
    collector = LakehouseStateCollector(config)
    registry = CollectorRegistry()
    registry.register(collector)
    yield registry
    collector.close()


def append(table, rows: int, **properties: str) -> int:
    """One snapshot adding `rows` rows with these summary properties; returns its id."""
    table.append(pa.table({"order_id": [f"o-{i}" for i in range(rows)]}), snapshot_properties=properties)
    return table.current_snapshot().snapshot_id


def ours(topic: str, next_offset: int, **properties: str) -> dict[str, str]:
    """Summary properties of a commit of our ingest runs."""
    return {OFFSETS_PROPERTY_PREFIX + topic: json.dumps({"0": next_offset}), RUN_ID_PROPERTY: f"run-{next_offset}",
            **properties}


def counters(registry: CollectorRegistry, topic: str) -> dict[str, float | None]:
    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"topic": topic, **labels})

    return {
        "written": sample("kafscale_processor_records_total", result="written"),
        "invalid": sample("kafscale_processor_records_total", result="invalid"),
        "batches": sample("kafscale_processor_batches_total"),
        "latency_count": sample("kafscale_processor_write_latency_ms_count"),
        "latency_sum": sample("kafscale_processor_write_latency_ms_sum"),
        "latency_le_250": sample("kafscale_processor_write_latency_ms_bucket", le="250"),
        "latency_le_30000": sample("kafscale_processor_write_latency_ms_bucket", le="30000"),
    }


def test_only_snapshots_carrying_the_topics_offsets_count(world, table, registry):
    topic = world.topic
    assert counters(registry, topic) == {"written": 0, "invalid": 0, "batches": 0, "latency_count": 0,
                                         "latency_sum": 0, "latency_le_250": 0, "latency_le_30000": 0}
    append(table, 3, **ours(topic, 3, **{WRITE_LATENCY_PROPERTY: "120", DEAD_LETTER_RECORDS_PROPERTY: "2"}))
    append(table, 5)  # another engine's commit (no offsets property)
    append(table, 4, **ours(topic, 7))  # a commit without a write latency (written before it was recorded)
    append(table, 6, **{OFFSETS_PROPERTY_PREFIX + "another-topic": '{"0": 6}'})

    assert counters(registry, topic) == {"written": 7, "invalid": 2, "batches": 2, "latency_count": 1,
                                         "latency_sum": 120, "latency_le_250": 1, "latency_le_30000": 1}
    assert registry.get_sample_value("kafscale_processor_records_total",
                                     {"topic": topic, "result": "dropped"}) == 0


def test_counters_do_not_go_down_when_snapshots_expire_and_count_each_new_commit(world, table, registry):
    topic = world.topic
    first = append(table, 3, **ours(topic, 3, **{WRITE_LATENCY_PROPERTY: "120"}))
    append(table, 4, **ours(topic, 7, **{WRITE_LATENCY_PROPERTY: "900"}))
    before = counters(registry, topic)

    table.maintenance.expire_snapshots().by_id(first).commit()
    assert table.metadata.snapshot_by_id(first) is None
    after_expiry = counters(registry, topic)
    append(table, 10, **ours(topic, 17, **{WRITE_LATENCY_PROPERTY: "40000"}))
    after_commit = counters(registry, topic)

    assert before == {"written": 7, "invalid": 0, "batches": 2, "latency_count": 2, "latency_sum": 1020,
                      "latency_le_250": 1, "latency_le_30000": 2}
    assert after_expiry == before
    assert after_commit == {"written": 17, "invalid": 0, "batches": 3, "latency_count": 3, "latency_sum": 41020,
                            "latency_le_250": 1, "latency_le_30000": 2}


def test_offset_gauges_come_from_the_local_offsets_store_too(world, config, table, registry):
    with offset_store_from_config(config) as store:
        with held_leases(store, world.topic, [0, 3], "test-owner") as leases:
            store.commit_offsets(leases.values(), {0: (42, 1_700_000_000_000), 3: (10, 1_700_000_000_500)})
        store.record_broker_watermark(world.topic, 0, 50)
        committed = store.committed_offsets(world.topic)

    def gauge(name: str, partition: int) -> float | None:
        return registry.get_sample_value(f"kafscale_processor_{name}", {"topic": world.topic,
                                                                        "partition": str(partition)})

    assert (gauge("last_offset", 0), gauge("watermark_offset", 0), gauge("last_offset", 3)) == (41, 41, 9)
    # The record timestamp is in our snapshots, not in etcd: no commit of ours yet, no watermark timestamp.
    assert (gauge("watermark_timestamp_ms", 0), gauge("watermark_timestamp_ms", 3)) == (None, None)
    append(table, 2, **ours(world.topic, 42, **{WATERMARK_TIMESTAMP_PROPERTY: '{"0": 1600000000000, "3": 1}'}))
    assert (gauge("watermark_timestamp_ms", 0), gauge("watermark_timestamp_ms", 3)) == (1_600_000_000_000, 1)
    append(table, 2, **ours(world.topic, 44))  # a snapshot without it leaves the values as they are
    append(table, 2, **ours(world.topic, 46, **{WATERMARK_TIMESTAMP_PROPERTY: '{"3": 1699999999000}'}))
    append(table, 1, **{WATERMARK_TIMESTAMP_PROPERTY: '{"3": 5}'})  # not ours (no offsets property): ignored
    # The newest commit that has a partition gives its value; the others keep theirs.
    assert (gauge("watermark_timestamp_ms", 0), gauge("watermark_timestamp_ms", 3)) == (1_600_000_000_000,
                                                                                        1_699_999_999_000)
    assert committed[3].last_timestamp_ms == 1_700_000_000_500  # what the caller gave, stored as is
    assert (gauge("lag", 0), gauge("lag", 3)) == (50 - 42, None)


def test_lag_without_a_broker_watermark_is_measured_against_the_completed_segments(world, config, table, registry):
    """A restored topic (`kafscale-cli restore` writes no `next_offset` for it): partition 0 has 42 records
    committed of 100 in segments, partition 1 none of 60; partition 2 has a watermark, which wins."""
    world.write_segments(0, 100, records_per_segment=50)
    world.write_segments(1, 60, records_per_segment=30)
    world.write_segments(2, 10, records_per_segment=10)
    with offset_store_from_config(config) as store:
        with held_leases(store, world.topic, [0], "test-owner") as leases:
            store.commit_offsets(leases.values(), {0: (42, 1_700_000_000_000)})
        store.record_broker_watermark(world.topic, 2, 15)

    lags = {p: registry.get_sample_value("kafscale_processor_lag", {"topic": world.topic, "partition": str(p)})
            for p in (0, 1, 2)}

    assert lags == {0: 58, 1: 60, 2: 15}
