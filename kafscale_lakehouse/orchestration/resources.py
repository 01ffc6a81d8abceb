"""Dagster resources: the Spark session, the segment store (S3 through dagster-aws, or a local directory), the
Iceberg catalog and the offsets store, each a `ConfigurableResource` built from the lakehouse config by
`lakehouse_resources(config)`.

Secrets never become plain resource config (the UI shows resource config): they are passed as `dg.EnvVar`
references. A secret the config file holds is exported under a name of ours (`secret_env_var_name`) in the process
that loads the definitions; run workers and step processes load them too, so the reference resolves there.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import dagster as dg
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import PrivateAttr, SecretStr
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.engine.catalog import CatalogSettings, load_catalog, open_table
from kafscale_lakehouse.engine.ingest import IngestContext, catalog_settings
from kafscale_lakehouse.engine.kafscale_source import StoreOptions
from kafscale_lakehouse.engine.spark import get_spark_session
from kafscale_lakehouse.engine.validation_stage import schema_registry_client
from kafscale_lakehouse.etcd_client import EtcdClient
from kafscale_lakehouse.offsets import EtcdOffsetStore, LocalOffsetStore, OffsetStore
from kafscale_lakehouse.storage import SegmentStore

SPARK_RESOURCE_KEY = "spark"
SEGMENT_STORE_RESOURCE_KEY = "segment_store"
CATALOG_RESOURCE_KEY = "iceberg_catalog"
OFFSET_STORE_RESOURCE_KEY = "offset_store"
SECRET_ENV_PREFIX = "KAFSCALE_LAKEHOUSE_SECRET_"
SECRET_MASK = "**********"  # as pydantic's SecretStr shows a secret
_S3_SECRET_FIELDS = frozenset({"aws_secret_access_key", "aws_session_token"})


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


class _SecretsHiddenInRepr:
    """`repr`/`str` of a resource show its `_SECRET_FIELDS`, and the keys of a nested `S3Resource`, through
    `_secret_shown`: in the definitions they are EnvVar references, but once a run resolves the resource they hold
    the secrets themselves."""

    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset()

    def __repr_args__(self):  # noqa: ANN204 - pydantic's signature
        for name, value in super().__repr_args__():
            if name in self._SECRET_FIELDS:
                yield name, _secret_shown(value)
            elif isinstance(value, S3Resource):
                yield name, _ReprText(f"{type(value).__name__}(" + ", ".join(
                    f"{key}={_secret_shown(item) if key in _S3_SECRET_FIELDS else item!r}"
                    for key, item in value.__repr_args__()) + ")")
            else:
                yield name, value


class _ReprText(str):
    """Text that `repr` shows unquoted (a nested resource's own repr)."""

    def __repr__(self) -> str:
        return str(self)


class SparkResource(PySparkResource):
    """The Spark session of `spark.*` through dagster-pyspark, built by `engine.spark.get_spark_session` (loopback
    binding for local masters, the venv's Python for workers, `KAFSCALE_SPARK_*` deployment overrides). Created on
    first use, so steps that never touch Spark do not pay its start-up."""

    master: str = "local[*]"
    spark_config: dict[str, Any] = {}

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Deliberately lazy: see `spark_session`.
        self._spark_session = None

    @property
    def spark_session(self) -> SparkSession:
        if self._spark_session is None:
            self._spark_session = get_spark_session(self.master, {k: str(v) for k, v in self.spark_config.items()})
        return self._spark_session


class SegmentStoreResource(_SecretsHiddenInRepr, dg.ConfigurableResource):
    """Where KafScale segments are: `local_root` (the embedded default) or S3 `bucket`, reached with the dagster-aws
    `s3` resource's endpoint, region and credentials (`path_style` is ours: S3Resource has no addressing setting)."""

    namespace: str
    local_root: str | None = None
    bucket: str | None = None
    path_style: bool = False
    s3: S3Resource | None = None

    def store_options(self) -> StoreOptions:
        """The store as the `kafscale` Spark source takes it (executors open their own store from it). Of the `s3`
        resource, endpoint, region and credentials are used; without credentials, the AWS chain (AWS_PROFILE, ...)."""
        if self.local_root is not None:
            return StoreOptions(kind="local", namespace=self.namespace, local_root=self.local_root)
        s3 = self.s3 or S3Resource()
        if s3.profile_name or s3.use_unsigned_session:
            raise ValueError("segment_store.s3: profile_name and use_unsigned_session are not supported for the "
                             "segment store; set credentials (s3.access_key_id/secret_access_key) or AWS_PROFILE")
        return StoreOptions(kind="s3", namespace=self.namespace, bucket=self.bucket, endpoint=s3.endpoint_url,
                            region=s3.region_name, path_style=self.path_style, access_key_id=s3.aws_access_key_id,
                            secret_access_key=s3.aws_secret_access_key, session_token=s3.aws_session_token)

    def open_store(self) -> SegmentStore:
        """A new store; its `request_counts` count only the requests made through it."""
        return self.store_options().open()


class IcebergCatalogResource(_SecretsHiddenInRepr, dg.ConfigurableResource):
    """The Iceberg catalog (`iceberg.catalog.*`, `iceberg.warehouse`) and the S3 settings of its FileIO."""

    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset({"token", "password", "s3_secret_access_key"})

    type: str
    uri: str | None = None
    warehouse: str | None = None
    name: str = "default"
    token: str | None = None
    username: str | None = None
    password: str | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_sse_type: str | None = None
    s3_sse_kms_key_id: str | None = None
    properties: dict[str, str] = {}  # iceberg.catalog.properties, passed to pyiceberg as they are

    def settings(self) -> CatalogSettings:
        return CatalogSettings(
            type=self.type, uri=self.uri, warehouse=self.warehouse, name=self.name, token=self.token,
            username=self.username, password=self.password, s3_endpoint=self.s3_endpoint, s3_region=self.s3_region,
            s3_path_style=self.s3_path_style, s3_access_key_id=self.s3_access_key_id,
            s3_secret_access_key=self.s3_secret_access_key, s3_sse_type=self.s3_sse_type,
            s3_sse_kms_key_id=self.s3_sse_kms_key_id, extra_properties=dict(self.properties))

    def load_table(self, identifier: str) -> Table:
        """The table as the catalog has it now; `engine.catalog.TableNotFoundError` names it when it is missing."""
        return open_table(load_catalog(self.settings()), identifier)


class OffsetStoreResource(_SecretsHiddenInRepr, dg.ConfigurableResource):
    """Committed offsets, broker watermarks and leases: `etcd` (KafScale keys) or `local` (sqlite). The etcd client
    also serves `discovery.mode` etcd/auto; both are opened once per step and closed after it."""

    backend: str
    key_prefix: str
    lease_ttl_seconds: int
    local_path: str | None = None
    etcd_endpoints: list[str] = []
    etcd_username: str | None = None
    etcd_password: str | None = None
    etcd_ca_file: str | None = None
    etcd_cert_file: str | None = None
    etcd_key_file: str | None = None

    _SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset({"etcd_password"})

    _etcd: EtcdClient | None = PrivateAttr(default=None)
    _store: OffsetStore | None = PrivateAttr(default=None)

    def etcd_client(self) -> EtcdClient | None:
        """The step's etcd client, or None when no etcd endpoints are configured."""
        if self._etcd is None and self.etcd_endpoints:
            self._etcd = EtcdClient(self.etcd_endpoints, username=self.etcd_username, password=self.etcd_password,
                                    ca_file=self.etcd_ca_file, cert_file=self.etcd_cert_file,
                                    key_file=self.etcd_key_file)
        return self._etcd

    def offset_store(self) -> OffsetStore:
        """The step's offsets store (leases it grants are kept alive on its connection)."""
        if self._store is None:
            if self.backend == "local":
                if self.local_path is None:
                    raise ValueError("offsets.local_path is required for offsets.backend local")
                self._store = LocalOffsetStore(self.local_path, key_prefix=self.key_prefix,
                                               lease_ttl_seconds=self.lease_ttl_seconds)
            else:
                client = self.etcd_client()
                if client is None:
                    raise ValueError("etcd.endpoints is required for offsets.backend etcd")
                self._store = EtcdOffsetStore(client, key_prefix=self.key_prefix,
                                              lease_ttl_seconds=self.lease_ttl_seconds)
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
    s3 = config.s3
    if config.segments.local_root is not None:
        segment_store = SegmentStoreResource(namespace=s3.namespace, local_root=str(config.segments.local_root))
    else:
        segment_store = SegmentStoreResource(
            namespace=s3.namespace, bucket=s3.bucket, path_style=s3.path_style,
            s3=S3Resource(endpoint_url=s3.endpoint, region_name=s3.region, aws_access_key_id=s3.access_key_id,
                          aws_secret_access_key=secret_reference("s3.secret_access_key", s3.secret_access_key)))
    settings = catalog_settings(config)
    catalog = IcebergCatalogResource(
        type=settings.type, uri=settings.uri, warehouse=settings.warehouse, name=settings.name,
        token=secret_reference("iceberg.catalog.token", settings.token), username=settings.username,
        password=secret_reference("iceberg.catalog.password", settings.password),
        s3_endpoint=settings.s3_endpoint, s3_region=settings.s3_region, s3_path_style=settings.s3_path_style,
        s3_access_key_id=settings.s3_access_key_id,
        # The warehouse's own `iceberg.s3` key when it has one, else the `s3` key the segment store shares.
        s3_secret_access_key=secret_reference(
            "iceberg.s3.secret_access_key" if config.iceberg.s3 is not None else "s3.secret_access_key",
            settings.s3_secret_access_key),
        s3_sse_type=settings.s3_sse_type, s3_sse_kms_key_id=settings.s3_sse_kms_key_id,
        properties=dict(settings.extra_properties))
    offsets, etcd = config.offsets, config.etcd
    tls = etcd.tls
    offset_store = OffsetStoreResource(
        backend=offsets.backend, key_prefix=offsets.key_prefix, lease_ttl_seconds=offsets.lease_ttl_seconds,
        local_path=str(offsets.local_path) if offsets.local_path is not None else None,
        etcd_endpoints=list(etcd.endpoints), etcd_username=etcd.username,
        etcd_password=secret_reference("etcd.password", etcd.password),
        etcd_ca_file=str(tls.ca_file) if tls and tls.ca_file else None,
        etcd_cert_file=str(tls.cert_file) if tls and tls.cert_file else None,
        etcd_key_file=str(tls.key_file) if tls and tls.key_file else None)
    return {
        SPARK_RESOURCE_KEY: SparkResource(master=config.spark.master, spark_config=dict(config.spark.conf)),
        SEGMENT_STORE_RESOURCE_KEY: segment_store,
        CATALOG_RESOURCE_KEY: catalog,
        OFFSET_STORE_RESOURCE_KEY: offset_store,
    }


def ingest_context(config: LakehouseConfig, spark: SparkResource, segment_store: SegmentStoreResource,
                   offset_store: OffsetStoreResource, catalog: IcebergCatalogResource) -> IngestContext:
    """The engine's run context over the step's resources (the engine's own `from_config` is for the CLI)."""
    return IngestContext(config=config, spark=spark.spark_session, store=segment_store.open_store(),
                         offsets=offset_store.offset_store(),
                         catalog_settings=catalog.settings(), etcd=offset_store.etcd_client(),
                         registry=schema_registry_client(config))
