"""A clean run in production shape: the CLI with a KafScale Go-processor config, S3 + REST catalog + etcd."""

from __future__ import annotations

import json

import yaml

from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.summary import OFFSETS_PROPERTY_PREFIX
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS, PIZZA_COLUMNS, IngestWorld
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, TABLE_BUCKET

PARTITION_SEGMENTS = {  # partition → (records, codecs of its segments in turn)
    0: (200, ("none", "gzip", "snappy", "lz4", "zstd")),
    1: (120, ("zstd", "lz4")),
    2: (90, ("snappy",)),
}


def go_processor_config(world: IngestWorld) -> dict:
    """`examples/go-processor.yaml` pointed at this world: only the Go processor's keys, no credentials in it."""
    document = yaml.safe_load((REPO_ROOT / "kafscale_lakehouse" / "examples" / "go-processor.yaml").read_text())
    document["s3"].update(bucket=S3_BUCKET, namespace=world.name, endpoint=world.seaweedfs.s3_endpoint,
                          region=REGION, path_style=True)
    del document["iceberg"]["catalog"]["token"]
    document["iceberg"]["catalog"].update(uri=world.seaweedfs.rest_uri, username=ACCESS_KEY, password=SECRET_KEY)
    document["iceberg"]["warehouse"] = f"s3://{TABLE_BUCKET}"
    document["offsets"].update(key_prefix=world.name, lease_ttl_seconds=LEASE_TTL_SECONDS)
    # The shared etcd has no broker metadata snapshot; `s3` discovery lists the bucket (`auto` would too, noisily).
    document["discovery"]["mode"] = "s3"
    document["etcd"]["endpoints"] = [f"http://{world.etcd_endpoint}"]
    document["mappings"] = [{"topic": world.topic, "table": world.table_name, "mode": "append",
                             "create_table_if_missing": True,
                             "schema": {"columns": [dict(c) for c in PIZZA_COLUMNS], "allow_type_widening": True}}]
    return document


def test_cli_once_with_a_go_processor_config_lands_every_offset_once(production_world, spark):
    world = production_world
    for partition, (records, codecs) in PARTITION_SEGMENTS.items():
        world.write_segments(partition, records, records_per_segment=40, codecs=codecs)
    config_path = world.write_config_file(go_processor_config(world))

    done = world.run_cli(config_path)

    assert done.returncode == 0, done.stderr[-4000:]
    table = world.assert_exactly_once(runs=1)
    ends = {p: records for p, (records, _) in PARTITION_SEGMENTS.items()}
    summary = table.current_snapshot().summary
    assert json.loads(summary[OFFSETS_PROPERTY_PREFIX + world.topic]) == {str(p): e for p, e in ends.items()}
    assert summary["added-records"] == str(sum(ends.values()))
    assert world.store_next_offsets() == ends
    assert world.lease_keys() == [], "leases are released when the run ends"

    # Nothing new: the next run (here in-process) reads nothing and commits nothing.
    [result] = ingest(world.config(), spark)
    assert result.records == 0 and result.snapshot_id is None
    world.assert_exactly_once(runs=1)
