"""JSON Schema validation inside the read of segments: on the executors, per record, with the schema path."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from kafscale_lakehouse.engine.ingestion.segment_reader import INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN
from kafscale_lakehouse.engine.ingestion.spark_job import run_ingestion_spark_job
from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, load_catalog, open_table
from kafscale_lakehouse.engine.tables.data_files import SinkJob
from kafscale_lakehouse.engine.tables.dead_letters import DEAD_LETTER_SCHEMA, DeadLetterTarget
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.schema.validation import compile_json_schema
from kafscale_lakehouse.storage import LocalSegmentStore
from kafscale_lakehouse_tests.engine.ingestion.reader.conftest import ReadRequest
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, PIZZA_SCHEMA, SEGMENT_RECORDS, records_with_faults

TOPIC = "validated-pizzas"
COLUMNS = (Column(name="order_id", type="string", required=True), Column(name="store_id", type="int"))
SCHEMA_SOURCE = "http://registry.test/schemas/validated-pizzas.json"


@pytest.fixture
def store(tmp_path) -> LocalSegmentStore:
    (tmp_path / "segments").mkdir()
    store = LocalSegmentStore(tmp_path / "segments", namespace="ns")
    for base in (0, SEGMENT_RECORDS):
        segment = encode_segment(records_with_faults(base), base_offset=base, codec="zstd", records_per_batch=7)
        store.write_segment(TOPIC, 0, base, segment.kfs, segment.index)
    return store


def read_all(store: LocalSegmentStore, *, validated: bool) -> pa.Table:
    json_schema = compile_json_schema(PIZZA_SCHEMA, SCHEMA_SOURCE) if validated else None
    return ReadRequest(starting={0: 0}, topic=TOPIC, columns=COLUMNS, json_schema=json_schema).read_all(store)


def expected_schema_status(offset: int) -> tuple[str | None, str | None]:
    fault = FAULTS.get(offset % SEGMENT_RECORDS)
    return (None, None) if fault is None else (fault.schema_reason, fault.schema_path)


def test_each_violation_gets_its_reason_and_schema_path_and_valid_records_none(store):
    table = read_all(store, validated=True)

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
    [row] = [r for r in read_all(store, validated=True).to_pylist() if r["offset"] == 5]

    # order_id is missing: a required column that cannot be coerced, and a `required` keyword of the schema.
    assert row[INVALID_REASON_COLUMN] == "$: 'order_id' is a required property"
    assert row[INVALID_SCHEMA_PATH_COLUMN] == "#/required"


def test_without_a_schema_only_coercion_failures_are_invalid_and_there_is_no_schema_path_column(store):
    table = read_all(store, validated=False)

    assert INVALID_SCHEMA_PATH_COLUMN not in table.schema.names
    reasons = {row["offset"]: row[INVALID_REASON_COLUMN] for row in table.to_pylist()}
    expected = {offset for offset in reasons if (f := FAULTS.get(offset % SEGMENT_RECORDS)) and f.coercion_reason}
    assert {o for o, r in reasons.items() if r is not None} == expected
    for offset in expected:
        assert FAULTS[offset % SEGMENT_RECORDS].coercion_reason in reasons[offset]


def test_the_compiled_schema_travels_to_the_tasks_as_its_document():
    compiled = compile_json_schema(PIZZA_SCHEMA, SCHEMA_SOURCE)

    copy = pickle.loads(pickle.dumps(compiled))

    assert copy.document == PIZZA_SCHEMA and copy.source == SCHEMA_SOURCE
    assert copy.validator.is_valid({"order_id": "x", "store_id": 1})
    assert not copy.validator.is_valid({"store_id": 1})


def test_spark_tasks_validate_with_the_schema_of_the_task_spec(store, spark, tmp_path):
    catalog = load_catalog(CatalogSettings(type="sql", warehouse=str(tmp_path / "warehouse")))
    table = open_table(catalog, "validation.pizzas", schema=table_schema(COLUMNS), create_if_missing=True)
    dead_letters = open_table(catalog, "validation.pizzas_dead_letters", schema=DEAD_LETTER_SCHEMA,
                              create_if_missing=True)
    target = DeadLetterTarget(SinkJob.for_table(dead_letters, "run-v", 1 << 20), ingested_at_us=0)
    partitions = ReadRequest(starting={0: 0}, topic=TOPIC, max_bytes_per_partition=1).plan(store).input_partitions

    outputs = run_ingestion_spark_job(spark, table, "run-v", store, TOPIC, partitions, columns=COLUMNS,
                                      json_schema=compile_json_schema(PIZZA_SCHEMA, SCHEMA_SOURCE),
                                      target_file_size_bytes=1 << 20, dead_letters=(dead_letters, target))

    assert len(outputs) == 2 and all(o.failure is None for o in outputs)
    invalid = {offset for offset in range(2 * SEGMENT_RECORDS) if offset % SEGMENT_RECORDS in FAULTS}
    assert sum(o.source_stats.invalid_count for o in outputs) == len(invalid)
    assert sum(sum(o.source_stats.rows.values()) for o in outputs) == 2 * SEGMENT_RECORDS - len(invalid)
    samples = [sample for o in outputs for sample in o.source_stats.invalid_samples]
    assert {int(sample.record_id.rsplit(":", 1)[1]) for sample in samples} == invalid  # fewer than 20 per task
    for sample in samples:
        assert sample.schema_path == expected_schema_status(int(sample.record_id.rsplit(":", 1)[1]))[1], sample
    assert sum(len(o.source_stats.dead_letter_files) for o in outputs) == 2
