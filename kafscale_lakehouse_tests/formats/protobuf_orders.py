"""Protobuf order schemas (.proto text: nested messages, repeated, map, enum, oneof, Timestamp, a wrapper) and
Confluent-framed values of them, built as a producer without generated code would (descriptor → message class)."""

from __future__ import annotations

import datetime
from typing import Any

from google.protobuf import message_factory
from google.protobuf.message import Message

from kafscale_lakehouse.value_formats.protobuf import encode_framed_protobuf, message_descriptor
from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry

_ORDER = """syntax = "proto3";
package shop;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  message LineItem {
    string sku = 1;
    int32 quantity = 2;
    double unit_price = 3;%(line_v2)s
  }
  message Customer {
    string name = 1;
    optional string email = 2;
  }
  string order_id = 1;
  %(store_id_type)s store_id = 2;
  google.protobuf.Timestamp placed_at = 3;
  Status status = 4;
  repeated LineItem lines = 5;
  map<string, string> attributes = 6;
  google.protobuf.StringValue note = 7;
  oneof payment {
    string card = 8;
    int64 cash_cents = 9;
  }
  Customer customer = 10;
  bytes signature = 11;%(order_v2)s
}

// A second message of the file: a value of it is not the mapping's message.
message Refund {
  string order_id = 1;
}
"""
ORDER_V1 = _ORDER % {"line_v2": "", "store_id_type": "int32", "order_v2": ""}
# Version 2: store_id widened to int64, a nested field and a top-level field added.
ORDER_V2 = _ORDER % {"line_v2": "\n    optional double discount = 4;", "store_id_type": "int64",
                     "order_v2": "\n  string coupon = 12;"}
# Version 3: store_id becomes a string, which no table can evolve to.
ORDER_V3 = _ORDER % {"line_v2": "\n    optional double discount = 4;", "store_id_type": "string",
                     "order_v2": "\n  string coupon = 12;"}
PLACED_AT = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)


def message_class(registry: ConfluentCompatibleRegistry, schema_id: int, name: str = "shop.Order") -> type[Message]:
    """The message class of `name` in registered schema `schema_id` (from the form the registry serves with
    format=serialized, as a producer holding only the registry's schema builds it)."""
    serialized = registry.state.schema(schema_id).serialized
    assert serialized is not None
    return message_factory.GetMessageClass(message_descriptor(serialized, name, what=f"schema id {schema_id}"))


def order(n: int, *, version: int = 1) -> dict[str, Any]:
    """Order `n` as the fields of a message of `ORDER_V<version>` (and what the table holds for it)."""
    line: dict[str, Any] = {"sku": f"sku-{n % 7}", "quantity": n % 5 + 1, "unit_price": n % 50 + 0.25}
    if version >= 2:
        line["discount"] = 0.5 if n % 2 else None
    record: dict[str, Any] = {
        "order_id": f"order-{n}",
        "store_id": n % 10 if version < 3 else f"store-{n % 10}",
        "placed_at": PLACED_AT + datetime.timedelta(seconds=n, microseconds=n),
        "status": ("NEW", "PAID", "SHIPPED")[n % 3],
        "lines": [line] * (n % 3 + 1),
        "attributes": {"channel": "web"} if n % 2 else {},
        "note": f"note {n}" if n % 4 == 1 else None,
        "card": f"card-{n}" if n % 2 == 0 else None,
        "cash_cents": n * 100 if n % 2 else None,
        "customer": {"name": f"customer {n}", "email": f"c{n}@example.com" if n % 3 == 0 else None},
        "signature": n.to_bytes(4, "big"),
    }
    if version >= 2:
        record["coupon"] = f"C{n}" if n % 4 == 0 else ""
    return record


def order_message(cls: type[Message], record: dict[str, Any]) -> Message:
    message = cls()
    for name, value in record.items():
        if value is None:
            continue
        if name == "placed_at":
            message.placed_at.FromDatetime(value)
        elif name == "lines":
            for line in value:
                message.lines.add(**{k: v for k, v in line.items() if v is not None})
        elif name == "attributes":
            message.attributes.update(value)
        elif name == "note":
            message.note.value = value
        elif name == "customer":
            message.customer.name = value["name"]
            if value["email"] is not None:
                message.customer.email = value["email"]
        else:
            setattr(message, name, value)
    return message


def framed(registry: ConfluentCompatibleRegistry, schema_id: int, record: dict[str, Any]) -> bytes:
    """`record` as a Confluent-framed shop.Order of schema `schema_id` (message indexes [0])."""
    return encode_framed_protobuf(schema_id, order_message(message_class(registry, schema_id), record))
