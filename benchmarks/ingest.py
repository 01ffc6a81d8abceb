"""Ingest benchmark: pizza orders from SeaweedFS S3 into the SeaweedFS Iceberg REST catalog, end to end.

Run from the repository root: `.venv/bin/python benchmarks/ingest.py [--records N] [--partitions P] ...`.
Starts SeaweedFS (S3 + Iceberg REST) on loopback ports under a temporary directory, writes `--records` pizza orders
as KafScale segments of `--partitions` Kafka partitions (codecs in turn), uploads them, and lands the same
segments three times:
- reference, one process without Spark: boto3 downloads every completed segment, kafka-python's `DefaultRecordBatch`
  reader decodes it (cramjam codecs, as in decode.py), pyarrow's JSON reader parses the values into the mapped
  columns and one pyiceberg `table.append()` writes and commits everything, into a fresh table;
- floor, one process, the segment bytes already in memory (downloaded before timing): our decoder for the framing,
  CRCs, decompression and record fields (`decode_segment`), pyarrow's JSON reader for the mapped columns and
  `pyarrow.parquet` writing one zstd Parquet file per Kafka partition to a local temporary directory (no catalog,
  no commit, no network): the least work that turns these bytes into the table's Parquet;
- kafscale_lakehouse: `ingest_mapping` on a `local[2]` Spark session that is already started and has run one small
  warm-up ingestion (both timed and shown apart), offsets in a local sqlite file (or etcd with `--offsets etcd`),
  into a fresh table.
Prints, per pipeline, wall seconds, records/s, MB/s (of segment bytes), peak RSS of the driver and of its whole
process tree (Spark JVM and Python workers, sampled from /proc), CPU seconds of that tree and CPU utilisation; then
what each run committed (runs, byte limit per run, snapshots, data files, average data-file size), the speed ratios
ours/reference and ours/floor, and where our run spent its wall time (driver phases). Both tables must hold every
record exactly once and the floor's files every record, or the benchmark fails.

`--values avro`: the same orders (`--workload`: realistic by default, so unique trace headers and mixed
value sizes) with Avro values, `PIZZA_AVRO_SCHEMA` in the Confluent wire format (a nested list of toppings), the
schema in the test registry this process serves. Our pipeline maps the topic with `value_format: avro`; the reference
decodes each value with confluent-kafka's `AvroDeserializer` (per record) and builds the same nested columns with
`pa.Table.from_pylist`; the floor decodes them with our `AvroValueDecoder`. Our JSON path on the same logical data is
the default run (`--values json`) of the same orders. Needs the test extra (confluent-kafka[avro,schemaregistry]).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from pyiceberg.table import Table

from kafscale_lakehouse.apps.workload import (
    ALL_CODECS,
    PIZZA_AVRO_SCHEMA,
    PIZZA_COLUMNS,
    PIZZA_TOPIC,
    WORKLOADS,
    pizza_order_as_avro,
    write_partition_segments,
)
from kafscale_lakehouse.config import LakehouseConfig, ProcessorConfig, parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import IngestContext, ingest_mapping
from kafscale_lakehouse.engine.phases import phase_listener
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.format import Record, decode_segment
from kafscale_lakehouse.schema import ARROW_TYPES, record_arrow_schema, table_schema
from kafscale_lakehouse.value_formats.avro import AvroValueDecoder
from kafscale_lakehouse.value_formats.confluent_registry import ConfluentRegistryClient, ConfluentRegistrySettings
from kafscale_lakehouse.value_formats.framed import FramedValueSchemas
from kafscale_lakehouse.value_formats.registered_tables import RegisteredValueSchemas

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed
from kafscale_lakehouse_tests.support.kafka_python_reference import (
    cramjam_codec_patches,
    read_segment_records,
)
from kafscale_lakehouse_tests.support.process_usage import ProcessTreeSampler, ProcessUsage
from kafscale_lakehouse_tests.support.servers import (
    ACCESS_KEY,
    REGION,
    S3_BUCKET,
    SECRET_KEY,
    TABLE_BUCKET,
    Etcd,
    SeaweedFS,
)

log = logging.getLogger("benchmarks.ingest")

WARMUP_TOPIC = "warmup-pizzas"
WARMUP_RECORDS = 2_000
SPARK_TASK_SLOTS = 2
DEFAULT_RECORDS = 1_000_000
# What pyiceberg's `write_file` uses by default (write.parquet.compression-codec, write.parquet.row-group-limit),
# so that the floor writes the same Parquet as the table writers.
FLOOR_PARQUET_COMPRESSION = "zstd"
FLOOR_ROW_GROUP_ROWS = 1_048_576

# Avro orders: what every order has (notes is optional)
AVRO_VALUE_COLUMNS = ("order_id", "store_id", "date_ordered", "sauce", "cheese", "toppings")


@dataclass(frozen=True)
class AvroValues:
    """`--values avro`: the orders' schema as registered, and the table it lands in."""

    registry_url: str
    schema_id: int
    schema_text: str
    parsed_schema: Any  # fastavro's, to encode the orders

    @classmethod
    def register(cls, registry_url: str, topics: tuple[str, ...]) -> AvroValues:
        import fastavro

        client = ConfluentRegistryClient(ConfluentRegistrySettings(registry_url))
        text = json.dumps(PIZZA_AVRO_SCHEMA)
        [schema_id] = {client.register(f"{topic}-value", text) for topic in topics}
        return cls(registry_url, schema_id, text, fastavro.parse_schema(PIZZA_AVRO_SCHEMA))

    def transform(self, record: Record) -> Record:
        return pizza_order_as_avro(record, self.schema_id, self.parsed_schema)

    def registered(self, topic: str) -> RegisteredValueSchemas:
        client = ConfluentRegistryClient(ConfluentRegistrySettings(self.registry_url))
        return RegisteredValueSchemas(f"{topic}-value", tuple(client.subject_versions(f"{topic}-value")))

    def arrow_schema(self, topic: str) -> pa.Schema:
        """The table's Arrow schema: base columns, then the value fields."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        return schema_to_pyarrow(self.registered(topic).first_table_schema())

    def decoder(self, topic: str) -> AvroValueDecoder:
        value_schema = pa.schema(list(self.arrow_schema(topic))[len(record_arrow_schema(())):])
        return AvroValueDecoder(FramedValueSchemas(f"{topic}-value", {self.schema_id: self.schema_text},
                                                   value_schema))


# ------------------------------------------------------------------------------------------------ measuring


class PhaseTimer:
    """Wall seconds per phase of the engine's runs (`engine.phases`), summed while `listening()` is active."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def listening(self) -> contextlib.AbstractContextManager[None]:
        return phase_listener(self._add)

    def _add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds


