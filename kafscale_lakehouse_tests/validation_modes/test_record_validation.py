"""What a run resolves before reading: columns (mapping or registry), the JSON Schema, the dead-letter table."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.connections import schema_registry_client
from kafscale_lakehouse.engine.ingestion.validation import resolve_record_validation
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.value_formats.registry import SchemaNotFoundError, SchemaRegistryUnavailableError
from kafscale_lakehouse_tests.support.servers import free_ports
from kafscale_lakehouse_tests.validation_modes.faults import PIZZA_SCHEMA, serve_schema

TOPIC = "stage-pizzas"


def config(base_url: str | None, mode: str = "lenient", **mapping):
    document = {
        "segments": {"local_root": "segments"},
        "iceberg": {"catalog": {"type": "sql", "uri": "sqlite:///catalog.db"}, "warehouse": "warehouse"},
        "offsets": {"backend": "local", "local_path": "offsets.db"},
        "schema": {"mode": mode, **({"registry": {"base_url": base_url, "timeout_seconds": 1}} if base_url else {})},
        "mappings": [{"topic": TOPIC, "table": "rpc.pizzas", **mapping}],
    }
    return parse_config(document, source="<test config>", base_dir=Path.cwd())


def test_lenient_validates_against_the_registry_schema_into_the_default_dead_letter_table(registry):
    serve_schema(registry, TOPIC)
    lakehouse = config(registry.base_url, schema={"columns": [{"name": "order_id", "type": "string"}]})

    validation = resolve_record_validation(lakehouse, lakehouse.mappings[0], schema_registry_client(lakehouse))

    assert validation.json_schema.document == PIZZA_SCHEMA
    assert validation.json_schema.source == f"{registry.base_url}/{TOPIC}.json"
    assert validation.columns == (Column(name="order_id", type="string"),)
    assert validation.dead_letter_table == "rpc.pizzas_dead_letters"


def test_registry_columns_come_from_the_topic_schema(registry):
    serve_schema(registry, TOPIC)
    lakehouse = config(registry.base_url, mode="off")  # no columns: schema.source resolves to registry

    validation = resolve_record_validation(lakehouse, lakehouse.mappings[0], schema_registry_client(lakehouse))

    assert validation.json_schema is None and validation.dead_letter_table is None
    assert validation.columns == (
        Column(name="date_ordered", type="string"), Column(name="order_id", type="string", required=True),
        Column(name="sauce", type="string"), Column(name="store_id", type="long", required=True))


@pytest.mark.parametrize("mode, configured, expected", [
    ("strict", "rpc.bad_pizzas", None),  # strict never diverts: invalid records fail the run
    ("off", "rpc.bad_pizzas", "rpc.bad_pizzas"),  # mode off: coercion failures go to a configured table
    ("off", None, None),
    ("lenient", "rpc.bad_pizzas", "rpc.bad_pizzas"),
])
def test_which_modes_divert_invalid_records(registry, mode, configured, expected):
    serve_schema(registry, TOPIC)
    mapping = {"schema": {"columns": [{"name": "order_id", "type": "string"}]}}
    if configured:
        mapping["dead_letter_table"] = configured
    lakehouse = config(registry.base_url, mode=mode, **mapping)

    validation = resolve_record_validation(lakehouse, lakehouse.mappings[0], schema_registry_client(lakehouse))

    assert validation.dead_letter_table == expected
    assert (validation.json_schema is not None) == (mode != "off")


def test_a_topic_the_registry_does_not_know_is_an_infrastructure_error(registry):
    lakehouse = config(registry.base_url)

    with pytest.raises(SchemaNotFoundError, match=f"no schema for topic '{TOPIC}'.*answered 404"):
        resolve_record_validation(lakehouse, lakehouse.mappings[0], schema_registry_client(lakehouse))


def test_a_registry_that_is_down_is_an_infrastructure_error():
    [port] = free_ports(1)  # nothing listens there
    lakehouse = config(f"http://127.0.0.1:{port}/schemas")
    client = schema_registry_client(lakehouse)

    with pytest.raises(SchemaRegistryUnavailableError, match=f"http://127.0.0.1:{port}/schemas/{TOPIC}.json failed"):
        resolve_record_validation(lakehouse, lakehouse.mappings[0], client)


def test_a_default_dead_letter_table_that_is_another_mappings_table_is_a_config_error(registry):
    serve_schema(registry, TOPIC)
    lakehouse = config(registry.base_url, schema={"columns": [{"name": "order_id", "type": "string"}]})
    other = lakehouse.mappings[0].model_copy(update={"topic": "other", "table": "rpc.pizzas_dead_letters"})
    lakehouse.mappings.append(other)

    with pytest.raises(ConfigError, match=r"the default 'rpc\.pizzas_dead_letters' is the table of the mapping of "
                                          r"topic other"):
        resolve_record_validation(lakehouse, lakehouse.mappings[0], schema_registry_client(lakehouse))
