"""Switching from KafScale's Go iceberg-processor and back, on SeaweedFS + etcd + Spark: a table and etcd state as
the Go processor leaves them -> our runs -> etcd keys a Go processor resumes from (docs/kafscale-format.md §7)."""

from __future__ import annotations

import json
import logging
import re
import time

import pyarrow as pa
import pytest

from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.schema.columns import Column, record_arrow_schema
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, PIZZA_COLUMNS, IngestWorld

pytestmark = pytest.mark.integration

GO_OWNER = "iceberg-processor-7c9d5-x2k4q"  # the Go processor's owner id is its hostname (the pod name)
# Go's `json.Marshal(offsetState{...})`: exactly these keys in this order, integers only.
GO_OFFSET_VALUE = re.compile(rb'^\{"offset":(-?\d+),"last_timestamp_ms":(\d+),"updated_at":(\d+)\}$')


def go_offset_value(offset: int, at_ms: int) -> bytes:
    return f'{{"offset":{offset},"last_timestamp_ms":{at_ms},"updated_at":{at_ms}}}'.encode()


def create_go_table(world: IngestWorld, rows: dict[int, range]) -> None:
    """The table as the Go processor creates and appends it: base columns (ids 1-8) then the mapping's columns, one
    snapshot per write with Go's only summary property, no `kafscale.offsets.*` of ours."""
    columns = [Column(**c) for c in PIZZA_COLUMNS]
    catalog = load_catalog(catalog_settings(world.config()))
    namespace, _ = world.table_name.split(".")
    catalog.create_namespace_if_not_exists(namespace)
    catalog.create_table(world.table_name, schema=table_schema(columns), properties={"write.format.default": "parquet"})
    go_append(world, rows)


def go_append(world: IngestWorld, rows: dict[int, range]) -> None:
    table = world.table()
    arrow_schema = record_arrow_schema([Column(**c) for c in PIZZA_COLUMNS])
    for partition, offsets in rows.items():
        batch = {"record_id": [f"{world.topic}:{partition}:{o}" for o in offsets],
                 "topic": [world.topic] * len(offsets), "partition": [partition] * len(offsets),
                 "offset": list(offsets), "timestamp_ms": [1_700_000_000_000 + o for o in offsets],
                 "key": [None] * len(offsets), "value": [b"{}"] * len(offsets), "headers": [""] * len(offsets),
                 "order_id": [f"go-{o}" for o in offsets], "store_id": [None] * len(offsets),
                 "date_ordered": [None] * len(offsets)}
        table.append(pa.table(batch, schema=arrow_schema), snapshot_properties={"kafscale.commit.attempt": "1"})


def put_go_offsets(client: EtcdClient, world: IngestWorld, offsets: dict[int, int], at_ms: int) -> None:
    """What Go's `CommitOffset` leaves: offsets and partition watermarks (same bytes), the topic watermark (min)."""
    prefix, topic = world.name, world.topic
    for partition, offset in offsets.items():
        client.put(f"{prefix}/offsets/{topic}/{partition}", go_offset_value(offset, at_ms))
        client.put(f"{prefix}/watermarks/{topic}/{partition}", go_offset_value(offset, at_ms))
    client.put(f"{prefix}/watermarks/{topic}", go_offset_value(min(offsets.values()), at_ms))


def go_lease_value(expires_ms: int) -> bytes:
    return f'{{"owner_id":"{GO_OWNER}","lease_expires_at":{expires_ms},"generation":1}}'.encode()


def etcd_state(world: IngestWorld) -> dict[str, bytes]:
    with EtcdClient([world.etcd_endpoint]) as client:
        return {entry.key: entry.value for entry in client.get_prefix(f"{world.name}/")}


def go_resumes_from(state: dict[str, bytes], world: IngestWorld, partition: int) -> int:
    """Go's `LoadOffset` + `filterRecords`: the first offset a Go processor writes after this state."""
    match = GO_OFFSET_VALUE.match(state[f"{world.name}/offsets/{world.topic}/{partition}"])
    assert match, "not the bytes Go's json.Marshal writes"
    return int(match.group(1)) + 1


