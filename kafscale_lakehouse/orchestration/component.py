"""`KafscaleLakehouseComponent`: KafScale ingestion as a Dagster component (`dg scaffold defs`), the one way our
definitions are built, for our own code location (`kafscale_lakehouse/defs/lakehouse/defs.yaml`) and for a user's
Dagster project alike.

Per mapping of the lakehouse config: the topic's observable asset, the table asset with its checks, an ingest job,
a replay job and a sensor; maintenance jobs and schedules; the resources and the Iceberg IO manager. A
`topic_pattern` mapping is a mapping per topic it matches when the location loads (one topic listing), and a sensor
reloads the location when another topic matches (orchestration/topic_patterns.py). Nothing else: the demo
lakehouse's downstream assets and automation (`demo_assets.py`) are in our own code location's defs folder only.
"""

# No `from __future__ import annotations`: dg reads the component's field annotations at runtime.

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import dagster as dg
from dagster.components.scaffold.scaffold import ScaffoldRequest, scaffold_with
from pydantic import BaseModel, Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from kafscale_lakehouse.config import (
    CONFIG_PATH_ENV_VAR,
    DEFAULT_CONFIG_PATH,
    AssetConfig,
    LakehouseConfig,
    load_config,
    parse_config,
)
from kafscale_lakehouse.engine.ingestion.topic_patterns import with_pattern_topics
from kafscale_lakehouse.etcd import EtcdError
from kafscale_lakehouse.orchestration.assets import ICEBERG_IO_MANAGER_KEY, build_table_asset, build_topic_source_asset
from kafscale_lakehouse.orchestration.audited_publish import audited_publish_sensor
from kafscale_lakehouse.orchestration.checks import build_table_checks
from kafscale_lakehouse.orchestration.io_manager import KafscaleIcebergIOManager
from kafscale_lakehouse.orchestration.land_tables import build_land_tables_job
from kafscale_lakehouse.orchestration.maintenance import build_maintenance
from kafscale_lakehouse.orchestration.namespace_sensor import build_namespace_sensor
from kafscale_lakehouse.orchestration.naming import ingest_job_name, mapping_asset_key, with_translation
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
            ingest_job_name(mapping.table), selection=dg.AssetSelection.assets(mapping_asset_key(mapping)),
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
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs + maintenance_jobs, schedules=schedules,
                          sensors=sensors, resources=resources, executor=dg.in_process_executor)


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


