"""`kafscale-lakehouse segment inspect`: a KafScale segment's header, footer, batches, index and (optionally) records,
printed from a local path or an `s3://bucket/key` URI; every corrupt batch is named, not only the first."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import TextIO

from kafscale_lakehouse.format import (
    FOOTER_SIZE,
    CrcMismatchError,
    DecodedSegment,
    SegmentFormatError,
    decode_batches,
    decode_segment,
    parse_index,
)
from kafscale_lakehouse.storage import ObjectKind, parse_segment_key


class SegmentLocationError(Exception):
    """The location names no segment: no such object, a malformed S3 URI, or a key without topic and partition."""


def _read_object(location: str, kind: ObjectKind) -> tuple[str, bytes | None]:
    """Return (key, bytes) of the `.kfs` or its sibling `.index` at a local path or `s3://bucket/key` URI.

    The key is what errors name and what topic/partition are parsed from; `None` bytes when the object is absent.
    """
    base = location[: -len(ObjectKind.SEGMENT.suffix)] if location.endswith(ObjectKind.SEGMENT.suffix) else location
    target = base + kind.suffix
    if target.startswith("s3://"):
        from kafscale_lakehouse.connections import s3_store_from_environment
        from kafscale_lakehouse.storage import ObjectNotFoundError

        bucket, _, key = target[len("s3://"):].partition("/")
        if not bucket or not key:
            raise SegmentLocationError(
                f"{location}: an S3 URI must look like s3://bucket/<namespace>/<topic>/<p>/segment-N.kfs"
            )
        store = s3_store_from_environment(bucket)
        try:
            return target, store.read(key)
        except ObjectNotFoundError:
            return target, None
    path = Path(target)
    return target, path.read_bytes() if path.is_file() else None


def _topic_partition(key: str) -> tuple[str, int]:
    # Any namespace depth: the last three path parts are <topic>/<partition>/segment-<base>.kfs.
    tail = "/".join(key.split("/")[-3:])
    parsed = parse_segment_key(tail, namespace="")
    if parsed is None:
        raise SegmentLocationError(f"{key}: not a segment key; expected …/<topic>/<partition>/segment-<base>.kfs")
    return parsed.topic, parsed.partition


def inspect_segment(location: str, *, records: bool, out: TextIO, topic: str | None = None,
                    partition: int | None = None) -> int:
    """Print header, footer, batches (and records); return the exit code (1 when the segment is invalid)."""
    kfs_key, data = _read_object(location, ObjectKind.SEGMENT)
    if data is None:
        raise SegmentLocationError(f"{kfs_key}: no such segment object")
    if topic is None or partition is None:
        key_topic, key_partition = _topic_partition(kfs_key)
        topic = key_topic if topic is None else topic
        partition = key_partition if partition is None else partition
    problem: SegmentFormatError | None = None
    try:
        segment = decode_segment(data, key=kfs_key, topic=topic, partition=partition)
    except CrcMismatchError as err:
        # Still show the structure when the bytes allow it: decode without CRC checks, then name each bad batch.
        problem = err
        print(f"error: {err}", file=sys.stderr)
        segment = decode_segment(data, key=kfs_key, topic=topic, partition=partition, verify_crc=False)
    _print_summary(segment, data, kfs_key, topic, partition, problem, out)

    index_key, index_data = _read_object(location, ObjectKind.INDEX)
    if index_data is None:
        print(f"index: {index_key} missing (an orphan .kfs is never ingested)", file=out)
    else:
        entries = parse_index(index_data, key=index_key)
        print(f"index: {index_key} entries={len(entries)} "
              + " ".join(f"{e.offset}@{e.position}" for e in entries[:20]) + (" …" if len(entries) > 20 else ""),
              file=out)
    if records:
        for row in segment.records.to_pylist():
            print(json.dumps(_record_json(row), ensure_ascii=False), file=out)
    return 0 if problem is None else 1


def _print_summary(segment: DecodedSegment, data: bytes, key: str, topic: str, partition: int,
                   problem: SegmentFormatError | None, out: TextIO) -> None:
    h, f = segment.header, segment.footer
    print(f"segment: {key}", file=out)
    print(f"topic: {topic} partition: {partition}", file=out)
    print(f"header: version={h.version} flags={h.flags} base_offset={h.base_offset} "
          f"message_count={h.message_count} created_ms={h.created_ms}", file=out)
    footer_position = len(data) - FOOTER_SIZE
    body_crc = "MISMATCH" if problem is not None and problem.position == footer_position else "ok"
    print(f"footer: last_offset={f.last_offset} body_crc={f.body_crc:#010x} ({body_crc})", file=out)
    print(f"batches: {len(segment.batches)} records: {segment.records.num_rows}", file=out)
    for b in segment.batches:
        crc = "ok" if problem is None else _batch_crc_status(data, key, b.position, b.size, topic, partition)
        flags = ",".join(name for name, on in (("control", b.control), ("transactional", b.transactional),
                                               ("log_append_time", b.log_append_time)) if on)
        print(f"  batch @{b.position} size={b.size} offsets={b.base_offset}..{b.last_offset} "
              f"records={b.record_count} codec={b.codec} crc={crc}" + (f" flags={flags}" if flags else ""), file=out)


def _batch_crc_status(data: bytes, key: str, position: int, size: int, topic: str, partition: int) -> str:
    """Re-check one batch on its own, so every corrupt batch is named, not only the first."""
    try:
        decode_batches(data[position:position + size], key=key, position=position, topic=topic, partition=partition)
    except CrcMismatchError:
        return "MISMATCH"
    return "ok"


def _record_json(row: dict) -> dict:
    def b64(value: bytes | None) -> str | None:
        return None if value is None else base64.b64encode(value).decode("ascii")

    return {"record_id": row["record_id"], "topic": row["topic"], "partition": row["partition"],
            "offset": row["offset"], "timestamp_ms": row["timestamp_ms"], "key_b64": b64(row["key"]),
            "value_b64": b64(row["value"]), "headers": row["headers"]}