def test_cut_over_from_the_go_processor_and_back(production_world, spark, caplog):
    world = production_world
    world.write_segments(0, 100, records_per_segment=50)  # offsets 0..99
    world.write_segments(1, 90, records_per_segment=30)  # offsets 0..89
    # Go wrote p0 0..49 and p1 0..59, but crashed after writing p1 30..59 and before committing that offset.
    create_go_table(world, {0: range(50), 1: range(60)})
    go_committed_at = int(time.time() * 1000) - 60_000
    with EtcdClient([world.etcd_endpoint]) as client:
        put_go_offsets(client, world, {0: 49, 1: 29}, go_committed_at)
        # The Go processor was just stopped (or killed): it never releases its lease, which lapses after its TTL.
        go_lease = client.grant_lease(2)
        client.put(f"{world.name}/leases/{world.topic}/0", go_lease_value(go_committed_at + 2000), go_lease)

    with caplog.at_level(logging.INFO, logger="kafscale_lakehouse.engine.ingestion.positions"):
        [result] = ingest(world.config(), spark)

    assert {p: (o.start_offset, o.end_offset, o.records) for p, o in result.partitions.items()} == {
        0: (50, 100, 50), 1: (60, 90, 30)}
    messages = [r.getMessage() for r in caplog.records]
    lease_key = f"{world.name}/leases/{world.topic}/0"
    assert any(f"waiting up to {2 * LEASE_TTL_SECONDS}s for {lease_key} (held by {GO_OWNER!r}" in m
               for m in messages), messages
    location = f"etcd http://{world.etcd_endpoint}"
    assert (f"topic {world.topic} partition 0: hand-over from the Go processor: the table has no offsets of ours, "
            f"continuing from {location}'s offset 49 at offset 50") in messages
    assert (f"topic {world.topic} partition 1: the table already holds offsets 30..59 beyond {location}'s offset 29 "
            "(the Go processor wrote them and stopped before committing); continuing after them") in messages
    assert (f"topic {world.topic} partition 1: hand-over from the Go processor: the table has no offsets of ours, "
            f"continuing from {location}'s offset 29 at offset 60") in messages
    # Every offset once: Go's rows and ours; our one snapshot records the offsets; etcd agrees.
    world.assert_exactly_once(runs=1, expected={0: range(100), 1: range(90)})

    # What we leave in etcd is what the Go processor writes and resumes from, byte for byte, and no lease; plus our
    # own key naming the table the offsets belong to (the Go processor reads only its own keys).
    state = etcd_state(world)
    topic, prefix = world.topic, world.name
    assert sorted(state) == sorted([f"{prefix}/offsets/{topic}/0", f"{prefix}/offsets/{topic}/1",
                                    f"{prefix}/watermarks/{topic}", f"{prefix}/watermarks/{topic}/0",
                                    f"{prefix}/watermarks/{topic}/1", f"{prefix}/tables/{topic}"])
    assert json.loads(state[f"{prefix}/tables/{topic}"]) == {
        "table": world.table_name, "uuid": str(world.table().metadata.table_uuid), "partitions": [0, 1]}
    for partition, last in ((0, 99), (1, 89)):
        value = state[f"{prefix}/offsets/{topic}/{partition}"]
        offset, last_timestamp_ms, updated_at = map(int, GO_OFFSET_VALUE.match(value).groups())
        assert offset == last
        assert go_committed_at < last_timestamp_ms <= updated_at  # the commit time, as Go writes it
        assert state[f"{prefix}/watermarks/{topic}/{partition}"] == value
    assert state[f"{prefix}/watermarks/{topic}"] == state[f"{prefix}/offsets/{topic}/1"]  # the minimum offset
    assert (go_resumes_from(state, world, 0), go_resumes_from(state, world, 1)) == (100, 90)

    # A second run of ours is an ordinary one: the table's offsets, nothing read twice, no hand-over.
    caplog.clear()
    world.write_segments(0, 20, base_offset=100, records_per_segment=20)
    with caplog.at_level(logging.INFO, logger="kafscale_lakehouse.engine.ingestion.positions"):
        [second] = ingest(world.config(), spark)
    assert second.records == 20 and not caplog.records
    world.assert_exactly_once(runs=2, expected={0: range(120), 1: range(90)})
    assert go_resumes_from(etcd_state(world), world, 0) == 120

    # Rolled back: the Go processor resumed from our keys and wrote p0 120..139. Switching to us once more does not
    # read them again (our table offsets say 120): the partition is refused, naming why; p1 goes on.
    world.write_segments(0, 20, base_offset=120, records_per_segment=20)
    world.write_segments(1, 10, base_offset=90, records_per_segment=10)
    go_append(world, {0: range(120, 140)})
    with EtcdClient([world.etcd_endpoint]) as client:
        put_go_offsets(client, world, {0: 139, 1: 89}, int(time.time() * 1000))
    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(), spark)
    outcomes = failed.value.result.partitions
    assert (f"holds offsets 120..139 of partition 0 beyond our last commit (next offset 120), and {location} is at "
            "offset 139: another processor (the Go processor after a roll-back?) continued it") in outcomes[0].error
    assert outcomes[1].error is None and outcomes[1].records == 10
    rows = world.table_rows()
    assert len(rows) == len({r[0] for r in rows}) == 140 + 100, "nothing twice"
    assert go_resumes_from(etcd_state(world), world, 0) == 140  # the Go processor's own offset, left alone


def test_a_go_lease_that_stays_is_waited_for_then_named_not_broken(production_world, spark):
    world = production_world
    world.write_segments(0, 40, records_per_segment=40)
    create_go_table(world, {0: range(20)})
    with EtcdClient([world.etcd_endpoint]) as client:
        put_go_offsets(client, world, {0: 19}, int(time.time() * 1000))
        go_lease = client.grant_lease(60)  # a Go processor still running keeps renewing it
        lease_key = f"{world.name}/leases/{world.topic}/0"
        client.put(lease_key, go_lease_value(int(time.time() * 1000) + 60_000), go_lease)
        started = time.monotonic()
        with pytest.raises(IngestFailedError) as failed:
            ingest(world.config(), spark)
        waited = time.monotonic() - started
        error = failed.value.result.partitions[0].error
        assert f"lease {lease_key} on {world.topic}/0 is held by {GO_OWNER!r} after waiting " \
               f"{2 * LEASE_TTL_SECONDS}s for its release" in error
        assert "stop it first (README: switching from the Go processor)" in error
        assert waited >= 2 * LEASE_TTL_SECONDS
        # Not broken: the Go processor's lease and offsets are as it left them; nothing was written.
        entry = client.get_entry(lease_key)
        assert entry is not None and entry.lease_id == go_lease
        assert json.loads(entry.value)["owner_id"] == GO_OWNER
        assert world.our_snapshots() == []
        assert world.store_next_offsets() == {0: 20}
        client.revoke_lease(go_lease)
