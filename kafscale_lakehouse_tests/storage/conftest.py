"""Storage test fixtures: one S3 store and one local store per test, each under its own namespace."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.format.segment_frame import SegmentFooter, SegmentHeader, encode_footer, encode_header
from kafscale_lakehouse.storage import LocalSegmentStore, S3SegmentStore, SegmentStore
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, Etcd, SeaweedFS

# Storage only reads footers, so a synthetic body is enough; the index content is never parsed here.
INDEX_BYTES = b"IDX\x00" + bytes(12)


def segment_bytes(base_offset: int, last_offset: int, body: bytes = b"batches") -> bytes:
    """A finished `.kfs`: header + opaque body + footer (CRC not checked by storage)."""
    header = SegmentHeader(version=1, flags=0, base_offset=base_offset, message_count=last_offset - base_offset + 1,
                           created_ms=1_700_000_000_000)
    return encode_header(header) + body + encode_footer(SegmentFooter(body_crc=0, last_offset=last_offset))


def write_segments(store: SegmentStore, topic: str, partition: int, bases: list[int], size: int = 10) -> None:
    for base in bases:
        store.write_segment(topic, partition, base, segment_bytes(base, base + size - 1), INDEX_BYTES)


def make_s3_store(seaweedfs: SeaweedFS, namespace: str, **overrides) -> S3SegmentStore:
    options = {"namespace": namespace, "endpoint": seaweedfs.s3_endpoint, "region": REGION, "path_style": True,
                   "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    options.update(overrides)
    return S3SegmentStore(S3_BUCKET, **options)


@pytest.fixture
def s3_store(seaweedfs, unique_prefix) -> S3SegmentStore:
    return make_s3_store(seaweedfs, unique_prefix)


@pytest.fixture
def local_store(tmp_path, unique_prefix) -> LocalSegmentStore:
    return LocalSegmentStore(tmp_path / "segments", namespace=unique_prefix, create=True)


@pytest.fixture(params=["local", "s3"])
def store(request) -> SegmentStore:
    """Both backends: every behaviour test runs against the local directory and the real SeaweedFS."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture(scope="module")
def private_etcd(tmp_path_factory) -> Etcd:
    """An etcd of our own: `/kafscale/metadata/snapshot` is one fixed key, so writing it on the shared server
    would change what other tests of the run discover."""
    server = Etcd(tmp_path_factory.mktemp("storage-etcd")).start()
    yield server
    server.stop()
