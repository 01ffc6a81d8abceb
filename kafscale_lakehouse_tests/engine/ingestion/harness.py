"""One test's world for ingest runs: segments, a config, and the exactly-once checks every scenario ends with.

Two flavours share the checks: `production` (segments in the SeaweedFS bucket, the SeaweedFS Iceberg REST catalog,
offsets and leases in etcd) and `embedded` (a local segment directory, a sqlite catalog, the sqlite offsets store).
Every name a world uses (S3 namespace, topic, table namespace, offsets key prefix) is its own, so worlds share the
session's servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pyiceberg.table import Table

from kafscale_lakehouse.apps.workload import ALL_CODECS, WrittenSegment, partition_dir, write_partition_segments
from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.connections import catalog_settings, etcd_client_from_config, offset_store_from_config
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY, SKIPPED_PROPERTY_PREFIX, read_topic_offsets
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.format import Record, encode_segment
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore
from kafscale_lakehouse.offsets.records import decode_offset
from kafscale_lakehouse.storage import ObjectKind, segment_key
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, TABLE_BUCKET, SeaweedFS

CLI = Path(sys.executable).parent / "kafscale-lakehouse"
SUBPROCESS_TIMEOUT_SECONDS = 240
# Short, so a crashed run's lease expires quickly; renewals every second keep live runs safe.
LEASE_TTL_SECONDS = 3
PIZZA_COLUMNS = (
    {"name": "order_id", "type": "string", "required": True},
    {"name": "store_id", "type": "int"},
    {"name": "date_ordered", "type": "timestamp"},
)


@dataclass
class IngestWorld:
    kind: Literal["production", "embedded"]
    root: Path
    name: str  # unique per test: S3 namespace, offsets key prefix, and (as a Python identifier) table namespace
    topic: str
    seaweedfs: SeaweedFS | None = None  # production worlds
    etcd_endpoint: str | None = None  # production worlds
    segments: dict[int, dict[int, WrittenSegment]] = field(default_factory=dict)  # partition → base → segment

    # ---- config -------------------------------------------------------------------------------------------

    @property
    def table_name(self) -> str:
        # S3 Tables names allow lowercase letters, digits and underscores only.
        return f"{self.name.replace('-', '_')}.orders"

    @property
    def segments_root(self) -> Path:
        """Where segments are generated (the `segments.local_root` of an embedded world)."""
        return self.root / "segments"

    def config_document(self, *, lease_ttl_seconds: int = LEASE_TTL_SECONDS, **processor: Any) -> dict[str, Any]:
        """A config for this world with `processor.*` settings; S3 credentials are in the config (extension keys)."""
        mapping = {"topic": self.topic, "table": self.table_name, "create_table_if_missing": True,
                   "schema": {"columns": [dict(c) for c in PIZZA_COLUMNS]}}
        if self.kind == "embedded":
            document = {
                "segments": {"local_root": str(self.segments_root)},
                "s3": {"namespace": self.name},
                "iceberg": {"catalog": {"type": "sql", "uri": f"sqlite:///{self.root / 'catalog.db'}"},
                            "warehouse": str(self.root / "warehouse")},
                "offsets": {"backend": "local", "local_path": str(self.root / "offsets.db"),
                            "lease_ttl_seconds": lease_ttl_seconds, "key_prefix": self.name},
                "discovery": {"mode": "s3"},
            }
        else:
            document = {
                "s3": {"bucket": S3_BUCKET, "namespace": self.name, "endpoint": self.seaweedfs.s3_endpoint,
                       "region": REGION, "path_style": True, "access_key_id": ACCESS_KEY,
                       "secret_access_key": SECRET_KEY},
                "iceberg": {"catalog": {"type": "rest", "uri": self.seaweedfs.rest_uri, "username": ACCESS_KEY,
                                        "password": SECRET_KEY},
                            "warehouse": f"s3://{TABLE_BUCKET}"},
                "offsets": {"backend": "etcd", "lease_ttl_seconds": lease_ttl_seconds, "key_prefix": self.name},
                "discovery": {"mode": "s3"},
                "etcd": {"endpoints": [f"http://{self.etcd_endpoint}"]},
            }
        if processor:
            document["processor"] = dict(processor)
        document["mappings"] = [mapping]
        return document

    def config(self, document: Mapping[str, Any] | None = None, **processor: Any) -> LakehouseConfig:
        document = document if document is not None else self.config_document(**processor)
        return parse_config(document, source=f"<{self.name} config>", base_dir=self.root)

    def write_config_file(self, document: Mapping[str, Any] | None = None, **processor: Any) -> Path:
        path = self.root / "lakehouse.yaml"
        path.write_text(yaml.safe_dump(dict(document or self.config_document(**processor)), sort_keys=False))
        return path

    # ---- segments -----------------------------------------------------------------------------------------

    def write_segments(self, partition: int, record_count: int, *, records_per_segment: int = 50,
                       base_offset: int = 0, codecs: Iterable[str] = ALL_CODECS) -> list[WrittenSegment]:
        """Pizza-order segments of one partition, uploaded `.kfs` then `.index` (production) or left on disk."""
        written = write_partition_segments(
            self.segments_root, record_count=record_count, namespace=self.name, topic=self.topic,
            partition=partition, base_offset=base_offset, records_per_segment=records_per_segment,
            records_per_batch=10, codecs=tuple(codecs))
        for segment in written:
            self._store(partition, segment)
        return written

    def _store(self, partition: int, segment: WrittenSegment) -> None:
        self.segments.setdefault(partition, {})[segment.base_offset] = segment
        if self.kind == "production":
            for path in (segment.kfs_path, segment.index_path):  # `.kfs` first: the `.index` completes it
                self.put_object(path.relative_to(self.segments_root).as_posix(), path.read_bytes())

    def write_records(self, partition: int, base_offset: int, records: Sequence[Record]) -> WrittenSegment:
        """One segment holding exactly `records` (zstd batches of 10), stored like `write_segments` does."""
        encoded = encode_segment(records, base_offset=base_offset, codec="zstd", records_per_batch=10)
        directory = partition_dir(self.segments_root, namespace=self.name, topic=self.topic, partition=partition)
        directory.mkdir(parents=True, exist_ok=True)
        segment = WrittenSegment(directory / f"segment-{base_offset:020d}.kfs",
                                 directory / f"segment-{base_offset:020d}.index",
                                 encoded.base_offset, encoded.last_offset, "zstd")
        segment.kfs_path.write_bytes(encoded.kfs)
        segment.index_path.write_bytes(encoded.index)
        self._store(partition, segment)
        return segment

    def segment_object_key(self, partition: int, base_offset: int, kind: ObjectKind = ObjectKind.SEGMENT) -> str:
        return segment_key(self.name, self.topic, partition, base_offset, kind)

    def put_object(self, key: str, data: bytes) -> None:
        if self.kind == "production":
            self.seaweedfs.s3_client().put_object(Bucket=S3_BUCKET, Key=key, Body=data)
        else:
            (self.segments_root / key).write_bytes(data)

    def corrupt_segment(self, partition: int, base_offset: int) -> str:
        """Flip one byte inside the first batch's records (its CRC no longer matches); returns the `.kfs` key."""
        key = self.segment_object_key(partition, base_offset)
        data = bytearray(self.segments[partition][base_offset].kfs_path.read_bytes())
        data[32 + 70] ^= 0xFF
        self.put_object(key, bytes(data))
        return key

    def restore_segment(self, partition: int, base_offset: int) -> None:
        """Put the good copy of a segment back."""
        segment = self.segments[partition][base_offset]
        self.put_object(self.segment_object_key(partition, base_offset), segment.kfs_path.read_bytes())

    def delete_segment(self, partition: int, base_offset: int) -> range:
        """Delete both objects of a segment (retention before ingestion); returns its offsets."""
        segment = self.segments[partition].pop(base_offset)
        for kind in (ObjectKind.SEGMENT, ObjectKind.INDEX):
            key = self.segment_object_key(partition, base_offset, kind)
            if self.kind == "production":
                self.seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=key)
            else:
                (self.segments_root / key).unlink()
        return range(segment.base_offset, segment.last_offset + 1)

    def written_offsets(self) -> dict[int, set[int]]:
        """Every offset in the segments that exist now, per partition."""
        return {p: {o for s in by_base.values() for o in range(s.base_offset, s.last_offset + 1)}
                for p, by_base in self.segments.items()}

    # ---- what the runs left behind ------------------------------------------------------------------------

    def table(self) -> Table:
        return open_table(load_catalog(catalog_settings(self.config())), self.table_name)

    def table_rows(self, table: Table | None = None) -> list[tuple[str, int, int]]:
        """`(record_id, partition, offset)` of every row of this world's topic."""
        table = table or self.table()
        rows = table.scan(selected_fields=("record_id", "topic", "partition", "offset")).to_arrow().to_pylist()
        return [(r["record_id"], r["partition"], r["offset"]) for r in rows if r["topic"] == self.topic]

    def store_next_offsets(self) -> dict[int, int]:
        """Next offset per partition as the offsets store holds it (etcd: the raw `<prefix>/offsets/<topic>/<p>`)."""
        if self.kind == "embedded":
            store = LocalOffsetStore(self.root / "offsets.db", key_prefix=self.name)
            return {p: c.next_offset for p, c in store.committed_offsets(self.topic).items()}
        prefix = f"{self.name}/offsets/{self.topic}/"
        with EtcdClient([self.etcd_endpoint]) as client:
            return {int(e.key[len(prefix):]): decode_offset("etcd", e.key, e.value).next_offset
                    for e in client.get_prefix(prefix)}

    def lease_keys(self) -> list[str]:
        """The lease keys present in etcd (production worlds)."""
        with EtcdClient([self.etcd_endpoint]) as client:
            return [e.key for e in client.get_prefix(f"{self.name}/leases/")]

    def recorded_runs(self) -> list[str]:
        """Run ids with a record in the offsets store (engine/tables/run_files.py): runs whose files are not settled."""
        config = self.config()
        etcd = etcd_client_from_config(config) if config.offsets.backend == "etcd" else None
        try:
            with offset_store_from_config(config, etcd) as store:
                return [run_id for run_id, _ in store.recorded_runs(self.topic)]
        finally:
            if etcd is not None:
                etcd.close()

    def wait_for_leases_to_expire(self, timeout_seconds: float) -> None:
        """Until etcd drops the leases of a killed run (their TTL runs out)."""
        deadline = time.monotonic() + timeout_seconds
        while self.lease_keys():
            assert time.monotonic() < deadline, f"leases still held after {timeout_seconds}s: {self.lease_keys()}"
            time.sleep(0.2)

    def our_snapshots(self, table: Table | None = None) -> list:
        """Snapshots written by ingest runs (they carry `kafscale.run-id`), oldest first."""
        table = table or self.table()
        return [s for s in table.metadata.snapshots if s.summary is not None and s.summary.get(RUN_ID_PROPERTY)]

    def assert_exactly_once(self, *, runs: int, expected: Mapping[int, Iterable[int]] | None = None) -> Table:
        """Every expected offset is in the table exactly once (nothing else of the topic is), the table's
        `kafscale.offsets.<topic>` and the offsets store agree on the next offsets, and `runs` runs committed
        (one snapshot each). `expected` defaults to every offset of the segments that exist now."""
        expected_sets = {p: set(o) for p, o in (expected or self.written_offsets()).items()}
        expected_sets = {p: o for p, o in expected_sets.items() if o}
        table = self.table()
        rows = self.table_rows(table)
        duplicates = sorted(r for r, n in Counter(r[0] for r in rows).items() if n > 1)
        assert not duplicates, f"duplicated records: {duplicates[:10]}"
        found: dict[int, set[int]] = {}
        for record_id, partition, offset in rows:
            assert record_id == f"{self.topic}:{partition}:{offset}"
            found.setdefault(partition, set()).add(offset)
        for partition in sorted(set(found) | set(expected_sets)):
            missing = sorted(expected_sets.get(partition, set()) - found.get(partition, set()))
            extra = sorted(found.get(partition, set()) - expected_sets.get(partition, set()))
            assert not missing and not extra, (f"partition {partition}: missing offsets {missing[:10]}, "
                                               f"unexpected offsets {extra[:10]}")
        table_next = read_topic_offsets(table, self.topic)
        # A skipped gap moves the next offset past offsets that are not in the table, so compare with the end.
        assert table_next == {p: max(o) + 1 for p, o in expected_sets.items()}
        assert self.store_next_offsets() == table_next, "offsets store disagrees with the table"
        snapshots = self.our_snapshots(table)
        assert len(snapshots) == runs, [s.summary.additional_properties for s in snapshots]
        assert len({s.summary[RUN_ID_PROPERTY] for s in snapshots}) == runs, "a run committed more than once"
        return table

    def skipped_ranges(self, table: Table | None = None) -> list[dict[str, list[int]]]:
        """`kafscale.skipped.<topic>` of every snapshot that has it."""
        key = SKIPPED_PROPERTY_PREFIX + self.topic
        return [json.loads(s.summary[key]) for s in self.our_snapshots(table) if key in s.summary.additional_properties]

    def table_data_files(self, table: Table | None = None) -> set[str]:
        """Every object under the table's data location (production: listed in the warehouse bucket)."""
        table = table or self.table()
        location = table.location().rstrip("/") + "/data/"
        if self.kind == "embedded":
            root = Path(location.removeprefix("file://"))
            return {f"file://{p}" for p in root.rglob("*") if p.is_file()} if root.exists() else set()
        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        paginator = self.seaweedfs.s3_client().get_paginator("list_objects_v2")
        return {f"s3://{bucket}/{o['Key']}" for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", []) if not o["Key"].endswith("/")}  # SeaweedFS lists directories

    def referenced_data_files(self, table: Table | None = None) -> set[str]:
        table = table or self.table()
        return {task.file.file_path for task in table.scan().plan_files()}

    # ---- processes ----------------------------------------------------------------------------------------

    def subprocess_env(self) -> dict[str, str]:
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION,
                   PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.pop(name, None)
        return env

    def run_process(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=REPO_ROOT, env=self.subprocess_env(), capture_output=True, text=True,
                              timeout=SUBPROCESS_TIMEOUT_SECONDS)

    def run_cli(self, config_path: Path) -> subprocess.CompletedProcess:
        """`kafscale-lakehouse ingest --config F --once` in a process of its own."""
        return self.run_process(str(CLI), "ingest", "--config", str(config_path), "--once")

    def run_killed(self, config_path: Path, kill_point: str, actor: str = "ingest") -> subprocess.CompletedProcess:
        """`ingest --once` in a process of its own, SIGKILLed at `kill_point`: a point of the fault matrix's `actor`
        (engine/faults/actor.py; `upsert` for an upsert mapping), `before-iceberg-commit` / `after-iceberg-commit`
        (its `before-commit` / `after-commit`), or `renewing-lease` (crash_run); asserts it died there."""
        if kill_point == "renewing-lease":
            done = self.run_process(sys.executable, "-m", "kafscale_lakehouse_tests.engine.ingestion.crash_run",
                                    kill_point, "--config", str(config_path))
            reached = f"KILL POINT {kill_point}" in done.stderr
        else:
            from kafscale_lakehouse_tests.engine.faults.actor import command  # the actor imports the whole engine

            point = {"before-iceberg-commit": "before-commit", "after-iceberg-commit": "after-commit"}.get(
                kill_point, kill_point)
            signal_dir = self.root / f"kill-{actor}-{point}-{time.monotonic_ns()}"
            signal_dir.mkdir(parents=True)
            done = self.run_process(*command(actor, point, "kill", signal_dir,
                                             ["ingest", "--config", str(config_path), "--once"]))
            reached = (signal_dir / "reached").exists()
        assert done.returncode == -9 and reached, (
            f"not killed at {kill_point}: exit {done.returncode}, stderr:\n{done.stderr[-4000:]}")
        return done
