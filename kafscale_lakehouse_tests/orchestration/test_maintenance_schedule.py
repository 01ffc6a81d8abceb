"""One maintenance job and schedule for every table, on the real servers (SeaweedFS S3 + Iceberg REST, etcd, local
Spark) with a real DagsterInstance: a run maintains only the tables over a threshold, the most urgent first and at
most `max_tables`, and records what it did on each table's asset."""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
import pytest

from kafscale_lakehouse.config import parse_config
from kafscale_lakehouse.engine.ingestion.run import ingest
from kafscale_lakehouse.orchestration.maintenance import MAINTENANCE_JOB, build_maintenance
from kafscale_lakehouse.orchestration.naming import table_asset_key
from kafscale_lakehouse.orchestration.resources import SPARK_RESOURCE_KEY, SparkResource
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld

pytestmark = pytest.mark.integration


@dataclass
class TableWorld(IngestWorld):
    """One of several topics of a test, each landed in its own table."""

    own_table: str = ""

    @property
    def table_name(self) -> str:
        return self.own_table


def observed_tables(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    observations = [e.event_specific_data.asset_observation for e in result.all_events
                    if e.event_type_value == "ASSET_OBSERVATION"]
    return {"/".join(o.asset_key.path): {k: v.value for k, v in o.metadata.items()} for o in observations}


def test_one_schedule_maintains_only_the_tables_over_a_threshold_most_urgent_first(
        tmp_path, unique_prefix, seaweedfs, etcd_server, spark):
    namespace = unique_prefix.replace("-", "_")
    worlds = {name: TableWorld("production", tmp_path, unique_prefix, topic=f"{name}-{unique_prefix}",
                               seaweedfs=seaweedfs, etcd_endpoint=etcd_server.endpoint,
                               own_table=f"{namespace}.{name}")
              for name in ("busy", "quiet", "manifests")}
    document = worlds["busy"].config_document()
    document["mappings"] = [
        {"topic": w.topic, "table": w.table_name, "create_table_if_missing": True} for w in worlds.values()]
    # `manifests` needs its manifests merged (3 commits) long before it has files enough to compact.
    document["mappings"][2]["maintenance"] = {"min_input_files": 50, "manifest_min_count": 3}
    config = parse_config(document, source="<maintenance test>", base_dir=tmp_path)
    rounds = {"busy": 4, "quiet": 1, "manifests": 3}
    for round_number in range(max(rounds.values())):
        for name, world in worlds.items():
            if round_number < rounds[name]:
                for partition in (0, 1):
                    world.write_segments(partition, 20, base_offset=round_number * 20, records_per_segment=20)
        ingest(config, spark)
    quiet_snapshots = len(worlds["quiet"].table().metadata.snapshots)

    [job], [schedule] = build_maintenance(config)
    assert schedule.job_name == MAINTENANCE_JOB and schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    resources = {SPARK_RESOURCE_KEY: SparkResource(master="local[1]")}
    with dg.instance_for_test() as instance:
        def run(**op_config):
            result = job.execute_in_process(instance=instance, resources=resources,
                                            run_config={"ops": {f"{MAINTENANCE_JOB}_op": {"config": op_config}}})
            assert result.success
            return observed_tables(result)

        # busy: 8 files since its last compaction (8/5 of the threshold); manifests: 3 manifests (3/3). One per run.
        first = run(max_tables=1)
        assert list(first) == [f"{namespace}/busy"]
        assert first[f"{namespace}/busy"]["files_compacted"] == 8
        assert first[f"{namespace}/busy"]["data_files_after"] < first[f"{namespace}/busy"]["data_files_before"]

        second = run()
        assert list(second) == [f"{namespace}/manifests"]
        merged = second[f"{namespace}/manifests"]
        assert (merged["manifests_before"], merged["files_compacted"]) == (3, 0) and merged["manifests_after"] < 3

        assert run() == {}, "nothing is over a threshold any more"
        records = instance.fetch_observations(table_asset_key(worlds["busy"].table_name), limit=10).records
        assert len(records) == 1 and records[0].run_id

        # By hand, one table whatever its need.
        forced = run(tables=[worlds["quiet"].table_name], force=True)
        assert list(forced) == [f"{namespace}/quiet"]

    assert len(worlds["quiet"].table().metadata.snapshots) >= quiet_snapshots
    for name, world in worlds.items():
        world.assert_exactly_once(runs=rounds[name])


def test_mappings_with_different_crons_get_a_schedule_each_naming_their_tables(tmp_path):
    document = {
        "s3": {"bucket": "b"}, "iceberg": {"catalog": {"type": "rest", "uri": "http://catalog:8181"}},
        "etcd": {"endpoints": ["http://etcd:2379"]},
        "mappings": [{"topic": "a", "table": "raw.a"}, {"topic": "b", "table": "raw.b"},
                     {"topic": "c", "table": "raw.c", "maintenance": {"cron_schedule": "*/10 * * * *"}},
                     {"topic": "d", "table": "raw.d", "maintenance": {"enabled": False}}],
    }
    [job], schedules = build_maintenance(parse_config(document, base_dir=tmp_path))
    assert job.name == MAINTENANCE_JOB
    assert [(s.cron_schedule, run_config_of(s)["ops"][f"{MAINTENANCE_JOB}_op"]["config"]["tables"])
            for s in schedules] == [("17 * * * *", ["raw.a", "raw.b"]), ("*/10 * * * *", ["raw.c"])]
    document["mappings"] = document["mappings"][:2]
    [job], [schedule] = build_maintenance(parse_config(document, base_dir=tmp_path))
    assert schedule.name == f"{MAINTENANCE_JOB}_schedule" and not run_config_of(schedule)


def run_config_of(schedule: dg.ScheduleDefinition) -> dict:
    [request] = schedule.evaluate_tick(dg.build_schedule_context()).run_requests
    return request.run_config
