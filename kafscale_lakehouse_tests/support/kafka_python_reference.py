"""kafka-python's `DefaultRecordBatch` reader as an independent decoder of the same bytes.

The tests use it as a second opinion and `benchmarks/decode.py` as the speed reference. kafka-python looks for
python-snappy and lz4 for those codecs, which this project does not install; `cramjam_codec_patches` plugs in
cramjam (the library our decoder uses) so both readers decompress with the same code.
"""

from __future__ import annotations

import types

import cramjam
import kafka.codec
import kafka.record.default_records
from kafka.record.memory_records import MemoryRecords

from kafscale_lakehouse.format import FOOTER_SIZE, HEADER_SIZE


def _snappy_raw_decompress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(data))


def _lz4_frame_decompress(data: bytes) -> bytes:
    return bytes(cramjam.lz4.decompress(data))


def cramjam_codec_patches() -> list[tuple[object, str, object]]:
    """(object, attribute, value) triples that give kafka-python snappy and lz4 through cramjam."""
    return [
        (kafka.codec, "snappy", types.SimpleNamespace(decompress=_snappy_raw_decompress)),
        (kafka.codec, "lz4", types.SimpleNamespace(decompress=_lz4_frame_decompress)),
        (kafka.record.default_records, "lz4_decode", _lz4_frame_decompress),
    ]


def read_segment_records(kfs: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list]]:
    """(offset, timestamp, key, value, headers) of every non-control record, read by kafka-python from the body."""
    records: list[tuple[int, int, bytes | None, bytes | None, list]] = []
    batches = MemoryRecords(kfs[HEADER_SIZE:len(kfs) - FOOTER_SIZE])
    while (batch := batches.next_batch()) is not None:
        if not batch.validate_crc():
            raise AssertionError(f"kafka-python finds a bad CRC in the batch at offset {batch.base_offset}")
        if batch.is_control_batch:
            continue
        records.extend((record.offset, record.timestamp, record.key, record.value, record.headers)
                       for record in batch)
    if batches.valid_bytes() != batches.size_in_bytes():
        raise AssertionError(f"kafka-python stops {batches.size_in_bytes() - batches.valid_bytes()} bytes before "
                             f"the end of the segment body")
    return records
