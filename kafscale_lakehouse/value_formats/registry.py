"""Client of the JSON Schema registry of KafScale's Go processor: `GET <base_url>/<topic>.json`.

- The topic is percent-encoded as one path segment (`/`, `?`, `#`, `%` and `..` included), so no topic name can
  reach outside `base_url`. Plain Kafka topic names (`[A-Za-z0-9._-]`) give the URL the Go processor requests.
- Credentials in `base_url` (`https://user:secret@host/schemas`) are sent as HTTP Basic authorization and never
  appear in URLs that errors or logs show. Redirects are not followed: they would leave `base_url` (and carry the
  credentials along); the error names where the registry redirected to.
- Each topic's compiled schema is cached for `cache_seconds` (the time of the fetch that got it; injectable clock).
  One fetch per topic at a time: threads asking for the same topic meanwhile wait for its result.
- A registry that does not answer, times out or answers 5xx/429 is retried with exponential backoff, then
  `SchemaRegistryUnavailableError`; 404 is `SchemaNotFoundError`. Both are infrastructure errors, never invalid
  records: the run fails and no record is dropped. A document that is not JSON or not a JSON Schema is
  `InvalidSchemaDocumentError` (validation.py). Errors are not cached: the next call asks the registry again.
- `timeout_seconds` bounds each connection attempt and each read from the socket.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from kafscale_lakehouse.redaction import redact_url
from kafscale_lakehouse.schema.columns import Column, columns_from_json_schema
from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.schema.validation import CompiledJsonSchema, InvalidSchemaDocumentError, compile_json_schema

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_RETRY_BACKOFF_SECONDS = 0.5
# A JSON Schema is a small document; a body beyond this is a misconfigured URL, not a schema.
MAX_SCHEMA_BYTES = 8 << 20
_RETRYABLE_STATUSES = frozenset({429}) | frozenset(range(500, 600))


class SchemaRegistryError(Exception):
    """The schema registry could not give the schema of a topic: an infrastructure error, never an invalid record.

    `url` is the schema URL without credentials."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url

    def __reduce__(self) -> tuple[object, ...]:  # keep `url` when pickled across Spark workers
        return (_rebuild_error, (type(self), self.args[0], self.url))


def _rebuild_error(error_class: type[SchemaRegistryError], message: str, url: str | None) -> SchemaRegistryError:
    return error_class(message, url=url)


class SchemaRegistryUnavailableError(SchemaRegistryError):
    """The registry did not answer (connection refused, timeout, reset) or answered 5xx/429 on every attempt."""


class SchemaNotFoundError(SchemaRegistryError):
    """The registry answered 404: it has no schema for the topic."""


class SchemaRegistryRequestError(SchemaRegistryError):
    """The registry refused the request in a way retrying cannot fix (401, 403, another 4xx, a redirect)."""


@dataclass(frozen=True)
class _CacheEntry:
    schema: CompiledJsonSchema
    expires_at: float


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl) -> None:  # noqa: ANN001 - urllib's signature
        return None  # urllib then raises the 3xx as an HTTPError


