"""Client of a Confluent-compatible schema registry (Confluent, Karapace, Redpanda, Apicurio's ccompat API), for
values in the Confluent wire format (`mappings[].value_format: avro`, `protobuf`, `json_schema`).

Plain HTTP (urllib), not confluent-kafka's `SchemaRegistryClient`: the run needs three GETs on the driver
(a subject's versions, each version), which do not justify confluent-kafka plus httpx, authlib, attrs and cachetools
as runtime dependencies, and this way the errors, retries and secrets behave like our JSON Schema registry client's
(value_formats/registry.py): 404 is `SchemaNotFoundError`, an outage after retries is `SchemaRegistryUnavailableError`,
another refusal `SchemaRegistryRequestError`, all naming the subject or schema id and the URL without credentials.
Credentials: HTTP Basic (`username`/`password`) or a bearer token; TLS with an optional CA and client certificate.

Subjects follow the producer's subject name strategy: `topic` → `<topic>-value`, `record` → `<record name>`,
`topic_record` → `<topic>-<record name>`.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kafscale_lakehouse.redaction import redact_url
from kafscale_lakehouse.value_formats.registry import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF_SECONDS,
    SchemaNotFoundError,
    SchemaRegistryRequestError,
    SchemaRegistryUnavailableError,
)

log = logging.getLogger(__name__)

SubjectNameStrategy = Literal["topic", "record", "topic_record"]
_RETRYABLE_STATUSES = frozenset({429}) | frozenset(range(500, 600))
MAX_RESPONSE_BYTES = 8 << 20


def subject_name(topic: str, strategy: SubjectNameStrategy, record_name: str | None, *, key: bool = False) -> str:
    """The subject a producer with this strategy registers the value (or key) schemas of `topic` under."""
    if strategy == "topic":
        return f"{topic}-{'key' if key else 'value'}"
    if not record_name:
        raise ValueError(f"subject name strategy {strategy} needs the record name")
    return record_name if strategy == "record" else f"{topic}-{record_name}"


@dataclass(frozen=True)
class ConfluentRegistrySettings:
    url: str
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    timeout_seconds: float = 10


@dataclass(frozen=True)
class SchemaReference:
    """A schema's import of another registered schema (Confluent's `references`: a Protobuf `import` by `name`)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    schema_id: int
    schema_type: str  # AVRO, PROTOBUF, JSON
    text: str
    version: int | None = None  # within the subject it was fetched from
    references: tuple[SchemaReference, ...] = ()


