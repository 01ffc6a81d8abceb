"""What one S3 request costs the process that makes it: CPU and wall milliseconds per request, of the segment store
(`S3SegmentStore`: obstore) against a plain boto3 client making the same requests (what the store used before), on
SeaweedFS; and what each request costs SeaweedFS (its process's CPU).

Run from the repository root: `.venv/bin/python benchmarks/s3_requests.py [--objects 200] [--rounds 3]`.

At hundreds of topics these requests are most of a sensor tick (a listing page and a footer read per partition with
new segments) and a third of the engine's Python CPU (a GET per segment); the PUTs are what a producer (the demo's,
a benchmark's) spends on each segment it writes. Objects of 12,000 bytes (a segment of ~40
realistic records) under 4 partition folders; requests one after another in one thread; each kind warmed once, then
timed over `--rounds` rounds, both clients alternating.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kafscale_lakehouse.storage import S3SegmentStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import bench_servers
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

OBJECT_BYTES = 12_000
BUCKET = "s3-requests"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with bench_servers("s3-requests-", etcd=False) as servers:
        measure(servers.seaweedfs, args.objects, args.rounds)


def server_cpu_seconds(seaweedfs: SeaweedFS) -> float:
    """CPU seconds (user + system) SeaweedFS's `weed mini` process has used."""
    assert seaweedfs.proc is not None
    stat = Path(f"/proc/{seaweedfs.proc.pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(seaweedfs: SeaweedFS, objects: int, rounds: int) -> None:
    boto = seaweedfs.s3_client()
    boto.create_bucket(Bucket=BUCKET)
    store = S3SegmentStore(BUCKET, endpoint=seaweedfs.s3_endpoint, region=REGION, path_style=True,
                           access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    data = os.urandom(OBJECT_BYTES)
    keys = [f"ns/topic/{i % 4}/{i:020d}.kfs" for i in range(objects)]
    for key in keys:
        boto.put_object(Bucket=BUCKET, Key=key, Body=data)
    folders = [f"ns/topic/{p}/" for p in range(4)]
    middle = keys[objects // 2]

    def boto_get() -> None:
        for key in keys:
            body = boto.get_object(Bucket=BUCKET, Key=key)["Body"]
            body.read()
            body.close()

    footer = f"bytes={OBJECT_BYTES - 16}-{OBJECT_BYTES - 1}"

    def boto_footer() -> None:
        for key in keys:
            body = boto.get_object(Bucket=BUCKET, Key=key, Range=footer)["Body"]
            body.read()
            body.close()

    def boto_list() -> None:
        for folder in folders * 10:
            boto.list_objects_v2(Bucket=BUCKET, Prefix=folder, StartAfter=middle)

    def boto_put() -> None:
        for key in keys:
            boto.put_object(Bucket=BUCKET, Key=key, Body=data)

    def store_get() -> None:
        for key in keys:
            store.read(key)

    def store_footer() -> None:
        for key in keys:
            store.read_range(key, OBJECT_BYTES - 16, 16)

    def store_list() -> None:
        for folder in folders * 10:
            list(store.list_objects(folder, start_after=middle))

    def store_put() -> None:
        for key in keys:
            store.put(key, data)

    kinds: list[tuple[str, Callable[[], None], Callable[[], None], int]] = [
        ("GET (whole segment)", boto_get, store_get, len(keys)),
        ("ranged GET (16-byte footer)", boto_footer, store_footer, len(keys)),
        ("listing page (StartAfter)", boto_list, store_list, len(folders) * 10),
        ("PUT (whole segment)", boto_put, store_put, len(keys)),
    ]
    print(f"{objects} objects of {OBJECT_BYTES} bytes on SeaweedFS; load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{'request':30s} {'boto3 CPU':>10s} {'store CPU':>10s} {'boto3 wall':>11s} {'store wall':>11s} "
          f"{'server, boto3':>14s} {'server, store':>14s}  (ms)")
    for name, with_boto, with_store, requests in kinds:
        with_boto()
        with_store()
        cpu = {"boto3": 0.0, "store": 0.0}
        wall = {"boto3": 0.0, "store": 0.0}
        server = {"boto3": 0.0, "store": 0.0}
        for _ in range(rounds):
            for client, call in (("boto3", with_boto), ("store", with_store)):
                started, started_cpu, started_server = time.perf_counter(), time.process_time(), server_cpu_seconds(
                    seaweedfs)
                call()
                wall[client] += time.perf_counter() - started
                cpu[client] += time.process_time() - started_cpu
                server[client] += server_cpu_seconds(seaweedfs) - started_server
        per = 1000 / (rounds * requests)
        print(f"{name:30s} {cpu['boto3'] * per:10.2f} {cpu['store'] * per:10.2f} {wall['boto3'] * per:11.2f} "
              f"{wall['store'] * per:11.2f} {server['boto3'] * per:14.2f} {server['store'] * per:14.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
