"""Malformed segments raise a typed SegmentFormatError naming the object key and the byte at fault - never an
IndexError/struct.error/plain ValueError from deep inside, never a hang, never a partial result."""

from __future__ import annotations

import struct

import pytest

from kafscale_lakehouse.format import (
    BadMagicError,
    BadRecordError,
    BatchOverrunError,
    CorruptCompressedPayloadError,
    CrcMismatchError,
    Record,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
    UnknownCodecError,
    assemble_segment,
    decode_batches,
    decode_segment,
    encode_record_batch,
    encode_segment,
)
from kafscale_lakehouse_tests.format.segment_surgery import FIRST_BATCH, FIRST_RECORDS, patched, reseal

KEY = "default/orders/0/segment-00000000000000000010.kfs"


def decode(kfs: bytes, **options):
    return decode_segment(kfs, key=KEY, topic="orders", partition=0, **options)


def raises_at(error_type: type[SegmentFormatError], position: int, kfs: bytes, **options) -> SegmentFormatError:
    with pytest.raises(error_type) as caught:
        decode(kfs, **options)
    assert caught.value.key == KEY
    assert caught.value.position == position
    assert str(caught.value).startswith(f"{KEY} at byte {position}: ")
    return caught.value


def small_segment(codec: str = "none", **options) -> bytes:
    batch_records = [Record(b"k1", b"v1", ((("h", b"x"),) if i % 2 else ()), 1_700_000_000_000 + i) for i in range(6)]
    return encode_segment(batch_records, base_offset=10, records_per_batch=2, codec=codec, **options).kfs


def worked_example() -> bytes:
    return encode_segment([Record(b"k1", b"v1", timestamp_ms=1_700_000_000_000)], base_offset=10).kfs


@pytest.mark.parametrize("kfs", [worked_example(), small_segment(), small_segment("zstd", transactional=True)],
                         ids=["one-record", "three-batches", "zstd-transactional"])
def test_every_truncation_raises_a_typed_error_within_the_object(kfs):
    for length in range(len(kfs)):
        with pytest.raises(SegmentFormatError) as caught:
            decode(kfs[:length], verify_crc=False)
        assert caught.value.key == KEY
        assert 0 <= caught.value.position <= length


def test_bad_segment_magic_and_version():
    kfs = worked_example()
    raises_at(BadMagicError, 0, b"KAFX" + kfs[4:])
    raises_at(BadMagicError, 4, patched(kfs, 4, "H", 2))


def test_bad_footer_magic_names_the_footer():
    kfs = worked_example()
    raises_at(BadMagicError, len(kfs) - 4, kfs[:-1] + b"?")


def test_bad_batch_magic():
    raises_at(BadMagicError, FIRST_BATCH + 16, reseal(patched(worked_example(), FIRST_BATCH + 16, "b", 1)))


def test_batch_length_past_the_end():
    kfs = reseal(patched(small_segment(), FIRST_BATCH + 8, "i", 10_000))
    raises_at(BatchOverrunError, FIRST_BATCH + 8, kfs)
    raises_at(BatchOverrunError, FIRST_BATCH + 8, reseal(patched(small_segment(), FIRST_BATCH + 8, "i", 3)))


def test_batch_crc_mismatch_is_caught_even_with_a_good_body_crc():
    kfs = bytearray(worked_example())
    kfs[FIRST_RECORDS + 7] ^= 0x01  # a byte of the value
    raises_at(CrcMismatchError, FIRST_BATCH + 17, reseal(kfs, batches=False))


def test_body_crc_mismatch_names_the_footer():
    kfs = bytearray(worked_example())
    kfs[FIRST_BATCH + 12] ^= 0x01  # partitionLeaderEpoch: outside the batch CRC, inside the body CRC
    raises_at(CrcMismatchError, len(kfs) - 16, bytes(kfs))
    assert decode(bytes(kfs), verify_crc=False).records.num_rows == 1


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec(codec_id):
    raises_at(UnknownCodecError, FIRST_BATCH + 21, reseal(patched(worked_example(), FIRST_BATCH + 21, "h", codec_id)))


@pytest.mark.parametrize(("codec", "framing"), [("gzip", "xerial"), ("snappy", "xerial"), ("snappy", "raw"),
                                                ("lz4", "xerial"), ("zstd", "xerial")])
def test_corrupt_compressed_payload(codec, framing):
    kfs = bytearray(small_segment(codec, snappy_framing=framing))
    # Break the payload's magic / frame header / length preamble (raw snappy has no checksum, so garbling
    # its middle may still "decompress").
    kfs[FIRST_RECORDS:FIRST_RECORDS + 6] = b"\xff" * 6
    error = raises_at(CorruptCompressedPayloadError, FIRST_BATCH, reseal(kfs))
    assert isinstance(error, UnknownCodecError)
    assert codec in str(error)


def test_record_length_past_the_batch():
    raises_at(BatchOverrunError, FIRST_RECORDS, reseal(patched(worked_example(), FIRST_RECORDS, "b", 0x7E)))


def test_record_key_length_past_the_record():
    # record: length, attributes, timestampDelta, offsetDelta, keyLen (at +4)
    raises_at(BatchOverrunError, FIRST_RECORDS, reseal(patched(worked_example(), FIRST_RECORDS + 4, "b", 0x20)))


