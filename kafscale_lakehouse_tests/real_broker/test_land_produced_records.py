"""Records a real Kafka client produced to KafScale's own broker, landed by the CLI and by the Dagster sensors:
every acknowledged offset once, with the bytes the client sent."""

from __future__ import annotations

import pytest

from kafscale_lakehouse_tests.real_broker.clients import (
    produce_all_compressions,
    produce_with_kafka_python,
    records,
)
from kafscale_lakehouse_tests.real_broker.conftest import PARTITIONS, partitions_of

pytestmark = pytest.mark.integration


def test_cli_lands_every_acknowledged_record_of_every_compression_byte_exact(broker_world, kafscale_broker):
    world = broker_world()
    acked = produce_all_compressions(kafscale_broker.bootstrap, world.topic, records(300, PARTITIONS, seed=1))
    assert partitions_of(acked) == set(range(PARTITIONS))

    world.land_with_cli()

    world.assert_lands(acked, runs=1)


def test_cli_lands_values_of_mixed_sizes_up_to_hundreds_of_kilobytes(broker_world, kafscale_broker):
    world = broker_world()
    outgoing = records(100, PARTITIONS, seed=6, max_value_bytes=40_000, large_every=10, large_bytes=300_000)
    acked = produce_all_compressions(kafscale_broker.bootstrap, world.topic, outgoing)
    assert max(len(a.record.value or b"") for a in acked) == 300_000

    world.land_with_cli()

    world.assert_lands(acked, runs=1)


def test_cli_lands_what_kafka_python_produced(broker_world, kafscale_broker):
    """A second client with batches of its own making (kafka-python offers none, gzip and zstd here)."""
    world = broker_world()
    outgoing = [r for r in records(90, PARTITIONS, seed=7) if r.key is not None or r.value is not None]  # it needs one
    acked = []
    for index, compression in enumerate(("none", "gzip", "zstd")):
        acked += produce_with_kafka_python(kafscale_broker.bootstrap, world.topic, outgoing[index::3],
                                           compression=compression)

    world.land_with_cli()

    world.assert_lands(acked, runs=1)
