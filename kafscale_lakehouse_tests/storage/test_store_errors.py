"""Typed storage errors: credentials, missing bucket/root, unreachable endpoint, missing objects, short reads."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time

import pytest

from kafscale_lakehouse.storage import (
    BucketNotFoundError,
    LocalSegmentStore,
    ObjectNotFoundError,
    S3SegmentStore,
    StorageAuthError,
    StorageRequestError,
    StorageUnreachableError,
)
from kafscale_lakehouse_tests.storage.conftest import make_s3_store, write_segments
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY, free_ports


@pytest.mark.parametrize(
    ("access_key", "secret_key", "code"),
    [("WRONGKEYID", SECRET_KEY, "InvalidAccessKeyId"), (ACCESS_KEY, "wrong-secret-value", "SignatureDoesNotMatch")],
)
def test_wrong_credentials_name_endpoint_bucket_and_key_id_never_the_secret(seaweedfs, unique_prefix, access_key,
                                                                          secret_key, code):
    store = make_s3_store(seaweedfs, unique_prefix, access_key_id=access_key, secret_access_key=secret_key)
    with pytest.raises(StorageAuthError) as raised:
        store.list_topics()
    assert str(raised.value) == (f"S3 at {seaweedfs.s3_endpoint} rejected the credentials (access key id "
                                 f"{access_key}) for bucket {S3_BUCKET}: {code}")
    assert secret_key not in str(raised.value) and secret_key not in repr(store)


def test_writes_fail_with_the_same_named_errors_as_reads(seaweedfs, unique_prefix):
    key = f"{unique_prefix}/orders/0/00000000000000000000.kfs"
    rejected = make_s3_store(seaweedfs, unique_prefix, access_key_id="WRONGKEYID")
    with pytest.raises(StorageAuthError) as raised:
        rejected.put(key, b"segment")
    assert str(raised.value) == (f"S3 at {seaweedfs.s3_endpoint} rejected the credentials (access key id "
                                 f"WRONGKEYID) for bucket {S3_BUCKET}: InvalidAccessKeyId")
    # (A PUT to a missing bucket: SeaweedFS creates the bucket, so that answer cannot be seen here.)
    [port] = free_ports(1)
    unreachable = S3SegmentStore(S3_BUCKET, endpoint=f"http://127.0.0.1:{port}", region=REGION, path_style=True,
                                 access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, max_attempts=2,
                                 connect_timeout_seconds=1)
    with pytest.raises(StorageUnreachableError, match=f"unreachable while trying to write {key} in bucket"):
        unreachable.put(key, b"segment")
    store = make_s3_store(seaweedfs, unique_prefix)
    store.put(key, b"segment")
    assert store.read(key) == b"segment"


def test_credentials_from_the_environment_chain(seaweedfs, unique_prefix, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    store = S3SegmentStore(S3_BUCKET, namespace=unique_prefix, endpoint=seaweedfs.s3_endpoint, region=REGION,
                           path_style=True)
    write_segments(store, "orders", 0, [0])
    assert [s.base_offset for s in store.list_segments("orders", 0).segments] == [0]

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEYID")
    rejected = S3SegmentStore(S3_BUCKET, namespace=unique_prefix, endpoint=seaweedfs.s3_endpoint, region=REGION,
                              path_style=True)
    with pytest.raises(StorageAuthError, match=r"\(access key id ENVKEYID\)"):
        rejected.list_topics()


def test_configured_keys_are_used_alone_whatever_session_token_the_environment_has(seaweedfs, unique_prefix,
                                                                                   monkeypatch):
    # A shell with temporary AWS credentials: their token must not be sent with the keys the config names.
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-token-of-other-credentials")
    store = make_s3_store(seaweedfs, unique_prefix)
    write_segments(store, "orders", 0, [0])
    listing = store.list_segments("orders", 0)
    assert [s.base_offset for s in listing.segments] == [0]
    assert store.read(listing.segments[0].kfs_key)[:8]


def test_a_store_with_keys_and_a_region_never_imports_boto3(seaweedfs, unique_prefix):
    # boto3's import is 0.13-0.27 CPU-s of every process that opens a store (run workers, Spark's Python workers): it is
    # only needed for the credential chain (the test above) or to find a region.
    script = f"""
