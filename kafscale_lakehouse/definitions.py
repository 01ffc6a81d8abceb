"""Dagster definitions: the code location `dagster dev` loads (see [tool.dagster] in pyproject.toml).

Everything comes from the lakehouse config (`$KAFSCALE_LAKEHOUSE_CONFIG`, default `lakehouse.yaml`): per mapping the
topic's observable source asset, the table asset with its checks, an ingest job and a sensor. A config that cannot
be used (unknown key, wrong type, invalid table name, a mapped topic that does not exist) fails here, when the code
location loads, with a `ConfigError` naming the key, not in the middle of a run.
"""

from __future__ import annotations

import logging
import os

import dagster as dg

from kafscale_lakehouse.config import (
    CONFIG_PATH_ENV_VAR,
    DEFAULT_CONFIG_PATH,
    ConfigError,
    LakehouseConfig,
    load_config,
)
from kafscale_lakehouse.connections import etcd_client_from_config, segment_store_from_config
from kafscale_lakehouse.orchestration.assets import ICEBERG_IO_MANAGER_KEY, build_table_asset, build_topic_source_asset
from kafscale_lakehouse.orchestration.checks import build_table_checks
from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.maintenance import build_maintenance
from kafscale_lakehouse.orchestration.naming import ingest_job_name, table_asset_key
from kafscale_lakehouse.orchestration.resources import CATALOG_RESOURCE_KEY, SPARK_RESOURCE_KEY, lakehouse_resources
from kafscale_lakehouse.orchestration.sensors import build_sensors
from kafscale_lakehouse.storage import DiscoveryMode, discover_partitions

log = logging.getLogger(__name__)

# How long loading the definitions waits for an unreachable etcd before failing.
ETCD_RETRY_SECONDS_AT_LOAD = 5.0


def check_mapped_topics_exist(config: LakehouseConfig, source: str) -> None:
    """Every mapped topic must have partitions where `discovery.mode` looks (segment store and/or etcd metadata);
    a `ConfigError` names the mappings whose topic does not exist."""
    if not config.mappings:
        return
    store = segment_store_from_config(config)
    etcd = etcd_client_from_config(config, retry_seconds=ETCD_RETRY_SECONDS_AT_LOAD) if config.etcd.endpoints else None
    try:
        discovery = discover_partitions(DiscoveryMode.parse(config.discovery.mode), store, etcd,
                                        topics=[m.topic for m in config.mappings])
    finally:
        if etcd is not None:
            etcd.close()
    where = (f"the KafScale metadata snapshot in etcd at {', '.join(etcd.endpoints)}"
             if discovery.source is DiscoveryMode.ETCD and etcd is not None
             else f"{store.location} under namespace {store.namespace!r}")
    problems = [f"mappings[{index}].topic: topic {mapping.topic!r} does not exist in {where} "
                f"(discovery.mode {config.discovery.mode})"
                for index, mapping in enumerate(config.mappings) if not discovery.partitions.get(mapping.topic)]
    if problems:
        raise ConfigError(source, problems)


def build_definitions(config: LakehouseConfig, *, source: str = "<config>") -> dg.Definitions:
    """The definitions of `config` (`source` names the config file in errors)."""
    check_mapped_topics_exist(config, source)
    resources: dict[str, object] = dict(lakehouse_resources(config))
    resources[ICEBERG_IO_MANAGER_KEY] = KafscaleIcebergIOManager(
        iceberg_catalog=resources[CATALOG_RESOURCE_KEY], spark=resources[SPARK_RESOURCE_KEY])
    assets: list[object] = []
    checks: list[dg.AssetChecksDefinition] = []
    jobs = []
    for mapping in config.mappings:
        assets += [build_topic_source_asset(config, mapping), build_table_asset(config, mapping)]
        checks += build_table_checks(config, mapping)
        jobs.append(dg.define_asset_job(
            ingest_job_name(mapping.table), selection=dg.AssetSelection.assets(table_asset_key(mapping.table)),
            description=f"Ingest KafScale topic {mapping.topic!r} into {mapping.table} and check the result."))
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
    return build_definitions(load_config(source), source=source)
