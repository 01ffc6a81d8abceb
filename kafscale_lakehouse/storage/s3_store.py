"""`S3SegmentStore`: KafScale segments in an S3 bucket, with bounded retries and typed errors.

Every request goes through obstore (the Rust `object_store` crate). Reads (listings, GETs, ranged footer GETs,
streams, HEADs) are the hot path, every segment a run reads and every listing and footer a sensor tick makes:
obstore spends 0.3 ms of CPU per GET and 1.3 ms per listing page where boto3 spent 4.6 and 5.4
(benchmarks/s3_requests.py), with the GIL released while it waits. Writes (segments the demo producer, a benchmark's
or a test uploads) are one PUT each, as a broker's, with the server-side encryption of `s3.sse`: a PUT of a 12 kB
segment costs 0.35 ms of CPU where boto3's cost 3.8 (and SeaweedFS 2.6 ms where 3.9), most of a producer's CPU.
Without static keys the credentials are boto3's chain (environment, profile, instance or pod role), which obstore
asks through `Boto3CredentialProvider`; boto3 is imported only then (or to find the region when none is given): its
import is 0.13-0.27 CPU-s of every process that opens a store (run workers, the Spark engine's Python workers)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.exceptions import PermissionDeniedError, UnauthenticatedError
from obstore.store import S3Store

if TYPE_CHECKING:
    import boto3
    from obstore.store import ClientConfig  # in obstore's type stubs only

from kafscale_lakehouse.storage.errors import (
    BucketNotFoundError,
    ObjectNotFoundError,
    StorageAuthError,
    StorageError,
    StorageRequestError,
    StorageUnreachableError,
)
from kafscale_lakehouse.storage.keys import DEFAULT_NAMESPACE
from kafscale_lakehouse.storage.store import DEFAULT_LIST_PAGE_SIZE, ListPage, ObjectInfo, SegmentStore

log = logging.getLogger(__name__)

# Server-side encryption we can request for written objects (S3's x-amz-server-side-encryption values); the
# warehouse FileIO (engine/tables/catalogs.py) and the config's `s3.sse.type` take the same.
SseType = Literal["AES256", "aws:kms"]
SSE_TYPES: tuple[SseType, ...] = get_args(SseType)

# S3 error codes meaning "these credentials are not accepted here".
_AUTH_ERROR_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "AuthorizationHeaderMalformed", "InvalidClientTokenId", "403", "Forbidden",
})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# What obstore's error messages carry of the S3 answer: its error document's code, else the HTTP status.
_ERROR_CODE = re.compile(r"<Code>([^<]+)</Code>")
_HTTP_STATUS = re.compile(r"status code: (\d{3})")
# Idle connections kept open: a namespace watch reads on up to 32 threads (engine.ingestion.topic_scan).
POOL_CONNECTIONS = 32
_DEFAULT_REGION = "us-east-1"  # S3's own default, where neither the config nor the AWS chain names one


class S3SegmentStore(SegmentStore):
    """Segments in `bucket` under `namespace`.

    Credentials: `access_key_id` + `secret_access_key` (+ `session_token`) when given, else the standard AWS chain
    (environment variables, profile, instance/pod role). `max_attempts` bounds the attempts of a request (the
    first included); every request also has connect/read timeouts. The clients are created lazily and not
    pickled, so a store can be shipped to Spark executors. `sse_type` (`AES256` | `aws:kms`, with an optional
    `sse_kms_key_id`) is the server-side encryption requested for every object the store writes.
    """

    def __init__(
        self,
        bucket: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        endpoint: str | None = None,
        region: str | None = None,
        path_style: bool = False,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        max_attempts: int = 3,
        connect_timeout_seconds: float = 5.0,
        read_timeout_seconds: float = 30.0,
        list_page_size: int = DEFAULT_LIST_PAGE_SIZE,
        sse_type: str | None = None,
        sse_kms_key_id: str | None = None,
    ) -> None:
        super().__init__(namespace=namespace, list_page_size=list_page_size)
        if not bucket:
            raise ValueError("bucket: the S3 bucket name is empty")
        if (access_key_id is None) != (secret_access_key is None):
            raise ValueError("S3 access key id and secret access key must be given together (or neither, to use "
                             "the AWS credential chain)")
        if max_attempts < 1:
            raise ValueError(f"S3 max_attempts {max_attempts} must be at least 1")
        if sse_type is not None and sse_type not in SSE_TYPES:
            raise ValueError(f"sse_type: must be one of {SSE_TYPES}, got {sse_type!r}")
        if sse_kms_key_id is not None and sse_type != "aws:kms":
            raise ValueError("sse_kms_key_id: is only used with sse_type aws:kms")
        self.bucket = bucket
        self.endpoint = endpoint or None
        self.region = region or None
        self.path_style = path_style
        self.max_attempts = max_attempts
        self.connect_timeout_seconds = connect_timeout_seconds
        self.read_timeout_seconds = read_timeout_seconds
        self.sse_type = sse_type
        self.sse_kms_key_id = sse_kms_key_id
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self._session_token = session_token
        self._client_lock = threading.Lock()
        self._session: boto3.session.Session | None = None
        self._objects: S3Store | None = None

    @property
    def static_credentials(self) -> tuple[str | None, str | None, str | None]:
        """(access key id, secret access key, session token) as given; all None when the AWS chain is used."""
        return self._access_key_id, self._secret_access_key, self._session_token

    def __repr__(self) -> str:  # never shows the secret
        return f"S3SegmentStore(bucket={self.bucket!r}, namespace={self.namespace!r}, endpoint={self.endpoint!r})"

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for unpicklable in ("_client_lock", "_session", "_objects"):
            del state[unpicklable]
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._client_lock = threading.Lock()
        self._session = None
        self._objects = None

    @property
    def _endpoint_text(self) -> str:
        if self.endpoint:
            return self.endpoint
        return f"the AWS endpoint for region {self.region or '(default)'}"

    @property
    def location(self) -> str:
        return f"s3://{self.bucket} at {self._endpoint_text}"

    def _boto_session(self) -> boto3.session.Session:
        """Under `_client_lock`."""
        if self._session is None:
            import boto3  # only without static keys or a region (module docstring)

            self._session = boto3.session.Session(
                aws_access_key_id=self._access_key_id,
                aws_secret_access_key=self._secret_access_key,
                aws_session_token=self._session_token,
                region_name=self.region,
            )
        return self._session

    def _store(self) -> S3Store:
        """obstore's S3 store."""
        with self._client_lock:
            if self._objects is None:
                settings: dict[str, Any] = {}
                if self._access_key_id is not None:
                    # A provider, not keys: object_store would add an AWS_SESSION_TOKEN of the environment to keys
                    # given (boto3 takes given keys alone).
                    settings["credential_provider"] = _StaticCredentials(
                        self._access_key_id, self._secret_access_key or "", self._session_token)
                else:
                    from obstore.auth.boto3 import Boto3CredentialProvider  # imports boto3

                    settings["credential_provider"] = Boto3CredentialProvider(self._boto_session())
                endpoint = self.endpoint
                if endpoint is not None and not self.path_style:
                    # object_store takes a virtual-hosted endpoint with the bucket in it, as boto3 sends it
                    parts = urlsplit(endpoint)
                    endpoint = urlunsplit(parts._replace(netloc=f"{self.bucket}.{parts.netloc}"))
                options: ClientConfig = {"connect_timeout": f"{self.connect_timeout_seconds}s",
                                           "timeout": f"{self.read_timeout_seconds}s",
                                           "pool_max_idle_per_host": str(POOL_CONNECTIONS)}
                if endpoint is not None and endpoint.startswith("http://"):
                    options["allow_http"] = True
                if self.sse_type is not None:  # sent with every PUT only (SSE-S3 and SSE-KMS need nothing on reads)
                    settings["server_side_encryption"] = self.sse_type
                    if self.sse_kms_key_id is not None:
                        settings["sse_kms_key_id"] = self.sse_kms_key_id
                self._objects = S3Store(
                    self.bucket, endpoint=endpoint,
                    region=self.region or self._boto_session().region_name or _DEFAULT_REGION,
                    virtual_hosted_style_request=not self.path_style, client_options=options,
                    retry_config={"max_retries": self.max_attempts - 1,
                                  "retry_timeout": timedelta(seconds=self.max_attempts * (
                                      self.connect_timeout_seconds + self.read_timeout_seconds))},
                    **settings)
            return self._objects

    def _access_key_id_text(self) -> str:
        if self._access_key_id is not None:
            return self._access_key_id
        credentials = self._session.get_credentials() if self._session is not None else None
        return credentials.access_key if credentials is not None else "(none found)"

    def _error(self, exc: Exception, action: str, key: str | None) -> StorageError:
        """Translate an obstore error (whose message carries the S3 answer) into the StorageError family; messages name
        endpoint, bucket and key."""
        text = str(exc)
        found = _ERROR_CODE.search(text) or _HTTP_STATUS.search(text)
        code = found.group(1) if found else ""
        if not code and isinstance(exc, PermissionDeniedError | UnauthenticatedError):
            code = "AccessDenied"
        if not code and isinstance(exc, FileNotFoundError):
            code = "NoSuchKey"
        if "NoCredentialsError" in text or "Unable to locate credentials" in text:
            return self._classified("", action, key, text, no_credentials=True)
        detail = text.split(" - ", 1)[-1].splitlines()[0] if text else type(exc).__name__
        # No answer from S3 at all (no code): the request could not be sent or timed out, after the retries.
        return self._classified(code, action, key, detail,
                                unreachable=any(m in text for m in ("error sending request", "timed out", "onnect")))

    def _classified(self, code: str, action: str, key: str | None, detail: str, *, unreachable: bool = False,
                    no_credentials: bool = False) -> StorageError:
        """The StorageError of an S3 error `code` (or of no answer); messages name endpoint, bucket and key."""
        target = f"{key} in bucket {self.bucket}" if key is not None else f"bucket {self.bucket}"
        if no_credentials:
            return StorageAuthError(
                f"no S3 credentials for bucket {self.bucket} at {self._endpoint_text}: set the s3 access key or the "
                "AWS environment/profile chain", location=self.location, key=key)
        if code in _AUTH_ERROR_CODES:
            return StorageAuthError(
                f"S3 at {self._endpoint_text} rejected the credentials (access key id "
                f"{self._access_key_id_text()}) for bucket {self.bucket}: {code}", location=self.location, key=key)
        if code == "NoSuchBucket":
            return BucketNotFoundError(f"S3 at {self._endpoint_text} has no bucket {self.bucket}",
                                       location=self.location, key=key)
        if code in _NOT_FOUND_CODES:
            return ObjectNotFoundError(f"object {target} not found at S3 {self._endpoint_text}",
                                       location=self.location, key=key)
        if unreachable and not code:
            return StorageUnreachableError(
                f"S3 at {self._endpoint_text} unreachable while trying to {action} {target} "
                f"(after up to {self.max_attempts} attempts): {detail}", location=self.location, key=key)
        return StorageRequestError(f"S3 at {self._endpoint_text} failed to {action} {target}: {code} {detail}"
                                   .replace("  ", " ").strip(), location=self.location, key=key)

    def _list_page(self, prefix: str, *, start_after: str | None, delimiter: str | None,
                   token: str | None) -> ListPage:
        # object_store lists whole path segments: the folder the prefix is in, filtered to the prefix (ours are
        # folders, `<namespace>/<topic>/<partition>/`). A page resumes after the last key of the one before.
        folder = prefix.rpartition("/")[0] or None
        try:
            if delimiter is not None:
                if delimiter != "/":
                    raise ValueError(f"delimiter {delimiter!r}: only '/' is supported")
                found = obstore.list_with_delimiter(self._store(), prefix=folder)
                return ListPage([_object_info(o) for o in found["objects"] if o["path"].startswith(prefix)],
                                [f"{p}/" for p in found["common_prefixes"] if f"{p}/".startswith(prefix)], None)
            marker = max(filter(None, (start_after, token)), default=None)
            stream = obstore.list(self._store(), prefix=folder, offset=marker, chunk_size=self.list_page_size)
            chunk = next(iter(stream), [])
        except (ObstoreError, OSError) as exc:
            raise self._error(exc, "list", prefix or None) from exc
        objects = [_object_info(o) for o in chunk if o["path"].startswith(prefix)]
        return ListPage(objects, [], chunk[-1]["path"] if len(chunk) == self.list_page_size else None)

    def _get(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        try:
            if byte_range is None:
                return bytes(obstore.get(self._store(), key).bytes())
            return bytes(obstore.get_range(self._store(), key, start=byte_range[0], end=byte_range[1] + 1))
        except (ObstoreError, OSError) as exc:
            raise self._error(exc, "read", key) from exc

    def _stream(self, key: str, chunk_size: int) -> tuple[int, Iterator[bytes]]:
        try:
            result = obstore.get(self._store(), key)
        except (ObstoreError, OSError) as exc:
            raise self._error(exc, "read", key) from exc

        def chunks() -> Iterator[bytes]:
            try:
                for chunk in result.stream(min_chunk_size=chunk_size):
                    view = memoryview(chunk)
                    for start in range(0, len(view), chunk_size):  # never more than asked at once
                        yield bytes(view[start:start + chunk_size])
            except (ObstoreError, OSError) as exc:
                raise self._error(exc, "read", key) from exc
        return int(result.meta["size"]), chunks()

    def _head(self, key: str) -> int:
        try:
            return int(obstore.head(self._store(), key)["size"])
        except (ObstoreError, OSError) as exc:
            raise self._error(exc, "stat", key) from exc

    def _put(self, key: str, data: bytes) -> None:
        try:  # one PUT, as boto3's put_object and a broker: no multipart upload to leave behind
            obstore.put(self._store(), key, data, use_multipart=False)
        except (ObstoreError, OSError) as exc:
            raise self._error(exc, "write", key) from exc


@dataclass(frozen=True)
class _StaticCredentials:
    """The configured keys as an obstore credential provider (never expire)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None

    def __call__(self) -> dict[str, Any]:
        return {"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key,
                "token": self.session_token, "expires_at": None}


def _object_info(meta: Any) -> ObjectInfo:
    return ObjectInfo(meta["path"], int(meta["size"]), meta["last_modified"])
