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

`--values avro`: the same realistic orders (unique trace headers, keys, mixed sizes through the free-text
`notes`) with Avro values, `PIZZA_AVRO_SCHEMA` in the Confluent wire format (a nested list of toppings, a uuid, a
timestamp), schema in the test registry served by this process; three decoders, from segment bytes to Arrow columns
of the values: ours (`decode_segment`, then `AvroValueDecoder` per segment into the table's nested types: the
columnar decoder, value_formats/avro_columns.py and its C extension, straight from Avro binary to Arrow buffers), the
reference (kafka-python's reader, then confluent-kafka's `AvroDeserializer` per record and `pa.Table.from_pylist`
into the same types), and our JSON path on the same orders as JSON values (`decode_segment`, then
`JsonColumnCoercer` into the flat columns the JSON mapping has: the toppings are the flat meats/veggies fields
there). Needs the test extra (confluent-kafka[avro,schemaregistry]).
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kafscale_lakehouse_tests.support: not installed

STARTED = time.perf_counter()  # as early as we can: interpreter start is not counted, imports are

DECODERS = ("kafscale_lakehouse", "kafka-python")
AVRO_DECODERS = ("kafscale_lakehouse", "confluent-kafka", "kafscale_lakehouse-json")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
TOPIC = "completed-pizzas"


