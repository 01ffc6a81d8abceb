"""`KafscaleLakehouseComponent`: KafScale ingestion as a Dagster component (`dg scaffold defs`), the one way our
definitions are built, for our own code location (`kafscale_lakehouse/defs/lakehouse/defs.yaml`) and for a user's
Dagster project alike.

Per mapping of the lakehouse config: the topic's observable asset, the table asset with its checks, an ingest job,
a replay job and a sensor; maintenance jobs and schedules; the resources and the Iceberg IO manager. A
`topic_pattern` mapping is a mapping per topic it matches when the location loads (one topic listing), and a sensor
reloads the location when another topic matches (orchestration/topic_patterns.py). With the demo's
mapping (`rpc.pizzas`), the demo lakehouse's downstream assets (`demo_assets.py`) are added.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import dagster as dg
from dagster.components.scaffold.scaffold import ScaffoldRequest, scaffold_with
from pydantic import Field, model_validator

from kafscale_lakehouse.config import (
    CONFIG_PATH_ENV_VAR,
    DEFAULT_CONFIG_PATH,
    LakehouseConfig,
    load_config,
    parse_config,
)
from kafscale_lakehouse.demo_assets import DEMO_LANDED_TABLE, demo_definitions
from kafscale_lakehouse.engine.ingestion.topic_patterns import with_pattern_topics
from kafscale_lakehouse.etcd import EtcdError
from kafscale_lakehouse.orchestration.assets import ICEBERG_IO_MANAGER_KEY, build_table_asset, build_topic_source_asset
from kafscale_lakehouse.orchestration.audited_publish import audited_publish_sensor
from kafscale_lakehouse.orchestration.checks import build_table_checks
from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.land_tables import build_land_tables_job
from kafscale_lakehouse.orchestration.maintenance import build_maintenance
from kafscale_lakehouse.orchestration.namespace_sensor import build_namespace_sensor
from kafscale_lakehouse.orchestration.naming import ingest_job_name, table_asset_key
from kafscale_lakehouse.orchestration.partitions import register_topic_partitions
from kafscale_lakehouse.orchestration.replay import build_replay_job
from kafscale_lakehouse.orchestration.resources import CATALOG_RESOURCE_KEY, SPARK_RESOURCE_KEY, lakehouse_resources
from kafscale_lakehouse.orchestration.sensors import build_sensors
from kafscale_lakehouse.orchestration.topic_patterns import (
    WEBSERVER_URL_ENV_VAR,
    build_topic_pattern_sensor,
    webserver_reload,
)
from kafscale_lakehouse.storage import StorageError

log = logging.getLogger(__name__)


def build_definitions(config: LakehouseConfig, *, source: str = "<config>", webserver_url: str | None = None,
                      instance: dg.DagsterInstance | None = None) -> dg.Definitions:
    """The definitions of `config` (`source` names the config file in errors). With `topic_pattern` mappings, a
    mapping per matching topic that exists now, and the sensor that reloads the code location (through the webserver
    at `webserver_url`, default `$KAFSCALE_LAKEHOUSE_WEBSERVER_URL`) when another one appears. With `instance`, the
    topics' partitions that exist now are registered in it (`partitions.py`), so they can be materialized by hand
    before any sensor tick."""
    config = _with_pattern_topics(config, source)
    if instance is not None:
        register_partitions_on_load(config, instance, source)
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
    if config.processor.watch == "namespace":  # one sensor for every mapping, runs that land many tables each
        sensors = [build_namespace_sensor(config)]
        jobs.append(build_land_tables_job(config))
    else:
        sensors = build_sensors(config)
    # The IO manager's `publish: audited` writes are published by this run status sensor; without such writes it
    # finds nothing to publish in a run.
    sensors.append(audited_publish_sensor)
    if config.pattern_mappings:
        url = webserver_url or os.environ.get(WEBSERVER_URL_ENV_VAR) or None
        sensors.append(build_topic_pattern_sensor(config, reload=webserver_reload(url) if url else None))
    definitions = dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs + maintenance_jobs,
                                 schedules=schedules, sensors=sensors, resources=resources,
                                 executor=dg.in_process_executor)
    if any(mapping.table == DEMO_LANDED_TABLE for mapping in config.mappings):
        definitions = dg.Definitions.merge(definitions, demo_definitions())
    return definitions


def register_partitions_on_load(config: LakehouseConfig, instance: dg.DagsterInstance, source: str) -> None:
    """`register_topic_partitions`, logged instead of raised when a server cannot be reached or answers wrong: a
    server that is down never keeps the location from loading (the sensors register the partitions later)."""
    try:
        register_topic_partitions(config, instance)
    except Exception as exc:  # noqa: BLE001 - any failure to reach or read a server; the load goes on without it
        log.warning("%s: the topics' partitions could not be registered while loading (%s); the sensors register "
                    "them on their first tick", source, exc)


def _instance_of_this_process() -> dg.DagsterInstance | None:
    """The instance of `$DAGSTER_HOME` (the code server's, `dg launch`'s), or None when it is not set."""
    if not os.environ.get("DAGSTER_HOME"):
        log.info("DAGSTER_HOME is not set: the topics' partitions are registered by the sensors, not when the "
                 "definitions load")
        return None
    return dg.DagsterInstance.get()


def _with_pattern_topics(config: LakehouseConfig, source: str) -> LakehouseConfig:
    """`config` with a mapping per existing topic its patterns match. Listing the topics is the one request loading
    makes, and only with patterns: when it fails, the location loads with the explicit mappings (the pattern sensor
    reloads it once the topics can be listed), so a server that is down never takes the other mappings down."""
    if not config.pattern_mappings:
        return config
    try:
        return with_pattern_topics(config).config
    except (StorageError, EtcdError) as exc:
        log.error("%s: the topics matching its topic patterns cannot be listed (%s); loading without them", source,
                  exc)
        return config


class KafscaleLakehouseScaffolder(dg.Scaffolder):
    """`dg scaffold defs kafscale_lakehouse.orchestration.component.KafscaleLakehouseComponent <path>`: a defs.yaml
    that points at a `lakehouse.yaml` beside it, and that file with one mapping to fill in."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        dg.scaffold_component(request, {"config_path": "lakehouse.yaml"})
        config = Path(request.target_path) / "lakehouse.yaml"
        if not config.exists():
            config.write_text(SCAFFOLDED_CONFIG)


