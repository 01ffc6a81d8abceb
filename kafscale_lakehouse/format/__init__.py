"""KafScale segment and index codec: pure functions on bytes, no I/O (docs/kafscale-format.md)."""

from kafscale_lakehouse.format.base_columns import BASE_SCHEMA, build_base_table, record_id
from kafscale_lakehouse.format.compression import CODEC_IDS, CODEC_NAMES, SNAPPY_FRAMINGS
from kafscale_lakehouse.format.errors import (
    BadIndexError,
    BadMagicError,
    BadRecordError,
    BatchOverrunError,
    CorruptCompressedPayloadError,
    CrcMismatchError,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
    UnknownCodecError,
)
from kafscale_lakehouse.format.headers_json import go_headers_json
from kafscale_lakehouse.format.record_batch import (
    BatchInfo,
    DecodedBatches,
    FramedBatches,
    Record,
    decode_batches,
    decode_framed,
    encode_control_batch,
    encode_record_batch,
    frame_batch_run,
)
from kafscale_lakehouse.format.segment import (
    DecodedSegment,
    EncodedSegment,
    FramedSegment,
    assemble_segment,
    check_index_matches_segment,
    decode_segment,
    encode_segment,
    frame_segment,
)
from kafscale_lakehouse.format.segment_frame import (
    FOOTER_SIZE,
    HEADER_SIZE,
    SegmentFooter,
    SegmentHeader,
    parse_footer,
    parse_header,
)
from kafscale_lakehouse.format.segment_index import (
    DEFAULT_INDEX_INTERVAL,
    IndexEntry,
    build_index_entries,
    encode_index,
    entry_for_offset,
    parse_index,
)

__all__ = [
    "BASE_SCHEMA", "CODEC_IDS", "CODEC_NAMES", "DEFAULT_INDEX_INTERVAL", "FOOTER_SIZE", "HEADER_SIZE",
    "SNAPPY_FRAMINGS", "BadIndexError", "BadMagicError", "BadRecordError", "BatchInfo", "BatchOverrunError",
    "CorruptCompressedPayloadError", "CrcMismatchError", "DecodedBatches", "DecodedSegment", "EncodedSegment",
    "FramedBatches", "FramedSegment", "IndexEntry", "Record", "SegmentFooter", "SegmentFormatError", "SegmentHeader",
    "SegmentMismatchError", "TruncatedSegmentError", "UnknownCodecError", "assemble_segment", "build_base_table",
    "build_index_entries", "check_index_matches_segment", "decode_batches", "decode_framed", "decode_segment",
    "encode_control_batch", "encode_index", "encode_record_batch", "encode_segment", "entry_for_offset",
    "frame_batch_run", "frame_segment", "go_headers_json", "parse_footer", "parse_header", "parse_index", "record_id",
]