def avro_decoder(name: str, registry_url: str) -> Callable[[list[tuple[str, bytes]]], int]:
    """The decode function of an `--values avro` decoder: segment bytes → records → value columns; its row count."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema

    from kafscale_lakehouse.apps.workload import PIZZA_AVRO_SCHEMA, PIZZA_COLUMNS
    from kafscale_lakehouse.format import decode_segment
    from kafscale_lakehouse.schema import JsonColumnCoercer
    from kafscale_lakehouse.schema.columns import Column
    from kafscale_lakehouse.value_formats.avro import AvroValueDecoder, avro_value_fields, parse_avro_schema
    from kafscale_lakehouse.value_formats.confluent_registry import ConfluentRegistryClient, ConfluentRegistrySettings
    from kafscale_lakehouse.value_formats.framed import FramedValueSchemas

    text = json.dumps(PIZZA_AVRO_SCHEMA)
    value_schema = schema_to_pyarrow(Schema(*avro_value_fields(parse_avro_schema(text, what="bench"), what="bench")))
    if name == "kafscale_lakehouse":
        [version] = ConfluentRegistryClient(ConfluentRegistrySettings(registry_url)).subject_versions(f"{TOPIC}-value")
        ours = AvroValueDecoder(FramedValueSchemas(f"{TOPIC}-value", {version.schema_id: version.text}, value_schema))

        def decode(segments: list[tuple[str, bytes]]) -> int:
            rows = 0
            for key, kfs in segments:
                values = decode_segment(kfs, key=key, topic=TOPIC, partition=0, verify_crc=True).records
                decoded = ours.decode(values.column("value"))
                assert decoded.invalid_reasons.null_count == len(decoded.invalid_reasons), "a value did not decode"
                rows += len(decoded.columns[0])
            return rows
    elif name == "kafscale_lakehouse-json":
        coercer = JsonColumnCoercer((*PIZZA_COLUMNS, Column("notes", "string")))

        def decode(segments: list[tuple[str, bytes]]) -> int:
            rows = 0
            for key, kfs in segments:
                values = decode_segment(kfs, key=key, topic=TOPIC, partition=0, verify_crc=True).records
                rows += len(coercer.coerce(values.column("value")).columns["order_id"])
            return rows
    else:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        from kafscale_lakehouse_tests.support.kafka_python_reference import cramjam_codec_patches, read_segment_records
        for target, attribute, value in cramjam_codec_patches():
            setattr(target, attribute, value)
        deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
        context = SerializationContext(TOPIC, MessageField.VALUE)

        def decode(segments: list[tuple[str, bytes]]) -> int:
            rows = 0
            for _, kfs in segments:
                # read_segment_records validates each batch CRC and touches every field of every record.
                orders = [deserializer(record[3], context) for record in read_segment_records(kfs)]
                rows += pa.Table.from_pylist(orders, schema=value_schema).num_rows
            return rows
    return decode


def write_avro_workload(directory: Path, *, records: int, records_per_segment: int, records_per_batch: int,
                        registry_url: str) -> list[tuple[str, str, str]]:
    """The realistic orders as segments of Avro values (`avro/`) and of their JSON values (`json/`), codecs in
    turn; the manifest rows (codec, path, decoder)."""
    import fastavro

    from kafscale_lakehouse.apps.workload import PIZZA_AVRO_SCHEMA, pizza_order_as_avro, pizza_orders
    from kafscale_lakehouse.format import encode_segment
    from kafscale_lakehouse.value_formats.confluent_registry import ConfluentRegistryClient, ConfluentRegistrySettings

    schema_id = ConfluentRegistryClient(ConfluentRegistrySettings(registry_url)).register(
        f"{TOPIC}-value", json.dumps(PIZZA_AVRO_SCHEMA))
    parsed = fastavro.parse_schema(PIZZA_AVRO_SCHEMA)
    manifest = []
    for number, first in enumerate(range(0, records, records_per_segment)):
        codec = CODECS[number % len(CODECS)]
        orders = pizza_orders(first, min(records_per_segment, records - first), workload="realistic")
        for kind, batch in (("avro", [pizza_order_as_avro(r, schema_id, parsed) for r in orders]), ("json", orders)):
            path = Path(kind, f"segment-{first:020d}.kfs")
            (directory / kind).mkdir(exist_ok=True)
            segment = encode_segment(batch, base_offset=first, codec=codec, records_per_batch=records_per_batch)
            (directory / path).write_bytes(segment.kfs)
            manifest.extend((codec, str(path), decoder) for decoder in AVRO_DECODERS
                            if (kind == "json") == decoder.endswith("-json"))
    return manifest


def serve_decoder(name: str, directory: Path, registry_url: str | None = None) -> None:
    """In a fresh process: import `name`'s decoder, load the segments, decode them all once (cold), then decode
    the segments of the codec named on each stdin line (warm), answering each line with a JSON line."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a Spark task gets
    manifest = json.loads((directory / "manifest.json").read_text())
    if registry_url is not None:  # --values avro
        decode = avro_decoder(name, registry_url)
        manifest = [(codec, path) for codec, path, decoder in manifest if decoder == name]
    elif name == "kafscale_lakehouse":
        from kafscale_lakehouse.format import decode_segment

        def decode(segments: list[tuple[str, bytes]]) -> int:
            return sum(decode_segment(kfs, key=key, topic="completed-pizzas", partition=0,
                                      verify_crc=True).records.num_rows for key, kfs in segments)
    else:
        from kafscale_lakehouse_tests.support.kafka_python_reference import (
            cramjam_codec_patches,
            read_segment_records,
        )
        for target, attribute, value in cramjam_codec_patches():
            setattr(target, attribute, value)

        def decode(segments: list[tuple[str, bytes]]) -> int:
            # read_segment_records validates each batch CRC and touches every field of every record.
            return sum(len(read_segment_records(kfs)) for _, kfs in segments)
    imported = time.perf_counter()
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
    parser.add_argument("--values", choices=("json", "avro"), default="json",
                        help="avro: the realistic orders as Avro values against the reference and our JSON path")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--records-per-segment", type=int, default=10_000)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5, help="warm pairs per codec")
    parser.add_argument("--child", choices=(*DECODERS, *AVRO_DECODERS), help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--registry-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        serve_decoder(args.child, args.directory, args.registry_url)
        return

    from kafscale_lakehouse.apps.workload import write_partition_segments
    from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry

    decoders = AVRO_DECODERS if args.values == "avro" else DECODERS
    registry = ConfluentCompatibleRegistry().start() if args.values == "avro" else None
    with tempfile.TemporaryDirectory() as root:
        directory = Path(root)
        if registry is not None:
            manifest = write_avro_workload(directory, records=args.records,
                                           records_per_segment=args.records_per_segment,
                                           records_per_batch=args.records_per_batch, registry_url=registry.url)
            written_codecs = {codec for codec, _, _ in manifest}
            sizes = {kind: sum(p.stat().st_size for p in (directory / kind).iterdir()) / 1e6
                     for kind in ("avro", "json")}
            description = (f"Avro values {sizes['avro']:.1f} MB, the same orders as JSON {sizes['json']:.1f} MB; "
                           f"segments of {args.records_per_segment}")
        else:
            written = write_partition_segments(directory, record_count=args.records, codecs=CODECS,
                                               records_per_segment=args.records_per_segment,
                                               records_per_batch=args.records_per_batch, workload=args.workload)
            manifest = [(segment.codec, str(segment.kfs_path.relative_to(directory))) for segment in written]
            written_codecs = {segment.codec for segment in written}
            description = (f"{len(written)} segments "
                           f"({sum(segment.kfs_path.stat().st_size for segment in written) / 1e6:.1f} MB)")
        (directory / "manifest.json").write_text(json.dumps(manifest))
        print(f"{args.records} pizza records ({args.workload} workload, {args.values} values) in {description}, "
              f"codecs {', '.join(CODECS)}, {args.records_per_batch} records per batch, one core; warm: the "
              f"decoders in turn, {args.repeat} rounds, medians; load {os.getloadavg()[0]:.1f}", flush=True)
        children, cold = {}, {}
        for name in decoders:  # one after the other, so that each cold figure has the core to itself
            command = [sys.executable, __file__, "--child", name, "--directory", str(directory)]
            if registry is not None:
                command += ["--registry-url", registry.url]
            children[name] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            cold[name] = json.loads(children[name].stdout.readline())
        codecs = ["all", *(codec for codec in CODECS if codec in written_codecs)]
        warm: dict[str, dict[str, list[dict]]] = {codec: {name: [] for name in decoders} for codec in codecs}
        for _ in range(args.repeat):
            for codec, by_decoder in warm.items():
                for name, child in children.items():
                    child.stdin.write(codec + "\n")
                    child.stdin.flush()
                    by_decoder[name].append(json.loads(child.stdout.readline()))
        for child in children.values():
            child.stdin.close()
            child.wait()
    if registry is not None:
        registry.stop()

    for name in decoders:
        if cold[name]["rows"] != args.records:
            raise SystemExit(f"{name} decoded {cold[name]['rows']} records, expected {args.records}")
    for name, figures in cold.items():
        peak = max(run["peak_rss_mb"] for by_decoder in warm.values() for run in by_decoder[name])
        print(f"  {name:>18}: cold {figures['cold_s']:6.2f} s ({args.records / figures['cold_s'] / 1e3:7.1f} k "
              f"records/s) after {figures['import_s']:.2f} s of interpreter start and imports; peak RSS {peak:.0f} MB")
    whole = {name: figures["import_s"] + figures["cold_s"] for name, figures in cold.items()}
    ours = decoders[0]
    for other in decoders[1:]:
        print(f"  {'cold ratio':>18}: {cold[other]['cold_s'] / cold[ours]['cold_s']:.2f}x {other}'s time; whole "
              f"process (imports + cold decode): {whole[other] / whole[ours]:.2f}x")
    for codec, by_decoder in warm.items():
        if len({run["rows"] for runs in by_decoder.values() for run in runs}) != 1:
            raise SystemExit(f"decoders disagree on the record count of {codec}: {by_decoder}")
        print("all codecs, warm" if codec == "all" else f"{codec} only, warm")
        for name, runs in by_decoder.items():
            seconds = statistics.median(run["seconds"] for run in runs)
            print(f"  {name:>18}: {seconds:7.3f} s  {runs[0]['rows'] / seconds / 1e3:8.1f} k records/s  "
                  f"{runs[0]['megabytes'] / seconds:7.1f} MB/s")
        for other in decoders[1:]:
            ratios = [theirs["seconds"] / mine["seconds"] for mine, theirs in zip(by_decoder[ours], by_decoder[other],
                                                                                   strict=True)]
            print(f"  {'ratio':>18}: {statistics.median(ratios):.2f}x (our speed / {other}'s, median of rounds; "
                  f"{min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
