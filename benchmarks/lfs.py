"""LFS resolution benchmark: a topic where one record in ten is an LFS envelope of a 1 MB blob, resolved end to end.

Run from the repository root: `.venv/bin/python benchmarks/lfs.py [--records N] [--partitions P] [--concurrency C]`.
Starts SeaweedFS (S3 + Iceberg REST) on loopback ports under a temporary directory, writes `--records` pizza orders
as KafScale segments of `--partitions` partitions in which every tenth value is replaced by the envelope of a
`--blob-bytes` blob (random bytes, sha256) uploaded to a bucket of its own, and lands the topic with `ingest_mapping`
(`lfs.mode: resolve`, `store_metadata`, `validate_checksum`, `resolve_concurrency` C) on a `local[2]` Spark session
that has already run a small warm-up ingestion (not counted). Prints wall seconds, records/s, MB/s of blob bytes
resolved and of everything landed (segments + blobs), the peak RSS of the driver and of the whole process tree by
kind (the Spark JVM; the Python workers, which are the executors that fetch the blobs), and checks that every blob
landed byte for byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import logging
import os
import sys
import time
import uuid
from pathlib import Path

import pyarrow.compute as pc

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest_mapping
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.format.lfs import encode_envelope
from kafscale_lakehouse.storage import ObjectKind, segment_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.harness import bench_servers
from kafscale_lakehouse_tests.support.process_usage import ProcessTreeSampler
from kafscale_lakehouse_tests.support.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    SeaweedFS,
)

BLOB_BUCKET = "lfs-blobs"
TOPIC, WARMUP_TOPIC = "photos", "warmup-photos"
RECORDS_PER_SEGMENT = 500
SPARK_TASK_SLOTS = 2


def write_topic(s3, *, namespace: str, topic: str, records: int, partitions: int, blob_bytes: int) -> dict:
    """Segments of `records` orders over `partitions`, every tenth an envelope; returns {(partition, offset): sha256}
    of the blobs and the bytes written."""
    blobs, segment_bytes = {}, 0
    for partition in range(partitions):
        count = records // partitions
        for base in range(0, count, RECORDS_PER_SEGMENT):
            batch = pizza_orders(base, min(RECORDS_PER_SEGMENT, count - base), partition=partition)
            for i in range(0, len(batch), 10):
                offset = base + i
                blob = os.urandom(blob_bytes)
                key = f"{namespace}/{topic}/{partition}/{offset}.bin"
                s3.put_object(Bucket=BLOB_BUCKET, Key=key, Body=blob)
                batch[i] = dataclasses.replace(batch[i], value=encode_envelope(
                    BLOB_BUCKET, key, blob, content_type="application/octet-stream"))
                blobs[(partition, offset)] = hashlib.sha256(blob).hexdigest()
            encoded = encode_segment(batch, base_offset=base, codec="zstd", records_per_batch=100)
            for kind, data in ((ObjectKind.SEGMENT, encoded.kfs), (ObjectKind.INDEX, encoded.index)):
                s3.put_object(Bucket=S3_BUCKET, Key=segment_key(namespace, topic, partition, base, kind), Body=data)
            segment_bytes += len(encoded.kfs)
    return {"blobs": blobs, "segment_bytes": segment_bytes}


def config_for(seaweedfs: SeaweedFS, workdir: Path, namespace: str, concurrency: int, blob_bytes: int):
    def mapping(topic: str) -> dict:
        return {"topic": topic, "table": f"{namespace.replace('-', '_')}.{topic.replace('-', '_')}",
                "create_table_if_missing": True,
                "lfs": {"mode": "resolve", "max_inline_size": 2 * blob_bytes, "store_metadata": True,
                        "resolve_concurrency": concurrency}}
    return parse_config({
        "s3": {"bucket": S3_BUCKET, "namespace": namespace, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {"backend": "local", "local_path": str(workdir / "offsets.db"), "key_prefix": f"bench-{namespace}"},
        "discovery": {"mode": "s3"},
        "spark": {"master": f"local[{SPARK_TASK_SLOTS}]", "conf": {"spark.ui.showConsoleProgress": "false"}},
        "mappings": [mapping(TOPIC), mapping(WARMUP_TOPIC)],
    }, source="benchmarks/lfs.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--blob-bytes", type=int, default=1 << 20)
    parser.add_argument("--concurrency", type=int, default=4, help="lfs.resolve_concurrency")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    namespace = f"lfs-{uuid.uuid4().hex[:8]}"
    with bench_servers("kafscale-lfs-bench-", etcd=False) as servers:
        benchmark(args, servers.seaweedfs, servers.workdir, namespace)


def benchmark(args: argparse.Namespace, seaweedfs: SeaweedFS, workdir: Path, namespace: str) -> None:
    s3 = seaweedfs.s3_client()
    s3.create_bucket(Bucket=BLOB_BUCKET)
    started = time.perf_counter()
    written = write_topic(s3, namespace=namespace, topic=TOPIC, records=args.records, partitions=args.partitions,
                          blob_bytes=args.blob_bytes)
    write_topic(s3, namespace=namespace, topic=WARMUP_TOPIC, records=20 * SPARK_TASK_SLOTS,
                partitions=SPARK_TASK_SLOTS, blob_bytes=1024)
    blob_total = len(written["blobs"]) * args.blob_bytes
    print(f"{args.records} records in {args.partitions} partitions, {len(written['blobs'])} of them envelopes of "
          f"{args.blob_bytes} B blobs ({blob_total / 1e6:.0f} MB of blobs, {written['segment_bytes'] / 1e6:.1f} MB of "
          f"segments), uploaded to SeaweedFS in {time.perf_counter() - started:.1f} s; {os.cpu_count()} cores; "
          f"resolve_concurrency {args.concurrency}")
    config = config_for(seaweedfs, workdir, namespace, args.concurrency, args.blob_bytes)
    spark = get_spark_session(config.spark.master, dict(config.spark.conf), ui_enabled=False)
    try:
        context = IngestContext.from_config(config, spark)
        ingest_mapping(context, config.mappings[1])  # warm-up: starts the Python workers
        gc.collect()
        started = time.perf_counter()
        with ProcessTreeSampler({seaweedfs.proc.pid}) as sampler:
            result = ingest_mapping(context, config.mappings[0])
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    assert result.records == args.records, f"landed {result.records} of {args.records} records"
    table = open_table(load_catalog(catalog_settings(config)), config.mappings[0].table)
    landed = table.scan(row_filter="lfs_key IS NOT NULL", selected_fields=("partition", "offset", "value")) \
        .to_arrow()
    assert landed.num_rows == len(written["blobs"]), f"{landed.num_rows} resolved rows"
    assert pc.sum(pc.binary_length(landed.column("value"))).as_py() == blob_total
    columns = (landed.column(n).to_pylist() for n in ("partition", "offset", "value"))
    for partition, offset, value in zip(*columns, strict=True):
        assert hashlib.sha256(value).hexdigest() == written["blobs"][(partition, offset)]
    usage = sampler.usage
    total_mb = (blob_total + written["segment_bytes"]) / 1e6
    print(
        f"resolve run: {seconds:.1f} s wall, {args.records / seconds:,.0f} records/s, "
        f"{blob_total / 1e6 / seconds:.1f} MB/s of blobs ({total_mb / seconds:.1f} MB/s with the segments)"
    )
    print(f"peak RSS: driver {usage.peak_driver_rss / 2**20:.0f} MB, whole tree {usage.peak_tree_rss / 2**20:.0f} MB")
    for kind, (processes, rss) in sorted(usage.peak_tree_rss_by_kind.items(), key=lambda item: -item[1][1]):
        print(f"  {kind:<32} {rss / 2**20:6.0f} MB in {processes} process(es)")
    print("every blob landed byte for byte (sha256 checked per row)")


if __name__ == "__main__":
    main()
