"""`processor.watch` picks the watch the definitions carry: the per-table sensors, or the namespace sensor and the
`land_tables` job (the per-table ingest jobs stay, for manual runs); a wrong value is an error naming the key."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.definitions import build_definitions
from kafscale_lakehouse.orchestration.audited_publish import AUDITED_PUBLISH_SENSOR
from kafscale_lakehouse.orchestration.land_tables import LAND_TABLES_JOB
from kafscale_lakehouse.orchestration.namespace_sensor import NAMESPACE_SENSOR_NAME
from kafscale_lakehouse.orchestration.naming import ingest_job_name
from kafscale_lakehouse.orchestration.sensors import sensor_name

TABLES = {"orders": "raw.orders", "payments": "raw.payments", "refunds": "raw.refunds"}


def document(**processor) -> dict:
    # Nothing is connected while definitions are built: the endpoints need not answer.
    return {"s3": {"bucket": "lake", "endpoint": "http://127.0.0.1:1", "region": "us-east-1", "path_style": True},
            "iceberg": {"catalog": {"type": "rest", "uri": "http://127.0.0.1:2"}, "warehouse": "s3://warehouse"},
            "etcd": {"endpoints": ["http://127.0.0.1:3"]},
            "processor": processor,
            "mappings": [{"topic": topic, "table": table} for topic, table in TABLES.items()]}


def test_the_namespace_watch_is_one_sensor_and_the_land_tables_job_beside_the_tables_own_jobs():
    definitions = build_definitions(parse_config(document(watch="namespace")))
    repository = definitions.get_repository_def()
    assert sorted(s.name for s in repository.sensor_defs) == sorted([NAMESPACE_SENSOR_NAME, AUDITED_PUBLISH_SENSOR])
    assert repository.get_sensor_def(NAMESPACE_SENSOR_NAME).job_name == LAND_TABLES_JOB
    jobs = {job.name for job in repository.get_all_jobs()}
    assert LAND_TABLES_JOB in jobs and {ingest_job_name(t) for t in TABLES.values()} <= jobs


def test_the_per_table_watch_stays_the_default():
    repository = build_definitions(parse_config(document())).get_repository_def()
    assert sorted(s.name for s in repository.sensor_defs) == sorted(
        [*(sensor_name(t) for t in TABLES.values()), AUDITED_PUBLISH_SENSOR])
    assert LAND_TABLES_JOB not in {job.name for job in repository.get_all_jobs()}


def test_a_watch_that_is_not_one_of_the_two_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"processor\.watch: 'topics' is not one of per_table, namespace"):
        parse_config(document(watch="topics"))
    with pytest.raises(ConfigError, match=r"processor\.max_bytes_per_batch_run: must be greater than 0"):
        parse_config(document(watch="namespace", max_bytes_per_batch_run=0))
