"""Records a real Kafka client produced to KafScale's own broker, landed by the CLI and by the Dagster sensors:
every acknowledged offset once, with the bytes the client sent."""

from __future__ import annotations

import pytest

from kafscale_lakehouse_tests.real_broker.clients import (
    COMPRESSIONS,
    produce,
    produce_all_compressions,
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