SCAFFOLDED_CONFIG = """\
# The KafScale lakehouse config (README: "Configuration"): where the segments are, the Iceberg catalog, the offsets
# store, and a mapping per topic. `${VAR}` is read from the environment (secrets belong there).
s3:
  bucket: kafscale-data
  namespace: default
  region: us-east-1
iceberg:
  catalog:
    type: rest
    uri: http://iceberg-rest:8181
  warehouse: s3://warehouse/
etcd:
  endpoints: [http://etcd:2379]
mappings:
  - topic: orders
    table: prod.orders
    create_table_if_missing: true
"""


@scaffold_with(KafscaleLakehouseScaffolder)
class KafscaleLakehouseComponent(dg.Component, dg.Model, dg.Resolvable):
    """KafScale topics landed in Iceberg tables exactly once: per mapping, the topic and table assets, the table's
    checks, ingest and replay jobs, a sensor, maintenance jobs and schedules, and their resources.

    The lakehouse config is either a file (`config_path`, relative to this defs.yaml) or inline (`config`: the same
    document as a lakehouse.yaml, `mappings[]` and all); with neither, `$KAFSCALE_LAKEHOUSE_CONFIG`, then
    `lakehouse.yaml` in the working directory.
    """

    config_path: str | None = Field(
        default=None, description="A lakehouse.yaml, relative to the directory of this defs.yaml.")
    config: dict[str, Any] | None = Field(
        default=None, description="The lakehouse config inline: s3, iceberg, etcd/offsets, mappings[], ...")
    webserver_url: str | None = Field(
        default=None, description="The Dagster webserver (http://host:port) the topic pattern sensor asks to reload "
                                  "this code location when a new topic matches a pattern; default "
                                  f"${WEBSERVER_URL_ENV_VAR}.")

    register_partitions_on_load: bool = Field(
        default=True, description="Register the Kafka partitions each topic has now as its table asset's partitions "
                                  "in the instance of $DAGSTER_HOME when the definitions load, so they can be "
                                  "materialized before any sensor tick.")

    @model_validator(mode="after")
    def _one_config(self) -> KafscaleLakehouseComponent:
        if self.config_path is not None and self.config is not None:
            raise ValueError("give config_path or config, not both")
        return self

    def lakehouse_config(self, directory: Path) -> tuple[LakehouseConfig, str]:
        """The config and its source, for a component whose defs.yaml is in `directory`."""
        if self.config is not None:
            source = f"{directory / 'defs.yaml'} (attributes.config)"
            return parse_config(self.config, source=source, base_dir=directory), source
        if self.config_path is not None:
            path = directory / self.config_path
            return load_config(path), str(path)
        source = os.environ.get(CONFIG_PATH_ENV_VAR) or DEFAULT_CONFIG_PATH
        return load_config(source), source

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        config, source = self.lakehouse_config(context.path)
        instance = _instance_of_this_process() if self.register_partitions_on_load else None
        try:
            return build_definitions(config, source=source, webserver_url=self.webserver_url, instance=instance)
        finally:
            if instance is not None:
                instance.dispose()
