"""Decode benchmark: our segment decoder against kafka-python's DefaultRecordBatch reader, on one core.

Run from the repository root: `.venv/bin/python benchmarks/decode.py [--workload realistic|friendly]
[--records N] [--repeat R]`. Writes pizza-order segments (`kafscale_lakehouse.workload`; realistic by default:
unique trace headers and keys, values of 100 B to 100 KB) with a codec mix (none, gzip, snappy, lz4, zstd) to a
temporary directory. Each decoder then runs in a fresh process pinned to one core, which reads the segments into
memory and decodes all of them: once cold (the process's first decode, module imports timed apart), then best of
R warm, over all segments and per codec. Ours decodes every segment to Arrow with CRC checks; kafka-python reads
the same segment bodies record by record (CRC per batch, touching offset, timestamp, key, value and headers).
Prints records/s and MB/s (of segment bytes), the ratio, and each process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DECODERS = ("kafscale_lakehouse", "kafka-python")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def run_decoder(name: str, directory: Path, repeat: int) -> dict:
    """In a fresh process: import `name`'s decoder, load the segments, decode them cold and then warm."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a Spark task gets
    if name == "kafscale_lakehouse":
        from kafscale_lakehouse.format import decode_segment

        def decode(segments: list[tuple[str, bytes]]) -> int:
            return sum(decode_segment(kfs, key=key, topic="completed-pizzas", partition=0,
                                      verify_crc=True).records.num_rows for key, kfs in segments)
    else:
        from kafscale_lakehouse_tests.format.kafka_python_reference import (
            cramjam_codec_patches,
            read_segment_records,
        )
        for target, attribute, value in cramjam_codec_patches():
            setattr(target, attribute, value)

        def decode(segments: list[tuple[str, bytes]]) -> int:
            # read_segment_records validates each batch CRC and touches every field of every record.
            return sum(len(read_segment_records(kfs)) for _, kfs in segments)
    imported = time.perf_counter()
    manifest = json.loads((directory / "manifest.json").read_text())
    segments = [(codec, path, (directory / path).read_bytes()) for codec, path in manifest]
    started = time.perf_counter()
    rows = decode([(path, kfs) for _, path, kfs in segments])
    result = {"import_s": imported - STARTED, "cold_s": time.perf_counter() - started, "rows": rows, "warm": {}}
    for codec in (None, *CODECS):
        chosen = [(path, kfs) for segment_codec, path, kfs in segments if codec in (None, segment_codec)]
        if not chosen:
            continue
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            rows = decode(chosen)
            best = min(best, time.perf_counter() - started)
        result["warm"][codec or "all"] = {"seconds": best, "rows": rows,
                                           "megabytes": sum(len(kfs) for _, kfs in chosen) / 1e6}
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("realistic", "friendly"), default="realistic")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--records-per-segment", type=int, default=10_000)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=DECODERS, help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_decoder(args.child, args.directory, args.repeat)))
        return

    from kafscale_lakehouse.workload import write_partition_segments

    with tempfile.TemporaryDirectory() as root:
        directory = Path(root)
        written = write_partition_segments(directory, record_count=args.records, codecs=CODECS,
                                           records_per_segment=args.records_per_segment,
                                           records_per_batch=args.records_per_batch, workload=args.workload)
        (directory / "manifest.json").write_text(json.dumps(
            [(segment.codec, str(segment.kfs_path.relative_to(directory))) for segment in written]))
        megabytes = sum(segment.kfs_path.stat().st_size for segment in written) / 1e6
        print(f"{args.records} pizza records ({args.workload} workload) in {len(written)} segments "
              f"({megabytes:.1f} MB, codecs {', '.join(CODECS)}), {args.records_per_batch} records per batch, "
              f"one core, warm = best of {args.repeat}", flush=True)
        results = {}
        for name in DECODERS:
            completed = subprocess.run([sys.executable, __file__, "--child", name, "--directory", str(directory),
                                        "--repeat", str(args.repeat)], check=True, capture_output=True, text=True)
            results[name] = json.loads(completed.stdout)

    for name in DECODERS:
        if results[name]["rows"] != args.records:
            raise SystemExit(f"{name} decoded {results[name]['rows']} records, expected {args.records}")
    for name, result in results.items():
        print(f"  {name:>18}: cold {result['cold_s']:6.2f} s ({args.records / result['cold_s'] / 1e3:7.1f} k "
              f"records/s) after {result['import_s']:.2f} s of imports, peak RSS {result['peak_rss_mb']:.0f} MB")
    print(f"  {'cold ratio':>18}: {results['kafka-python']['cold_s'] / results['kafscale_lakehouse']['cold_s']:.2f}x")
    for codec in results["kafscale_lakehouse"]["warm"]:
        print("all codecs, warm" if codec == "all" else f"{codec} only, warm")
        warm = {name: results[name]["warm"][codec] for name in DECODERS}
        if len({figures["rows"] for figures in warm.values()}) != 1:
            raise SystemExit(f"decoders disagree on the record count of {codec}: {warm}")
        for name, figures in warm.items():
            print(f"  {name:>18}: {figures['seconds']:7.3f} s  {figures['rows'] / figures['seconds'] / 1e3:8.1f} k "
                  f"records/s  {figures['megabytes'] / figures['seconds']:7.1f} MB/s")
        print(f"  {'ratio':>18}: {warm['kafka-python']['seconds'] / warm['kafscale_lakehouse']['seconds']:.2f}x "
              f"(our speed / kafka-python's)")


if __name__ == "__main__":
    main()
