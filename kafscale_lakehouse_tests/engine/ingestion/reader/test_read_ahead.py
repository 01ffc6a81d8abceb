"""A run's segments are fetched ahead of the one being decoded (`segment_reader.READ_AHEAD_SEGMENTS` and
`READ_AHEAD_BYTES`): a segment is a GET, and a run of small segments fetched one after another waited a round trip
each. Order, exact offsets and where a failing segment stops the read stay what they were."""

from __future__ import annotations

import threading
import time

import pytest

from kafscale_lakehouse.engine.ingestion import segment_reader
from kafscale_lakehouse.engine.ingestion.segment_reader import SegmentReadError, read_input_partition
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import (
    ReadRequest,
    RecordingLocalStore,
    corrupt_segment,
    write_pizza_segments,
)

ROUND_TRIP_SECONDS = 0.05


class SlowStore(RecordingLocalStore):
    """A local store whose object reads take a round trip, counting how many are in flight at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    def _get(self, key, byte_range):
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(ROUND_TRIP_SECONDS)
            return super()._get(key, byte_range)
        finally:
            with self._lock:
                self.in_flight -= 1

    def plan(self, request: ReadRequest):
        """`request`'s input partitions; the planning's own reads (footers, concurrent) are not counted."""
        input_partitions = request.plan(self).input_partitions
        self.most_in_flight = 0
        return input_partitions


@pytest.fixture
def slow_store(tmp_path):
    return SlowStore(tmp_path / "segments", namespace="production", create=True)


def test_a_runs_segments_are_fetched_ahead_and_come_out_in_offset_order(slow_store):
    write_pizza_segments(slow_store, 0, [20] * 12)
    [partition] = slow_store.plan(ReadRequest(starting={0: 5}))

    started = time.monotonic()
    batches = list(read_input_partition(slow_store, partition, ()))
    elapsed = time.monotonic() - started

    offsets = [offset for batch in batches for offset in batch.column("offset").to_pylist()]
    assert offsets == list(range(5, 240))
    assert slow_store.most_in_flight == getattr(segment_reader, "READ_AHEAD_SEGMENTS", 4)  # one at a time before
    assert elapsed < 12 * ROUND_TRIP_SECONDS  # 13 round trips one after another (the first segment's index too)


def test_segments_larger_than_the_read_ahead_budget_are_fetched_one_at_a_time(slow_store, monkeypatch):
    segments = write_pizza_segments(slow_store, 0, [20] * 4)
    monkeypatch.setattr(segment_reader, "READ_AHEAD_BYTES", min(len(s.kfs) for s in segments) - 1, raising=False)
    [partition] = slow_store.plan(ReadRequest(starting={0: None}))

    rows = sum(batch.num_rows for batch in read_input_partition(slow_store, partition, ()))

    assert rows == 80 and slow_store.most_in_flight == 1


def test_a_corrupt_segment_fetched_ahead_fails_where_it_comes(slow_store):
    write_pizza_segments(slow_store, 0, [30] * 6)
    bad_key = corrupt_segment(slow_store, 0, 60)
    [partition] = slow_store.plan(ReadRequest(starting={0: None}))
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(slow_store, partition, ()))

    assert [o for batch in delivered for o in batch.column("offset").to_pylist()] == list(range(60))
    assert (raised.value.failure.kfs_key, raised.value.failure.next_offset) == (bad_key, 60)
