"""Iceberg catalogs through pyiceberg (`rest`, `sql` on sqlite or a database, and every other catalog type pyiceberg
ships) and opening/creating the mapped tables."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import requests
from pyarrow.fs import FileSelector
from pyiceberg.catalog import AVAILABLE_CATALOGS, Catalog, CatalogType
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import (
    ForbiddenError,
    NoSuchNamespaceError,
    NoSuchTableError,
    OAuthError,
    ServerError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from pyiceberg.io import FSSPEC_FILE_IO, PY_IO_IMPL, S3_SERVER_SIDE_ENCRYPTION, S3_SSE_KMS_KEY_ID
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.transforms import IdentityTransform, UnknownTransform, parse_transform
from pyiceberg.types import IcebergType
from requests.adapters import HTTPAdapter

from kafscale_lakehouse.engine.tables.file_io import TABLES_FILE_IO
from kafscale_lakehouse.redaction import redact_url
from kafscale_lakehouse.storage.s3_store import SSE_TYPES

log = logging.getLogger(__name__)
T = TypeVar("T")

CATALOG_TYPES = tuple(catalog_type.value for catalog_type in CatalogType)  # rest, hive, glue, dynamodb, sql, ...
# Partition field ids start at 1000 by Iceberg convention; the catalog re-assigns them on create anyway.
_FIRST_PARTITION_FIELD_ID = 1000


class CatalogError(RuntimeError):
    """An Iceberg catalog problem; the message names the catalog endpoint (never a secret)."""


class CatalogUnavailableError(CatalogError):
    """The catalog cannot be reached or answered with a server error."""


class CatalogAuthenticationError(CatalogError):
    """The catalog rejected the configured credentials or token."""


class TableNotFoundError(CatalogError):
    """The mapped table does not exist and `create_table_if_missing` is off."""


class TableDefinitionError(CatalogError):
    """The table cannot be created as configured (identifier, partition spec, properties)."""


@dataclass(frozen=True)
class CatalogSettings:
    """How to reach the catalog. Field names follow the config keys `iceberg.catalog.*`, `iceberg.warehouse`, `s3.*`.

    `sql` is the embedded catalog: `uri` is an SQLAlchemy URL and defaults to `<warehouse>/catalog.db` (sqlite)
    for a local warehouse. `username`/`password` become the OAuth2 client credential of a `rest` catalog.
    `s3_sse_type` (`AES256` | `aws:kms`) and `s3_sse_kms_key_id` are the server-side encryption requested for every
    object the FileIO writes (data files, manifests, manifest lists, and metadata files a `sql` catalog writes).
    """

    type: str
    uri: str | None = None
    warehouse: str | None = None
    name: str = "kafscale"
    token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = field(default=None, repr=False)
    s3_sse_type: str | None = None
    s3_sse_kms_key_id: str | None = None
    extra_properties: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.s3_sse_type is not None and self.s3_sse_type not in SSE_TYPES:
            raise ValueError(f"s3_sse_type: must be one of {SSE_TYPES}, got {self.s3_sse_type!r}")
        if self.s3_sse_kms_key_id is not None and self.s3_sse_type != "aws:kms":
            raise ValueError("s3_sse_kms_key_id: is only used with s3_sse_type aws:kms")

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg catalog properties (contain secrets: never log them)."""
        props: dict[str, str] = {}
        if self.uri:
            props["uri"] = self.uri
        if self.warehouse:
            props["warehouse"] = self.warehouse
        if self.token:
            props["token"] = self.token
        if self.username or self.password:
            # Same rule as the Go processor: "user" or "user:password".
            props["credential"] = f"{self.username or ''}:{self.password}" if self.password else self.username or ""
            if self.uri:
                # The REST spec's default token endpoint; pyiceberg deprecates guessing it.
                props["oauth2-server-uri"] = f"{self.uri.rstrip('/')}/v1/oauth/tokens"
        s3 = {
            "s3.endpoint": self.s3_endpoint,
            "s3.region": self.s3_region,
            "s3.access-key-id": self.s3_access_key_id,
            "s3.secret-access-key": self.s3_secret_access_key,
        }
        props.update({k: v for k, v in s3.items() if v})
        if self.s3_path_style is not None:
            props["s3.force-virtual-addressing"] = "false" if self.s3_path_style else "true"
        if self.s3_sse_type:
            props[S3_SERVER_SIDE_ENCRYPTION] = self.s3_sse_type
            if self.s3_sse_kms_key_id:
                props[S3_SSE_KMS_KEY_ID] = self.s3_sse_kms_key_id
            # pyiceberg 0.12 applies these only in its fsspec (s3fs) FileIO; the PyArrow FileIO it picks by default
            # for s3:// ignores them (pyarrow's S3FileSystem has no SSE-S3/SSE-KMS option) and would write plain.
            props[PY_IO_IMPL] = FSSPEC_FILE_IO
        else:
            # pyiceberg's PyArrow FileIO, small files in one PUT each (file_io.py)
            props[PY_IO_IMPL] = TABLES_FILE_IO
        props.update(self.extra_properties)
        return props


