"""The fault matrix's batch primary: a batch of two topics whose invalid records share one dead-letter table, landed
as `land_tables` lands them (engine/faults/batch_run.py: one run id, one Spark job, a commit per table), held or
killed at a point of each family, with another run of the mappings meanwhile; then settling runs. The invariant:
every valid record of each topic once in its table, every invalid record of each topic once in the dead-letter
table, no run record left, every file a snapshot of any of the three tables references exists, and every data file
of the topics' tables is referenced by one."""

from __future__ import annotations

import contextlib
from collections import Counter

import pyarrow.compute as pc
import pytest

from kafscale_lakehouse.engine.ingestion import IngestFailedError, ingest
from kafscale_lakehouse.engine.spark.engine import SPARK_REMOTE_VARIABLE
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse_tests.engine.faults.actor import OTHER_POINTS
from kafscale_lakehouse_tests.engine.faults.held import files_of_every_snapshot, run_held
from kafscale_lakehouse_tests.engine.faults.matrix import point_family
from kafscale_lakehouse_tests.engine.ingestion.harness import LEASE_TTL_SECONDS
from kafscale_lakehouse_tests.orchestration.namespace.test_writer_dirs import shared_dead_letters
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, SEGMENT_RECORDS, records_with_faults

INVALID_POSITIONS = {p for p, f in FAULTS.items() if f.coercion_reason}  # with the harness' columns
SEGMENTS = 2  # per topic, partition 0: one landed before the case, one pending for the batch
CASES = (
    ("before-lease", "pause", "ingest"),
    ("after-write", "freeze", "ingest"),
    ("before-commit", "kill", "ingest"),
    ("inside-commit", "unknown", "ingest"),
    ("inside-commit", "late", "ingest"),
    ("after-commit", "kill", "ingest"),
    ("before-forget", "kill", "none"),
)


def test_the_cases_cover_every_point_family_of_the_batch_primary():
    assert {point_family(point) for point, _, _ in CASES} == {point_family(p) for p in OTHER_POINTS["batch"]}


@pytest.mark.parametrize(("point", "action", "secondary"), CASES, ids=[f"batch@{p}/{a}+{s}" for p, a, s in CASES])
def test_batch_case_lands_every_record_and_dead_letter_once(namespace_world, spark, spark_engine, point, action,
                                                            secondary, tmp_path):
    topics = [namespace_world.topics["orders"], namespace_world.topics["payments"]]
    config, rejects = shared_dead_letters(namespace_world)
    config.mappings[:] = [m for m in config.mappings if m.topic in {t.topic for t in topics}]
    first = topics[0]
    document = first.config_document()
    document["mappings"] = [dict(t.config_document()["mappings"][0], dead_letter_table=rejects) for t in topics]
    config_path = first.write_config_file(document)
    for topic in topics:
        topic.write_records(0, 0, records_with_faults(0))
    ingest(config, spark)
    for topic in topics:
        topic.write_records(0, SEGMENT_RECORDS, records_with_faults(SEGMENT_RECORDS))
    env = dict(first.subprocess_env(), **{SPARK_REMOTE_VARIABLE: spark_engine.url})

    def leases_gone() -> None:
        for topic in topics:
            topic.wait_for_leases_to_expire(LEASE_TTL_SECONDS * 4)

    def second_run() -> None:
        with contextlib.suppress(IngestFailedError):  # the primary holds the partitions' leases (pause)
            ingest(config, spark)

    run_held("batch", point, action, ["land-batch", str(config_path)], env=env, signal_dir=tmp_path / "signals",
             wait_for_leases=leases_gone, meanwhile=second_run if secondary == "ingest" else lambda: None)
    for _ in range(2):  # settling runs
        ingest(config, spark)

    catalog_table = first.table().catalog.load_table
    dead = catalog_table(rejects).scan().to_arrow()
    offsets = range(SEGMENTS * SEGMENT_RECORDS)
    invalid = sorted(o for o in offsets if o % SEGMENT_RECORDS in INVALID_POSITIONS)
    for topic in topics:
        table = topic.table()
        assert read_topic_offsets(table, topic.topic) == {0: len(offsets)}
        landed = Counter(table.scan().to_arrow()["offset"].to_pylist())
        assert sorted(landed.elements()) == sorted(set(offsets) - set(invalid)), f"{topic.topic}: rows not once"
        letters = dead.filter(pc.equal(dead["topic"], topic.topic))["offset"].to_pylist()
        assert sorted(letters) == invalid, f"{topic.topic}: dead letters not exactly once"
        assert topic.recorded_runs() == []
    for table in (topics[0].table(), topics[1].table(), catalog_table(rejects)):
        referenced, stored = files_of_every_snapshot(table), first.table_data_files(table)
        assert referenced <= stored, f"{table.name()}: referenced files are gone: {sorted(referenced - stored)[:3]}"
        if table.name()[-1] != "rejects":
            # Dead letters staged by a run that never committed its table are left to orphan-file removal
            # (run_files.py: a staged commit's outcome is unknown), so only the topics' tables have none left.
            assert stored <= referenced, f"{table.name()}: unreferenced files left: {sorted(stored - referenced)[:3]}"
