"""Avro order schemas (a nested line-item list, a map, logical types) and Confluent-framed values of them."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import fastavro

from kafscale_lakehouse.value_formats.avro import encode_framed_avro

LINE_ITEM = {"type": "record", "name": "LineItem", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "quantity", "type": "int"},
    {"name": "unit_price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
]}
ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "store_id", "type": "int"},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "delivery_date", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "lines", "type": {"type": "array", "items": LINE_ITEM}},
    {"name": "attributes", "type": {"type": "map", "values": "string"}},
    {"name": "signature", "type": {"type": "fixed", "name": "Signature", "size": 4}},
]}
# Version 2: store_id widened to long, a nested field and a top-level field added (both with defaults).
ORDER_V2 = {**ORDER_V1, "fields": [
    *[f for f in ORDER_V1["fields"] if f["name"] not in ("store_id", "lines")],
    {"name": "store_id", "type": "long"},
    {"name": "lines", "type": {"type": "array", "items": {**LINE_ITEM, "fields": [
        *LINE_ITEM["fields"], {"name": "discount", "type": ["null", "double"], "default": None}]}}},
    {"name": "coupon", "type": ["null", "string"], "default": None},
]}
# Version 3 (registered with compatibility NONE): store_id becomes a string, which no table can evolve to.
ORDER_V3 = {**ORDER_V2, "fields": [
    *[f for f in ORDER_V2["fields"] if f["name"] != "store_id"], {"name": "store_id", "type": "string"}]}


def order(n: int, *, version: int = 1) -> dict[str, Any]:
    """Order `n` as a record of `ORDER_V<version>`."""
    line = {"sku": f"sku-{n % 7}", "quantity": n % 5 + 1, "unit_price": decimal.Decimal(f"{n % 50}.{n % 100:02d}")}
    if version >= 2:
        line["discount"] = 0.5 if n % 2 else None
    record = {
        "order_id": str(uuid.UUID(int=n + 1)),
        "store_id": n % 10 if version < 3 else f"store-{n % 10}",
        "placed_at": datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC) + datetime.timedelta(seconds=n),
        "delivery_date": datetime.date(2026, 12, 1) if n % 3 else None,
        "status": ("NEW", "PAID", "SHIPPED")[n % 3],
        "lines": [line] * (n % 3 + 1),
        "attributes": {"channel": "web"} if n % 2 else {},
        "signature": n.to_bytes(4, "big"),
    }
    if version >= 2:
        record["coupon"] = f"C{n}" if n % 4 == 0 else None
    return record



def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """`record` of `schema` in the Confluent wire format."""
    return encode_framed_avro(schema_id, fastavro.parse_schema(schema), record)
