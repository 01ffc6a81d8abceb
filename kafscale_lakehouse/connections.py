"""From config to clients: the one place that turns a `LakehouseConfig` into the segment store, the etcd client, the
offsets store, the Iceberg catalog settings and the schema registry client.

The CLI, `engine.ingestion.IngestContext`, the sensors, metrics and report, and the Dagster resources (which hold the
config and delegate here) all open their connections through these functions; nothing else reads connection keys.

The layers below take plain values and never quote config keys; a value they refuse (`ValueError`) comes back out
of here as a `ConfigError` naming the key path it came from (`at_key`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import SecretStr

from kafscale_lakehouse.config import ConfigError, LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.tables import CatalogSettings
from kafscale_lakehouse.engine.tables.dead_letters import mapping_dead_letter_table
from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.offsets.etcd_store import EtcdOffsetStore
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore
from kafscale_lakehouse.offsets.store import OffsetStore
from kafscale_lakehouse.storage.local_store import LocalSegmentStore
from kafscale_lakehouse.storage.s3_store import S3SegmentStore
from kafscale_lakehouse.storage.store import SegmentStore
from kafscale_lakehouse.value_formats.registry import SchemaRegistryClient

if TYPE_CHECKING:
    from kafscale_lakehouse.engine.maintenance import TableMaintenance

CONFIG_SOURCE = "config"
# Every config key that holds a secret (a `SecretStr`); the Dagster resources pass these as `EnvVar` references.
SECRET_KEYS = ("s3.secret_access_key", "iceberg.s3.secret_access_key", "iceberg.catalog.token",
               "iceberg.catalog.password", "iceberg.catalog.credential", "etcd.password")


@contextmanager
def at_key(section: str, keys: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-raise a `ValueError` of a lower layer as a `ConfigError` naming the config key (the original stays chained).

    Lower layers start such a message with the name of the argument at fault (`lease_ttl_seconds: ...`); it becomes
    `keys[name]`, else `<section>.<name>`. A message without an argument name is put under `section`.
    """
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        name, separator, rest = str(exc).partition(": ")
        if separator and name.isidentifier():
            problem = f"{(keys or {}).get(name, f'{section}.{name}')}: {rest}"
        else:
            problem = f"{section}: {exc}"
        raise ConfigError(CONFIG_SOURCE, [problem]) from exc


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def segment_store_from_config(config: LakehouseConfig) -> SegmentStore:
    """`LocalSegmentStore` when `segments.local_root` is set, else `S3SegmentStore` (writing with `s3.sse`); both under
    `s3.namespace`."""
    s3 = config.s3
    if config.segments.local_root is not None:
        with at_key("segments.local_root"):
            return LocalSegmentStore(config.segments.local_root, namespace=s3.namespace)
    if not s3.bucket:
        raise ConfigError(CONFIG_SOURCE, ["s3.bucket: is required (or segments.local_root) to read segments"])
    with at_key("s3", {"sse_type": "s3.sse.type", "sse_kms_key_id": "s3.sse.kms_key_id"}):
        return S3SegmentStore(
            s3.bucket, namespace=s3.namespace, endpoint=s3.endpoint, region=s3.region, path_style=s3.path_style,
            access_key_id=s3.access_key_id, secret_access_key=_secret(s3.secret_access_key),
            sse_type=s3.sse.type if s3.sse is not None else None,
            sse_kms_key_id=s3.sse.kms_key_id if s3.sse is not None else None,
        )


def s3_store_from_environment(bucket: str) -> S3SegmentStore:
    """A store over all of `bucket` (no namespace) reached as the AWS CLI would: `AWS_ENDPOINT_URL_S3` /
    `AWS_ENDPOINT_URL`, `AWS_REGION` / `AWS_DEFAULT_REGION`, the AWS credential chain; path-style addressing unless
    `AWS_S3_PATH_STYLE=false`. For commands that run without a config file (`inspect s3://...`)."""
    return S3SegmentStore(
        bucket, namespace="", endpoint=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        path_style=os.environ.get("AWS_S3_PATH_STYLE", "true").lower() != "false",
    )


def etcd_client_from_config(config: LakehouseConfig, *, retry_seconds: float | None = None) -> EtcdClient:
    """A client for `etcd.*`; `retry_seconds` bounds how long an unreachable etcd is retried (client default else)."""
    etcd = config.etcd
    if not etcd.endpoints:
        raise ConfigError(CONFIG_SOURCE, ["etcd.endpoints: is required for offsets.backend etcd or discovery.mode "
                                          "etcd"])
    tls = etcd.tls
    extra = {} if retry_seconds is None else {"retry_seconds": retry_seconds}
    with at_key("etcd", {"ca_file": "etcd.tls.ca_file", "cert_file": "etcd.tls.cert_file",
                         "key_file": "etcd.tls.key_file"}):
        return EtcdClient(
            etcd.endpoints, username=etcd.username, password=_secret(etcd.password),
            ca_file=str(tls.ca_file) if tls and tls.ca_file else None,
            cert_file=str(tls.cert_file) if tls and tls.cert_file else None,
            key_file=str(tls.key_file) if tls and tls.key_file else None,
            **extra,
        )


