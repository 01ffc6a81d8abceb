"""Protobuf value schemas → Iceberg columns, message indexes, and Confluent-framed values → Arrow columns
(value_formats/protobuf.py); JSON Schema value schemas → columns (value_formats/json_schema_values.py). Pure logic: the
schemas are compiled by the test registry's protoc, as the registry serves them with format=serialized."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf import message_factory
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.engine.ingestion.rows import with_framed_value_columns
from kafscale_lakehouse.engine.ingestion.segment_reader import SegmentReadError, SegmentReadFailure, SegmentRunPartition
from kafscale_lakehouse.engine.ingestion.validation import registered_value_schemas
from kafscale_lakehouse.format import BASE_SCHEMA
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.storage import SegmentRef
from kafscale_lakehouse.value_formats.framed import FramedValueSchemas, arrow_column
from kafscale_lakehouse.value_formats.json_schema_values import json_schema_value_fields
from kafscale_lakehouse.value_formats.protobuf import (
    ProtobufValueDecoder,
    encode_framed_protobuf,
    encode_message_indexes,
    message_descriptor,
    protobuf_value_fields,
    read_message_indexes,
)
from kafscale_lakehouse_tests.formats.protobuf_orders import ORDER_V1, order, order_message
from kafscale_lakehouse_tests.formats.test_avro_config import BASE
from kafscale_lakehouse_tests.support.schema_registry import RegistryState

TREE = """syntax = "proto3";
package shop;
message Node { string name = 1; repeated Node children = 2; }
"""


def _serialized(text: str) -> str:
    state = RegistryState()
    serialized = state.schema(state.register("s-value", text, "PROTOBUF")).serialized
    assert serialized is not None
    return serialized


@pytest.mark.parametrize(("indexes", "encoded"), [((0,), b"\x00"), ((1,), b"\x02\x02"), ((2, 3), b"\x04\x04\x06")])
def test_message_indexes_round_trip_as_confluent_writes_them(indexes, encoded):
    assert encode_message_indexes(indexes) == encoded
    assert read_message_indexes(b"\x00\x00\x00\x00\x07" + encoded + b"rest", 5) == (indexes, 5 + len(encoded))
    with pytest.raises(ValueError, match="cut short"):
        read_message_indexes(b"\x00\x00\x00\x00\x07" + encoded[:-1] + b"\x80", 5)


def test_a_recursive_message_has_no_iceberg_type_and_the_error_names_the_field():
    with pytest.raises(SchemaMappingError, match=r"field children\.element is the recursive message shop\.Node"):
        protobuf_value_fields(_serialized(TREE), None, what="schema id 1")
    with pytest.raises(SchemaMappingError, match=r"has no message shop\.Missing"):
        protobuf_value_fields(_serialized(TREE), "shop.Missing", what="schema id 1")


def test_the_decoder_stops_at_an_unknown_or_refused_schema_id_and_reads_bare_values_with_latest():
    serialized = _serialized(ORDER_V1)
    value_schema = schema_to_pyarrow(Schema(*protobuf_value_fields(serialized, None, what="v1")))
    message = order_message(message_factory.GetMessageClass(message_descriptor(serialized, None, what="v1")), order(4))
    settings = FramedValueSchemas("orders-value", {4: serialized}, value_schema, refused={5: "schema id 5 refused"},
                                  value_format="protobuf")
    values = pa.array([encode_framed_protobuf(4, message), None, b"\x01junk", encode_framed_protobuf(9, message),
                       encode_framed_protobuf(4, message)], pa.binary())

    decoded = ProtobufValueDecoder(settings).decode(values)

    assert decoded.stop is not None and decoded.stop.row == 3 and decoded.stop.schema_id == 9
    assert "schema id 9 is not a version of subject orders-value known to this run (ids 4)" in decoded.stop.reason
    assert [len(c) for c in decoded.columns] == [3] * len(value_schema)
    rows = pa.Table.from_arrays(decoded.columns, schema=value_schema).to_pylist()
    assert rows[0]["order_id"] == "order-4" and rows[0]["card"] == "card-4" and rows[1]["order_id"] is None
    assert "not in the Confluent wire format (magic byte 1" in decoded.invalid_reasons[2].as_py()
    refused = ProtobufValueDecoder(settings).decode(pa.array([encode_framed_protobuf(5, message)], pa.binary()))
    assert refused.stop is not None and refused.stop.reason == "schema id 5 refused"

    latest = FramedValueSchemas("orders-value", {4: serialized}, value_schema, latest_id=4, value_format="protobuf")
    bare = ProtobufValueDecoder(latest).decode(pa.array([message.SerializeToString()], pa.binary()))
    assert bare.invalid_reasons.null_count == 1 and bare.columns[0].to_pylist() == ["order-4"]


def test_a_partition_stopped_by_a_protobuf_value_names_the_protobuf_error_type():
    """The stop's `error_type` names the value's format (it said AvroDecodeError / AvroSchemaError for every format)."""
    serialized = _serialized(ORDER_V1)
    value_schema = schema_to_pyarrow(Schema(*protobuf_value_fields(serialized, None, what="v1")))
    message = order_message(message_factory.GetMessageClass(message_descriptor(serialized, None, what="v1")), order(4))
    decoder = ProtobufValueDecoder(FramedValueSchemas("orders-value", {4: serialized}, value_schema,
                                                      value_format="protobuf"))
    segment = SegmentRef("orders", 0, 0, 9, "orders/0/0.kfs", "orders/0/0.index", 100)
    partition = SegmentRunPartition("orders", OffsetRange(0, 0, 10), (segment,))

    def stop_of(values: list[bytes]) -> SegmentReadFailure:
        batch = pa.RecordBatch.from_pylist(
            [{"record_id": f"orders:0:{n}", "topic": "orders", "partition": 0, "offset": n, "value": v}
             for n, v in enumerate(values)], schema=BASE_SCHEMA)
        with pytest.raises(SegmentReadError) as stopped:
            list(with_framed_value_columns([batch], decoder, partition, invalid_stops=True))
        return stopped.value.failure

    undecodable = stop_of([encode_framed_protobuf(4, message), encode_framed_protobuf(4, message)[:-3] + b"\xff"])
    assert (undecodable.error_type, undecodable.next_offset) == ("ProtobufDecodeError", 1)
    unknown_id = stop_of([encode_framed_protobuf(7, message)])
    assert (unknown_id.error_type, unknown_id.next_offset) == ("ProtobufSchemaError", 0)


def test_json_schema_columns_follow_refs_and_nullable_types_and_refuse_recursion():
    document = {"type": "object", "$defs": {"when": {"type": ["string", "null"], "format": "date-time"}},
                "properties": {"at": {"$ref": "#/$defs/when"},
                               "tags": {"type": "array", "items": {"type": "string"}},
                               "total": {"anyOf": [{"type": "null"}, {"type": "number"}]},
                               "free": {"type": ["string", "number"]}}}
    fields = json_schema_value_fields(json.dumps(document), what="schema id 3")
    assert [(f.name, str(f.field_type), f.required) for f in fields] == [
        ("at", "timestamptz", False), ("tags", "list<string>", False), ("total", "double", False),
        ("free", "string", False)]
    recursive = {"type": "object", "$defs": {"node": {"type": "object", "properties": {
        "next": {"$ref": "#/$defs/node"}}}}, "properties": {"head": {"$ref": "#/$defs/node"}}}
    with pytest.raises(SchemaMappingError, match=r"field head\.next is the recursive #/\$defs/node"):
        json_schema_value_fields(json.dumps(recursive), what="schema id 4")


MONEY = """syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 units = 2; }
"""
PAYMENT = """syntax = "proto3";
package shop;
import "shop/common/money.proto";
import "google/protobuf/timestamp.proto";
message Payment { string id = 1; shop.common.Money amount = 2; google.protobuf.Timestamp at = 3; }
"""


def test_a_protobuf_schema_importing_another_registered_schema_resolves_through_its_references(confluent_registry):
    """Registry references (`import "shop/common/money.proto"` registered under its own subject): the run fetches
    the imported schema with format=serialized too and decodes with both, as Confluent's deserializers do."""
    confluent_registry.register("shop-money", MONEY, "PROTOBUF")
    references = [{"name": "shop/common/money.proto", "subject": "shop-money", "version": 1}]
    payment_id = confluent_registry.register("payments-value", PAYMENT, "PROTOBUF", references)
    config = parse_config({**BASE, "mappings": [{"topic": "payments", "table": "shop.payments",
                                                 "value_format": "protobuf",
                                                 "schema_registry": {"url": confluent_registry.url}}]},
                          source="<test>", base_dir=Path("/tmp"))

    registered = registered_value_schemas(config.mappings[0])

    [version] = registered.versions
    assert [r.name for r in version.references] == ["shop/common/money.proto"]
    imports = registered.imports[payment_id]
    assert [name for name, _ in imports] == ["shop/common/money.proto"]
    fields = protobuf_value_fields(version.text, None, what="payments", imports=imports)
    assert [(f.name, str(f.field_type)) for f in fields][1:] == [
        ("amount", "struct<3: currency: optional string, 4: units: optional long>"), ("at", "timestamptz")]
    descriptor = message_descriptor(version.text, None, what="payments", imports=imports)
    payment = message_factory.GetMessageClass(descriptor)(id="p1")
    payment.amount.currency, payment.amount.units = "EUR", 12
    value_schema = schema_to_pyarrow(Schema(*fields))
    settings = FramedValueSchemas("payments-value", {payment_id: version.text}, value_schema,
                                  value_format="protobuf", imports=registered.imports)
    decoded = ProtobufValueDecoder(settings).decode(pa.array([encode_framed_protobuf(payment_id, payment)]))
    assert pa.Table.from_arrays(decoded.columns, schema=value_schema).to_pylist() == [
        {"id": "p1", "amount": {"currency": "EUR", "units": 12}, "at": None}]
    with pytest.raises(SchemaMappingError, match=r"imports shop/common/money\.proto, which are not among its registry"):
        protobuf_value_fields(version.text, None, what="payments")


