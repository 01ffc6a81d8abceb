"""Avro values produced to KafScale's broker with Confluent's own registry serializer (confluent-kafka's
AvroSerializer, which registers the schema) land typed."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kafscale_lakehouse_tests.formats.avro_orders import ORDER_V1, order
from kafscale_lakehouse_tests.real_broker.clients import Acked, Outgoing
from kafscale_lakehouse_tests.real_broker.conftest import PARTITIONS
from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry

pytestmark = pytest.mark.integration

ORDERS = 60


@pytest.fixture(scope="module")
def confluent_registry() -> ConfluentCompatibleRegistry:
    server = ConfluentCompatibleRegistry().start()
    yield server
    server.stop()


def test_avro_values_from_the_registry_serializer_land_typed(broker_world, kafscale_broker, confluent_registry):
    world = broker_world()
    serializer = AvroSerializer(SchemaRegistryClient({"url": confluent_registry.url}), json.dumps(ORDER_V1))
    context = SerializationContext(world.topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": world.bootstrap, "acks": "all", "linger.ms": 20,
                         "enable.idempotence": False, "compression.type": "zstd"})
    acked: list[Acked] = []
    for n in range(ORDERS):
        record = Outgoing(n % PARTITIONS, f"order-{n}".encode(), serializer(order(n), context), (),
                          1_790_000_000_000 + n)
        producer.produce(world.topic, key=record.key, value=record.value, partition=record.partition,
                         timestamp=record.timestamp_ms,
                         on_delivery=lambda error, message, record=record: acked.append(
                             Acked(record, -1 if error else message.offset(), "zstd")))
    assert producer.flush(60) == 0 and all(a.offset >= 0 for a in acked)
    document = world.config_document()
    document["mappings"][0].update(value_format="avro", schema_registry={"url": confluent_registry.url})
    world.write_config_file(document)

    world.land_with_cli()

    world.assert_lands(acked, runs=1)  # the raw values stay, byte-exact
    by_key = {row["key"]: row for row in world.table().scan().to_arrow().to_pylist()}
    for n in range(ORDERS):
        row, sent = by_key[f"order-{n}".encode()], order(n)
        assert str(row["order_id"]) == sent["order_id"] and row["store_id"] == sent["store_id"]
        assert row["placed_at"] == sent["placed_at"] and row["status"] == sent["status"]
        assert row["lines"] == sent["lines"] and row["signature"] == sent["signature"]