class ConfluentRegistryClient:
    """GETs against the registry's REST API, retried with backoff on outages."""

    def __init__(self, settings: ConfluentRegistrySettings, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 retry_backoff_seconds: float = DEFAULT_RETRY_BACKOFF_SECONDS) -> None:
        self.base_url = settings.url.rstrip("/")
        self._settings = settings
        self._max_attempts = max_attempts
        self._retry_backoff_seconds = retry_backoff_seconds
        self._authorization: str | None = None
        if settings.bearer_token:
            self._authorization = f"Bearer {settings.bearer_token}"
        elif settings.username is not None:
            pair = f"{settings.username}:{settings.password or ''}".encode()
            self._authorization = "Basic " + base64.b64encode(pair).decode("ascii")
        context = None
        if settings.ca_file is not None or settings.cert_file is not None:
            context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
            if settings.cert_file is not None:
                context.load_cert_chain(str(settings.cert_file),
                                        str(settings.key_file) if settings.key_file else None)
        self._context = context

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        body = self._get(f"/schemas/ids/{schema_id}", f"schema id {schema_id}")
        return RegisteredSchema(schema_id, body.get("schemaType", "AVRO"), body["schema"],
                                references=_references(body))

    def subject_versions(self, subject: str, schema_format: str | None = None) -> list[RegisteredSchema]:
        """Every version of `subject`, oldest first; `schema_format` as the registry's `format` parameter
        (`serialized`: Protobuf schemas as the base64 of their FileDescriptorProto)."""
        what = f"subject {subject}"
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        return [self._version(path, what, str(v), schema_format) for v in self._get(path, what)]

    def latest_version(self, subject: str) -> RegisteredSchema:
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        return self._version(path, f"subject {subject}", "latest")

    def register(self, subject: str, schema_text: str, schema_type: str = "AVRO") -> int:
        """Register a schema under `subject` (a producer's side: the demo producer); returns its id."""
        body: dict[str, Any] = {"schema": schema_text}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        return int(self._get(path, f"subject {subject}", json.dumps(body).encode())["id"])

    def _version(self, path: str, what: str, version: str, schema_format: str | None = None) -> RegisteredSchema:
        query = f"?format={urllib.parse.quote(schema_format)}" if schema_format else ""
        body = self._get(f"{path}/{version}{query}", f"{what} version {version}")
        return RegisteredSchema(int(body["id"]), body.get("schemaType", "AVRO"), body["schema"], int(body["version"]),
                                _references(body))

    def serialized_imports(self, schema: RegisteredSchema) -> tuple[tuple[str, str], ...]:
        """(import name, base64 FileDescriptorProto) of every schema a Protobuf schema imports through its
        references, transitively, imports before their importers; Google's well-known types are the protobuf
        library's (as Confluent's clients skip them)."""
        found: dict[str, str] = {}

        def visit(references: tuple[SchemaReference, ...]) -> None:
            for reference in references:
                if reference.name in found or reference.name.startswith("google/protobuf/"):
                    continue
                path = f"/subjects/{urllib.parse.quote(reference.subject, safe='')}/versions"
                imported = self._version(path, f"subject {reference.subject}", str(reference.version), "serialized")
                visit(imported.references)
                found[reference.name] = imported.text

        visit(schema.references)
        return tuple(found.items())

    def _get(self, path: str, what: str, post: bytes | None = None) -> Any:
        """GET `path` (POST `post` to it when given), retried on outages."""
        url = self.base_url + path
        shown = redact_url(url)
        media_type = "application/vnd.schemaregistry.v1+json"
        request = urllib.request.Request(url, data=post,  # noqa: S310 - the configured registry URL
                                         headers={"Accept": media_type, "Content-Type": media_type})
        if self._authorization is not None:
            request.add_unredirected_header("Authorization", self._authorization)
        failure = ""
        for attempt in range(1, self._max_attempts + 1):
            try:
                with urllib.request.urlopen(request, timeout=self._settings.timeout_seconds,  # noqa: S310
                                            context=self._context) as response:
                    return json.loads(response.read(MAX_RESPONSE_BYTES))
            except urllib.error.HTTPError as exc:
                message = _error_message(exc)
                exc.close()
                if exc.code == 404:
                    raise SchemaNotFoundError(f"schema registry has no {what}: {shown} answered 404 ({message})",
                                              url=shown) from None
                if exc.code not in _RETRYABLE_STATUSES:
                    raise SchemaRegistryRequestError(f"schema registry refused {what}: {shown} answered {exc.code} "
                                                     f"({message})", url=shown) from None
                failure = f"HTTP {exc.code} ({message})"
            except urllib.error.URLError as exc:
                failure = str(exc.reason)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
            if attempt < self._max_attempts:
                delay = self._retry_backoff_seconds * 2 ** (attempt - 1)
                log.warning("schema registry %s: attempt %d of %d failed (%s); retrying in %.2fs", shown, attempt,
                            self._max_attempts, failure, delay)
                time.sleep(delay)
        raise SchemaRegistryUnavailableError(
            f"schema registry did not give {what}: {shown} failed {self._max_attempts} times, last with {failure}",
            url=shown)


def _references(body: dict[str, Any]) -> tuple[SchemaReference, ...]:
    return tuple(SchemaReference(r["name"], r["subject"], int(r["version"])) for r in body.get("references") or ())


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(64 << 10))
        return f"error_code {body.get('error_code')}: {body.get('message')}"
    except (ValueError, OSError, AttributeError):
        return str(exc.reason)