@dataclass(frozen=True)
class PartitionFieldSpec:
    """One partition field of a mapping: `transform` is an Iceberg transform string (`identity`, `day`,
    `bucket[16]`, `truncate[4]`, ...); `name` defaults to the column for identity, else `<column>_<transform>`."""

    source_column: str
    transform: str = "identity"
    name: str | None = None


def load_catalog(settings: CatalogSettings) -> Catalog:
    """Connect to the configured catalog; unreachable or refused → `CatalogError` naming the endpoint."""
    if settings.type not in CATALOG_TYPES:
        raise ValueError(f"type: must be one of {CATALOG_TYPES}, got {settings.type!r}")
    props = settings.catalog_properties()
    if settings.type == "rest":
        if not settings.uri:
            raise ValueError("uri: is required for a rest catalog")
        endpoint = redact_url(settings.uri)
        with catalog_errors(endpoint, _rest_auth_hint(settings)):
            rest = RestCatalog(settings.name, **props)
        _keep_more_connections(rest)
        catalog: Catalog = rest
    elif settings.type != "sql":
        # glue, hive, dynamodb, bigquery, in-memory: pyiceberg's own constructor, with the properties as given.
        if settings.warehouse:
            props["warehouse"] = _warehouse_uri(settings.warehouse)
        endpoint = redact_url(props.get("uri") or f"{settings.type} catalog {settings.name}")
        with catalog_errors(endpoint):
            catalog = _construct_catalog(settings.type, settings.name, props, endpoint)
    else:
        if not settings.warehouse:
            raise ValueError("warehouse: is required for a sql catalog")
        props["warehouse"] = _warehouse_uri(settings.warehouse)
        if "uri" not in props:  # not setdefault: the default needs a local warehouse, a given uri does not
            props["uri"] = _default_sqlite_uri(props["warehouse"])
        endpoint = redact_url(props["uri"])
        from pyiceberg.catalog.sql import SqlCatalog  # SQLAlchemy, ~0.3 s of imports: only for a sql catalog

        with catalog_errors(endpoint, "the access to its database"):
            catalog = SqlCatalog(settings.name, **props)
    log.info("Iceberg %s catalog %r at %s", settings.type, settings.name, endpoint)
    return catalog


# The REST catalog's HTTP connections kept open per host. A namespace scan loads tables on up to 32 threads
# (`NAMESPACE_SCAN_THREADS`) and a batch prepares and commits tables on 8: with requests' default of 10, each request
# over it opened a connection and threw it away, logging "Connection pool is full, discarding connection".
REST_POOL_CONNECTIONS = 32


def _keep_more_connections(catalog: RestCatalog) -> None:
    """Widen the pools of the HTTP adapters pyiceberg mounted on the catalog's session (its own and the SigV4 one);
    pyiceberg has no setting for it. Its session is not a public attribute: a version without it is left as it is."""
    session = getattr(catalog, "_session", None)
    if not isinstance(session, requests.Session):
        return
    for adapter in session.adapters.values():
        if isinstance(adapter, HTTPAdapter) and adapter._pool_maxsize < REST_POOL_CONNECTIONS:
            adapter._pool_maxsize = REST_POOL_CONNECTIONS  # kept by the adapter's pickling and proxy managers
            adapter.init_poolmanager(adapter._pool_connections, REST_POOL_CONNECTIONS, block=adapter._pool_block)


