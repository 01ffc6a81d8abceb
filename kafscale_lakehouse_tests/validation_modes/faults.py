"""Pizza records with known faults, the JSON Schema they are judged by, and what validation must say about them."""

from __future__ import annotations

from dataclasses import dataclass

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.schema_registry.conftest import REGISTRY_PATH, RegistryServer

PIZZA_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["order_id", "store_id"],
    "properties": {
        "order_id": {"type": "string"},
        "store_id": {"type": "integer", "minimum": 1, "maximum": 100},
        "date_ordered": {"type": "string"},
        "sauce": {"type": "string"},
    },
}
SEGMENT_RECORDS = 20


@dataclass(frozen=True)
class Fault:
    """A value made invalid on purpose and what each mode says about it."""

    value: bytes
    schema_reason: str  # part of the reason JSON Schema validation gives
    schema_path: str | None  # the violated keyword; None when the value is no JSON at all
    coercion_reason: str | None = None  # with the harness' columns (order_id required) in mode off; None: valid


# position within a segment of SEGMENT_RECORDS → fault; the other positions are ordinary pizza orders.
FAULTS = {
    3: Fault(b'{"order_id": "o-3", "store_id": "seven"}', "'seven' is not of type 'integer'",
             "#/properties/store_id/type"),
    5: Fault(b'{"store_id": 5}', "'order_id' is a required property", "#/required",
             coercion_reason="order_id: required value is missing or null"),
    8: Fault(b"not json at all", "value is not valid JSON", None,
             coercion_reason="value is not valid JSON"),
    11: Fault(b'{"order_id": "o-11", "store_id": 500}', "500 is greater than the maximum of 100",
              "#/properties/store_id/maximum"),
}


def records_with_faults(base_offset: int = 0, partition: int = 0) -> list[Record]:
    """SEGMENT_RECORDS pizza orders from `base_offset` whose values at the FAULTS positions are replaced."""
    records = pizza_orders(base_offset, SEGMENT_RECORDS, partition=partition)
    return [Record(key=r.key, value=FAULTS[i].value, headers=r.headers, timestamp_ms=r.timestamp_ms)
            if i in FAULTS else r for i, r in enumerate(records)]


def serve_schema(registry: RegistryServer, topic: str, document: dict | None = None) -> None:
    registry.serve_json(f"{REGISTRY_PATH}/{topic}.json", PIZZA_SCHEMA if document is None else document)
