"""The one place that talks to etcd: a small wrapper over `pyetcd` (etcd v3 gRPC API) so the client can be swapped.

Every call is retried with backoff for a bounded time when etcd cannot be reached, then fails with
`EtcdUnavailableError` naming the endpoints. Authentication problems raise `EtcdAuthError` naming the user
(never the password). Values are bytes; keys are str.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
import pyetcd
from pyetcd import exceptions as pyetcd_errors
from pyetcd import transactions as pyetcd_txn

from kafscale_lakehouse.etcd.errors import (
    EtcdAuthError,
    EtcdError,
    EtcdRequestError,
    EtcdUnavailableError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# gRPC otherwise backs off reconnects up to 120 s, so a restarted etcd would stay "unavailable" long after it is up.
_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# pyetcd shuns a failed endpoint for this long before trying it again (its default is 300 s).
_ENDPOINT_RETRY_SECONDS = 1.0
_MAX_BACKOFF_SECONDS = 1.0

_UNAVAILABLE_ERRORS = (
    pyetcd_errors.ConnectionFailedError,
    pyetcd_errors.ConnectionTimeoutError,
    pyetcd_errors.NoServerAvailableError,
    pyetcd_errors.InternalServerError,
)
_UNAVAILABLE_VALUE_ERRORS = ("Trying to use a failed node", "closed channel")
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}


@dataclass(frozen=True)
class EtcdEntry:
    """One key as etcd stores it, with the revisions transactions compare against."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int


# Transaction comparisons and operations: plain data, translated to the client library in one place.
@dataclass(frozen=True)
class VersionIs:
    """True when the key's version equals `version` (0 = the key does not exist)."""

    key: str
    version: int


@dataclass(frozen=True)
class ModRevisionIs:
    """True when the key was last modified at `revision` (0 = the key does not exist)."""

    key: str
    revision: int


@dataclass(frozen=True)
class LeaseIs:
    """True when the key exists and is attached to etcd lease `lease_id`."""

    key: str
    lease_id: int


EtcdCompare = VersionIs | ModRevisionIs | LeaseIs


@dataclass(frozen=True)
class PutOp:
    key: str
    value: bytes
    lease_id: int = 0


EtcdOp = PutOp


@dataclass(frozen=True)
class _ParsedEndpoint:
    host: str
    port: int
    secure: bool


def _parse_endpoint(raw: str) -> _ParsedEndpoint:
    text = raw.strip()
    if not text:
        raise ValueError("endpoints: empty endpoint")
    split = urlsplit(text if "://" in text else f"http://{text}")
    if split.scheme not in ("http", "https"):
        raise ValueError(f"endpoints: {raw!r} has scheme {split.scheme!r}; expected http or https")
    try:
        port = split.port
    except ValueError as exc:
        raise ValueError(f"endpoints: {raw!r} has an invalid port") from exc
    if not split.hostname or port is None or split.path not in ("", "/"):
        raise ValueError(f"endpoints: {raw!r} is not host:port or http(s)://host:port")
    return _ParsedEndpoint(split.hostname, port, split.scheme == "https")


def _read_pem(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what}: {path} cannot be read ({exc.strerror or exc})") from exc


