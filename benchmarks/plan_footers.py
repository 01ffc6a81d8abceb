"""What planning a partition costs: every new segment's footer read against the newest one's only.

Run from the repository root: `.venv/bin/python benchmarks/plan_footers.py [--segments 25] [--repeat 5]`. Starts
SeaweedFS (`kafscale_lakehouse_tests/support/servers.py`) under a temporary directory, uploads `--segments` segments of
40 realistic records (apps/workload.py) to each of 4 partitions, then plans each partition from offset 0, alternating
A/B/A/B: A lists it reading every segment's footer (`segments_from`, what a run's plan did before 2026-11-28), B is
`planning.plan_partition` (the newest segment's footer only; the reader checks the others against their successors).
Prints the median wall time, the CPU time of this process and the S3 requests per partition plan.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kafscale_lakehouse.apps.workload import write_partition_segments
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import segment_store_from_config
from kafscale_lakehouse.engine.ingestion.planning import plan_partition
from kafscale_lakehouse.storage import SegmentStore, segments_from

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, SeaweedFS

PARTITIONS = 4
TOPIC = "plan-footers"


def every_footer(store: SegmentStore, partition: int) -> None:
    segments_from(store, TOPIC, partition, 0)


def newest_footer(store: SegmentStore, partition: int) -> None:
    plan_partition(store, TOPIC, partition, 0, 1 << 40, False, orphan_grace_seconds=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=25, help="new segments per partition (default 25)")
    parser.add_argument("--repeat", type=int, default=5, help="plans of every partition per A or B round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kafscale-plan-footers-") as directory:
        root = Path(directory)
        seaweedfs = SeaweedFS(root / "seaweedfs").start()
        try:
            s3 = seaweedfs.s3_client()
            for partition in range(PARTITIONS):
                for segment in write_partition_segments(root / "segments", record_count=40 * args.segments,
                                                        namespace="bench", topic=TOPIC, partition=partition,
                                                        base_offset=0, records_per_segment=40, codecs=("zstd",),
                                                        workload="realistic"):
                    for path in (segment.kfs_path, segment.index_path):
                        s3.upload_file(str(path), S3_BUCKET, path.relative_to(root / "segments").as_posix())
            config = parse_config({
                "s3": {"bucket": S3_BUCKET, "namespace": "bench", "endpoint": seaweedfs.s3_endpoint,
                       "region": REGION, "path_style": True, "access_key_id": ACCESS_KEY,
                       "secret_access_key": SECRET_KEY},
                "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri}, "warehouse": "s3://unused"},
                "offsets": {"backend": "local", "local_path": str(root / "offsets")},
                "mappings": [{"topic": TOPIC, "table": "bench.plan_footers"}]}, source="benchmarks/plan_footers.py")
            store = segment_store_from_config(config)
            plans = args.repeat * PARTITIONS
            for label, plan in (("A every footer", every_footer), ("B newest footer", newest_footer)) * 2:
                seconds = []
                before, cpu = store.request_counts, time.process_time()
                for _ in range(args.repeat):
                    for partition in range(PARTITIONS):
                        started = time.perf_counter()
                        plan(store, partition)
                        seconds.append(time.perf_counter() - started)
                cpu = time.process_time() - cpu
                used = store.request_counts - before
                print(f"{label:<16} {args.segments} segments: median {statistics.median(seconds) * 1000:6.1f} ms wall, "
                      f"{cpu / plans * 1000:5.1f} ms CPU per partition plan; S3 requests per plan: "
                      + ", ".join(f"{kind} {count / plans:g}" for kind, count in sorted(used.items())))
        finally:
            seaweedfs.stop()


if __name__ == "__main__":
    main()