def test_values_of_confluent_kafkas_protobuf_serializer_decode_and_ours_deserialize_with_theirs(confluent_registry):
    """Interop with Confluent's own client: its ProtobufSerializer registers the schema as a base64
    FileDescriptorProto (the registry answers it as .proto text) and frames values with message indexes; our
    decoder reads them, and its ProtobufDeserializer reads the values we frame."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafscale_lakehouse.value_formats.confluent_registry import ConfluentRegistryClient, ConfluentRegistrySettings

    order_class = message_factory.GetMessageClass(message_descriptor(_serialized(ORDER_V1), None, what="v1"))
    refund_class = message_factory.GetMessageClass(
        message_descriptor(_serialized(ORDER_V1), "shop.Refund", what="v1"))
    context = SerializationContext("interop", MessageField.VALUE)
    client = SchemaRegistryClient({"url": confluent_registry.url})
    serializer = ProtobufSerializer(order_class, client, {"use.deprecated.format": False})
    refunds = ProtobufSerializer(refund_class, client, {"use.deprecated.format": False,
                                                        "auto.register.schemas": False, "use.latest.version": True})
    theirs = serializer(order_message(order_class, order(7)), context)
    their_refund = refunds(refund_class(order_id="r"), context)

    [version] = ConfluentRegistryClient(ConfluentRegistrySettings(confluent_registry.url)).subject_versions(
        "interop-value", "serialized")
    assert "message Order {" in confluent_registry.state.schema(version.schema_id).text  # answered as .proto text
    value_schema = schema_to_pyarrow(Schema(*protobuf_value_fields(version.text, None, what="interop")))
    decoder = ProtobufValueDecoder(FramedValueSchemas("interop-value", {version.schema_id: version.text},
                                                      value_schema, value_format="protobuf"))
    decoded = decoder.decode(pa.array([theirs, their_refund], pa.binary()))
    [row, _] = pa.Table.from_arrays(decoded.columns, schema=value_schema).to_pylist()
    assert (row["order_id"], row["cash_cents"], row["lines"][0]["sku"]) == ("order-7", 700, "sku-0")
    assert theirs[5:6] == b"\x00" and their_refund[5:7] == b"\x02\x02"  # message indexes [0] and [1]
    assert "is a shop.Refund" in decoded.invalid_reasons[1].as_py()

    ours = encode_framed_protobuf(version.schema_id, order_message(order_class, order(8)))
    deserialized = ProtobufDeserializer(order_class, {"use.deprecated.format": False})(ours, context)
    assert deserialized.order_id == "order-8" and deserialized.store_id == 8


def test_a_per_record_value_that_is_no_uuid_makes_its_row_invalid_not_the_batch_fail():
    """`arrow_column` (the per-record formats' columns): a uuid column's value that is no UUID string is that row's
    reason; before, uuid.UUID's ValueError escaped and failed the whole batch."""
    good = "6f1c2a7e-9d3b-4c55-8a0e-1b2c3d4e5f60"
    reasons: list[str | None] = [None, None, None]
    column = arrow_column(pa.field("id", pa.uuid()), [{"id": good}, {"id": "not-a-uuid"}, None], reasons)
    assert [str(v) if v is not None else None for v in column.to_pylist()] == [good, None, None]
    assert reasons[0] is None and reasons[2] is None
    assert reasons[1] is not None and reasons[1].startswith("id: 'not-a-uuid' does not fit the column type")