def _construct_catalog(catalog_type: str, name: str, props: dict[str, str], endpoint: str) -> Catalog:
    """pyiceberg's catalog of `catalog_type`; what its constructor refuses (a missing extra, a property it
    validates, an AWS client without region or credentials) → `CatalogError` naming the type and the endpoint."""
    try:
        return AVAILABLE_CATALOGS[CatalogType(catalog_type)](name, props)
    except Exception as exc:  # any constructor failure (boto3, thrift, google-cloud) is a config fault
        if isinstance(exc, (CatalogError, requests.RequestException, *_sql_catalog_errors())):
            raise  # catalog_errors names these
        raise CatalogError(
            f"Iceberg {catalog_type} catalog at {endpoint} cannot be constructed: {type(exc).__name__}: {exc}"
        ) from exc


def open_table(
    catalog: Catalog,
    identifier: str,
    *,
    schema: Schema | None = None,
    create_if_missing: bool = False,
    partition_fields: Sequence[PartitionFieldSpec] = (),
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Load `identifier` (`namespace.table`); with `create_if_missing`, create namespace and table first.

    A created table gets `schema` as given (base columns ids 1-8, then mapped columns), Parquet data files,
    the partition spec and the extra table properties. An existing table is loaded unchanged.
    """
    endpoint = catalog_endpoint(catalog)
    namespace = Catalog.namespace_from(identifier)
    if not namespace:
        raise TableDefinitionError(f"table identifier {identifier!r} needs a namespace (e.g. 'prod.orders')")
    with catalog_errors(endpoint):
        try:
            return _retrying_server_errors(lambda: catalog.load_table(identifier), f"loading table {identifier}",
                                           endpoint)
        except (NoSuchTableError, NoSuchNamespaceError):
            if not create_if_missing:
                raise TableNotFoundError(
                    f"table {identifier} does not exist in the Iceberg catalog at {endpoint} and "
                    "create_table_if_missing is off for its mapping"
                ) from None
    if schema is None:
        raise ValueError(f"creating table {identifier} needs a schema")
    table_properties = _creation_properties(identifier, properties or {})
    spec = build_partition_spec(identifier, schema, partition_fields)

    def create() -> Table:  # "if not exists" both: a create the server made before failing its answer is found
        catalog.create_namespace_if_not_exists(namespace)
        location = _unused_location(catalog, identifier)
        return catalog.create_table_if_not_exists(
            identifier, schema, partition_spec=spec, properties={**_go_paths(location), **table_properties},
            location=location,
        )

    with catalog_errors(endpoint):
        table = _retrying_server_errors(create, f"creating table {identifier}", endpoint)
    log.info("table %s ready at %s (catalog %s)", identifier, table.location(), endpoint)
    return table


# A catalog's 5xx on loading or creating a table is tried again after each of these pauses (3 attempts in all): a REST
# catalog under load (SeaweedFS's, 50 tables created at once by a land_tables batch) fails a few requests and
# answers the next. Both calls are safe to repeat; commits are not retried here (appends.py settles those).
CATALOG_SERVER_ERROR_PAUSES_SECONDS = (0.5, 2.0)
CATALOG_SERVER_ERROR_ATTEMPTS = len(CATALOG_SERVER_ERROR_PAUSES_SECONDS) + 1


def _retrying_server_errors(call: Callable[[], T], what: str, endpoint: str) -> T:
    pauses = CATALOG_SERVER_ERROR_PAUSES_SECONDS
    for attempt, pause in enumerate(pauses, start=1):
        try:
            return call()
        except (ServerError, ServiceUnavailableError) as exc:
            log.warning("%s: the Iceberg catalog at %s answered %s (attempt %d of %d); again in %.1f s", what,
                        endpoint, type(exc).__name__, attempt, len(pauses) + 1, pause)
            time.sleep(pause)
    return call()  # the last attempt: its error is the caller's


def build_partition_spec(identifier: str, schema: Schema, fields: Sequence[PartitionFieldSpec]) -> PartitionSpec:
    """The partition spec of `fields` bound to `schema` by column name."""
    spec_fields = []
    for position, spec in enumerate(fields):
        try:
            source = schema.find_field(spec.source_column)
        except ValueError:
            raise TableDefinitionError(
                f"table {identifier}: partition column {spec.source_column!r} is not in the schema"
            ) from None
        transform = parse_transform(spec.transform)
        if isinstance(transform, UnknownTransform) or not transform.can_transform(source.field_type):
            raise TableDefinitionError(
                f"table {identifier}: partition transform {spec.transform!r} does not apply to column "
                f"{spec.source_column!r} of type {source.field_type}"
            )
        name = spec.name or (
            spec.source_column if isinstance(transform, IdentityTransform)
            else f"{spec.source_column}_{str(transform).replace('[', '_').rstrip(']')}"
        )
        spec_fields.append(PartitionField(source.field_id, _FIRST_PARTITION_FIELD_ID + position, transform, name))
    return PartitionSpec(*spec_fields)


def add_missing_column(table: Table, name: str, field_type: IcebergType) -> bool:
    """Add the optional top-level column `name` unless the table has one; returns whether it added it."""
    if name in table.schema().column_names:
        return False
    with table.update_schema() as update:
        update.add_column(name, field_type, required=False)
    log.info("table %s: column %s (%s) added", ".".join(table.name()), name, field_type)
    return True


def evolve_partition_spec(table: Table, identifier: str, fields: Sequence[PartitionFieldSpec]) -> bool:
    """Bring the table's current partition spec to `fields` (`update_spec`: fields the config no longer has are
    removed, new ones added; files written under the old spec stay as they are); returns whether it changed."""
    wanted = build_partition_spec(identifier, table.schema(), fields)
    current = table.spec()
    if [(f.source_id, f.transform, f.name) for f in current.fields] == [
            (f.source_id, f.transform, f.name) for f in wanted.fields]:
        return False
    schema = table.schema()
    keep = {(f.source_id, str(f.transform), f.name) for f in wanted.fields}
    have = {(f.source_id, str(f.transform), f.name) for f in current.fields}
    with table.update_spec() as update:
        for field in current.fields:
            if (field.source_id, str(field.transform), field.name) not in keep:
                update.remove_field(field.name)
        for field in wanted.fields:
            if (field.source_id, str(field.transform), field.name) not in have:
                update.add_field(schema.find_field(field.source_id).name, field.transform, field.name)
    log.info("table %s: partition spec evolved from [%s] to [%s]", identifier,
             ", ".join(f"{f.name}={f.transform}" for f in current.fields),
             ", ".join(f"{f.name}={f.transform}" for f in wanted.fields))
    return True


def catalog_endpoint(catalog: Catalog) -> str:
    """Where the catalog lives, for messages (password in a URI is masked)."""
    return redact_url(catalog.properties.get("uri", f"catalog {catalog.name}"))


@contextmanager
def catalog_errors(endpoint: str, credential_keys: str = "the catalog credentials") -> Iterator[None]:
    """Turn transport and auth failures of a catalog call into `CatalogError`s that name `endpoint`.

    The original exception stays chained; neither message carries a secret.
    """
    try:
        yield
    except (OAuthError, UnauthorizedError, ForbiddenError) as exc:
        raise CatalogAuthenticationError(
            f"Iceberg catalog at {endpoint} rejected {credential_keys} ({type(exc).__name__})"
        ) from exc
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise CatalogUnavailableError(f"Iceberg catalog at {endpoint} is unreachable ({type(exc).__name__})") from exc
    except _sql_catalog_errors() as exc:
        raise CatalogUnavailableError(f"Iceberg sql catalog at {endpoint} failed ({type(exc).__name__})") from exc
    except (ServerError, ServiceUnavailableError) as exc:
        raise CatalogUnavailableError(f"Iceberg catalog at {endpoint} answered {type(exc).__name__}") from exc


def _sql_catalog_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's errors once something (pyiceberg's SqlCatalog) imported it; none can be raised before, and a
    REST deployment's processes should not import SQLAlchemy for an except clause."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    return (sqlalchemy_exc.SQLAlchemyError,) if sqlalchemy_exc is not None else ()


def _rest_auth_hint(settings: CatalogSettings) -> str:
    if settings.username or settings.password:
        return "the configured credential (username/password)"
    if settings.token:
        return "the configured bearer token"
    return "the request (no token or username/password configured)"


# Every commit writes a metadata.json listing the snapshots; without these every old version is kept and the
# metadata folder grows with the square of the history. Same meaning as Iceberg's Java properties; a mapping's
# table_properties may override them. Applied to existing tables by maintenance (engine/maintenance.py).
BOUNDED_METADATA_PROPERTIES = {
    TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
    TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "20",
}


def go_table_location(catalog: Catalog, identifier: str) -> str | None:
    """Where the Go processor creates `identifier`: `<warehouse>/<namespace parts>/<table>` (sink/iceberg.go:314-316),
    when the catalog's `warehouse` is a location (`s3://...`, `file://...`); None when it is none (a REST catalog's
    warehouse may be a name, which Go would make a relative path of): the catalog chooses then."""
    warehouse = catalog.properties.get("warehouse") or ""
    if "://" not in warehouse:
        return None
    return f"{warehouse.rstrip('/')}/{'/'.join(Catalog.identifier_to_tuple(identifier))}"


def _go_paths(location: str | None) -> dict[str, str]:
    """The table properties the Go processor creates a table with beside its location (sink/iceberg.go:321-324): the
    data and metadata directories, so that either engine writes a table's files where the other would."""
    if location is None:
        return {}
    return {TableProperties.WRITE_DATA_PATH: f"{location}/data", TableProperties.WRITE_METADATA_PATH:
            f"{location}/metadata"}