class LakehouseDocument(dict[str, Any]):
    """The lakehouse config inline, as a component attribute: validated like a lakehouse.yaml (`LakehouseConfig`, so
    `dg check defs` names the key at fault and `dg` shows every key's schema) and kept as written, so dg's templates
    (`{{ env.X }}`) and our `${VAR}` are filled in when the component loads, not when it is checked."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        # Named for the errors, which show it: `config.function-wrap[lakehouse_config()].iceberg.catalog.uri`.
        def lakehouse_config(value: Any, validate: core_schema.ValidatorFunctionWrapHandler) -> Any:
            validate(value)
            return value

        return core_schema.no_info_wrap_validator_function(lakehouse_config, handler.generate_schema(LakehouseConfig))


def _resolve_config(context: dg.ResolutionContext, document: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if document is None else dict(context.resolve_value(document))


def _resolve_translation(context: dg.ResolutionContext, translation: AssetConfig | None) -> AssetConfig | None:
    if translation is None:
        return None
    return AssetConfig.model_validate(context.resolve_value(translation.model_dump(exclude_none=True)))


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EMBEDDED_TOPIC = "completed-pizzas"
EMBEDDED_TABLE = "rpc.pizzas"


class ScaffoldParams(BaseModel):
    """`dg scaffold defs ...KafscaleLakehouseComponent PATH [--json-params '{...}']`."""

    template: Literal["embedded", "remote"] = Field(
        default="embedded", description="embedded: no servers (segments in a local directory, a sqlite catalog and "
                                        "offsets store, under var/ beside the defs.yaml); remote: S3, an Iceberg REST "
                                        "catalog and etcd, secrets from the environment.")
    topic: str = Field(default=EMBEDDED_TOPIC, description="The KafScale topic of the one mapping.")
    table: str = Field(default=EMBEDDED_TABLE, description="Its Iceberg table, `namespace.table`.")
    bucket: str = Field(default="kafscale-data", description="remote: the segment bucket.")
    catalog_uri: str = Field(default="http://iceberg-rest:8181", description="remote: the Iceberg REST catalog.")
    etcd_endpoint: str = Field(default="http://etcd:2379", description="remote: etcd (offsets, broker metadata).")


class KafscaleLakehouseScaffolder(dg.Scaffolder[ScaffoldParams]):
    """`dg scaffold defs kafscale_lakehouse.orchestration.component.KafscaleLakehouseComponent <path>`: a defs.yaml
    that points at a `lakehouse.yaml` beside it, and that file from a template with one mapping: `embedded` (the
    default, no servers: examples/embedded.yaml's sections) or `remote` (`--json-params '{"template": "remote",
    "topic": ..., "table": ..., "bucket": ..., "catalog_uri": ..., "etcd_endpoint": ...}'`)."""

    @classmethod
    def get_scaffold_params(cls) -> type[ScaffoldParams]:
        return ScaffoldParams

    def scaffold(self, request: ScaffoldRequest[ScaffoldParams]) -> None:
        params = request.params or ScaffoldParams()
        dg.scaffold_component(request, {"config_path": "lakehouse.yaml"})
        config = Path(request.target_path) / "lakehouse.yaml"
        if not config.exists():
            config.write_text(scaffolded_config(params), encoding="utf-8")
        if params.template == "embedded":
            (Path(request.target_path) / "var" / "segments").mkdir(parents=True, exist_ok=True)


def scaffolded_config(params: ScaffoldParams) -> str:
    """The lakehouse.yaml `dg scaffold defs` writes: the template's sections and one mapping of `params`."""
    if params.template == "embedded":
        template = (EXAMPLES / "embedded.yaml").read_text(encoding="utf-8")
        head = template[:template.index("\nmappings:\n")]
        return (f"{head}\n\nmappings:\n  - topic: {json.dumps(params.topic)}\n    table: {json.dumps(params.table)}\n"
                "    create_table_if_missing: true\n")
    return REMOTE_CONFIG.format(topic=json.dumps(params.topic), table=json.dumps(params.table),
                                bucket=json.dumps(params.bucket), catalog_uri=json.dumps(params.catalog_uri),
                                etcd_endpoint=json.dumps(params.etcd_endpoint))


REMOTE_CONFIG = """\
# The KafScale lakehouse config (docs/dagster-component.md): where the broker keeps segments (S3), the Iceberg REST
# catalog, etcd (offsets, leases, the broker's metadata), and a mapping per topic. Secrets come from the environment:
# `${{VAR}}` (or, in defs.yaml attributes, dg's `{{{{ env.VAR }}}}`).
s3:
  bucket: {bucket}
  namespace: default
  region: us-east-1
  access_key_id: ${{AWS_ACCESS_KEY_ID}}
  secret_access_key: ${{AWS_SECRET_ACCESS_KEY}}
iceberg:
  catalog:
    type: rest
    uri: {catalog_uri}
  warehouse: s3://warehouse/
etcd:
  endpoints: [{etcd_endpoint}]
mappings:
  - topic: {topic}
    table: {table}
    create_table_if_missing: true
"""


@scaffold_with(KafscaleLakehouseScaffolder)
@dataclass
class KafscaleLakehouseComponent(dg.Component, dg.Resolvable):
    """KafScale topics landed in Iceberg tables exactly once: per mapping, the topic and table assets, the table's
    checks, ingest and replay jobs, a sensor, maintenance jobs and schedules, and their resources.

    The lakehouse config is either a file (`config_path`, relative to this defs.yaml) or inline (`config`: the same
    document as a lakehouse.yaml, `mappings[]` and all, checked against its schema); with neither,
    `$KAFSCALE_LAKEHOUSE_CONFIG`, then `lakehouse.yaml` in the working directory. `translation` names and describes
    every mapping's assets (a mapping's own `asset` keys win).
    """

    config_path: Annotated[str | None, dg.Resolver.default(
        description="A lakehouse.yaml, relative to the directory of this defs.yaml.")] = None
    config: Annotated[dict[str, Any] | None, dg.Resolver(
        _resolve_config, model_field_type=LakehouseDocument | None,
        description="The lakehouse config inline: s3, segments, iceberg, offsets, etcd, discovery, schema, processor, "
                    "spark, mappings[]. Secrets as {{ env.VAR }} or ${VAR}.")] = None
    translation: Annotated[AssetConfig | None, dg.Resolver(
        _resolve_translation, model_field_type=AssetConfig | None,
        description="Every mapping's Dagster assets unless the mapping's own `asset` says otherwise: key_prefix, "
                    "key, topic_key, group, description ({table}, {topic}), kinds.")] = None
    webserver_url: Annotated[str | None, dg.Resolver.default(
        description="The Dagster webserver (http://host:port) the topic pattern sensor asks to reload this code "
                    f"location when a new topic matches a pattern; default ${WEBSERVER_URL_ENV_VAR}.")] = None
    register_partitions_on_load: Annotated[bool, dg.Resolver.default(
        description="Register the Kafka partitions each topic has now as its table asset's partitions in the "
                    "instance of $DAGSTER_HOME when the definitions load, so they can be materialized before any "
                    "sensor tick.")] = True

    def __post_init__(self) -> None:
        if self.config_path is not None and self.config is not None:
            raise ValueError("give config_path or config, not both")

    def lakehouse_config(self, directory: Path) -> tuple[LakehouseConfig, str]:
        """The config and its source, for a component whose defs.yaml is in `directory`, with `translation`."""
        if self.config is not None:
            source = f"{directory / 'defs.yaml'} (attributes.config)"
            config = parse_config(self.config, source=source, base_dir=directory)
        elif self.config_path is not None:
            source = str(directory / self.config_path)
            config = load_config(source)
        else:
            source = os.environ.get(CONFIG_PATH_ENV_VAR) or DEFAULT_CONFIG_PATH
            config = load_config(source)
        return with_translation(config, self.translation), source

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        config, source = self.lakehouse_config(context.path)
        instance = _instance_of_this_process() if self.register_partitions_on_load else None
        try:
            return build_definitions(config, source=source, webserver_url=self.webserver_url, instance=instance)
        finally:
            if instance is not None:
                instance.dispose()
