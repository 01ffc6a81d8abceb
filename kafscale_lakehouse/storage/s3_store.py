"""`S3SegmentStore`: KafScale segments in an S3 bucket (boto3), with bounded retries and typed errors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal, get_args
from xml.etree import ElementTree

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)

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
_CONNECTION_ERRORS = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError,
                      ResponseStreamingError)
# Connections kept open per client: a namespace watch reads on up to 32 threads (engine.ingestion.topic_scan); past
# boto3's default of 10, each read over the limit opened a connection and threw it away ("Connection pool is full").
POOL_CONNECTIONS = 32


class S3SegmentStore(SegmentStore):
    """Segments in `bucket` under `namespace`.

    Credentials: `access_key_id` + `secret_access_key` (+ `session_token`) when given, else the standard AWS chain
    (environment variables, profile, instance/pod role). `max_attempts` bounds botocore's retries (standard mode);
    every request also has connect/read timeouts. The boto3 client is created lazily and not pickled, so a store
    can be shipped to Spark executors. `sse_type` (`AES256` | `aws:kms`, with an optional `sse_kms_key_id`) is the
    server-side encryption requested for every object the store writes.
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
        self._s3: Any = None

    @property
    def static_credentials(self) -> tuple[str | None, str | None, str | None]:
        """(access key id, secret access key, session token) as given; all None when the AWS chain is used."""
        return self._access_key_id, self._secret_access_key, self._session_token

    def __repr__(self) -> str:  # never shows the secret
        return f"S3SegmentStore(bucket={self.bucket!r}, namespace={self.namespace!r}, endpoint={self.endpoint!r})"

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for unpicklable in ("_client_lock", "_session", "_s3"):
            del state[unpicklable]
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._client_lock = threading.Lock()
        self._session = None
        self._s3 = None

    @property
    def _endpoint_text(self) -> str:
        if self.endpoint:
            return self.endpoint
        return f"the AWS endpoint for region {self.region or '(default)'}"

    @property
    def location(self) -> str:
        return f"s3://{self.bucket} at {self._endpoint_text}"

    def _client(self) -> Any:
        with self._client_lock:
            if self._s3 is None:
                self._session = boto3.session.Session(
                    aws_access_key_id=self._access_key_id,
                    aws_secret_access_key=self._secret_access_key,
                    aws_session_token=self._session_token,
                    region_name=self.region,
                )
                config = Config(
                    retries={"max_attempts": self.max_attempts, "mode": "standard"},
                    connect_timeout=self.connect_timeout_seconds,
                    read_timeout=self.read_timeout_seconds,
                    s3={"addressing_style": "path" if self.path_style else "auto"},
                    signature_version="s3v4",
                    max_pool_connections=POOL_CONNECTIONS,
                )
                self._s3 = self._session.client("s3", endpoint_url=self.endpoint, config=config)
                self._s3.meta.events.register("before-parse.s3.ListObjectsV2", parse_listing_page)
            return self._s3

    def _access_key_id_text(self) -> str:
        if self._access_key_id is not None:
            return self._access_key_id
        credentials = self._session.get_credentials() if self._session is not None else None
        return credentials.access_key if credentials is not None else "(none found)"

    def _error(self, exc: Exception, action: str, key: str | None) -> StorageError:
        """Translate a boto error into the StorageError family; messages name endpoint, bucket and key."""
        target = f"{key} in bucket {self.bucket}" if key is not None else f"bucket {self.bucket}"
        if isinstance(exc, NoCredentialsError):
            return StorageAuthError(
                f"no S3 credentials for bucket {self.bucket} at {self._endpoint_text}: set the s3 access key or the "
                "AWS environment/profile chain", location=self.location, key=key)
        if isinstance(exc, _CONNECTION_ERRORS):
            return StorageUnreachableError(
                f"S3 at {self._endpoint_text} unreachable while trying to {action} {target} "
                f"(after up to {self.max_attempts} attempts): {exc}", location=self.location, key=key)
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "")) or str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
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
            detail = error.get("Message") or ""
            return StorageRequestError(f"S3 at {self._endpoint_text} failed to {action} {target}: {code} {detail}"
                                       .rstrip(), location=self.location, key=key)
        return StorageRequestError(f"S3 at {self._endpoint_text} failed to {action} {target}: {exc}",
                                   location=self.location, key=key)

    def _call(self, action: str, key: str | None, operation: str, **params: Any) -> Any:
        try:
            return getattr(self._client(), operation)(Bucket=self.bucket, **params)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(exc, action, key) from exc

    def _list_page(self, prefix: str, *, start_after: str | None, delimiter: str | None,
                   token: str | None) -> ListPage:
        params: dict[str, Any] = {"Prefix": prefix, "MaxKeys": self.list_page_size}
        if start_after:
            params["StartAfter"] = start_after
        if delimiter:
            params["Delimiter"] = delimiter
        if token:
            params["ContinuationToken"] = token
        response = self._call("list", prefix or None, "list_objects_v2", **params)
        objects = [ObjectInfo(item["Key"], int(item["Size"]), item["LastModified"])
                   for item in response.get("Contents", [])]
        prefixes = [item["Prefix"] for item in response.get("CommonPrefixes", [])]
        next_token = response.get("NextContinuationToken") if response.get("IsTruncated") else None
        if response.get("IsTruncated") and not next_token:
            raise StorageRequestError(f"S3 at {self._endpoint_text} returned a truncated listing of prefix {prefix!r} "
                                      f"in bucket {self.bucket} without a continuation token",
                                      location=self.location, key=prefix)
        return ListPage(objects, prefixes, next_token)

    def _get(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        params: dict[str, Any] = {"Key": key}
        if byte_range is not None:
            params["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
        response = self._call("read", key, "get_object", **params)
        body = response["Body"]
        try:
            return body.read()
        except (BotoCoreError, ClientError) as exc:
            raise self._error(exc, "read", key) from exc
        finally:
            body.close()

    def _stream(self, key: str, chunk_size: int) -> tuple[int, Iterator[bytes]]:
        response = self._call("read", key, "get_object", Key=key)
        body = response["Body"]

        def chunks() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(chunk_size)
            except (BotoCoreError, ClientError) as exc:
                raise self._error(exc, "read", key) from exc
            finally:
                body.close()
        return int(response["ContentLength"]), chunks()

    def _head(self, key: str) -> int:
        return int(self._call("stat", key, "head_object", Key=key)["ContentLength"])

    def _put(self, key: str, data: bytes) -> None:
        self._call("write", key, "put_object", Key=key, Body=data, **self._sse_params())

    def _sse_params(self) -> dict[str, str]:
        """PutObject parameters of the configured server-side encryption (none without `sse_type`)."""
        params: dict[str, str] = {}
        if self.sse_type is not None:
            params["ServerSideEncryption"] = self.sse_type
            if self.sse_kms_key_id is not None:
                params["SSEKMSKeyId"] = self.sse_kms_key_id
        return params


# The ListObjectsV2 elements a listing page is read from, as botocore names them in its parsed answer.
_LISTING_TEXT = ("Name", "Prefix", "Delimiter", "EncodingType", "NextContinuationToken", "ContinuationToken",
                 "StartAfter")


def parse_listing_page(response_dict: dict[str, Any], customized_response_dict: dict[str, Any],
                       **_: Any) -> None:
    """Reads a successful ListObjectsV2 answer with the C XML parser, in botocore's `before-parse` hook: botocore's own
    parser took ~65 ms of CPU per page of 1000 keys, ~1 s per tick of a namespace watch over 15,000 objects. The page
    goes into `customized_response_dict` in the shape botocore's parser gives (its `decode_list_object_v2` still
    URL-decodes the keys afterwards) and botocore parses an empty result instead. Errors are left to botocore."""
    if response_dict.get("status_code") != 200 or not response_dict.get("body"):
        return
    try:
        root = ElementTree.fromstring(response_dict["body"])  # noqa: S314 - the S3 endpoint botocore parses too
    except ElementTree.ParseError:
        return  # botocore's parser says what is wrong with it
    page: dict[str, Any] = {}
    contents: list[dict[str, Any]] = []
    prefixes: list[dict[str, str]] = []
    for element in root:
        tag = element.tag.rpartition("}")[2]
        if tag == "Contents":
            item = {child.tag.rpartition("}")[2]: child.text or "" for child in element}
            contents.append({"Key": item["Key"], "Size": int(item.get("Size") or 0),
                             "LastModified": datetime.fromisoformat(item["LastModified"].replace("Z", "+00:00")),
                             "ETag": item.get("ETag", ""), "StorageClass": item.get("StorageClass", "")})
        elif tag == "CommonPrefixes":
            prefixes.extend({"Prefix": child.text or ""} for child in element if child.tag.endswith("Prefix"))
        elif tag == "IsTruncated":
            page["IsTruncated"] = (element.text or "").strip().lower() == "true"
        elif tag in ("KeyCount", "MaxKeys"):
            page[tag] = int(element.text or 0)
        elif tag in _LISTING_TEXT:
            page[tag] = element.text or ""
    if contents:
        page["Contents"] = contents
    if prefixes:
        page["CommonPrefixes"] = prefixes
    customized_response_dict.update(page)
    response_dict["body"] = b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></ListBucketResult>'