@dataclass(frozen=True)
class WrittenFiles:
    """What a pipeline left behind: Iceberg snapshots (None: no table) and data files with their bytes on disk."""

    snapshots: int | None
    data_files: int
    data_file_bytes: int

    @property
    def average_file_megabytes(self) -> float:
        return self.data_file_bytes / self.data_files / 1e6 if self.data_files else 0.0


@dataclass
class PipelineFigures:
    name: str
    seconds: float
    usage: ProcessUsage
    written: WrittenFiles
    runs: int = 1
    max_bytes_per_run: int | None = None  # None: the pipeline has no per-run limit (reads everything at once)
    phases: dict[str, float] = field(default_factory=dict)

    def cpu_utilisation(self, cores: int) -> float:
        """Tree CPU seconds per wall second per core: 1.0 keeps every core busy for the whole run."""
        return self.usage.tree_cpu_seconds / self.seconds / cores


# ------------------------------------------------------------------------------------------------ workload


@dataclass(frozen=True)
class UploadedSegments:
    namespace: str
    topic: str
    kfs_keys: tuple[str, ...]
    kfs_bytes: int
    records_by_partition: dict[int, int]


def write_and_upload(s3, root: Path, *, namespace: str, topic: str, records: int, partitions: int,
                     records_per_segment: int, records_per_batch: int, codecs: tuple[str, ...],
                     workload: str, avro: AvroValues | None = None) -> UploadedSegments:
    """Write `records` pizza orders of `workload` spread over `partitions` as segments and upload them, `.kfs`
    before `.index`."""
    records_by_partition = {p: records // partitions + (1 if p < records % partitions else 0)
                            for p in range(partitions)}
    kfs_keys, kfs_bytes = [], 0
    for partition, count in records_by_partition.items():
        if count == 0:
            continue
        for segment in write_partition_segments(root, record_count=count, namespace=namespace, topic=topic,
                                                partition=partition, records_per_segment=records_per_segment,
                                                records_per_batch=records_per_batch, codecs=codecs,
                                                workload=workload,
                                                transform=avro.transform if avro is not None else None):
            for path in (segment.kfs_path, segment.index_path):
                s3.upload_file(str(path), S3_BUCKET, path.relative_to(root).as_posix())
            kfs_keys.append(segment.kfs_path.relative_to(root).as_posix())
            kfs_bytes += segment.kfs_path.stat().st_size
    return UploadedSegments(namespace, topic, tuple(kfs_keys), kfs_bytes,
                            {p: n for p, n in records_by_partition.items() if n})


