"""LFS end to end: envelope records in segments, blobs in SeaweedFS (or the local store), `ingest_mapping` with Spark.

Each mode (resolve, reference, skip, hybrid) with blobs in a bucket of their own, and the failures the Go processor
drops silently (bad envelope, missing blob, checksum mismatch, blob over the limit) in each schema mode: lenient
dead-letters them, off and strict stop the partition at the record, naming it and its blob.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from kafscale_lakehouse.apps.metrics import TopicTotals, _table_families
from kafscale_lakehouse.apps.workload import pizza_order, pizza_orders
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestContext, IngestFailedError, ingest_mapping
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.summary import (
    LFS_ERRORS_PROPERTY_PREFIX,
    LFS_RESOLVED_BYTES_PROPERTY,
    LFS_RESOLVED_PROPERTY,
    LFS_SKIPPED_PROPERTY,
)
from kafscale_lakehouse.format import Record
from kafscale_lakehouse.format.lfs import LFS_METADATA_COLUMNS, encode_envelope
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.validation_modes.faults import serve_schema

BLOB_BUCKET = "lfs-blobs"
RECORDS = 20
SMALL_AT, LARGE_AT = (2, 7), 12  # positions of envelope records in the mode tests
LIMIT = 64 * 1024
COLUMNS = [{"name": "order_id", "type": "string"}, {"name": "store_id", "type": "int"}]


def blob_for(partition: int, index: int, size: int) -> bytes:
    """A pizza order as JSON, padded to about `size` bytes (so mapped columns come from the resolved value)."""
    order = json.loads(pizza_order(index, partition=partition).value)
    order["order_id"] = f"blob-{partition}-{index}"
    order["photo"] = "x" * max(0, size - 250)
    return json.dumps(order).encode()


def put_blob(world: IngestWorld, key: str, data: bytes, bucket: str = BLOB_BUCKET) -> None:
    if world.kind == "production":
        client = world.seaweedfs.s3_client()
        if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key=key, Body=data)
    else:  # the local store maps s3://<bucket>/<key> to <local_root>/<bucket>/<key>
        path = world.segments_root / bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def with_value(record: Record, value: bytes) -> Record:
    return dataclasses.replace(record, value=value)


def envelope_record(world: IngestWorld, partition: int, index: int, size: int, **envelope) -> tuple[Record, bytes]:
    blob = blob_for(partition, index, size)
    key = f"{world.name}/{partition}/{index}.json"
    put_blob(world, key, blob)
    value = encode_envelope(BLOB_BUCKET, key, blob, content_type="application/json", **envelope)
    return with_value(pizza_order(index, partition=partition), value), blob


def config_for(world: IngestWorld, lfs: dict, *, schema_mode: str = "off", base_url: str | None = None):
    document = world.config_document()
    document["mappings"][0]["schema"] = {"columns": COLUMNS}
    document["mappings"][0]["lfs"] = lfs
    if base_url is not None:
        document["schema"] = {"mode": schema_mode, "registry": {"base_url": base_url, "timeout_seconds": 2}}
    return world.config(document)


def run(config, spark):
    return ingest_mapping(IngestContext.from_config(config, spark), config.mappings[0])


def rows_by_offset(world: IngestWorld, partition: int = 0) -> dict[int, dict]:
    rows = world.table().scan().to_arrow().to_pylist()
    return {r["offset"]: r for r in rows if r["partition"] == partition}


@pytest.mark.parametrize("mode", ["resolve", "reference", "skip", "hybrid"])
def test_each_mode_with_blobs_in_their_own_bucket(production_world, spark, mode):
    world = production_world
    records = pizza_orders(0, RECORDS)
    blobs, envelopes = {}, {}
    for index, size in ((SMALL_AT[0], 3000), (SMALL_AT[1], 5000), (LARGE_AT, 200_000)):
        records[index], blobs[index] = envelope_record(world, 0, index, size)
        envelopes[index] = records[index].value
    world.write_records(0, 0, records)
    limit = LIMIT if mode == "hybrid" else 0
    config = config_for(world, {"mode": mode, "max_inline_size": limit, "store_metadata": True,
                                "resolve_concurrency": 2})

    result = run(config, spark)

    assert not result.failed
    resolved = {"resolve": {*SMALL_AT, LARGE_AT}, "reference": set(), "skip": set(), "hybrid": set(SMALL_AT)}[mode]
    expected_offsets = set(range(RECORDS)) - (set(blobs) if mode == "skip" else set())
    world.assert_exactly_once(runs=1, expected={0: expected_offsets})
    assert world.store_next_offsets() == {0: RECORDS}, "skipped records are committed past, not pending"
    rows = rows_by_offset(world)
    for offset, row in rows.items():
        if offset in resolved:
            assert row["value"] == blobs[offset] and row["order_id"] == f"blob-0-{offset}"
            assert row["lfs_blob_size"] == len(blobs[offset]) and row["lfs_checksum_alg"] == "sha256"
        elif offset in envelopes:
            assert row["value"] == envelopes[offset] and row["order_id"] is None
            assert row["lfs_blob_size"] == len(blobs[offset])
        else:
            assert row["value"] == records[offset].value and row["order_id"] is not None
            assert all(row[name] is None for name in LFS_METADATA_COLUMNS)
            continue
        assert (row["lfs_bucket"], row["lfs_key"], row["lfs_content_type"]) == \
            (BLOB_BUCKET, f"{world.name}/0/{offset}.json", "application/json")
    summary = world.table().current_snapshot().summary.additional_properties
    # A commit that resolved, skipped or failed nothing carries no LFS keys.
    assert summary.get(LFS_RESOLVED_PROPERTY, "0") == str(len(resolved))
    assert summary.get(LFS_RESOLVED_BYTES_PROPERTY, "0") == str(sum(len(blobs[o]) for o in resolved))
    assert summary.get(LFS_SKIPPED_PROPERTY, "0") == str(3 if mode == "skip" else 0)

    # serve-metrics derives Go's series from the snapshot summary.
    totals = TopicTotals()
    totals.add_new_snapshots(world.table(), world.topic)
    families = {f.name: f for f in _table_families({world.topic: totals})}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("kafscale_processor_records_total", (("result", "skipped_lfs"), ("topic", world.topic)))] == \
        (3 if mode == "skip" else 0)
    assert samples[("kafscale_processor_lfs_resolved_total", (("topic", world.topic),))] == len(resolved)
    assert samples[("kafscale_processor_lfs_resolution_duration_seconds_count", (("topic", world.topic),))] == \
        len(resolved)


def test_the_local_store_maps_the_envelope_bucket_under_its_root(embedded_world, spark):
    world = embedded_world
    records = pizza_orders(0, RECORDS)
    records[4], blob = envelope_record(world, 0, 4, 1000, checksum_alg="crc32")
    world.write_records(0, 0, records)

    run(config_for(world, {"mode": "resolve"}), spark)

    assert rows_by_offset(world)[4]["value"] == blob


# ------------------------------------------------------------------------------------------------ failures

FAULT_AT = {0: 5, 1: 6, 2: 7, 3: 8}  # partition → position of its faulty record
GOOD_AT = 1  # a good envelope before the fault in every partition


def write_faulty_topic(world: IngestWorld) -> dict[int, str]:
    """Four partitions, each with one good envelope and one failure; returns partition → blob location at fault."""
    where = {}
    for partition, fault_at in FAULT_AT.items():
        records = pizza_orders(0, RECORDS, partition=partition)
        records[GOOD_AT], _ = envelope_record(world, partition, GOOD_AT, 2000)
        key = f"{world.name}/{partition}/{fault_at}.json"
        blob = blob_for(partition, fault_at, 2000)
        if partition == 0:  # bad envelope: no key, no sha256
            value = json.dumps({"kfs_lfs": 1, "bucket": BLOB_BUCKET, "size": 10}).encode()
            where[partition] = f"{world.topic}:0:{fault_at}"
        elif partition == 1:  # missing blob
            value = encode_envelope(BLOB_BUCKET, key, blob)
        elif partition == 2:  # checksum mismatch
            put_blob(world, key, blob.replace(b"blob-", b"BLOB-"))
            value = encode_envelope(BLOB_BUCKET, key, blob)
        else:  # over max_inline_size
            blob = blob_for(partition, fault_at, LIMIT + 10_000)
            put_blob(world, key, blob)
            value = encode_envelope(BLOB_BUCKET, key, blob)
        if partition:
            where[partition] = f"s3://{BLOB_BUCKET}/{key}"
        records[fault_at] = with_value(records[fault_at], value)
        world.write_records(partition, 0, records)
    return where


REASONS = {0: "missing required fields key, sha256", 1: "blob not found", 2: "sha256 checksum mismatch",
           3: f"over max_inline_size {LIMIT}"}


@pytest.mark.parametrize("schema_mode", ["off", "strict"])
def test_failures_stop_each_partition_at_the_record_naming_it_and_the_blob(production_world, registry, spark,
                                                                           schema_mode):
    world = production_world
    where = write_faulty_topic(world)
    serve_schema(registry, world.topic)
    base_url = registry.base_url if schema_mode != "off" else None
    config = config_for(world, {"mode": "resolve", "max_inline_size": LIMIT}, schema_mode=schema_mode,
                        base_url=base_url)

    with pytest.raises(IngestFailedError) as failure:
        run(config, spark)

    message = str(failure.value)
    for partition, fault_at in FAULT_AT.items():
        assert f"record {world.topic}:{partition}:{fault_at}" in message and where[partition] in message
        assert REASONS[partition] in message
    # Everything before each fault is committed exactly once, nothing at or after it.
    world.assert_exactly_once(runs=1, expected={p: range(at) for p, at in FAULT_AT.items()})
    assert world.store_next_offsets() == FAULT_AT
    for partition in FAULT_AT:
        assert rows_by_offset(world, partition)[GOOD_AT]["order_id"] == f"blob-{partition}-{GOOD_AT}"

    # The next run stops at the same records: nothing is skipped over.
    with pytest.raises(IngestFailedError):
        run(config, spark)
    assert world.store_next_offsets() == FAULT_AT


def test_lenient_sends_failures_to_the_dead_letter_table_with_the_reason(production_world, registry, spark):
    world = production_world
    where = write_faulty_topic(world)
    serve_schema(registry, world.topic)
    config = config_for(world, {"mode": "resolve", "max_inline_size": LIMIT}, schema_mode="lenient",
                        base_url=registry.base_url)

    result = run(config, spark)

    assert not result.failed and result.invalid_count == len(FAULT_AT)
    world.assert_exactly_once(runs=1, expected={p: set(range(RECORDS)) - {at} for p, at in FAULT_AT.items()})
    dead_letters = open_table(load_catalog(catalog_settings(config)), f"{world.table_name}_dead_letters")
    rows = {r["partition"]: r for r in dead_letters.scan().to_arrow().to_pylist()}
    assert {p: r["offset"] for p, r in rows.items()} == FAULT_AT
    for partition, row in rows.items():
        assert REASONS[partition] in row["error"] and row["error"].startswith("LFS")
        if partition:
            assert where[partition] in row["error"]
        assert b'"kfs_lfs"' in row["value"], "the dead letter keeps the envelope"
    summary = world.table().current_snapshot().summary
    assert summary[LFS_ERRORS_PROPERTY_PREFIX + "decode"] == "1"
    assert summary[LFS_ERRORS_PROPERTY_PREFIX + "resolve"] == "3"
    assert summary[LFS_RESOLVED_PROPERTY] == str(len(FAULT_AT))
