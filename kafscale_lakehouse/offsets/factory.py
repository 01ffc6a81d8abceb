"""The offset store a config describes: `offsets.backend` `etcd` (with `etcd.*`) or `local` (sqlite file)."""

from __future__ import annotations

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.etcd_client import EtcdClient
from kafscale_lakehouse.offsets.etcd_store import EtcdOffsetStore
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore
from kafscale_lakehouse.offsets.store import OffsetStore


def etcd_client_from_config(config: LakehouseConfig, *, retry_seconds: float | None = None) -> EtcdClient:
    """A client for `etcd.*`; `retry_seconds` bounds how long an unreachable etcd is retried (client default else)."""
    etcd = config.etcd
    if not etcd.endpoints:
        raise ValueError("etcd.endpoints is required for offsets.backend=etcd or discovery.mode=etcd")
    tls = etcd.tls
    extra = {} if retry_seconds is None else {"retry_seconds": retry_seconds}
    return EtcdClient(
        etcd.endpoints,
        username=etcd.username,
        password=etcd.password.get_secret_value() if etcd.password is not None else None,
        ca_file=str(tls.ca_file) if tls and tls.ca_file else None,
        cert_file=str(tls.cert_file) if tls and tls.cert_file else None,
        key_file=str(tls.key_file) if tls and tls.key_file else None,
        **extra,
    )


def offset_store_from_config(config: LakehouseConfig, etcd: EtcdClient | None = None) -> OffsetStore:
    offsets = config.offsets
    if offsets.backend == "local":
        if offsets.local_path is None:
            raise ValueError("offsets.local_path is required for offsets.backend=local")
        return LocalOffsetStore(offsets.local_path, key_prefix=offsets.key_prefix,
                                lease_ttl_seconds=offsets.lease_ttl_seconds)
    return EtcdOffsetStore(etcd or etcd_client_from_config(config), key_prefix=offsets.key_prefix,
                           lease_ttl_seconds=offsets.lease_ttl_seconds)