# ------------------------------------------------------------------------------------------------ reference


def reference_ingest(s3, segments: UploadedSegments, table: Table, avro: AvroValues | None = None) -> None:
    """kafka-python decode + pyarrow JSON parsing (Avro: confluent-kafka's AvroDeserializer per record) + one
    pyiceberg append, all in this process."""
    columns: dict[str, list] = {name: [] for name in ("record_id", "partition", "offset", "timestamp_ms", "key",
                                                        "value", "headers")}
    for kfs_key in _completed_segment_keys(s3, f"{segments.namespace}/{segments.topic}/"):
        partition = int(kfs_key.rsplit("/", 2)[1])
        kfs = s3.get_object(Bucket=S3_BUCKET, Key=kfs_key)["Body"].read()
        for offset, timestamp_ms, key, value, headers in read_segment_records(kfs):
            columns["record_id"].append(f"{segments.topic}:{partition}:{offset}")
            columns["partition"].append(partition)
            columns["offset"].append(offset)
            columns["timestamp_ms"].append(timestamp_ms)
            columns["key"].append(key)
            columns["value"].append(value)
            # Go's encoding of the `headers` column; json.dumps writes the same for these ASCII headers.
            columns["headers"].append(json.dumps([{"key": k, "value": (v or b"").decode()} for k, v in headers],
                                                 separators=(",", ":")) if headers else "")
    values = pa.array(columns["value"], pa.binary())
    if avro is not None:
        arrow_schema = avro.arrow_schema(segments.topic)
        value_fields = list(arrow_schema)[len(record_arrow_schema(())):]
        value_columns = deserialize_avro_values(columns["value"], avro, segments.topic, pa.schema(value_fields))
    else:
        arrow_schema = record_arrow_schema(PIZZA_COLUMNS)
        mapped = parse_pizza_values(values)
        value_columns = [mapped.column(column.name).combine_chunks() for column in PIZZA_COLUMNS]
    row_count = len(values)
    arrays = [
        pa.array(columns["record_id"], pa.string()),
        pa.repeat(pa.scalar(segments.topic, pa.string()), row_count),
        pa.array(columns["partition"], pa.int32()),
        pa.array(columns["offset"], pa.int64()),
        pa.array(columns["timestamp_ms"], pa.int64()),
        pa.array(columns["key"], pa.binary()),
        values,
        pa.array(columns["headers"], pa.string()),
        *value_columns,
    ]
    table.append(pa.Table.from_arrays(arrays, schema=arrow_schema))


def deserialize_avro_values(values: list[bytes], avro: AvroValues, topic: str,
                            value_schema: pa.Schema) -> list[pa.Array]:
    """The reference's Avro decoding: confluent-kafka's AvroDeserializer per record (its schema fetched once from
    the registry and cached), then pyarrow from the decoded dicts."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(SchemaRegistryClient({"url": avro.registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)
    decoded = pa.Table.from_pylist([deserializer(value, context) for value in values], schema=value_schema)
    return [column.combine_chunks() for column in decoded.columns]


def parse_pizza_values(values: pa.Array) -> pa.Table:
    """The mapped pizza columns of JSON `values`, parsed by pyarrow's JSON reader from the newline-joined values."""
    joined = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), b"\n")
    mapped_schema = pa.schema([(column.name, ARROW_TYPES[column.type]) for column in PIZZA_COLUMNS])
    parse_options = pa_json.ParseOptions(explicit_schema=mapped_schema, unexpected_field_behavior="ignore")
    return pa_json.read_json(pa.BufferReader(joined.buffers()[2]), parse_options=parse_options)


def _completed_segment_keys(s3, prefix: str) -> list[str]:
    """`.kfs` keys under `prefix` whose `.index` exists (a complete segment), in key order."""
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix):
        keys.update(item["Key"] for item in page.get("Contents", ()))
    return sorted(key for key in keys if key.endswith(".kfs") and key[:-len(".kfs")] + ".index" in keys)


def run_reference(s3, segments: UploadedSegments, config: LakehouseConfig, table_name: str,
                  excluded_pids: set[int], avro: AvroValues | None = None) -> PipelineFigures:
    schema = table_schema(PIZZA_COLUMNS) if avro is None else avro.registered(segments.topic).first_table_schema()
    gc.collect()
    started = time.perf_counter()
    with ProcessTreeSampler(excluded_pids) as sampler:
        table = open_table(load_catalog(catalog_settings(config)), table_name, schema=schema, create_if_missing=True)
        reference_ingest(s3, segments, table, avro)
    seconds = time.perf_counter() - started
    return PipelineFigures("reference", seconds, sampler.usage, verify_table(table, segments, avro is not None))


