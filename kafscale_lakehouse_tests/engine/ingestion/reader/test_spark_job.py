"""Segments read by the ingestion Spark job (`run_ingestion_spark_job`) on the shared Spark session, and the golden
fixtures read from S3 (SeaweedFS)."""

from __future__ import annotations

import base64
import json

import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.engine.ingestion.spark_job import run_ingestion_spark_job
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, load_catalog, open_table
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.storage import LocalSegmentStore
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import (
    PIZZA_COLUMNS,
    TOPIC,
    ReadRequest,
    corrupt_segment,
    s3_store_at,
    write_pizza_segments,
)

pytestmark = pytest.mark.integration

BASE_COLUMNS = ["record_id", "topic", "partition", "offset", "timestamp_ms", "key", "value", "headers"]


def test_every_golden_fixture_reads_as_its_expected_rows_from_s3(seaweedfs, unique_prefix, fixture_segments_dir):
    fixtures = sorted(path for path in fixture_segments_dir.iterdir() if (path / "fixture.json").is_file())
    assert len(fixtures) >= 7
    for fixture in fixtures:
        meta = json.loads((fixture / "fixture.json").read_text())
        # The pizza fixtures share one key (one per codec): each fixture gets its own namespace.
        namespace = f"{unique_prefix}-{fixture.name}"
        store = s3_store_at(seaweedfs, namespace)
        kfs_key = namespace + meta["s3_key"].removeprefix("default")
        kfs_file = fixture / kfs_key.rsplit("/", 1)[1]
        store.put(kfs_key, kfs_file.read_bytes())
        store.put(kfs_key.removesuffix(".kfs") + ".index", kfs_file.with_suffix(".index").read_bytes())

        rows = ReadRequest(topic=meta["topic"], starting={meta["partition"]: None}).read_all(store)

        expected = []
        for line in (fixture / "expected.jsonl").read_text().splitlines():
            row = json.loads(line)
            expected.append((row["record_id"], row["topic"], row["partition"], row["offset"], row["timestamp_ms"],
                             _b64(row["key_b64"]), _b64(row["value_b64"]), row["headers"]))
        assert [tuple(row.values()) for row in rows.select(BASE_COLUMNS).to_pylist()] == expected, fixture.name


def _b64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@pytest.fixture
def pizza_table(tmp_path, unique_prefix):
    catalog = load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))
    return open_table(catalog, f"{unique_prefix.replace('-', '_')}.pizzas", schema=table_schema(PIZZA_COLUMNS),
                      create_if_missing=True)


def test_exact_ranges_and_typed_mapped_columns_through_the_spark_job(spark, local_store, pizza_table):
    write_pizza_segments(local_store, 0, [100, 100, 100])
    write_pizza_segments(local_store, 1, [80, 80], codecs=["zstd", "snappy"])
    request = ReadRequest(starting={0: 135, 1: 0}, ending={0: 250}, columns=PIZZA_COLUMNS,
                          max_bytes_per_partition=1)  # one task per segment
    plan = request.plan(local_store)
    # The tasks get the store pickled; a plain store (the recording one's class lives in the tests).
    store = LocalSegmentStore(local_store.root, namespace=local_store.namespace)

    outputs = run_ingestion_spark_job(spark, pizza_table, "run-exact", store, TOPIC, plan.input_partitions,
                                      columns=PIZZA_COLUMNS, json_schema=None, target_file_size_bytes=1 << 20)

    assert [o.task_id for o in outputs] == list(range(len(plan.input_partitions))) and len(outputs) == 4
    assert all(o.failure is None for o in outputs)
    commit_append(pizza_table, [f for o in outputs for f in o.data_files], TOPIC, {0: 135, 1: 0}, {0: 250, 1: 160},
                  "run-exact")
    rows = sorted(pizza_table.scan().to_arrow().to_pylist(), key=lambda row: (row["partition"], row["offset"]))
    assert [(row["partition"], row["offset"]) for row in rows] == [(0, o) for o in range(135, 250)] + [
        (1, o) for o in range(160)]
    expected = pizza_orders(135, 115, partition=0) + pizza_orders(0, 160, partition=1)
    assert [row["value"] for row in rows] == [record.value for record in expected]
    orders = [json.loads(record.value) for record in expected]
    assert [(row["order_id"], row["store_id"]) for row in rows] == [(o["order_id"], o["store_id"]) for o in orders]
    assert [row["date_ordered"].strftime("%Y-%m-%d %H:%M:%S") for row in rows] == [o["date_ordered"] for o in orders]


def test_a_corrupt_segment_comes_back_as_the_failure_of_its_task(spark, local_store, pizza_table):
    write_pizza_segments(local_store, 0, [30, 30, 30])
    write_pizza_segments(local_store, 1, [30])
    bad_key = corrupt_segment(local_store, 0, 30)
    plan = ReadRequest(starting={0: None, 1: None}, columns=PIZZA_COLUMNS).plan(local_store)
    assert plan.ranges[0] == OffsetRange(0, 0, 90)  # the plan covers it; reading stops at it
    store = LocalSegmentStore(local_store.root, namespace=local_store.namespace)

    outputs = run_ingestion_spark_job(spark, pizza_table, "run-bad", store, TOPIC, plan.input_partitions,
                                      columns=PIZZA_COLUMNS, json_schema=None, target_file_size_bytes=1 << 20)

    [stopped, other] = outputs  # one task per Kafka partition (all segments fit its budget)
    failure = stopped.failure
    assert (failure.partition, failure.key, failure.error_type, failure.base_offset, failure.next_offset) == (
        0, bad_key, "CrcMismatchError", 30, 30)
    assert failure.message.startswith(f"{bad_key} at byte ")
    # Its task wrote the rows before the failing segment, and nothing of the segments after it.
    assert (stopped.source_stats.rows, stopped.source_stats.last_offset) == ({0: 30}, {0: 29})
    assert sum(f.record_count for f in stopped.data_files) == 30
    assert other.failure is None and other.source_stats.rows == {1: 30}
