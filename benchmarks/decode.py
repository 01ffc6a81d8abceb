"""Decode benchmark: our segment decoder against kafka-python's DefaultRecordBatch reader, on one core.

Run from the repository root: `.venv/bin/python benchmarks/decode.py [--workload realistic|friendly]
[--records N] [--repeat R]`. Writes pizza-order segments (`kafscale_lakehouse.apps.workload`; realistic by default:
unique trace headers and keys, values of 100 B to 100 KB) with a codec mix (none, gzip, snappy, lz4, zstd) to a
temporary directory. Each decoder then runs in a fresh process pinned to one core, which reads the segments into
memory and decodes all of them once cold (the process's first decode; interpreter start and imports timed apart),
then warm, over all segments and per codec, the two processes taking turns (R pairs; medians, and the ratio per
pair, so that a machine whose speed drifts affects both sides alike). Ours decodes every segment to Arrow with
CRC checks; kafka-python reads
the same segment bodies record by record (CRC per batch, touching offset, timestamp, key, value and headers).
Prints records/s and MB/s (of segment bytes), the ratio, and each process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()  # as early as we can: interpreter start is not counted, imports are

DECODERS = ("kafscale_lakehouse", "kafka-python")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def serve_decoder(name: str, directory: Path) -> None:
    """In a fresh process: import `name`'s decoder, load the segments, decode them all once (cold), then decode
    the segments of the codec named on each stdin line (warm), answering each line with a JSON line."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a Spark task gets
    if name == "kafscale_lakehouse":
        from kafscale_lakehouse.format import decode_segment

        def decode(segments: list[tuple[str, bytes]]) -> int:
            return sum(decode_segment(kfs, key=key, topic="completed-pizzas", partition=0,
                                      verify_crc=True).records.num_rows for key, kfs in segments)
    else:
        from kafscale_lakehouse.testing.kafka_python_reference import (
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
    print(json.dumps({"import_s": imported - STARTED, "cold_s": time.perf_counter() - started, "rows": rows}),
          flush=True)
    for line in sys.stdin:
        codec = line.strip()
        chosen = [(path, kfs) for segment_codec, path, kfs in segments if codec in ("all", segment_codec)]
        started = time.perf_counter()
        rows = decode(chosen)
        print(json.dumps({"seconds": time.perf_counter() - started, "rows": rows,
                          "megabytes": sum(len(kfs) for _, kfs in chosen) / 1e6,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("realistic", "friendly"), default="realistic")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--records-per-segment", type=int, default=10_000)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5, help="warm pairs per codec")
    parser.add_argument("--child", choices=DECODERS, help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        serve_decoder(args.child, args.directory)
        return

    from kafscale_lakehouse.apps.workload import write_partition_segments

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
              f"one core; warm: the two decoders in turn, {args.repeat} pairs, medians", flush=True)
        children, cold = {}, {}
        for name in DECODERS:  # one after the other, so that each cold figure has the core to itself
            children[name] = subprocess.Popen([sys.executable, __file__, "--child", name, "--directory",
                                               str(directory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              text=True)
            cold[name] = json.loads(children[name].stdout.readline())
        codecs = ["all", *(codec for codec in CODECS if any(segment.codec == codec for segment in written))]
        warm: dict[str, dict[str, list[dict]]] = {codec: {name: [] for name in DECODERS} for codec in codecs}
        for _ in range(args.repeat):
            for codec, by_decoder in warm.items():
                for name, child in children.items():
                    child.stdin.write(codec + "\n")
                    child.stdin.flush()
                    by_decoder[name].append(json.loads(child.stdout.readline()))
        for child in children.values():
            child.stdin.close()
            child.wait()

    for name in DECODERS:
        if cold[name]["rows"] != args.records:
            raise SystemExit(f"{name} decoded {cold[name]['rows']} records, expected {args.records}")
    for name, figures in cold.items():
        peak = max(run["peak_rss_mb"] for by_decoder in warm.values() for run in by_decoder[name])
        print(f"  {name:>18}: cold {figures['cold_s']:6.2f} s ({args.records / figures['cold_s'] / 1e3:7.1f} k "
              f"records/s) after {figures['import_s']:.2f} s of interpreter start and imports; peak RSS {peak:.0f} MB")
    whole = {name: figures["import_s"] + figures["cold_s"] for name, figures in cold.items()}
    print(f"  {'cold ratio':>18}: {cold['kafka-python']['cold_s'] / cold['kafscale_lakehouse']['cold_s']:.2f}x; "
          f"whole process (imports + cold decode): {whole['kafka-python'] / whole['kafscale_lakehouse']:.2f}x")
    for codec, by_decoder in warm.items():
        if len({run["rows"] for runs in by_decoder.values() for run in runs}) != 1:
            raise SystemExit(f"decoders disagree on the record count of {codec}: {by_decoder}")
        print("all codecs, warm" if codec == "all" else f"{codec} only, warm")
        for name, runs in by_decoder.items():
            seconds = statistics.median(run["seconds"] for run in runs)
            print(f"  {name:>18}: {seconds:7.3f} s  {runs[0]['rows'] / seconds / 1e3:8.1f} k records/s  "
                  f"{runs[0]['megabytes'] / seconds:7.1f} MB/s")
        ratios = [theirs["seconds"] / ours["seconds"] for ours, theirs in zip(*by_decoder.values(), strict=False)]
        print(f"  {'ratio':>18}: {statistics.median(ratios):.2f}x (our speed / kafka-python's, median of pairs; "
              f"{min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