class SchemaRegistryClient:
    """Fetches, compiles and caches `<base_url>/<topic>.json`. Thread-safe: sensors and runs may share one."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float = 5,
        cache_seconds: float = 300,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_backoff_seconds: float = DEFAULT_RETRY_BACKOFF_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_seconds <= 0 or cache_seconds < 0 or max_attempts < 1 or retry_backoff_seconds < 0:
            raise ValueError(
                f"schema registry client needs timeout_seconds > 0, cache_seconds >= 0, max_attempts >= 1 and "
                f"retry_backoff_seconds >= 0 "
                f"(got {timeout_seconds}, {cache_seconds}, {max_attempts}, {retry_backoff_seconds})"
            )
        self.base_url, self._authorization = _split_credentials(base_url)
        self._timeout_seconds = timeout_seconds
        self._cache_seconds = cache_seconds
        self._max_attempts = max_attempts
        self._retry_backoff_seconds = retry_backoff_seconds
        self._clock = clock
        self._opener = urllib.request.build_opener(_NoRedirects())
        self._lock = threading.Lock()  # guards the two dicts below
        self._cache: dict[str, _CacheEntry] = {}
        self._fetch_locks: dict[str, threading.Lock] = {}

    def schema_url(self, topic: str) -> str:
        """`<base_url>/<topic>.json` with the topic as one percent-encoded path segment (no credentials)."""
        if not topic:
            raise ValueError("topic name is empty: no schema URL can be built for it")
        url = f"{self.base_url}/{urllib.parse.quote(topic, safe='')}.json"
        # quote() leaves only unreserved characters and %XX escapes; checked anyway because escaping base_url
        # would let a topic name read any URL of the registry host.
        if not url.startswith(self.base_url + "/") or url.count("/") != self.base_url.count("/") + 1:
            raise ValueError(f"topic {topic!r} would leave the schema registry base URL {self.base_url}")
        return url

    def get_schema(self, topic: str) -> CompiledJsonSchema:
        """The compiled schema of `topic`, from the cache while it is younger than `cache_seconds`.

        Raises `SchemaNotFoundError`, `SchemaRegistryUnavailableError`, `SchemaRegistryRequestError` or
        `InvalidSchemaDocumentError`."""
        cached = self._cached(topic)
        if cached is not None:
            return cached
        with self._lock:
            fetch_lock = self._fetch_locks.setdefault(topic, threading.Lock())
        with fetch_lock:
            cached = self._cached(topic)  # another thread may have fetched it while we waited
            if cached is not None:
                return cached
            fetched_at = self._clock()
            url = self.schema_url(topic)
            schema = _compile_body(self._fetch(topic, url), url)
            with self._lock:
                self._cache[topic] = _CacheEntry(schema, fetched_at + self._cache_seconds)
            return schema

    def columns(self, topic: str) -> list[Column]:
        """The mapped columns of a `schema.source: registry` mapping, derived from the topic's schema as the Go
        processor derives them (`columns.columns_from_json_schema`)."""
        document = self.get_schema(topic).document
        if isinstance(document, bool):
            raise SchemaMappingError(
                f"registry schema of topic {topic!r} is the boolean schema "
                f"{str(document).lower()}: it declares no columns"
            )
        return columns_from_json_schema(document, topic)

    def invalidate(self, topic: str | None = None) -> None:
        """Forget the cached schema of `topic` (of every topic when None): the next call fetches it again."""
        with self._lock:
            if topic is None:
                self._cache.clear()
            else:
                self._cache.pop(topic, None)

    def _cached(self, topic: str) -> CompiledJsonSchema | None:
        with self._lock:
            entry = self._cache.get(topic)
        if entry is not None and self._clock() < entry.expires_at:
            return entry.schema
        return None

    def _fetch(self, topic: str, url: str) -> bytes:
        # S310 below is deliberate: `url` is the configured registry `base_url` plus a topic name, so its scheme is the
        # config's
        request = urllib.request.Request(  # noqa: S310
            url, headers={"Accept": "application/schema+json, application/json"}
        )
        if self._authorization is not None:
            request.add_unredirected_header("Authorization", self._authorization)
        failure = ""
        for attempt in range(1, self._max_attempts + 1):
            try:
                with self._opener.open(request, timeout=self._timeout_seconds) as response:
                    body = response.read(MAX_SCHEMA_BYTES + 1)
                log.info("fetched the schema of topic %s from %s (%d bytes)", topic, url, len(body))
                if len(body) > MAX_SCHEMA_BYTES:
                    raise InvalidSchemaDocumentError(url, f"the document is larger than {MAX_SCHEMA_BYTES} bytes")
                return body
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code == 404:
                    raise SchemaNotFoundError(
                        f"schema registry has no schema for topic {topic!r}: {url} answered 404", url=url
                    ) from None
                if 300 <= exc.code < 400:
                    location = redact_url(exc.headers.get("Location") or "nowhere")
                    raise SchemaRegistryRequestError(
                        f"schema registry answered {exc.code} for {url}, redirecting to {location}: redirects are not "
                        f"followed, "
                        "set schema.registry.base_url to the final location",
                        url=url,
                    ) from None
                if exc.code not in _RETRYABLE_STATUSES:
                    raise SchemaRegistryRequestError(
                        f"schema registry answered {exc.code} {exc.reason} for {url}", url=url
                    ) from None
                failure = f"HTTP {exc.code} {exc.reason}"
            except urllib.error.URLError as exc:
                failure = str(exc.reason)
            except (OSError, http.client.HTTPException) as exc:  # timeouts and resets while reading the body
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if attempt < self._max_attempts:
                delay = self._retry_backoff_seconds * 2 ** (attempt - 1)
                log.warning(
                    "schema registry %s: attempt %d of %d failed (%s); retrying in %.2fs",
                    url,
                    attempt,
                    self._max_attempts,
                    failure,
                    delay,
                )
                time.sleep(delay)
        raise SchemaRegistryUnavailableError(
            f"schema registry did not give the schema of topic {topic!r}: {url} failed {self._max_attempts} times, "
            f"last with {failure} "
            f"(timeout {self._timeout_seconds}s per attempt)",
            url=url,
        )


def _compile_body(body: bytes, url: str) -> CompiledJsonSchema:
    try:
        document = json.loads(body.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InvalidSchemaDocumentError(url, f"the document is not UTF-8 (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidSchemaDocumentError(url, f"the document is not JSON: {exc}") from None
    return compile_json_schema(document, url)


def _split_credentials(base_url: str) -> tuple[str, str | None]:
    """(base URL without userinfo and trailing `/`, the Basic authorization header value or None)."""
    try:
        parts = urllib.parse.urlsplit(base_url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"base_url: {redact_url(base_url)!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"base_url: {redact_url(base_url)!r} must be an http(s) URL with a host and no query or "
                         "fragment")
    authorization = None
    if parts.username is not None or parts.password is not None:
        user_pass = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user_pass.encode("utf-8")).decode("ascii")
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", "")), authorization