import sys
from kafscale_lakehouse.storage import S3SegmentStore
store = S3SegmentStore({S3_BUCKET!r}, namespace={unique_prefix!r}, endpoint={seaweedfs.s3_endpoint!r},
                       region={REGION!r}, path_style=True, access_key_id={ACCESS_KEY!r},
                       secret_access_key={SECRET_KEY!r})
store.put("no-boto3/object", b"segment")
assert store.read("no-boto3/object") == b"segment"
print(sorted(name for name in sys.modules if name.split(".")[0] in ("boto3", "botocore")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_missing_bucket(seaweedfs, unique_prefix):
    store = S3SegmentStore(f"{unique_prefix}-absent", endpoint=seaweedfs.s3_endpoint, region=REGION,
                           path_style=True, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    with pytest.raises(BucketNotFoundError) as raised:
        store.list_segments("orders", 0)
    assert str(raised.value) == f"S3 at {seaweedfs.s3_endpoint} has no bucket {unique_prefix}-absent"


def test_unreachable_endpoint_fails_fast_and_names_it(unique_prefix):
    [port] = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    store = S3SegmentStore(S3_BUCKET, namespace=unique_prefix, endpoint=endpoint, region=REGION, path_style=True,
                           access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, max_attempts=2,
                           connect_timeout_seconds=1)
    started = time.monotonic()
    with pytest.raises(StorageUnreachableError) as raised:
        store.read(f"{unique_prefix}/orders/0/segment-00000000000000000000.kfs")
    assert time.monotonic() - started < 10  # bounded retries
    assert f"S3 at {endpoint} unreachable while trying to read {unique_prefix}/orders/0/" in str(raised.value)
    assert "after up to 2 attempts" in str(raised.value)


def test_missing_object_and_short_range(store):
    key = f"{store.namespace}/orders/0/segment-00000000000000000000.kfs"
    with pytest.raises(ObjectNotFoundError, match=key):
        store.read(key)
    with pytest.raises(ObjectNotFoundError, match=key):
        store.size(key)
    store.put(key, b"0123456789")
    with pytest.raises(StorageRequestError, match=f"short read of {key}.*asked for 8 bytes at byte 6, got 4"):
        store.read_range(key, 6, 8)
    with pytest.raises(StorageRequestError, match=key):
        store.read_range(key, 20, 4)


def test_missing_local_root(tmp_path):
    store = LocalSegmentStore(tmp_path / "absent")
    with pytest.raises(BucketNotFoundError, match=f"segment root {tmp_path / 'absent'} does not exist"):
        store.list_segments("orders", 0)


@pytest.mark.parametrize("key", ["../escape", "default/../../etc/passwd", "/abs", "a//b", "a\\b"])
def test_local_keys_cannot_leave_the_root(local_store, key):
    with pytest.raises(ValueError, match="not a relative"):
        local_store.put(key, b"x")


def test_stores_pickle_for_spark_executors(s3_store, local_store):
    for store in (s3_store, local_store):
        write_segments(store, "orders", 0, [0, 10])
        copy = pickle.loads(pickle.dumps(store))
        assert [s.base_offset for s in copy.list_segments("orders", 0).segments] == [0, 10]


def test_storage_errors_pickle_with_their_attributes(s3_store):
    with pytest.raises(ObjectNotFoundError) as raised:
        s3_store.read(f"{s3_store.namespace}/missing")
    copy = pickle.loads(pickle.dumps(raised.value))
    assert (type(copy), str(copy), copy.key, copy.location) == (
        ObjectNotFoundError, str(raised.value), f"{s3_store.namespace}/missing", s3_store.location)


def test_explicit_credentials_come_in_pairs():
    with pytest.raises(ValueError, match="given together"):
        S3SegmentStore(S3_BUCKET, access_key_id="only-the-id")
