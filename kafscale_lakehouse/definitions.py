"""Dagster definitions: the code location `dagster dev` loads (see [tool.dagster] in pyproject.toml).

Everything comes from the lakehouse config (`$KAFSCALE_LAKEHOUSE_CONFIG`, default `lakehouse.yaml`): per mapping the
topic's observable asset, the table asset with its checks, an ingest job and a sensor. A config that cannot be used
(unknown key, wrong type, invalid table name) fails here, when the code location loads, with a `ConfigError` naming
the key. Loading contacts no server (S3, etcd, the catalog, the registry): a topic that does not exist yet or a
server that is down is reported by the topic's sensor and by the run, naming it, and never takes the other
mappings' sensors down. With the demo's mapping (`rpc.pizzas`), the demo lakehouse's downstream assets
(`demo_assets.py`) are added.
"""

from __future__ import annotations

import logging
import os

import dagster as dg

from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, DEFAULT_CONFIG_PATH, LakehouseConfig, load_config
from kafscale_lakehouse.demo_assets import DEMO_LANDED_TABLE, demo_definitions
from kafscale_lakehouse.orchestration.assets import ICEBERG_IO_MANAGER_KEY, build_table_asset, build_topic_source_asset
from kafscale_lakehouse.orchestration.checks import build_table_checks
from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.maintenance import build_maintenance
from kafscale_lakehouse.orchestration.naming import ingest_job_name, table_asset_key
from kafscale_lakehouse.orchestration.replay import build_replay_job
from kafscale_lakehouse.orchestration.resources import CATALOG_RESOURCE_KEY, SPARK_RESOURCE_KEY, lakehouse_resources
from kafscale_lakehouse.orchestration.sensors import build_sensors

log = logging.getLogger(__name__)

def build_definitions(config: LakehouseConfig, *, source: str = "<config>") -> dg.Definitions:
    """The definitions of `config` (`source` names the config file in errors)."""
    resources: dict[str, object] = dict(lakehouse_resources(config))
    resources[ICEBERG_IO_MANAGER_KEY] = KafscaleIcebergIOManager(
        iceberg_catalog=resources[CATALOG_RESOURCE_KEY], spark=resources[SPARK_RESOURCE_KEY],
        target_file_size_bytes=config.processor.target_file_size_bytes)
    assets: list[dg.AssetsDefinition] = []
    checks: list[dg.AssetChecksDefinition] = []
    jobs: list[dg.JobDefinition | dg.UnresolvedAssetJobDefinition] = []
    for mapping in config.mappings:
        assets += [build_topic_source_asset(config, mapping), build_table_asset(config, mapping)]
        checks += build_table_checks(config, mapping)
        jobs.append(dg.define_asset_job(
            ingest_job_name(mapping.table), selection=dg.AssetSelection.assets(table_asset_key(mapping.table)),
            description=f"Ingest KafScale topic {mapping.topic!r} into {mapping.table} and check the result."))
        jobs.append(build_replay_job(config, mapping))
    maintenance_jobs, schedules = build_maintenance(config)
    log.info("Dagster definitions for %d mapping(s) of %s", len(config.mappings), source)
    # In-process: a run's checks follow its commit in the same process, reusing its Spark session and clients
    # (a process per step would start Spark and the connections again, on machines Spark already keeps busy).
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs + maintenance_jobs, schedules=schedules,
                          sensors=build_sensors(config),
                          resources=resources, executor=dg.in_process_executor)


@dg.definitions
def defs() -> dg.Definitions:
    source = os.environ.get(CONFIG_PATH_ENV_VAR) or DEFAULT_CONFIG_PATH
    config = load_config(source)
    definitions = build_definitions(config, source=source)
    if any(mapping.table == DEMO_LANDED_TABLE for mapping in config.mappings):
        definitions = dg.Definitions.merge(definitions, demo_definitions())
    return definitions
