"""`decode_framed` decodes the records of consecutive segments of one partition in one pass (the reader's way of
amortizing the decoder's fixed cost per call): the rows are exactly those of decoding each segment alone, and an
error names the segment and byte at fault as decoding it alone does."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kafscale_lakehouse.apps.workload import ALL_CODECS, pizza_orders
from kafscale_lakehouse.format import (
    BadRecordError,
    decode_framed,
    decode_segment,
    encode_segment,
    frame_segment,
)
from kafscale_lakehouse_tests.format.segment_surgery import FIRST_RECORDS, reseal


def segments(sizes: list[int], codecs: tuple[str, ...] | list[str] = ALL_CODECS) -> list[tuple[str, bytes]]:
    """Consecutive realistic segments (unique trace headers, mixed value sizes), segment i in codec i."""
    out, offset = [], 0
    for number, size in enumerate(sizes):
        records = pizza_orders(offset, size, partition=3, workload="realistic", seed=number)
        kfs = encode_segment(records, base_offset=offset, codec=codecs[number % len(codecs)],
                             records_per_batch=7).kfs
        out.append((f"ns/t/3/segment-{offset:020d}.kfs", kfs))
        offset += size
    return out


@pytest.mark.parametrize(("start", "end"), [(None, None), (13, 151)])
def test_segments_decoded_together_give_the_rows_of_each_decoded_alone(start, end):
    written = segments([40, 25, 1, 60, 40, 33])
    alone = pa.concat_tables(decode_segment(kfs, key=key, topic="t", partition=3, start_offset=start,
                                            end_offset=end).records for key, kfs in written)

    together = decode_framed([frame_segment(kfs, key=key, topic="t", partition=3, start_offset=start,
                                            end_offset=end).run for key, kfs in written])

    assert together.equals(alone)
    assert together.column("offset").to_pylist() == list(range(start or 0, end or 199))
    assert together.column("headers").null_count == 0 and len(set(together.column("headers").to_pylist())) > 100


def test_a_bad_record_decoded_together_is_named_by_its_own_segment_and_byte():
    written = segments([40, 40, 40], codecs=["zstd", "none", "lz4"])
    key, kfs = written[1]
    bad = bytearray(kfs)
    bad[FIRST_RECORDS] |= 1  # the first record's length varint made negative
    written[1] = (key, reseal(bad))
    with pytest.raises(BadRecordError) as alone:
        decode_segment(written[1][1], key=key, topic="t", partition=3)

    with pytest.raises(BadRecordError) as together:
        decode_framed([frame_segment(kfs, key=k, topic="t", partition=3).run for k, kfs in written])

    assert (together.value.key, together.value.position, together.value.reason) == (
        key, alone.value.position, alone.value.reason)


def test_runs_of_other_partitions_or_ranges_are_refused():
    (key, kfs), (key2, kfs2) = segments([10, 10])
    first = frame_segment(kfs, key=key, topic="t", partition=3).run
    with pytest.raises(ValueError, match="one topic partition and one offset range"):
        decode_framed([first, frame_segment(kfs2, key=key2, topic="t", partition=3, start_offset=12).run])