def test_negative_key_length_other_than_null():
    raises_at(BadRecordError, FIRST_RECORDS, reseal(patched(worked_example(), FIRST_RECORDS + 4, "b", 0x03)))


def test_negative_and_zero_record_length():
    raises_at(BadRecordError, FIRST_RECORDS, reseal(patched(worked_example(), FIRST_RECORDS, "b", 0x01)))
    raises_at(BadRecordError, FIRST_RECORDS, reseal(patched(worked_example(), FIRST_RECORDS, "b", 0x00)))


def test_header_count_larger_than_the_headers():
    # the worked example's record ends with headerCount 0 (at +10); claim one header, whose key length is missing
    raises_at(BatchOverrunError, FIRST_RECORDS + 11, reseal(patched(worked_example(), FIRST_RECORDS + 10, "b", 2)))


def test_negative_header_key_length():
    kfs = encode_segment([Record(b"k", b"v", (("h", b"x"),))], base_offset=0).kfs
    # record: length, attributes, tsDelta, offsetDelta, keyLen, "k", valueLen, "v", headerCount, headerKeyLen(+9)
    raises_at(BadRecordError, FIRST_RECORDS + 9, reseal(patched(kfs, FIRST_RECORDS + 9, "b", 0x01)))


def test_record_count_disagreeing_with_the_records():
    kfs = small_segment()
    # The first batch holds an 11-byte record without headers and a 15-byte record with one header. The header's
    # message count (byte 16, 6) agrees with the batch's, so the records themselves are at fault.
    error = raises_at(BatchOverrunError, FIRST_RECORDS + 26,
                      reseal(patched(patched(kfs, FIRST_BATCH + 57, "i", 3), 16, "i", 7)))
    assert "past the end of the batch" in error.reason
    error = raises_at(BatchOverrunError, FIRST_RECORDS + 11,
                      reseal(patched(patched(kfs, FIRST_BATCH + 57, "i", 1), 16, "i", 5)))
    assert "follow the batch's last record" in error.reason
    # A header disagreeing with the batches is found before any record is decoded.
    error = raises_at(SegmentMismatchError, 16, reseal(patched(kfs, FIRST_BATCH + 57, "i", 3)))
    assert "header message count is 6, the batches hold 7 records" in error.reason


def test_record_offsets_out_of_order():
    kfs = encode_segment([Record(b"a", b"1"), Record(b"b", b"2")], base_offset=0).kfs
    # the second record starts after the first (9 bytes); its offsetDelta (zigzag 1 = 0x02, at +3) becomes 0
    raises_at(BadRecordError, FIRST_RECORDS + 9, reseal(patched(kfs, FIRST_RECORDS + 9 + 3, "b", 0x00)))


def test_timestamp_overflow():
    kfs = encode_segment([Record(b"a", b"1", timestamp_ms=0), Record(b"b", b"2", timestamp_ms=5)], base_offset=0).kfs
    # baseTimestamp near the int64 maximum: the second record (9 bytes in, delta 5) overflows
    raises_at(BadRecordError, FIRST_RECORDS + 9, reseal(patched(kfs, FIRST_BATCH + 27, "q", 2**63 - 3)))


def test_header_disagreements():
    kfs = small_segment()
    raises_at(SegmentMismatchError, 16, patched(kfs, 16, "i", 7))
    raises_at(SegmentMismatchError, FIRST_BATCH, patched(kfs, 8, "q", 9))
    raises_at(SegmentMismatchError, len(kfs) - 12, patched(kfs, len(kfs) - 12, "q", 99))


def test_gap_between_batches():
    first = encode_record_batch([Record(b"a", b"1")], base_offset=0)
    after_gap = encode_record_batch([Record(b"b", b"2")], base_offset=5)
    raises_at(SegmentMismatchError, FIRST_BATCH + len(first), assemble_segment([first, after_gap]).kfs)


def test_segment_without_batches():
    kfs = reseal(worked_example()[:FIRST_BATCH] + worked_example()[-16:])
    raises_at(SegmentMismatchError, FIRST_BATCH, kfs)


def test_ranged_read_errors_name_absolute_positions():
    kfs = bytearray(small_segment())
    (first_length,) = struct.unpack_from(">i", kfs, FIRST_BATCH + 8)
    second_batch = FIRST_BATCH + 12 + first_length
    kfs[second_batch + 61 + 7] ^= 0x01
    with pytest.raises(CrcMismatchError) as caught:
        decode_batches(bytes(kfs[second_batch:-16]), key=KEY, position=second_batch, topic="orders", partition=0)
    assert caught.value.position == second_batch + 17
    with pytest.raises(TruncatedSegmentError) as caught:
        decode_batches(bytes(kfs[second_batch:second_batch + 40]), key=KEY, position=second_batch, topic="orders",
                       partition=0)
    assert caught.value.position == second_batch


def test_errors_survive_pickling_for_spark_workers():
    import pickle

    with pytest.raises(SegmentFormatError) as caught:
        decode(b"KAFX" + worked_example()[4:])
    clone = pickle.loads(pickle.dumps(caught.value))
    assert (type(clone), clone.key, clone.position, str(clone)) == (BadMagicError, KEY, 0, str(caught.value))