class EtcdClient:
    """Thread-safe etcd v3 client with bounded retries.

    `endpoints` are `host:port` or `http(s)://host:port`. TLS is used when an endpoint is `https://` or `ca_file` is
    given (`cert_file` + `key_file` add a client certificate). With several endpoints, a failed one is skipped.
    Each RPC times out after `timeout_seconds`; an unreachable etcd is retried for `retry_seconds` in total.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        username: str | None = None,
        password: str | None = None,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        timeout_seconds: float = 5,
        retry_seconds: float = 15,
    ) -> None:
        if isinstance(endpoints, str) or not endpoints:
            raise ValueError("endpoints: expected a non-empty list of host:port or http(s)://host:port")
        parsed = [_parse_endpoint(e) for e in endpoints]
        secure = {p.secure for p in parsed}
        if len(secure) > 1:
            raise ValueError(f"endpoints: mixes http and https endpoints ({', '.join(endpoints)})")
        if (username is None) != (password is None):
            raise ValueError("username: must be set together with password")
        if (cert_file is None) != (key_file is None):
            raise ValueError("tls: cert_file and key_file must be set together")
        self._use_tls = secure.pop() or ca_file is not None
        if not self._use_tls and cert_file is not None:
            raise ValueError("tls: cert_file/key_file given but endpoints are http:// and no ca_file is set")
        self._endpoints = parsed
        scheme = "https" if self._use_tls else "http"
        self.endpoints = [f"{scheme}://{p.host}:{p.port}" for p in parsed]
        self._username = username
        self._password = password
        self._ca_pem = _read_pem(ca_file, "ca_file")
        self._cert_pem = _read_pem(cert_file, "cert_file")
        self._key_pem = _read_pem(key_file, "key_file")
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._client: pyetcd.MultiEndpointEtcd3Client | None = None

    def __repr__(self) -> str:  # never shows the password
        return f"EtcdClient(endpoints={self.endpoints!r}, username={self._username!r})"

    # ---- public API -------------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        entry = self.get_entry(key)
        return None if entry is None else entry.value

    def get_entry(self, key: str) -> EtcdEntry | None:
        def call(client: Any) -> EtcdEntry | None:
            value, meta = client.get(key)
            return None if meta is None else _entry(value, meta)

        return self._call(f"get {key}", call)

    def get_prefix(self, prefix: str) -> list[EtcdEntry]:
        """All keys starting with `prefix`, sorted by key, read at one revision."""
        return self._call(
            f"get prefix {prefix}",
            lambda client: [_entry(v, m) for v, m in client.get_prefix(prefix, sort_order="ascend")],
        )

    def put(self, key: str, value: bytes | str, lease_id: int = 0) -> None:
        data = value.encode() if isinstance(value, str) else value
        self._call(f"put {key}", lambda client: client.put(key, data, lease=lease_id))

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        return self._call(f"delete {key}", lambda client: client.delete(key))

    def transaction(self, compares: Sequence[EtcdCompare], success: Sequence[EtcdOp],
                    failure: Sequence[EtcdOp] = ()) -> bool:
        """Run `success` if every comparison holds, else `failure`, atomically; True if the comparisons held.

        A retried transaction may have been applied by an earlier attempt whose answer was lost, so callers
        compare revisions or values to make a retry harmless.
        """
        keys = ", ".join(sorted({c.key for c in compares} | {op.key for op in (*success, *failure)}))

        def call(client: Any) -> bool:
            succeeded, _ = client.transaction(
                compare=[_to_pyetcd_compare(c) for c in compares],
                success=[_to_pyetcd_op(op) for op in success],
                failure=[_to_pyetcd_op(op) for op in failure],
            )
            return bool(succeeded)

        return self._call(f"transaction on {keys}", call)

    def grant_lease(self, ttl_seconds: int) -> int:
        """A new etcd lease; keys put with its id are deleted when it expires or is revoked."""
        return self._call(f"grant lease ttl={ttl_seconds}s", lambda client: client.lease(ttl_seconds).id)

    def refresh_lease(self, lease_id: int) -> int:
        """Keep a lease alive once; returns its new TTL in seconds, 0 when it has already expired."""
        def call(client: Any) -> int:
            responses = list(client.refresh_lease(lease_id))
            return responses[-1].TTL if responses else 0

        return self._call(f"refresh lease {lease_id:x}", call)

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease (deleting its keys); a lease that no longer exists is not an error."""
        def call(client: Any) -> None:
            try:
                client.revoke_lease(lease_id)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise

        self._call(f"revoke lease {lease_id:x}", call)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- internals --------------------------------------------------------------------------------------------

    def _connected(self) -> pyetcd.MultiEndpointEtcd3Client:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> pyetcd.MultiEndpointEtcd3Client:
        credentials = None
        if self._use_tls:
            credentials = grpc.ssl_channel_credentials(self._ca_pem, self._key_pem, self._cert_pem)
        endpoints = [
            pyetcd.Endpoint(p.host, p.port, secure=self._use_tls, creds=credentials,
                            time_retry=_ENDPOINT_RETRY_SECONDS, opts=_GRPC_OPTIONS)
            for p in self._endpoints
        ]
        try:
            # Authenticates right away when a user is configured.
            client = pyetcd.MultiEndpointEtcd3Client(
                endpoints=endpoints, timeout=self.timeout_seconds,
                user=self._username, password=self._password, failover=True,
            )
        except BaseException:
            for endpoint in endpoints:
                endpoint.close()
            raise
        if not self._use_tls:
            # pyetcd sends the auth token twice: as metadata and as gRPC call credentials, which gRPC refuses on a
            # plaintext channel. The metadata alone is what etcd reads.
            client.call_credentials = None
        return client

    def _drop_client(self, client: pyetcd.MultiEndpointEtcd3Client) -> None:
        # Re-authenticate on the next call. The old channel is left to the garbage collector because other
        # threads may still be using it.
        with self._lock:
            if self._client is client:
                self._client = None

    def _call(self, operation: str, fn: Callable[[pyetcd.MultiEndpointEtcd3Client], T]) -> T:
        started = time.monotonic()
        attempts = 0
        backoff = 0.1
        reauthenticated = False
        while True:
            attempts += 1
            client = None
            try:
                client = self._connected()
                return fn(client)
            except _UNAVAILABLE_ERRORS as exc:
                cause = f"{type(exc).__name__}: {exc}"
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if code in _UNAVAILABLE_CODES:
                    cause = f"{code.name}: {details}"
                elif code == grpc.StatusCode.UNAUTHENTICATED and client is not None and not reauthenticated:
                    # Tokens expire (--auth-token-ttl) and do not survive an etcd restart: log in again once.
                    log.info("etcd auth token rejected at %s (%s); authenticating again", self.endpoints, details)
                    self._drop_client(client)
                    reauthenticated = True
                    continue
                else:
                    raise self._request_error(operation, code, details) from None
            except ValueError as exc:
                # pyetcd raises ValueError for an endpoint it marked failed moments ago, grpc for a closed channel.
                if not any(text in str(exc) for text in _UNAVAILABLE_VALUE_ERRORS):
                    raise
                cause = f"{type(exc).__name__}: {exc}"
            elapsed = time.monotonic() - started
            if elapsed >= self.retry_seconds:
                raise EtcdUnavailableError(self.endpoints, operation, attempts, elapsed, cause)
            if attempts == 1:
                log.warning("etcd at %s unavailable during %s (%s); retrying for up to %.0fs",
                            ", ".join(self.endpoints), operation, cause, self.retry_seconds)
            time.sleep(min(backoff, self.retry_seconds - elapsed))
            backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)

    def _request_error(self, operation: str, code: grpc.StatusCode, details: str) -> EtcdError:
        where = ", ".join(self.endpoints)
        user = self._username if self._username is not None else "(no user)"
        if "authentication failed" in details or code == grpc.StatusCode.UNAUTHENTICATED:
            return EtcdAuthError(f"etcd at {where}: authentication failed for user {user!r} ({details})")
        if "user name is empty" in details:
            return EtcdAuthError(f"etcd at {where} requires authentication but no username/password "
                                 f"are set ({details})")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return EtcdAuthError(f"etcd at {where}: user {user!r} is not allowed to {operation}: {details}")
        return EtcdRequestError(f"etcd at {where}: {operation} rejected: {code.name}: {details}")


def _entry(value: bytes, meta: Any) -> EtcdEntry:
    return EtcdEntry(
        key=meta.key.decode(), value=value, create_revision=meta.create_revision,
        mod_revision=meta.mod_revision, version=meta.version, lease_id=meta.lease_id,
    )


class _LeaseCompare(pyetcd_txn.BaseCompare):
    # pyetcd has no lease comparison although etcd >= 3.3 supports it.
    def build_compare(self, compare: Any) -> None:
        compare.target = pyetcd.etcdrpc.Compare.LEASE
        compare.lease = int(self.value)


def _to_pyetcd_compare(compare: EtcdCompare) -> Any:
    match compare:
        case VersionIs(key, version):
            return pyetcd_txn.Version(key) == version
        case ModRevisionIs(key, revision):
            return pyetcd_txn.Mod(key) == revision
        case LeaseIs(key, lease_id):
            return _LeaseCompare(key) == lease_id
    raise TypeError(f"unsupported etcd comparison {compare!r}")


def _to_pyetcd_op(op: EtcdOp) -> Any:
    match op:
        case PutOp(key, value, lease_id):
            return pyetcd_txn.Put(key, value, lease=lease_id)
    raise TypeError(f"unsupported etcd operation {op!r}")
