"""`spark.read.format("kafscale")` end to end on the shared Spark session: S3 (SeaweedFS) and a local directory."""

from __future__ import annotations

import base64
import json
from functools import reduce

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, TimestampNTZType

from kafscale_lakehouse.engine.kafscale_source import (
    ERROR_MARKER_OFFSET,
    INVALID_REASON_COLUMN,
    KAFSCALE_FORMAT,
    LATEST,
    SegmentErrorMode,
    plan_read,
    read_kafscale,
    register_kafscale_source,
    source_spark_schema,
)
from kafscale_lakehouse.storage import ObjectKind, segment_key
from kafscale_lakehouse.workload import pizza_orders
from kafscale_lakehouse_tests.engine_source.conftest import (
    PIZZA_COLUMNS,
    TOPIC,
    corrupt_segment,
    local_store_options,
    read_options,
    s3_store_options,
    write_pizza_segments,
)

pytestmark = pytest.mark.integration

BASE_COLUMNS = ["record_id", "topic", "partition", "offset", "timestamp_ms", "key", "value", "headers"]


def test_every_golden_fixture_reads_as_its_expected_rows_from_s3(spark, seaweedfs, unique_prefix,
                                                                 fixture_segments_dir):
    fixtures = sorted(path for path in fixture_segments_dir.iterdir() if (path / "fixture.json").is_file())
    assert len(fixtures) >= 7
    frames: list[DataFrame] = []
    expected_rows = []
    for fixture in fixtures:
        meta = json.loads((fixture / "fixture.json").read_text())
        # The pizza fixtures share one key (one per codec): each fixture gets its own namespace.
        namespace = f"{unique_prefix}-{fixture.name}"
        store_options = s3_store_options(seaweedfs, namespace)
        store = store_options.open()
        kfs_key = namespace + meta["s3_key"].removeprefix("default")
        kfs_file = fixture / kfs_key.rsplit("/", 1)[1]
        store.put(kfs_key, kfs_file.read_bytes())
        store.put(kfs_key.removesuffix(".kfs") + ".index", kfs_file.with_suffix(".index").read_bytes())
        options = read_options(store_options, topic=meta["topic"], ending={meta["partition"]: LATEST})
        frames.append(read_kafscale(spark, options).withColumn("fixture", F.lit(fixture.name)))
        for line in (fixture / "expected.jsonl").read_text().splitlines():
            row = json.loads(line)
            expected_rows.append((fixture.name, row["record_id"], row["topic"], row["partition"], row["offset"],
                                  row["timestamp_ms"], _b64(row["key_b64"]), _b64(row["value_b64"]), row["headers"]))

    rows = reduce(DataFrame.unionByName, frames).select("fixture", *BASE_COLUMNS).collect()

    assert sorted(tuple(row) for row in rows) == sorted(expected_rows)


def _b64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def test_exact_ranges_and_typed_mapped_columns_through_spark(spark, local_store):
    write_pizza_segments(local_store, 0, [100, 100, 100])
    write_pizza_segments(local_store, 1, [80, 80], codecs=["zstd", "snappy"])
    options = read_options(local_store_options(local_store), starting={0: 135, 1: 0}, ending={0: 250, 1: LATEST},
                           columns=PIZZA_COLUMNS, max_bytes_per_partition=1)  # one input partition per segment

    df = read_kafscale(spark, options)
    rows = df.orderBy("partition", "offset").collect()

    assert df.schema == source_spark_schema(PIZZA_COLUMNS)
    types = {field.name: field.dataType for field in df.schema.fields}
    assert (types["partition"], types["offset"], types["key"]) == (IntegerType(), LongType(), BinaryType())
    assert (types["order_id"], types["store_id"], types["date_ordered"]) == (
        StringType(), IntegerType(), TimestampNTZType())
    assert [(row.partition, row.offset) for row in rows] == [(0, o) for o in range(135, 250)] + [
        (1, o) for o in range(0, 160)]
    expected = pizza_orders(135, 115, partition=0) + pizza_orders(0, 160, partition=1)
    assert [row.value for row in rows] == [record.value for record in expected]
    orders = [json.loads(record.value) for record in expected]
    assert [(row.order_id, row.store_id) for row in rows] == [(o["order_id"], o["store_id"]) for o in orders]
    assert [row.date_ordered.strftime("%Y-%m-%d %H:%M:%S") for row in rows] == [o["date_ordered"] for o in orders]
    assert all(row[INVALID_REASON_COLUMN] is None for row in rows)


def test_gap_and_bad_options_fail_at_planning_naming_offsets_and_option(spark, local_store):
    write_pizza_segments(local_store, 0, [50, 50, 50])
    for kind in ObjectKind:
        (local_store.root / segment_key(local_store.namespace, TOPIC, 0, 50, kind)).unlink()
    options = read_options(local_store_options(local_store), ending={0: LATEST})

    with pytest.raises(Exception, match=r"offsets 50\.\.99 missing before .*segment-00000000000000000100\.kfs"):
        read_kafscale(spark, options).collect()
    register_kafscale_source(spark)
    with pytest.raises(Exception, match=r"unknown kafscale source options \['startoffsets'\]"):
        spark.read.format(KAFSCALE_FORMAT).options(**options.to_options(), startOffsets="{}").load()


def test_a_corrupt_segment_fails_the_job_or_is_marked(spark, local_store):
    write_pizza_segments(local_store, 0, [30, 30, 30])
    write_pizza_segments(local_store, 1, [30])
    bad_key = corrupt_segment(local_store, 0, 30)
    fail_options = read_options(local_store_options(local_store), ending={0: LATEST, 1: LATEST})
    mark_options = read_options(local_store_options(local_store), ending={0: LATEST, 1: LATEST},
                                on_segment_error=SegmentErrorMode.MARK)

    with pytest.raises(Exception, match=rf"CrcMismatchError.*{bad_key} at byte"):
        read_kafscale(spark, fail_options).collect()
    rows = read_kafscale(spark, mark_options).select("partition", "offset", "record_id", "value").collect()

    assert sorted((row.partition, row.offset) for row in rows if row.offset != ERROR_MARKER_OFFSET) == [
        (0, offset) for offset in range(30)] + [(1, offset) for offset in range(30)]
    [marker] = [row for row in rows if row.offset == ERROR_MARKER_OFFSET]
    assert (marker.partition, marker.record_id) == (0, bad_key)
    description = json.loads(marker.value)
    assert (description["key"], description["error_type"], description["base_offset"], description["next_offset"]) == (
        bad_key, "CrcMismatchError", 30, 30)
    assert plan_read(local_store, mark_options).ranges[0].end == 90  # the plan covered it; the marker stops it