# ------------------------------------------------------------------------------------------------ floor


def download_segments(s3, segments: UploadedSegments) -> dict[int, list[tuple[str, bytes]]]:
    """Kafka partition → [(key, `.kfs` bytes)] of every completed segment, in offset order (untimed)."""
    by_partition: dict[int, list[tuple[str, bytes]]] = defaultdict(list)
    for kfs_key in _completed_segment_keys(s3, f"{segments.namespace}/{segments.topic}/"):
        partition = int(kfs_key.rsplit("/", 2)[1])
        by_partition[partition].append((kfs_key, s3.get_object(Bucket=S3_BUCKET, Key=kfs_key)["Body"].read()))
    return dict(by_partition)


def floor_ingest(segments_in_memory: Mapping[int, list[tuple[str, bytes]]], topic: str, output: Path,
                 avro: AvroValues | None = None) -> list[Path]:
    """Decode, parse and write Parquet in this process: one zstd Parquet file per Kafka partition under `output`.

    The framing, CRCs, decompression (cramjam) and record fields are our decoder's (`decode_segment`), the fastest
    we have; the values are parsed by pyarrow's JSON reader into the mapped columns as the reference does (Avro:
    decoded by our `AvroValueDecoder`, the fastest Avro decoder we have).
    """
    schema = record_arrow_schema(PIZZA_COLUMNS) if avro is None else avro.arrow_schema(topic)
    decoder = avro.decoder(topic) if avro is not None else None
    paths = []
    for partition, kfs_segments in sorted(segments_in_memory.items()):
        tables = []
        for key, kfs in kfs_segments:
            records = decode_segment(kfs, key=key, topic=topic, partition=partition, verify_crc=True).records
            if decoder is not None:
                value_columns = decoder.decode(records.column("value").combine_chunks()).columns
            else:
                mapped = parse_pizza_values(records.column("value").combine_chunks())
                value_columns = [mapped.column(column.name) for column in PIZZA_COLUMNS]
            tables.append(pa.Table.from_arrays([*records.columns, *value_columns], schema=schema))
        path = output / f"partition-{partition}.parquet"
        with pq.ParquetWriter(path, schema, compression=FLOOR_PARQUET_COMPRESSION) as writer:
            writer.write_table(pa.concat_tables(tables), row_group_size=FLOOR_ROW_GROUP_ROWS)
        paths.append(path)
    return paths


def run_floor(s3, segments: UploadedSegments, output: Path, excluded_pids: set[int],
              avro: AvroValues | None = None) -> PipelineFigures:
    segments_in_memory = download_segments(s3, segments)
    output.mkdir(parents=True, exist_ok=True)
    gc.collect()
    started = time.perf_counter()
    with ProcessTreeSampler(excluded_pids) as sampler:
        paths = floor_ingest(segments_in_memory, segments.topic, output, avro)
    seconds = time.perf_counter() - started
    return PipelineFigures("floor", seconds, sampler.usage, verify_parquet_files(paths, segments))


# ------------------------------------------------------------------------------------------------ ours


def lakehouse_config(seaweedfs: SeaweedFS, etcd: Etcd | None, workdir: Path, *, s3_namespace: str,
                     table_namespace: str, max_bytes_per_run: int, target_file_size_bytes: int,
                     avro: AvroValues | None = None) -> LakehouseConfig:
    return parse_config(lakehouse_config_document(
        seaweedfs, etcd, workdir, s3_namespace=s3_namespace, table_namespace=table_namespace,
        max_bytes_per_run=max_bytes_per_run, target_file_size_bytes=target_file_size_bytes,
        tables={PIZZA_TOPIC: "pizzas_lakehouse", WARMUP_TOPIC: "warmup"}, avro=avro), source="benchmarks/ingest.py")


