"""One behaviour suite run against both backends: real etcd (session server) and a sqlite file."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

from kafscale_lakehouse.offsets import (
    NOTHING_COMMITTED,
    CommittedOffset,
    CorruptOffsetRecordError,
    LeaseHeldError,
    LeaseLostError,
    OffsetRegressionError,
)
from kafscale_lakehouse.offsets.store import now_ms
from kafscale_lakehouse_tests.offsets.conftest import SHORT_TTL_SECONDS
from kafscale_lakehouse_tests.support.leases import held_leases

pytestmark = pytest.mark.integration

OFFSET_VALUE = re.compile(rb'\{"offset":(-?\d+),"last_timestamp_ms":(-?\d+),"updated_at":(\d+)\}')


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(0.1)


def _pause_keeper(monkeypatch, store) -> None:
    """Renewals silently do nothing, as if the keeper thread were stalled (GC pause, frozen VM)."""
    monkeypatch.setattr(store, "_renew_lease", lambda lease: None)


def test_every_key_is_written_with_the_go_processors_exact_bytes(backend, topic):
    store = backend.open()
    prefix = backend.prefix
    before = now_ms()
    with held_leases(store, topic, [0, 1], "worker-a") as leases:
        lease_value = backend.raw(f"{prefix}/leases/{topic}/0")
        store.commit_offsets(leases.values(), {0: (42, 1700000000123), 1: (8, 1700000000456)})
        after = now_ms()

        match = re.fullmatch(rb'\{"owner_id":"worker-a","lease_expires_at":(\d+),"generation":1\}', lease_value)
        assert match, lease_value
        assert before + 30_000 <= int(match[1]) <= after + 30_000

        p0 = backend.raw(f"{prefix}/offsets/{topic}/0")
        updated_at = int(OFFSET_VALUE.fullmatch(p0)[3])
        assert before <= updated_at <= after
        expected_p0 = b'{"offset":41,"last_timestamp_ms":1700000000123,"updated_at":%d}' % updated_at
        expected_p1 = b'{"offset":7,"last_timestamp_ms":1700000000456,"updated_at":%d}' % updated_at
        assert p0 == expected_p0
        assert backend.raw(f"{prefix}/offsets/{topic}/1") == expected_p1
        assert backend.raw(f"{prefix}/watermarks/{topic}/0") == expected_p0
        assert backend.raw(f"{prefix}/watermarks/{topic}/1") == expected_p1
        assert backend.raw(f"{prefix}/watermarks/{topic}") == expected_p1  # the minimum offset
    assert backend.raw(f"{prefix}/leases/{topic}/0") is None  # released


def test_reads_offsets_of_all_partitions_and_of_one(backend, topic):
    store = backend.open()
    assert store.committed_offsets(topic) == {}
    assert store.committed_offset(topic, 0).offset == NOTHING_COMMITTED
    with held_leases(store, topic, [0, 2], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (11, 100), 2: (21, 200)})
    offsets = store.committed_offsets(topic)
    assert {p: (o.offset, o.last_timestamp_ms) for p, o in offsets.items()} == {0: (10, 100), 2: (20, 200)}
    assert store.committed_offset(topic, 2) == offsets[2]
    assert store.committed_offset(topic, 1).offset == NOTHING_COMMITTED


def test_values_written_by_the_go_processor_are_read(backend, topic):
    backend.put_raw(f"{backend.prefix}/offsets/{topic}/3",
                    b'{"offset":99,"last_timestamp_ms":1234,"updated_at":1700000000000}')
    assert backend.open().committed_offsets(topic) == {3: CommittedOffset(99, 1234, 1700000000000)}


def test_corrupt_offset_value_raises_naming_store_and_key(backend, topic):
    key = f"{backend.prefix}/offsets/{topic}/0"
    backend.put_raw(key, b"{garbage")
    store = backend.open()
    with pytest.raises(CorruptOffsetRecordError) as raised:
        store.committed_offsets(topic)
    assert key in str(raised.value) and store.location in str(raised.value)


def test_topic_watermark_covers_partitions_outside_the_commit(backend, topic):
    store = backend.open()
    with held_leases(store, topic, [0, 1], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (6, 50), 1: (9, 80)})
    with store.acquire_lease(topic, 1, "worker-b") as lease:
        store.commit_offsets([lease], {1: (13, 120)})
    topic_watermark = OFFSET_VALUE.fullmatch(backend.raw(f"{backend.prefix}/watermarks/{topic}"))
    assert (int(topic_watermark[1]), int(topic_watermark[2])) == (5, 50)


def test_second_owner_is_refused_naming_the_current_owner(backend, topic):
    store_a, store_b = backend.open(), backend.open()
    with store_a.acquire_lease(topic, 0, "worker-a"):
        with pytest.raises(LeaseHeldError, match="held by 'worker-a'") as raised:
            store_b.acquire_lease(topic, 0, "worker-b")
        assert raised.value.partition == 0 and raised.value.current_owner == "worker-a"
        store_b.acquire_lease(topic, 1, "worker-b").release()  # other partitions are free
    store_b.acquire_lease(topic, 0, "worker-b").release()


def test_expired_lease_lets_another_owner_take_over_and_fences_the_old_one(backend, topic, monkeypatch):
    store_a = backend.open(lease_ttl_seconds=SHORT_TTL_SECONDS)
    store_b = backend.open(lease_ttl_seconds=SHORT_TTL_SECONDS)
    _pause_keeper(monkeypatch, store_a)
    lease_a = store_a.acquire_lease(topic, 0, "worker-a")
    store_a.commit_offsets([lease_a], {0: (11, 100)})
    committed_bytes = backend.raw(f"{backend.prefix}/offsets/{topic}/0")

    taken = []

    def take_over() -> bool:
        try:
            taken.append(store_b.acquire_lease(topic, 0, "worker-b"))
        except LeaseHeldError:
            return False
        return True

    _wait_until(take_over, SHORT_TTL_SECONDS + 4, "takeover after expiry")
    with taken[0] as lease_b:
        with pytest.raises(LeaseLostError) as raised:
            store_a.commit_offsets([lease_a], {0: (21, 200)})
        assert raised.value.partition == 0 and f"/leases/{topic}/0" in str(raised.value)
        assert lease_a.lost
        assert backend.raw(f"{backend.prefix}/offsets/{topic}/0") == committed_bytes
        store_b.commit_offsets([lease_b], {0: (16, 150)})
    lease_a.release()  # must not delete worker-b's key (already released here) nor raise
    assert store_a.committed_offset(topic, 0).offset == 15


def test_keepalive_holds_the_lease_over_several_ttls(backend, topic):
    store_a = backend.open(lease_ttl_seconds=SHORT_TTL_SECONDS)
    store_b = backend.open(lease_ttl_seconds=SHORT_TTL_SECONDS)
    with store_a.acquire_lease(topic, 0, "worker-a") as lease:
        deadline = time.monotonic() + 3 * SHORT_TTL_SECONDS + 0.5
        while time.monotonic() < deadline:
            with pytest.raises(LeaseHeldError):
                store_b.acquire_lease(topic, 0, "worker-b")
            time.sleep(0.5)
        assert not lease.lost
        store_a.commit_offsets([lease], {0: (4, 30)})
    assert store_b.committed_offset(topic, 0).offset == 3


def test_keeper_notices_a_deleted_lease_key_and_commit_writes_nothing(backend, topic):
    store = backend.open(lease_ttl_seconds=SHORT_TTL_SECONDS)
    with held_leases(store, topic, [0, 1], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (2, 10), 1: (2, 10)})
        before = {p: backend.raw(f"{backend.prefix}/offsets/{topic}/{p}") for p in (0, 1)}
        backend.delete_lease_key(f"{backend.prefix}/leases/{topic}/1")
        assert leases[1].lost_event.wait(SHORT_TTL_SECONDS * 2), "keeper did not notice the deleted key"
        assert not leases[0].lost
        with pytest.raises(LeaseLostError) as raised:
            store.commit_offsets(leases.values(), {0: (3, 20), 1: (3, 20)})
        assert raised.value.partition == 1
        assert {p: backend.raw(f"{backend.prefix}/offsets/{topic}/{p}") for p in (0, 1)} == before


def test_lease_lost_while_keeper_is_paused_fences_the_whole_commit(backend, topic, monkeypatch):
    store = backend.open(lease_ttl_seconds=SHORT_TTL_SECONDS)
    with held_leases(store, topic, [0, 1], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (2, 10), 1: (2, 10)})
        before = {key: backend.raw(key) for key in (f"{backend.prefix}/offsets/{topic}/0",
                                                    f"{backend.prefix}/offsets/{topic}/1",
                                                    f"{backend.prefix}/watermarks/{topic}")}
        _pause_keeper(monkeypatch, store)
        time.sleep(SHORT_TTL_SECONDS + 1.5)  # both leases expire in the store; the holder has not noticed
        assert not any(lease.lost for lease in leases.values())
        with pytest.raises(LeaseLostError, match="nothing was written"):
            store.commit_offsets(leases.values(), {0: (3, 20), 1: (3, 20)})
        assert any(lease.lost for lease in leases.values())
        assert {key: backend.raw(key) for key in before} == before


def test_lease_is_released_when_the_block_raises(backend, topic):
    store_a, store_b = backend.open(), backend.open()
    with pytest.raises(RuntimeError), store_a.acquire_lease(topic, 0, "worker-a"):
        raise RuntimeError("ingest failed")
    store_b.acquire_lease(topic, 0, "worker-b").release()


def test_lease_is_released_on_keyboard_interrupt(backend, topic):
    store_a, store_b = backend.open(), backend.open()
    # Python's own Ctrl-C handling, whatever a library run earlier in this test process installed (Spark, Dagster);
    # the root conftest puts the previous handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt), held_leases(store_a, topic, [0, 1], "worker-a"):
        signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, delivered to the main thread
    with held_leases(store_b, topic, [0, 1], "worker-b"):
        pass


def test_released_lease_cannot_commit(backend, topic):
    store = backend.open()
    lease = store.acquire_lease(topic, 0, "worker-a")
    lease.release()
    with pytest.raises(LeaseLostError, match="already released"):
        store.commit_offsets([lease], {0: (2, 1)})
    assert store.committed_offsets(topic) == {}


def test_commit_needs_a_lease_for_every_partition(backend, topic):
    store = backend.open()
    with (store.acquire_lease(topic, 0, "worker-a") as lease,
          pytest.raises(ValueError, match=r"no lease given for partitions \[1\]")):
        store.commit_offsets([lease], {0: (2, 1), 1: (2, 1)})
    assert store.committed_offsets(topic) == {}


def test_commit_refuses_to_go_backwards_but_repair_from_the_table_may(backend, topic):
    store = backend.open()
    with held_leases(store, topic, [0, 1], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (51, 500), 1: (61, 600)})
        with pytest.raises(OffsetRegressionError, match=f"offsets/{topic}/0 holds offset 50"):
            store.commit_offsets(leases.values(), {0: (41, 400)})
        store.repair_offsets(leases.values(), {0: (41, 400)})
    assert store.committed_offset(topic, 0).offset == 40
    topic_watermark = OFFSET_VALUE.fullmatch(backend.raw(f"{backend.prefix}/watermarks/{topic}"))
    assert int(topic_watermark[1]) == 40


def test_concurrent_commits_on_one_topic_keep_the_topic_watermark_exact(backend, topic):
    stores = [backend.open(), backend.open()]
    errors: list[BaseException] = []

    def commit_many(store, partition: int, owner: str) -> None:
        try:
            with store.acquire_lease(topic, partition, owner) as lease:
                for offset in range(15):
                    store.commit_offsets([lease], {partition: (offset * (partition + 1) + 1, offset)})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit_many, args=(stores[p], p, f"worker-{p}")) for p in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    offsets = stores[0].committed_offsets(topic)
    assert {p: o.offset for p, o in offsets.items()} == {0: 14, 1: 28}
    topic_watermark = OFFSET_VALUE.fullmatch(backend.raw(f"{backend.prefix}/watermarks/{topic}"))
    assert int(topic_watermark[1]) == 14


def test_broker_watermarks_are_read_per_partition(backend, topic):
    backend.publish_broker_watermark(topic, 0, 120)
    backend.publish_broker_watermark(topic, 1, 7)
    assert backend.open().broker_watermarks(topic) == {0: 120, 1: 7}
    assert backend.open().broker_watermarks(f"{topic}-other") == {}


def test_the_offsets_and_watermarks_of_many_topics_are_one_read_each(backend, topic, monkeypatch):
    store = backend.open()
    longer, idle = f"{topic}-b", f"{topic}-idle"  # `topic` is a prefix of `longer`: its keys must not mix in
    with held_leases(store, topic, [0, 1], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (6, 50), 1: (9, 80)})
    with held_leases(store, longer, [0], "worker-a") as leases:
        store.commit_offsets(leases.values(), {0: (3, 10)})
    backend.publish_broker_watermark(topic, 0, 7)
    backend.publish_broker_watermark(longer, 2, 4)
    reads: list[str] = []
    read_prefix = store._read_prefix
    monkeypatch.setattr(store, "_read_prefix", lambda prefix: reads.append(prefix) or read_prefix(prefix))

    committed = store.committed_offsets_by_topic([topic, longer, idle])
    watermarks = store.broker_watermarks_by_topic([topic, longer, idle])

    assert len(reads) == 2
    assert {t: {p: c.offset for p, c in offsets.items()} for t, offsets in committed.items()} == {
        topic: {0: 5, 1: 8}, longer: {0: 2}, idle: {}}
    assert watermarks == {topic: {0: 7}, longer: {2: 4}, idle: {}}
    assert committed == {t: store.committed_offsets(t) for t in (topic, longer, idle)}
    assert watermarks == {t: store.broker_watermarks(t) for t in (topic, longer, idle)}