def _unused_location(catalog: Catalog, identifier: str) -> str | None:
    """The location to create `identifier` at: the Go processor's (`go_table_location`), else the catalog's default
    (None, when the catalog chooses itself), unless that location already holds files, e.g. of a table renamed
    away to keep it as a backup: the new table then gets a location of its own next to it, so that nothing of
    the new table (clean-up, orphan-file removal, a purge) can ever touch the other table's files.

    A location of its own rather than an error: `create_table_if_missing` must keep working after an operator's
    rename without a manual step, and no configuration key has to be invented for it.
    """
    default = go_table_location(catalog, identifier)
    resolve = getattr(catalog, "_resolve_table_location", None)
    if default is None and resolve is not None:
        namespace, name = Catalog.namespace_from(identifier), Catalog.table_name_from(identifier)
        default = resolve(None, Catalog.namespace_to_string(namespace), name)
    if default is None:
        return None
    io = PyArrowFileIO(catalog.properties)
    scheme, netloc, path = io.parse_location(default, io.properties)
    try:
        # One non-recursive listing of the table root (`data/`, `metadata/`): never the files below.
        held = io.fs_by_scheme(scheme, netloc).get_file_info(FileSelector(path, allow_not_found=True))
    except OSError as exc:  # e.g. a REST catalog that vends the storage credentials: the catalog judges the location
        log.info("table %s: cannot list %s to see whether it holds files (%s); creating it there", identifier,
                 default, exc)
        return default
    if not held:
        return default
    own = f"{default}-{uuid.uuid4().hex[:12]}"
    log.warning("table %s: the default location %s already holds files of another table; creating it at %s",
                identifier, default, own)
    return own


def _creation_properties(identifier: str, properties: Mapping[str, str]) -> dict[str, str]:
    file_format = properties.get(TableProperties.WRITE_FILE_FORMAT, "parquet")
    if file_format.lower() != "parquet":
        raise TableDefinitionError(
            f"table {identifier}: {TableProperties.WRITE_FILE_FORMAT}={file_format!r} is not supported; "
            "the sink writes parquet"
        )
    return {**BOUNDED_METADATA_PROPERTIES, **properties, TableProperties.WRITE_FILE_FORMAT: "parquet"}


def _warehouse_uri(warehouse: str) -> str:
    """A local warehouse path as an absolute `file://` URI; other URIs unchanged."""
    if "://" in warehouse:
        return warehouse
    return Path(warehouse).expanduser().resolve().as_uri()


def _default_sqlite_uri(warehouse_uri: str) -> str:
    parts = urlsplit(warehouse_uri)
    if parts.scheme != "file":
        raise ValueError(
            f"uri: is required for a sql catalog whose warehouse {warehouse_uri} is not local"
        )
    directory = Path(parts.path)
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / 'catalog.db'}"