def lakehouse_config_document(seaweedfs: SeaweedFS, etcd: Etcd | None, workdir: Path, *, s3_namespace: str,
                              table_namespace: str, max_bytes_per_run: int, target_file_size_bytes: int,
                              tables: Mapping[str, str], offsets_name: str = "offsets",
                              avro: AvroValues | None = None) -> dict:
    """The config document of our pipeline, mapping topic → table name of `tables` (Avro values: value_format
    avro through the registry of `avro`)."""
    def mapping(topic: str, table: str) -> dict:
        values: dict[str, Any] = {"schema": {"columns": [asdict(column) for column in PIZZA_COLUMNS]}}
        if avro is not None:
            values = {"value_format": "avro", "schema_registry": {"url": avro.registry_url}}
        return {"topic": topic, "table": f"{table_namespace}.{table}", "create_table_if_missing": True, **values}

    offsets = {"backend": "etcd"} if etcd else {"backend": "local", "local_path": str(workdir / f"{offsets_name}.db")}
    return {
        "s3": {"bucket": S3_BUCKET, "namespace": s3_namespace, "endpoint": seaweedfs.s3_endpoint, "region": REGION,
               "path_style": True, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
        "iceberg": {"catalog": {"type": "rest", "uri": seaweedfs.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}"},
                    "warehouse": f"s3://{TABLE_BUCKET}"},
        "offsets": {**offsets, "key_prefix": f"bench-{s3_namespace}-{offsets_name}"},
        "etcd": {"endpoints": [etcd.endpoint]} if etcd else {},
        "discovery": {"mode": "s3"},
        "processor": {"max_bytes_per_run": max_bytes_per_run, "target_file_size_bytes": target_file_size_bytes},
        "spark": {"master": f"local[{SPARK_TASK_SLOTS}]", "conf": {"spark.ui.showConsoleProgress": "false"}},
        "mappings": [mapping(topic, table) for topic, table in tables.items()],
    }


def ingest_all(context: IngestContext, topic: str, expected_records: int) -> int:
    """Runs of `ingest_mapping` until every record is in (one run unless the per-run byte limit splits it)."""
    [mapping] = [m for m in context.config.mappings if m.topic == topic]
    ingested, runs = 0, 0
    while ingested < expected_records:
        result = ingest_mapping(context, mapping)
        runs += 1
        if result.records == 0:
            raise SystemExit(f"run {runs} of topic {topic} → {mapping.table} found nothing pending after "
                             f"{ingested} of {expected_records} records")
        ingested += result.records
    return runs


def run_ours(context: IngestContext, segments: UploadedSegments, excluded_pids: set[int]) -> PipelineFigures:
    timer = PhaseTimer()
    gc.collect()
    started = time.perf_counter()
    with ProcessTreeSampler(excluded_pids) as sampler, timer.listening():
        runs = ingest_all(context, segments.topic, sum(segments.records_by_partition.values()))
    seconds = time.perf_counter() - started
    log.info("kafscale_lakehouse ingested topic %s in %d run(s)", segments.topic, runs)
    [mapping] = [m for m in context.config.mappings if m.topic == segments.topic]
    table = load_catalog(context.catalog_settings).load_table(mapping.table)
    written = verify_table(table, segments, avro=mapping.value_format == "avro")
    return PipelineFigures("kafscale_lakehouse", seconds, sampler.usage, written, runs=runs,
                           max_bytes_per_run=context.config.processor.max_bytes_per_run, phases=dict(timer.seconds))


def run_whole_process(document: dict, workdir: Path, table_name: str, segments: UploadedSegments,
                      excluded_pids: set[int], avro: AvroValues | None = None) -> PipelineFigures:
    """A fresh `kafscale-lakehouse ingest --once` process over the topic, timed from spawn to exit."""
    config_path = workdir / "ingest-once.yaml"
    config_path.write_text(json.dumps(document))  # JSON is YAML
    log_path = workdir / "ingest-once.log"
    gc.collect()
    started = time.perf_counter()
    with ProcessTreeSampler(excluded_pids) as sampler, log_path.open("w") as output:
        completed = subprocess.run([sys.executable, "-m", "kafscale_lakehouse.apps.cli", "ingest", "--once", "--config",
                                    str(config_path)], stdout=output, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - started
    if completed.returncode:
        raise SystemExit(f"ingest --once exited with {completed.returncode}; its output is in {log_path}:\n"
                         + log_path.read_text()[-4000:])
    table = load_catalog(catalog_settings(parse_config(document))).load_table(table_name)
    return PipelineFigures("ingest --once", seconds, sampler.usage, verify_table(table, segments, avro is not None),
                           max_bytes_per_run=document["processor"]["max_bytes_per_run"])


def reference_import_seconds() -> float:
    """Start-up of a fresh interpreter importing what the reference uses, to compare whole processes."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import boto3, kafka, pyarrow.json, pyiceberg.catalog.rest, "
                    "pyiceberg.table, kafscale_lakehouse_tests.support.kafka_python_reference"], check=True,
                   cwd=Path(__file__).resolve().parent.parent)
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------------ checks, output


def verify_table(table: Table, segments: UploadedSegments, avro: bool = False) -> WrittenFiles:
    """Snapshots and data files of a fresh table, after checking it holds every record exactly once, with every
    mapped column filled (each pizza order has every field; `avro`: the Avro orders' fields, notes optional)."""
    table.refresh()
    name = ".".join(table.name())
    expected = sum(segments.records_by_partition.values())
    value_columns = AVRO_VALUE_COLUMNS if avro else tuple(c.name for c in PIZZA_COLUMNS)
    rows = table.scan(selected_fields=("record_id", "partition", *value_columns)).to_arrow()
    distinct = pc.count_distinct(rows.column("record_id")).as_py()
    per_partition = {row["values"]: row["counts"] for row in pc.value_counts(rows.column("partition")).to_pylist()}
    if rows.num_rows != expected or distinct != expected or per_partition != segments.records_by_partition:
        raise SystemExit(f"table {name} holds {rows.num_rows} rows ({distinct} distinct record ids, per partition "
                         f"{per_partition}); expected {expected} ({segments.records_by_partition})")
    nulls = {c: rows.column(c).null_count for c in value_columns if rows.column(c).null_count}
    if nulls:
        raise SystemExit(f"table {name} has nulls in mapped columns {nulls}; every pizza order has every field")
    # The scan's data files, not table.inspect.files(): pyiceberg's metrics table cannot hold a uuid column's bounds
    files = [task.file for task in table.scan().plan_files()]
    return WrittenFiles(len(table.snapshots()), len(files), sum(f.file_size_in_bytes for f in files))


def verify_parquet_files(paths: list[Path], segments: UploadedSegments) -> WrittenFiles:
    """The floor's files, after checking their row counts per Kafka partition (from the Parquet footers)."""
    per_partition = {int(path.stem.removeprefix("partition-")): pq.read_metadata(path).num_rows for path in paths}
    if per_partition != segments.records_by_partition:
        raise SystemExit(f"floor Parquet files hold {per_partition} rows per partition; expected "
                         f"{segments.records_by_partition}")
    return WrittenFiles(None, len(paths), sum(path.stat().st_size for path in paths))


def print_figures(figures: list[PipelineFigures], records: int, megabytes: float, cores: int) -> None:
    print(f"{'pipeline':>18} {'wall s':>7} {'records/s':>10} {'MB/s':>6} {'driver RSS':>11} {'tree RSS':>9} "
          f"{'tree CPU s':>10} {'CPU use':>7}")
    for f in figures:
        print(f"{f.name:>18} {f.seconds:7.2f} {records / f.seconds:10,.0f} {megabytes / f.seconds:6.1f} "
              f"{f.usage.peak_driver_rss / 2**20:8.0f} MB {f.usage.peak_tree_rss / 2**20:6.0f} MB "
              f"{f.usage.tree_cpu_seconds:10.1f} {100 * f.cpu_utilisation(cores):6.0f}%")
    print(f"  (CPU use: tree CPU s / wall s / {cores} cores; driver RSS at start: "
          + ", ".join(f"{f.name} {f.usage.start_driver_rss / 2**20:.0f} MB" for f in figures) + ")")


def print_commits(figures: list[PipelineFigures]) -> None:
    print("what each pipeline wrote:")
    print(f"{'pipeline':>18} {'runs':>4} {'byte limit/run':>14} {'snapshots':>9} {'data files':>10} "
          f"{'avg file MB':>11} {'total MB':>8}")
    for f in figures:
        limit = f"{f.max_bytes_per_run / 1e6:,.0f} MB" if f.max_bytes_per_run is not None else "none"
        snapshots = "-" if f.written.snapshots is None else str(f.written.snapshots)
        print(f"{f.name:>18} {f.runs:4d} {limit:>14} {snapshots:>9} {f.written.data_files:10d} "
              f"{f.written.average_file_megabytes:11.1f} {f.written.data_file_bytes / 1e6:8.1f}")


def print_ratios(reference: PipelineFigures, floor: PipelineFigures, ours: PipelineFigures) -> None:
    print(f"ratio ours/reference: {reference.seconds / ours.seconds:.2f}x (our speed / the reference's, end to end; "
          f"target >= 3x)")
    print(f"ratio ours/floor:     {100 * floor.seconds / ours.seconds:.0f}% (our speed / the floor's; "
          f"target >= 40%)")


def print_phases(figures: PipelineFigures) -> None:
    print(f"where {figures.name} spent its {figures.seconds:.2f} s (driver wall time):")
    accounted = 0.0
    for phase, seconds in sorted(figures.phases.items(), key=lambda item: -item[1]):
        print(f"  {phase:<40} {seconds:6.2f} s  {100 * seconds / figures.seconds:5.1f} %")
        accounted += seconds
    rest = figures.seconds - accounted
    print(f"  {'other (lease release, logging, checks)':<40} {rest:6.2f} s  {100 * rest / figures.seconds:5.1f} %")
    usage = figures.usage
    print(f"{figures.name} by process: CPU seconds, and RSS when the whole tree peaked")
    for kind in sorted(usage.cpu_seconds_by_kind.keys() | usage.peak_tree_rss_by_kind.keys(),
                       key=lambda kind: -usage.cpu_seconds_by_kind.get(kind, 0)):
        processes, rss = usage.peak_tree_rss_by_kind.get(kind, (0, 0))
        if rss == 0 and usage.cpu_seconds_by_kind.get(kind, 0) < 0.005:
            continue  # exited before the peak and used no CPU worth a line
        print(f"  {kind:<40} {usage.cpu_seconds_by_kind.get(kind, 0):6.2f} s  {rss / 2**20:6.0f} MB in {processes} "
              f"process{'es' if processes != 1 else ''}")


# ------------------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="realistic",
                        help="realistic: unique trace headers and keys, values of 100 B to 100 KB; friendly: the "
                             "same header on every record, ~175-byte values (kafscale_lakehouse.apps.workload)")
    parser.add_argument("--values", choices=("json", "avro"), default="json",
                        help="avro: the orders as Avro values through the Confluent-compatible test registry")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--records-per-segment", type=int, default=10_000)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--codecs", nargs="+", choices=ALL_CODECS, default=list(ALL_CODECS),
                        help="codecs used by the segments in turn (default: all)")
    parser.add_argument("--max-bytes-per-run", type=int,
                        default=ProcessorConfig.model_fields["max_bytes_per_run"].default,
                        help="processor.max_bytes_per_run: segment bytes one of our runs may read (more runs, "
                             "more snapshots, less memory when smaller)")
    parser.add_argument("--target-file-size-bytes", type=int,
                        default=ProcessorConfig.model_fields["target_file_size_bytes"].default,
                        help="processor.target_file_size_bytes of our pipeline: Parquet data file size before "
                             "rolling over to the next file")
    parser.add_argument("--offsets", choices=("local", "etcd"), default="local",
                        help="offsets backend of our pipeline: a sqlite file, or a Debian etcd started here")
    parser.add_argument("--whole-process", action="store_true",
                        help="also land the records with a fresh `kafscale-lakehouse ingest --once` process "
                             "(Spark start-up included) into another table, and time that process")
    parser.add_argument("--verbose", action="store_true", help="log at INFO level")
    args = parser.parse_args()
    if min(args.records, args.partitions, args.records_per_segment, args.records_per_batch,
           args.max_bytes_per_run, args.target_file_size_bytes) < 1:
        parser.error("--records, --partitions, --records-per-segment, --records-per-batch, --max-bytes-per-run and "
                     "--target-file-size-bytes must be positive")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for target, attribute, value in cramjam_codec_patches():
        setattr(target, attribute, value)
    run = uuid.uuid4().hex[:8]
    s3_namespace, table_namespace = f"bench-{run}", f"bench_{run}"
    with tempfile.TemporaryDirectory(prefix="kafscale-ingest-bench-") as workdir_name:
        workdir = Path(workdir_name)
        seaweedfs = SeaweedFS(workdir / "seaweedfs").start()
        etcd = Etcd(workdir / "etcd").start() if args.offsets == "etcd" else None
        try:
            servers = {server.proc.pid for server in (seaweedfs, etcd) if server is not None}
            benchmark(args, seaweedfs, etcd, workdir, s3_namespace, table_namespace, servers)
        finally:
            for server in (etcd, seaweedfs):
                if server is not None:
                    server.stop()


def benchmark(args: argparse.Namespace, seaweedfs: SeaweedFS, etcd: Etcd | None, workdir: Path, s3_namespace: str,
              table_namespace: str, excluded_pids: set[int]) -> None:
    s3 = seaweedfs.s3_client()
    registry = None
    if args.values == "avro":
        from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry

        registry = ConfluentCompatibleRegistry().start()
    try:
        benchmark_values(args, seaweedfs, etcd, workdir, s3_namespace, table_namespace, excluded_pids, s3,
                         AvroValues.register(registry.url, (PIZZA_TOPIC, WARMUP_TOPIC)) if registry else None)
    finally:
        if registry is not None:
            registry.stop()


def benchmark_values(args: argparse.Namespace, seaweedfs: SeaweedFS, etcd: Etcd | None, workdir: Path,
                     s3_namespace: str, table_namespace: str, excluded_pids: set[int], s3: Any,
                     avro: AvroValues | None) -> None:
    started = time.perf_counter()
    segments = write_and_upload(s3, workdir / "segments", namespace=s3_namespace, topic=PIZZA_TOPIC,
                                records=args.records, partitions=args.partitions,
                                records_per_segment=args.records_per_segment,
                                records_per_batch=args.records_per_batch, codecs=tuple(args.codecs),
                                workload=args.workload, avro=avro)
    # As many warm-up partitions as Spark task slots, so that every Python worker a task uses is started.
    warmup = write_and_upload(s3, workdir / "segments", namespace=s3_namespace, topic=WARMUP_TOPIC,
                              records=WARMUP_RECORDS, partitions=SPARK_TASK_SLOTS, records_per_segment=WARMUP_RECORDS,
                              records_per_batch=args.records_per_batch, codecs=tuple(args.codecs[:1]),
                              workload=args.workload, avro=avro)
    megabytes = segments.kfs_bytes / 1e6
    print(f"{args.records} pizza records ({args.workload} workload, {args.values} values) in "
          f"{len(segments.kfs_keys)} segments of {args.partitions} partitions "
          f"({megabytes:.1f} MB, codecs {', '.join(args.codecs)}, {args.records_per_batch} records per batch), "
          f"written and uploaded to SeaweedFS in {time.perf_counter() - started:.1f} s; {os.cpu_count()} cores; "
          f"load {os.getloadavg()[0]:.1f}")
    config = lakehouse_config(seaweedfs, etcd, workdir, s3_namespace=s3_namespace, table_namespace=table_namespace,
                              max_bytes_per_run=args.max_bytes_per_run,
                              target_file_size_bytes=args.target_file_size_bytes, avro=avro)

    # The reference and the floor first, before Spark exists, so that their process tree is this process alone.
    reference = run_reference(s3, segments, config, f"{table_namespace}.pizzas_reference", excluded_pids, avro)
    floor = run_floor(s3, segments, workdir / "floor", excluded_pids, avro)

    started = time.perf_counter()
    spark = get_spark_session(config.spark.master, dict(config.spark.conf), ui_enabled=False)
    session_seconds = time.perf_counter() - started
    try:
        context = IngestContext.from_config(config, spark)
        started = time.perf_counter()
        ingest_all(context, warmup.topic, sum(warmup.records_by_partition.values()))
        warmup_seconds = time.perf_counter() - started
        print(f"Spark session start ({config.spark.master}): {session_seconds:.1f} s; warm-up run "
              f"({WARMUP_RECORDS} records, starts the Python workers): {warmup_seconds:.1f} s (both not counted below)")
        ours = run_ours(context, segments, excluded_pids)
    finally:
        spark.stop()
    whole = None
    if args.whole_process:
        document = lakehouse_config_document(
            seaweedfs, etcd, workdir, s3_namespace=s3_namespace, table_namespace=table_namespace,
            max_bytes_per_run=args.max_bytes_per_run, target_file_size_bytes=args.target_file_size_bytes,
            tables={PIZZA_TOPIC: "pizzas_once"}, offsets_name="offsets-once", avro=avro)
        whole = run_whole_process(document, workdir, f"{table_namespace}.pizzas_once", segments, excluded_pids,
                                  avro)

    cores = os.cpu_count() or 1
    pipelines = [reference, floor, ours, *([whole] if whole else [])]
    print_figures(pipelines, args.records, megabytes, cores)
    print_commits(pipelines)
    print_ratios(reference, floor, ours)
    if whole:
        imports = reference_import_seconds()
        print(f"ratio whole processes: {(reference.seconds + imports) / whole.seconds:.2f}x (reference "
              f"{reference.seconds:.2f} s + {imports:.2f} s interpreter start and imports / `ingest --once` process "
              f"{whole.seconds:.2f} s, Spark start-up included; target >= 1.5x)")
    print(f"Spark session start {session_seconds:.1f} s; engine up + session start: ours "
          f"{ours.seconds + session_seconds:.2f} s, ratio {reference.seconds / (ours.seconds + session_seconds):.2f}x")
    print_phases(ours)


if __name__ == "__main__":
    main()
