"""Decode benchmark: our segment decoder against kafka-python's DefaultRecordBatch reader, on one core.

Run from the repository root: `.venv/bin/python benchmarks/decode.py [--records N] [--repeat R]`.
Writes pizza-order segments with a codec mix (none, gzip, snappy, lz4, zstd) to a temporary directory, loads
them into memory, then times (best of R runs) decoding every segment to Arrow with CRC checks, and kafka-python
reading the same segment bodies record by record (touching offset, timestamp, key, value and headers).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafscale_lakehouse.format import decode_segment  # noqa: E402
from kafscale_lakehouse.testing.kafka_python_reference import (  # noqa: E402
    cramjam_codec_patches,
    read_segment_records,
)
from kafscale_lakehouse.workload import ALL_CODECS, PIZZA_TOPIC, write_partition_segments  # noqa: E402


def decode_with_ours(segments: list[tuple[str, bytes]]) -> int:
    rows = 0
    for key, kfs in segments:
        rows += decode_segment(kfs, key=key, topic=PIZZA_TOPIC, partition=0, verify_crc=True).records.num_rows
    return rows


def decode_with_kafka_python(segments: list[tuple[str, bytes]]) -> int:
    # read_segment_records validates each batch CRC and touches every field of every record.
    return sum(len(read_segment_records(kfs)) for _, kfs in segments)


def best_time(decode, segments: list[tuple[str, bytes]], repeat: int) -> tuple[float, int]:
    best = float("inf")
    rows = 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = decode(segments)
        best = min(best, time.perf_counter() - started)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--records-per-segment", type=int, default=10_000)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    # One core, as a Spark task gets.
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for target, attribute, value in cramjam_codec_patches():
        setattr(target, attribute, value)

    with tempfile.TemporaryDirectory() as root:
        written = write_partition_segments(Path(root), record_count=args.records, codecs=ALL_CODECS,
                                           records_per_segment=args.records_per_segment,
                                           records_per_batch=args.records_per_batch)
        segments = [(segment.codec, str(segment.kfs_path.relative_to(root)), segment.kfs_path.read_bytes())
                    for segment in written]
    megabytes = sum(len(kfs) for _, _, kfs in segments) / 1e6
    print(f"{args.records} pizza records in {len(segments)} segments ({megabytes:.1f} MB, codecs "
          f"{', '.join(ALL_CODECS)}), {args.records_per_batch} records per batch, best of {args.repeat}, one core")

    decode_with_ours([(key, kfs) for _, key, kfs in segments[:1]])  # warm up imports
    for codec in (None, *ALL_CODECS):
        chosen = [(key, kfs) for segment_codec, key, kfs in segments if codec in (None, segment_codec)]
        if not chosen:
            continue
        chosen_megabytes = sum(len(kfs) for _, kfs in chosen) / 1e6
        print("all codecs" if codec is None else f"{codec} only")
        seconds, rows = {}, {}
        for name, decode in (("kafscale_lakehouse", decode_with_ours), ("kafka-python", decode_with_kafka_python)):
            seconds[name], rows[name] = best_time(decode, chosen, args.repeat)
            print(f"  {name:>18}: {seconds[name]:7.3f} s  {rows[name] / seconds[name] / 1e3:8.1f} k records/s  "
                  f"{chosen_megabytes / seconds[name]:7.1f} MB/s")
        if len(set(rows.values())) != 1 or (codec is None and rows["kafka-python"] != args.records):
            raise SystemExit(f"decoders disagree on the record count: {rows} (expected {args.records} in all)")
        print(f"  {'ratio':>18}: {seconds['kafka-python'] / seconds['kafscale_lakehouse']:.2f}x "
              f"(our speed / kafka-python's)")


if __name__ == "__main__":
    main()
