"""A JSON number in a timestamp column, landed through a real run: micros as the Go processor stores it, or millis
(`mappings[].schema.numeric_timestamp_unit`)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.format import Record
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

AT = datetime(2023, 11, 14, 22, 13, 20, 123000)  # 1_700_000_000_123 ms


@pytest.mark.parametrize(("unit", "number"), [(None, 1_700_000_000_123_000), ("micros", 1_700_000_000_123_000),
                                              ("millis", 1_700_000_000_123)])
def test_a_numeric_timestamp_lands_in_the_mapping_unit(embedded_world: IngestWorld, spark, unit, number):
    world = embedded_world
    values = [json.dumps({"order_id": f"o-{i}", "store_id": i, "date_ordered": number}).encode() for i in range(30)]
    world.write_records(0, 0, [Record(key=None, value=v, timestamp_ms=1_700_000_000_000) for v in values])
    document = world.config_document()
    if unit is not None:
        document["mappings"][0]["schema"]["numeric_timestamp_unit"] = unit

    [result] = ingest(world.config(document), spark)

    assert not result.failed and result.records == 30
    table = world.assert_exactly_once(runs=1)
    assert set(table.scan(selected_fields=("date_ordered",)).to_arrow().column(0).to_pylist()) == {AT}
