"""Dagster resources: the Spark session, the segment store, the Iceberg catalog and the offsets store, each a
`ConfigurableResource` built from the lakehouse config by `lakehouse_resources(config)`.

The store, catalog and offsets resources hold the config's connection keys (`CONNECTION_SECTIONS`, as JSON without
secrets) and open their clients through `kafscale_lakehouse.connections`, the one mapping from config to clients.
Secrets never become plain resource config (the UI shows resource config): each resource has one field per secret
it needs, passed as a `dg.EnvVar` reference. A secret the config file holds is exported under a name of ours
(`secret_env_var_name`) in the process that loads the definitions; run workers and step processes load them too, so
the reference resolves there.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, ClassVar

import dagster as dg
from pydantic import BaseModel, PrivateAttr, SecretStr
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.connections import (
    SECRET_KEYS,
    catalog_settings,
    etcd_client_from_config,
    offset_store_from_config,
    schema_registry_client,
    segment_store_from_config,
)
from kafscale_lakehouse.engine.ingestion import IngestContext, spark_job
from kafscale_lakehouse.engine.spark import get_spark_session, local_engine_request
from kafscale_lakehouse.engine.tables import CatalogSettings, load_catalog, open_table
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets import OffsetStore
from kafscale_lakehouse.storage import SegmentStore

SPARK_RESOURCE_KEY = "spark"
SEGMENT_STORE_RESOURCE_KEY = "segment_store"
CATALOG_RESOURCE_KEY = "iceberg_catalog"
OFFSET_STORE_RESOURCE_KEY = "offset_store"
SECRET_ENV_PREFIX = "KAFSCALE_LAKEHOUSE_SECRET_"  # noqa: S105 - an environment variable prefix, not a secret
SECRET_MASK = "**********"  # noqa: S105 - the mask shown instead of a secret; as pydantic's SecretStr shows a secret
# The config sections the connection resources hold (what `connections` reads); no mapping, schema or registry.
CONNECTION_SECTIONS = ("s3", "segments", "iceberg", "offsets", "discovery", "etcd")
# `iceberg.catalog.properties` pass to pyiceberg as they are, and any of them may be a secret (a `header.*` token, a
# signing or OAuth credential): the whole map travels as one secret, JSON in an EnvVar, never as resource config.
CATALOG_PROPERTIES_KEY = "iceberg.catalog.properties"


class SecretConflictError(ValueError):
    """Two configs loaded into one process give the same secret key different values."""


def secret_env_var_name(config_key: str) -> str:
    """`s3.secret_access_key` -> `KAFSCALE_LAKEHOUSE_SECRET_S3_SECRET_ACCESS_KEY`."""
    return SECRET_ENV_PREFIX + config_key.upper().replace(".", "_")


def secret_reference(config_key: str, secret: SecretStr | str | None) -> dg.EnvVar | None:
    """An `EnvVar` holding `secret` (exported now, in this process), or None when the config has no such secret."""
    if secret is None:
        return None
    value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    name = secret_env_var_name(config_key)
    if os.environ.get(name, value) != value:
        raise SecretConflictError(
            f"{config_key}: a config loaded earlier in this process set it to a different value; load one "
            "lakehouse config per process")
    os.environ[name] = value
    return dg.EnvVar(name)


def _secret_shown(value: Any) -> Any:
    """A secret as `repr` shows it: an EnvVar reference (a variable name) as it is, a value as `**********`."""
    return value if value is None or isinstance(value, dg.EnvVar) else SECRET_MASK


# The mixin below overrides a method of the pydantic models it is mixed into; a type checker is told so.
if TYPE_CHECKING:
    _PydanticModel = BaseModel
else:
    _PydanticModel = object


class _SecretsHiddenInRepr(_PydanticModel):
    """`repr`/`str` of a resource show its `_SECRET_FIELDS` through `_secret_shown`: in the definitions they are
    EnvVar references, but once a run resolves the resource they hold the secrets themselves."""

    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset()

    def __repr_args__(self):  # noqa: ANN204 - pydantic's signature
        for name, value in super().__repr_args__():
            yield name, _secret_shown(value) if name in self._SECRET_FIELDS else value


class SparkResource(dg.ConfigurableResource):
    """The Spark session of `spark.*`, built by `engine.spark.get_spark_session` (loopback binding for local masters,
    the venv's Python for workers, `KAFSCALE_SPARK_*` deployment overrides): a client of the Spark engine at
    `remote` (or `$SPARK_REMOTE`) when set, else embedded. Created on first use, so steps that never touch Spark do
    not pay its start-up. The same `spark_session` / `spark_context` as dagster-pyspark's `PySparkResource`, without
    that package: it pins one Dagster release and brings Dagster's preview Spark pipeline component."""

    master: str = "local[*]"
    spark_config: dict[str, Any] = {}  # noqa: RUF012 - a config field; pydantic copies the default
    remote: str | None = None
    # Without `remote`, runs share the local Spark engine (engine/spark/local_engine.py) unless
    # KAFSCALE_SPARK_AUTO_ENGINE=0: each run worker would otherwise start a JVM and its Python workers.
    local_engine: bool = False
    _spark_session: SparkSession | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Deliberately lazy: see `spark_session`.
        self._spark_session = None

    @property
    def spark_session(self) -> SparkSession:
        if self._spark_session is None:
            local_engine = local_engine_request([spark_job.__name__]) if self.local_engine else None
            self._spark_session = get_spark_session(self.master, {k: str(v) for k, v in self.spark_config.items()},
                                                    remote=self.remote, local_engine=local_engine)
        return self._spark_session

    @property
    def spark_context(self) -> Any:
        return self.spark_session.sparkContext


def _secret_field(config_key: str) -> str:
    """The resource field of a secret config key: `iceberg.catalog.token` -> `iceberg_catalog_token`."""
    return config_key.replace(".", "_")


class _ConnectionResource(_SecretsHiddenInRepr, dg.ConfigurableResource):
    """The config's connection sections as JSON without secrets; a subclass declares a field for each secret of
    `_SECRET_KEYS` (named by `_secret_field`) and opens its clients from `lakehouse_config()`."""

    _SECRET_KEYS: ClassVar[tuple[str, ...]] = ()

    config_json: str

    @classmethod
    def of(cls, config: LakehouseConfig) -> _ConnectionResource:
        document = config.model_dump(mode="json", by_alias=True, include=set(CONNECTION_SECTIONS))
        for key in (*SECRET_KEYS, CATALOG_PROPERTIES_KEY):
            _set_path(document, key, None)
        secrets = {_secret_field(key): secret_reference(key, _secret_text(_get_path(config, key)))
                   for key in cls._SECRET_KEYS}
        return cls(config_json=json.dumps(document, sort_keys=True), **secrets)

    def lakehouse_config(self) -> LakehouseConfig:
        """The connection sections as a config (other sections at their defaults), with this resource's secrets."""
        document = json.loads(self.config_json)
        for key in self._SECRET_KEYS:
            value = getattr(self, _secret_field(key))
            if key == CATALOG_PROPERTIES_KEY and value is not None:
                text = value.get_value() if isinstance(value, dg.EnvVar) else value
                if text is None:
                    raise ValueError(f"{key}: environment variable {value} is not set")
                value = json.loads(text)
            _set_path(document, key, value)
        return LakehouseConfig.model_validate(document)



def _secret_text(value: Any) -> Any:
    """A secret as the text its EnvVar holds: a map as JSON (an empty map is no secret)."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True) if value else None
    return value


def _get_path(config: LakehouseConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, "schema_config" if part == "schema" else part, None)
    return value


def _set_path(document: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted) in `document` where its parent section exists; a None value removes it."""
    *parents, name = key.split(".")
    section: Any = document
    for part in parents:
        section = section.get(part) if isinstance(section, dict) else None
        if section is None:
            return
    if value is None:
        section.pop(name, None)
    else:
        section[name] = value


class SegmentStoreResource(_ConnectionResource):
    """Where KafScale segments are: `segments.local_root` or the `s3` bucket (`connections.segment_store_from_config`).
    """

    _SECRET_KEYS: ClassVar[tuple[str, ...]] = ("s3.secret_access_key",)
    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset(map(_secret_field, _SECRET_KEYS))

    s3_secret_access_key: str | None = None

    def open_store(self) -> SegmentStore:
        """A new store; its `request_counts` count only the requests made through it."""
        return segment_store_from_config(self.lakehouse_config())


class IcebergCatalogResource(_ConnectionResource):
    """The Iceberg catalog (`iceberg.*`) and the S3 settings of its FileIO (`connections.catalog_settings`)."""

    _SECRET_KEYS: ClassVar[tuple[str, ...]] = (
        "iceberg.catalog.token",
        "iceberg.catalog.password",
        "iceberg.catalog.credential",
        "iceberg.s3.secret_access_key",
        "s3.secret_access_key",
        CATALOG_PROPERTIES_KEY,
    )
    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset(map(_secret_field, _SECRET_KEYS))

    iceberg_catalog_token: str | None = None
    iceberg_catalog_password: str | None = None
    iceberg_catalog_credential: str | None = None
    iceberg_s3_secret_access_key: str | None = None
    s3_secret_access_key: str | None = None  # the warehouse's FileIO uses `s3` when there is no `iceberg.s3`
    iceberg_catalog_properties: str | None = None  # JSON (CATALOG_PROPERTIES_KEY)

    def settings(self) -> CatalogSettings:
        return catalog_settings(self.lakehouse_config())

    def load_table(self, identifier: str) -> Table:
        """The table as the catalog has it now; `engine.catalog.TableNotFoundError` names it when it is missing."""
        return open_table(load_catalog(self.settings()), identifier)


class OffsetStoreResource(_ConnectionResource):
    """Committed offsets, broker watermarks and leases: `offsets.backend` `etcd` (KafScale keys) or `local` (sqlite).
    The etcd client also serves `discovery.mode` etcd/auto; both are opened once per step and closed after it."""

    _SECRET_KEYS: ClassVar[tuple[str, ...]] = ("etcd.password",)
    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset(map(_secret_field, _SECRET_KEYS))

    etcd_password: str | None = None

    _etcd: EtcdClient | None = PrivateAttr(default=None)
    _store: OffsetStore | None = PrivateAttr(default=None)

    def etcd_client(self) -> EtcdClient | None:
        """The step's etcd client, or None when no etcd endpoints are configured."""
        if self._etcd is None:
            config = self.lakehouse_config()
            if config.etcd.endpoints:
                self._etcd = etcd_client_from_config(config)
        return self._etcd

    def offset_store(self) -> OffsetStore:
        """The step's offsets store (leases it grants are kept alive on its connection)."""
        if self._store is None:
            self._store = offset_store_from_config(self.lakehouse_config(), self.etcd_client())
        return self._store

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._etcd is not None:
            self._etcd.close()
            self._etcd = None


def lakehouse_resources(config: LakehouseConfig) -> dict[str, dg.ConfigurableResource]:
    """The resources of a config under their keys (`SPARK_RESOURCE_KEY`, ...), secrets as `EnvVar` references."""
    return {
        SPARK_RESOURCE_KEY: SparkResource(
            master=config.spark.master, spark_config=dict(config.spark.conf), remote=config.spark.remote,
            local_engine=True,
        ),
        SEGMENT_STORE_RESOURCE_KEY: SegmentStoreResource.of(config),
        CATALOG_RESOURCE_KEY: IcebergCatalogResource.of(config),
        OFFSET_STORE_RESOURCE_KEY: OffsetStoreResource.of(config),
    }


def ingest_context(
    config: LakehouseConfig,
    spark: SparkResource,
    segment_store: SegmentStoreResource,
    offset_store: OffsetStoreResource,
    catalog: IcebergCatalogResource,
) -> IngestContext:
    """The engine's run context over the step's resources (the engine's own `from_config` is for the CLI)."""
    return IngestContext(
        config=config,
        spark=spark.spark_session,
        store=segment_store.open_store(),
        offsets=offset_store.offset_store(),
        catalog_settings=catalog.settings(),
        etcd=offset_store.etcd_client(),
        registry=schema_registry_client(config),
    )
