"""A segment replaced between planning and reading: the read checks the object it fetched against
the planned segment (base offset, last offset, size), so a re-cut object never yields records for offsets the run
would then commit past."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from kafscale_lakehouse.engine.ingestion.segment_reader import SegmentReadError, read_input_partition
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import TOPIC, ReadRequest, write_pizza_segments


def test_a_segment_replaced_after_planning_stops_its_partition_naming_planned_and_found(local_store):
    """The object read is checked against the planned segment, not only against itself."""
    write_pizza_segments(local_store, 0, [200])
    write_pizza_segments(local_store, 1, [60])
    replaced, other = ReadRequest(starting={0: None, 1: None}).plan(local_store).input_partitions
    planned = replaced.segments[0]
    write_pizza_segments(local_store, 0, [150])  # re-cut between planning and reading: offsets 0..149 only
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, replaced, ()))

    assert delivered == []  # not the 150 rows of the re-cut object
    failure = raised.value.failure
    assert (failure.key, failure.kfs_key, failure.error_type, failure.base_offset, failure.next_offset) == (
        planned.kfs_key, planned.kfs_key, "SegmentChangedError", 0, 0)
    assert f"planned offsets 0..199 in {planned.kfs_size} bytes" in failure.message
    assert "found offsets 0..149 in " in failure.message and planned.kfs_key in failure.message
    assert pickle.loads(pickle.dumps(raised.value)).failure == failure
    rows = pa.Table.from_batches(list(read_input_partition(local_store, other, ()))).to_pylist()  # unaffected
    assert [(r["partition"], r["record_id"]) for r in rows] == [(1, f"{TOPIC}:1:{o}") for o in range(60)]


@pytest.mark.parametrize("recut_size", [150, 250])
def test_a_range_read_of_a_replaced_segment_stops_naming_the_object(local_store, recut_size):
    """Starting mid-segment (index, then one ranged GET to the planned end): a shorter object fails the
    exact-length read, a longer one has no footer at the planned end; neither yields records."""
    write_pizza_segments(local_store, 0, [200])
    [partition] = ReadRequest(starting={0: 120}).plan(local_store).input_partitions
    planned = partition.segments[0]
    write_pizza_segments(local_store, 0, [recut_size])
    delivered = []

    with pytest.raises(SegmentReadError) as raised:
        delivered.extend(read_input_partition(local_store, partition, ()))

    assert delivered == []
    failure = raised.value.failure
    assert (failure.key, failure.next_offset) == (planned.kfs_key, 120) and planned.kfs_key in failure.message
