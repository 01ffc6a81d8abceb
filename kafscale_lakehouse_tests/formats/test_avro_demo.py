"""The demo's Avro topic: `demo-producer --avro` writes the pizza orders in the Confluent wire format to the
lakehouse.yaml mapping with `value_format: avro` (their schema registered in the mapping's registry, which `make demo`
serves), and a run lands them in `rpc.pizzas_avro` with the nested toppings list, kafka_timestamp and an hourly
partition spec. Without a registry the producer names the URL it could not reach."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafscale_lakehouse.apps.demo_producer import run_demo_producer
from kafscale_lakehouse.apps.workload import PIZZA_AVRO_SCHEMA
from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry
from kafscale_lakehouse_tests.support.servers import free_ports

AVRO_TOPIC = "completed-pizzas-avro"


def test_demo_producer_writes_the_avro_topic_that_lands_typed_and_nested(tmp_path: Path, spark) -> None:
    [port] = free_ports(1)
    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text((REPO_ROOT / "lakehouse.yaml").read_text().replace("127.0.0.1:18081", f"127.0.0.1:{port}"))
    config = load_config(config_path)

    registry = ConfluentCompatibleRegistry(port).start()
    try:
        written = run_demo_producer(config, partitions=2, records_per_segment=20, rounds=1, avro=True)
    finally:
        registry.stop()
    assert written == 4  # a segment per partition of each topic

    # `make demo` starts a fresh registry each time; it gives the schema the same id (ids are deterministic).
    registry = ConfluentCompatibleRegistry(port).start()
    try:
        assert registry.register(f"{AVRO_TOPIC}-value", json.dumps(PIZZA_AVRO_SCHEMA)) == 1
        [result] = ingest(config, spark, topics=[AVRO_TOPIC])
    finally:
        registry.stop()
    assert result.records == 40 and not result.failed

    table = open_table(load_catalog(catalog_settings(config)), "rpc.pizzas_avro")
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["order_id"] == "uuid" and types["date_ordered"] == "timestamptz"
    assert types["kafka_timestamp"] == "timestamptz"
    assert [(f.name, str(f.field_type)) for f in table.schema().find_field("toppings").field_type.element_field
            .field_type.fields] == [("kind", "string"), ("name", "string")]
    assert [str(f.transform) for f in table.spec().fields] == ["hour"]
    rows = table.scan().to_arrow().to_pylist()
    assert len(rows) == 40 and all(r["kafka_timestamp"] is not None for r in rows)
    assert all(t["kind"] in ("MEAT", "VEGGIE") for r in rows for t in r["toppings"])


def test_demo_producer_without_its_registry_names_the_url(tmp_path: Path) -> None:
    [port] = free_ports(1)
    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text((REPO_ROOT / "lakehouse.yaml").read_text().replace("127.0.0.1:18081", f"127.0.0.1:{port}"))

    with pytest.raises(ValueError, match=rf"no schema registry answers at http://127.0.0.1:{port} for topic "
                                         f"{AVRO_TOPIC}"):
        run_demo_producer(load_config(config_path), partitions=1, records_per_segment=5, rounds=1, avro=True)
