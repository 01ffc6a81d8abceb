"""The segment store a config describes: `segments.local_root` (extension) or the `s3.*` bucket."""

from __future__ import annotations

from kafscale_lakehouse.config import LakehouseConfig
from kafscale_lakehouse.storage.local_store import LocalSegmentStore
from kafscale_lakehouse.storage.s3_store import S3SegmentStore
from kafscale_lakehouse.storage.store import SegmentStore


def segment_store_from_config(config: LakehouseConfig) -> SegmentStore:
    """`LocalSegmentStore` when `segments.local_root` is set, else `S3SegmentStore` (writing with `s3.sse`); both under
    `s3.namespace`."""
    s3 = config.s3
    if config.segments.local_root is not None:
        return LocalSegmentStore(config.segments.local_root, namespace=s3.namespace)
    if not s3.bucket:
        raise ValueError("s3.bucket is required (or segments.local_root) to read segments")
    return S3SegmentStore(
        s3.bucket,
        namespace=s3.namespace,
        endpoint=s3.endpoint,
        region=s3.region,
        path_style=s3.path_style,
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key.get_secret_value() if s3.secret_access_key is not None else None,
        sse_type=s3.sse.type if s3.sse is not None else None,
        sse_kms_key_id=s3.sse.kms_key_id if s3.sse is not None else None,
    )
