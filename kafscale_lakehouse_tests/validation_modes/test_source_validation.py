"""JSON Schema validation inside the `kafscale` source's read: on the executors, per record, with the schema path."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from kafscale_lakehouse.config import ColumnConfig
from kafscale_lakehouse.engine.kafscale_source import (
    INVALID_REASON_COLUMN,
    INVALID_SCHEMA_PATH_COLUMN,
    KafscaleOptionError,
    KafscaleReadOptions,
    StoreOptions,
    plan_read,
    read_input_partition,
    read_kafscale,
    source_spark_schema,
)
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.schema.validation import compile_json_schema
from kafscale_lakehouse.storage import LocalSegmentStore
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, PIZZA_SCHEMA, SEGMENT_RECORDS, records_with_faults

TOPIC = "validated-pizzas"
COLUMNS = (ColumnConfig(name="order_id", type="string", required=True), ColumnConfig(name="store_id", type="int"))
SCHEMA_SOURCE = "http://registry.test/schemas/validated-pizzas.json"


@pytest.fixture
def store(tmp_path) -> LocalSegmentStore:
    (tmp_path / "segments").mkdir()
    store = LocalSegmentStore(tmp_path / "segments", namespace="ns")
    for base in (0, SEGMENT_RECORDS):
        segment = encode_segment(records_with_faults(base), base_offset=base, codec="zstd", records_per_batch=7)
        store.write_segment(TOPIC, 0, base, segment.kfs, segment.index)
    return store


def read_options(store: LocalSegmentStore, *, validated: bool) -> KafscaleReadOptions:
    return KafscaleReadOptions(
        store=StoreOptions(kind="local", namespace=store.namespace, local_root=str(store.root)), topic=TOPIC,
        starting_offsets={0: 0}, ending_offsets={0: 2 * SEGMENT_RECORDS}, columns=COLUMNS,
        json_schema=compile_json_schema(PIZZA_SCHEMA, SCHEMA_SOURCE) if validated else None)


def read_all(store: LocalSegmentStore, options: KafscaleReadOptions) -> pa.Table:
    batches = [batch for part in plan_read(store, options).input_partitions
               for batch in read_input_partition(store, part, options.columns, options.on_segment_error,
                                                 options.json_schema)]
    return pa.Table.from_batches(batches)


def expected_schema_status(offset: int) -> tuple[str | None, str | None]:
    fault = FAULTS.get(offset % SEGMENT_RECORDS)
    return (None, None) if fault is None else (fault.schema_reason, fault.schema_path)


def test_each_violation_gets_its_reason_and_schema_path_and_valid_records_none(store):
    table = read_all(store, read_options(store, validated=True))

    assert table.num_rows == 2 * SEGMENT_RECORDS
    rows = table.select(["offset", INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN]).to_pylist()
    for row in rows:
        reason_part, schema_path = expected_schema_status(row["offset"])
        if reason_part is None:
            assert row[INVALID_REASON_COLUMN] is None and row[INVALID_SCHEMA_PATH_COLUMN] is None, row
        else:
            assert reason_part in row[INVALID_REASON_COLUMN], row
            assert row[INVALID_SCHEMA_PATH_COLUMN] == schema_path, row


def test_a_schema_violation_wins_over_a_coercion_failure_of_the_same_record(store):
    [row] = [r for r in read_all(store, read_options(store, validated=True)).to_pylist() if r["offset"] == 5]

    # order_id is missing: a required column that cannot be coerced, and a `required` keyword of the schema.
    assert row[INVALID_REASON_COLUMN] == "$: 'order_id' is a required property"
    assert row[INVALID_SCHEMA_PATH_COLUMN] == "#/required"


def test_without_a_schema_only_coercion_failures_are_invalid_and_there_is_no_schema_path_column(store):
    table = read_all(store, read_options(store, validated=False))

    assert INVALID_SCHEMA_PATH_COLUMN not in table.schema.names
    reasons = {row["offset"]: row[INVALID_REASON_COLUMN] for row in table.to_pylist()}
    expected = {offset for offset in reasons if (f := FAULTS.get(offset % SEGMENT_RECORDS)) and f.coercion_reason}
    assert {o for o, r in reasons.items() if r is not None} == expected
    for offset in expected:
        assert FAULTS[offset % SEGMENT_RECORDS].coercion_reason in reasons[offset]


def test_the_schema_travels_in_the_options_and_comes_back_compiled(store):
    options = read_options(store, validated=True)
    spark_options = {k.lower(): v for k, v in options.to_options().items()}

    parsed = KafscaleReadOptions.from_options(spark_options)

    assert parsed.json_schema.document == PIZZA_SCHEMA and parsed.json_schema.source == SCHEMA_SOURCE
    assert parsed.json_schema.validator.is_valid({"order_id": "x", "store_id": 1})
    assert INVALID_SCHEMA_PATH_COLUMN in source_spark_schema(parsed.columns, validated=True).fieldNames()


@pytest.mark.parametrize("change, message", [
    ({"jsonschema": "{not json"}, "option jsonSchema (from http://registry.test/schemas/validated-pizzas.json) is not JSON"),
    ({"jsonschema": json.dumps({"type": 5})}, "option jsonSchema: JSON Schema http://registry.test"),
    ({"jsonschema": None}, "option jsonSchemaSource is given without jsonSchema"),
])
def test_a_bad_schema_option_is_an_error_naming_the_option(store, change, message):
    spark_options = {k.lower(): v for k, v in read_options(store, validated=True).to_options().items()}
    spark_options.update(change)

    with pytest.raises(KafscaleOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KafscaleReadOptions.from_options({k: v for k, v in spark_options.items() if v is not None})


def test_spark_executors_validate_with_the_schema_from_the_options(store, spark):
    options = read_options(store, validated=True)

    rows = read_kafscale(spark, options).select("offset", INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN).collect()

    assert len(rows) == 2 * SEGMENT_RECORDS
    invalid = {row["offset"]: row[INVALID_SCHEMA_PATH_COLUMN] for row in rows if row[INVALID_REASON_COLUMN]}
    assert invalid == {offset: expected_schema_status(offset)[1] for offset in range(2 * SEGMENT_RECORDS)
                       if offset % SEGMENT_RECORDS in FAULTS}