def offset_store_from_config(config: LakehouseConfig, etcd: EtcdClient | None = None) -> OffsetStore:
    """The store of `offsets.backend`: `local` (sqlite at `offsets.local_path`) or `etcd` (on `etcd`, else a new
    client for `etcd.*`)."""
    offsets = config.offsets
    with at_key("offsets"):
        if offsets.backend == "local":
            if offsets.local_path is None:
                raise ConfigError(CONFIG_SOURCE, ["offsets.local_path: is required for offsets.backend local"])
            return LocalOffsetStore(offsets.local_path, key_prefix=offsets.key_prefix,
                                    lease_ttl_seconds=offsets.lease_ttl_seconds)
        client = etcd or etcd_client_from_config(config)
        return EtcdOffsetStore(client, key_prefix=offsets.key_prefix, lease_ttl_seconds=offsets.lease_ttl_seconds)


def catalog_settings(config: LakehouseConfig) -> CatalogSettings:
    """`iceberg.*` (+ `iceberg.s3`, else `s3.*`, for the warehouse FileIO) as catalog settings; secrets unwrapped
    only here. `iceberg.catalog.credential` (`id:secret`) and `username`/`password` are the same OAuth2 credential."""
    catalog, s3 = config.iceberg.catalog, config.warehouse_s3
    username, password = catalog.username, _secret(catalog.password)
    if catalog.credential is not None:
        username, _, password = catalog.credential.get_secret_value().partition(":")
    s3_key = "iceberg.s3" if config.iceberg.s3 is not None else "s3"
    with at_key("iceberg", {"s3_sse_type": f"{s3_key}.sse.type", "s3_sse_kms_key_id": f"{s3_key}.sse.kms_key_id"}):
        return CatalogSettings(
            type=catalog.type, uri=catalog.uri, warehouse=config.iceberg.warehouse, name=catalog.name,
            token=_secret(catalog.token), username=username, password=password or None,
            s3_endpoint=s3.endpoint, s3_region=s3.region, s3_path_style=s3.path_style if s3.endpoint else None,
            s3_access_key_id=s3.access_key_id, s3_secret_access_key=_secret(s3.secret_access_key),
            s3_sse_type=s3.sse.type if s3.sse else None, s3_sse_kms_key_id=s3.sse.kms_key_id if s3.sse else None,
            extra_properties=dict(catalog.properties),
        )


def schema_registry_client(config: LakehouseConfig) -> SchemaRegistryClient | None:
    """The process's registry client (its cache is per client: build one and share it), None without a base_url."""
    registry = config.schema_config.registry
    if registry.base_url is None:
        return None
    with at_key("schema.registry"):
        return SchemaRegistryClient(registry.base_url, timeout_seconds=registry.timeout_seconds,
                                    cache_seconds=registry.cache_seconds)


def table_maintenance(config: LakehouseConfig, mapping: MappingConfig) -> TableMaintenance:
    """What maintaining the table of `mapping` takes: the catalog, its tables and `mappings[].maintenance`. The
    dead-letter table is the one ingestion writes to (`mapping_dead_letter_table`, the default one included), so
    expiry keeps the table snapshots that name its unpublished staged dead letters."""
    # Imported here: ingestion, which imports this module, never maintains (the fixed cost of a run).
    from kafscale_lakehouse.engine.maintenance import MaintenanceSettings, TableMaintenance

    block = mapping.maintenance
    settings = MaintenanceSettings(
        snapshot_max_age=timedelta(hours=block.snapshot_max_age_hours), retain_last=block.retain_last,
        max_snapshots=block.max_snapshots,
        orphan_min_age=timedelta(hours=block.orphan_min_age_hours),
        target_file_size_bytes=block.target_file_size_bytes or config.processor.target_file_size_bytes,
        min_input_files=block.min_input_files, manifest_min_count=block.manifest_min_count,
        manifest_target_size_bytes=block.manifest_target_size_bytes)
    dead_letter_table = mapping_dead_letter_table(config.schema_config.mode, mapping.table, mapping.dead_letter_table)
    return TableMaintenance(catalog=catalog_settings(config), table=mapping.table,
                            dead_letter_table=dead_letter_table, settings=settings, audit_branch=mapping.audit_branch)
