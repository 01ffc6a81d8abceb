"""Cross-key rules of the config, and the values that depend on other keys, applied after the models validated.

Invariants: relative paths (local segments, offsets file, etcd TLS files, a `sql` catalog's sqlite URI and
warehouse) resolve against the config file's directory; `mappings[].allow_gaps` and `mappings[].schema.source` are
filled in as the Go processor fills them; every rule that spans keys reports a `key.path: problem` line naming the
key to change, and all problems are reported together. Most rules are the Go processor's; those that are ours (a
topic or table mapped once, columns only with `schema.source: mapping`, partition specs, ...) are stricter, never
looser.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kafscale_lakehouse.config.models import (
    PARTITION_TRANSFORM_PATTERN,
    PARTITION_TRANSFORM_SOURCE_TYPES,
    LakehouseConfig,
    MappingConfig,
)
from kafscale_lakehouse.config.spark_remote import parse_remote_url
from kafscale_lakehouse.format.lfs import LFS_METADATA_COLUMNS
from kafscale_lakehouse.schema.columns import BASE_COLUMNS, KAFKA_TIMESTAMP_COLUMN

# A part of a table identifier: what the Go processor lands (it splits `table` on `.` and takes any part) and every
# Dagster name can hold once escaped (`name_part`): letters, digits, `_` and `-` (`prod.orders-v2`, `raw.2024_orders`).
_IDENTIFIER_PART = re.compile(r"^[A-Za-z0-9_-]+$")
_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# In the `table` (and `dead_letter_table`) of a `topic_pattern` mapping: the matched topic, escaped (topic_patterns.py).
TOPIC_PLACEHOLDER = "{topic}"


def resolve_paths_and_defaults(config: LakehouseConfig, base_dir: Path) -> list[str]:
    """Resolve relative paths against `base_dir` (local segments, offsets file, etcd TLS files, a `sql` catalog's
    sqlite URI and warehouse) and fill in the defaults that depend on other keys (`mappings[].allow_gaps`,
    `mappings[].schema.source`), in place; returns the problems of values that cannot be resolved."""
    problems: list[str] = []
    catalog = config.iceberg.catalog
    if catalog.type == "sql":
        catalog.uri = _resolve_sqlite_uri(catalog.uri, base_dir)
        if config.iceberg.warehouse is not None:
            warehouse = _resolve_warehouse(config.iceberg.warehouse, base_dir)
            if warehouse is None:
                problems.append(
                    f"iceberg.warehouse: {config.iceberg.warehouse!r} is not an absolute file URI; write a "
                    "path or file:///absolute/path"
                )
            else:
                config.iceberg.warehouse = warehouse
    if config.segments.local_root is not None:
        config.segments.local_root = _resolve_path(config.segments.local_root, base_dir)
    if config.offsets.local_path is not None:
        config.offsets.local_path = _resolve_path(config.offsets.local_path, base_dir)
    tls = config.etcd.tls
    if tls is not None:
        for key in ("ca_file", "cert_file", "key_file"):
            if getattr(tls, key) is not None:
                setattr(tls, key, _resolve_path(getattr(tls, key), base_dir))
    for mapping in config.mappings:
        if mapping.allow_gaps is None:
            mapping.allow_gaps = config.processor.allow_gaps
        schema = mapping.schema_config
        if mapping.schema_registry is not None:
            for key in ("ca_file", "cert_file", "key_file"):
                if getattr(mapping.schema_registry, key) is not None:
                    setattr(mapping.schema_registry, key, _resolve_path(getattr(mapping.schema_registry, key),
                                                                        base_dir))
        if mapping.value_schema_file is not None:
            mapping.value_schema_file = _resolve_path(mapping.value_schema_file, base_dir)
        if schema.source is None and mapping.value_format != "json":
            schema.source = "none"  # the columns come from the value's own schema
        if schema.source is None:
            if schema.columns:
                schema.source = "mapping"
            elif config.schema_config.registry.base_url is not None:
                schema.source = "registry"
            else:
                schema.source = "none"
    return problems


def check_rules(config: LakehouseConfig) -> list[str]:
    """Rules that span keys (most are the Go processor's); run after `resolve_paths_and_defaults`."""
    problems: list[str] = []

    def problem(path: str, message: str) -> None:
        problems.append(f"{path}: {message}")

    if config.segments.local_root is None and not config.s3.bucket:
        problem("s3.bucket", "is required (or set segments.local_root to read segments from a local directory)")
    if config.segments.local_root is not None and config.s3.bucket:
        problem("segments.local_root", "and s3.bucket both say where segments are; set only one")
    for path, s3 in (("s3", config.s3), ("iceberg.s3", config.iceberg.s3)):
        if s3 is None:
            continue
        if s3.secret_access_key is not None and s3.access_key_id is None:
            problem(f"{path}.access_key_id", f"is required when {path}.secret_access_key is set")
        if s3.access_key_id is not None and s3.secret_access_key is None:
            problem(f"{path}.secret_access_key", f"is required when {path}.access_key_id is set")
        if s3.sse is not None and s3.sse.kms_key_id is not None and s3.sse.type != "aws:kms":
            problem(f"{path}.sse.kms_key_id", "is only used with sse.type aws:kms")

    catalog = config.iceberg.catalog
    if catalog.credential is not None and (catalog.username is not None or catalog.password is not None):
        problem(
            "iceberg.catalog.credential",
            "and iceberg.catalog.username/password are two ways to set the same credential; set only one",
        )
    if catalog.password is not None and catalog.username is None:
        problem("iceberg.catalog.username", "is required when iceberg.catalog.password is set")
    if catalog.type == "sql" and config.iceberg.warehouse is None:
        problem(
            "iceberg.warehouse", "is required for iceberg.catalog.type sql (a local directory or an object-store URI)"
        )

    if config.spark.remote is not None:
        try:
            parse_remote_url(config.spark.remote)
        except ValueError as exc:
            problems.append(str(exc))

    # JSON Schema validation judges JSON values; Avro mappings alone need no JSON Schema registry.
    json_values = not config.mappings or any(m.value_format == "json" for m in config.mappings)
    if config.schema_config.mode != "off" and config.schema_config.registry.base_url is None and json_values:
        problem("schema.registry.base_url", f"is required when schema.mode is {config.schema_config.mode}")
    if config.offsets.backend == "etcd" and not config.etcd.endpoints:
        problem("etcd.endpoints", "is required for offsets.backend etcd")
    if config.offsets.backend == "local" and config.offsets.local_path is None:
        problem("offsets.local_path", "is required for offsets.backend local")
    if config.offsets.backend != "local" and config.offsets.local_path is not None:
        problem("offsets.local_path", "is only used with offsets.backend local")
    if config.discovery.mode == "etcd" and not config.etcd.endpoints:
        problem("etcd.endpoints", "is required for discovery.mode etcd")
    if config.etcd.password is not None and config.etcd.username is None:
        problem("etcd.username", "is required when etcd.password is set")
    tls = config.etcd.tls
    if tls is not None and (tls.cert_file is None) != (tls.key_file is None):
        problem("etcd.tls", "cert_file and key_file go together (a client certificate and its key)")

    for index, mapping in enumerate(config.mappings):
        _check_mapping(config, index, mapping, problem)
    _check_unique(config, problem)
    return problems


def _check_mapping(config: LakehouseConfig, index: int, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    at = f"mappings[{index}]"
    base_types = {column.name: column.type for column in BASE_COLUMNS}
    if mapping.topic_pattern is not None:
        _check_topic_pattern(at, mapping, problem)
    elif not mapping.topic:
        problem(f"{at}.topic", "is required (a topic name, or topic_pattern: a regular expression of topic names)")
    elif not _KAFKA_TOPIC.match(mapping.topic) or mapping.topic in (".", ".."):
        problem(f"{at}.topic", f"{mapping.topic!r} is not a valid Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
    for key, identifier in (("table", mapping.table), ("dead_letter_table", mapping.dead_letter_table)):
        if identifier is not None and mapping.topic_pattern is not None:
            # A template: judged with a topic in the placeholder (each topic's own table is judged when resolved).
            identifier = identifier.replace(TOPIC_PLACEHOLDER, "t")
            if "{" in identifier or "}" in identifier:
                continue  # reported by _check_topic_pattern
        reason = table_identifier_problem(identifier) if identifier is not None else None
        if reason is not None:
            problem(f"{at}.{key}", reason)
    if mapping.dead_letter_table is not None and mapping.dead_letter_table == mapping.table:
        problem(f"{at}.dead_letter_table", "must differ from the mapping's table")

    if mapping.lfs.mode == "hybrid" and mapping.lfs.max_inline_size <= 0:
        problem(f"{at}.lfs.max_inline_size", "must be > 0 for lfs.mode hybrid")
    if mapping.lfs.store_metadata:
        for column_index, column in enumerate(mapping.schema_config.columns):
            if column.name in LFS_METADATA_COLUMNS:
                problem(
                    f"{at}.schema.columns[{column_index}].name",
                    f"{column.name!r} is a column lfs.store_metadata "
                    "adds; rename the mapped column or turn store_metadata off",
                )

    _check_value_format(at, mapping, problem)
    _check_key_format(at, mapping, problem)
    _check_publish(at, mapping, problem)
    schema = mapping.schema_config
    if schema.source == "mapping" and not schema.columns:
        problem(f"{at}.schema.columns", "is required for schema.source mapping")
    if schema.source != "mapping" and schema.columns:
        problem(
            f"{at}.schema.columns",
            f"is only used with schema.source mapping (this mapping has schema.source {schema.source})",
        )
    if schema.source == "registry" and config.schema_config.registry.base_url is None:
        problem("schema.registry.base_url", f"is required for {at}.schema.source registry")

    column_types = dict(base_types)
    if mapping.kafka_timestamp_column:
        column_types[KAFKA_TIMESTAMP_COLUMN] = "timestamp"
    for column_index, column in enumerate(schema.columns):
        column_at = f"{at}.schema.columns[{column_index}].name"
        if not column.name:
            problem(column_at, "must not be empty")
        elif column.name in base_types:
            problem(column_at, f"{column.name!r} is a base column KafScale always writes ({', '.join(base_types)})")
        elif column.name == KAFKA_TIMESTAMP_COLUMN and mapping.kafka_timestamp_column:
            problem(column_at, f"{column.name!r} is the column kafka_timestamp_column adds")
        elif column.name in column_types:
            problem(column_at, f"{column.name!r} is declared twice")
        column_types.setdefault(column.name, column.type)

    _check_id_columns(at, mapping, problem)

    partition_names: set[str] = set()
    for field_index, field in enumerate(mapping.partition_spec):
        field_at = f"{at}.partition_spec[{field_index}]"
        if not PARTITION_TRANSFORM_PATTERN.match(field.transform):
            problem(
                f"{field_at}.transform",
                f"{field.transform!r} is not one of identity, year, month, day, hour, bucket[N], truncate[W]",
            )
            continue
        source_type = column_types.get(field.source)
        if source_type is None:
            # Registry columns are only known when the table is created; base columns always are.
            if schema.source != "registry" and mapping.value_format == "json":
                problem(
                    f"{field_at}.source",
                    f"{field.source!r} is not a column of this mapping ({', '.join(column_types)})",
                )
        elif source_type not in PARTITION_TRANSFORM_SOURCE_TYPES[field.transform_name]:
            allowed = ", ".join(sorted(PARTITION_TRANSFORM_SOURCE_TYPES[field.transform_name]))
            problem(
                f"{field_at}.transform",
                f"{field.transform} cannot partition {field.source!r} of type {source_type} (it takes {allowed})",
            )
        name = field.field_name
        if name in partition_names:
            problem(f"{field_at}.name", f"partition field name {name!r} is used twice")
        elif name in column_types and not (field.transform_name == "identity" and name == field.source):
            problem(f"{field_at}.name", f"partition field name {name!r} is already a column name")
        partition_names.add(name)


def _check_publish(at: str, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    """An audited mapping's runs commit to `audit_branch`, which must be a branch of its own: not `main` (readers'
    branch), and not empty."""
    branch = mapping.audit_branch
    if branch == "main":
        problem(f"{at}.audit_branch", "must not be main: audited runs commit there before main is fast-forwarded")
    elif not branch.strip():
        problem(f"{at}.audit_branch", "must not be empty")
    if mapping.publish == "audited" and mapping.mode == "upsert":
        problem(f"{at}.publish", "audited is not supported with mode upsert yet (its copy-on-write commit goes to "
                "main); use publish direct")


def _check_topic_pattern(at: str, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    """A `topic_pattern` mapping: no `topic` beside it, a regular expression, and a table (and dead-letter table)
    template holding `{topic}`, so that every matched topic has a table of its own."""
    if mapping.topic:
        problem(f"{at}.topic_pattern", f"and topic both say which topics this mapping lands; set only one (topic "
                                       f"{mapping.topic!r}, topic_pattern {mapping.topic_pattern!r})")
    try:
        re.compile(mapping.topic_pattern or "")
    except re.error as exc:
        problem(f"{at}.topic_pattern", f"{mapping.topic_pattern!r} is not a regular expression ({exc})")
    if not mapping.topic_pattern:
        problem(f"{at}.topic_pattern", "must not be empty")
    for key, template in (("table", mapping.table), ("dead_letter_table", mapping.dead_letter_table)):
        if template is not None and TOPIC_PLACEHOLDER not in template:
            problem(f"{at}.{key}", f"{template!r} must hold {TOPIC_PLACEHOLDER} (each topic of topic_pattern "
                                   f"lands in a table of its own, e.g. raw.{TOPIC_PLACEHOLDER})")
        elif template is not None and ("{" in template.replace(TOPIC_PLACEHOLDER, "")
                                       or "}" in template.replace(TOPIC_PLACEHOLDER, "")):
            problem(f"{at}.{key}", f"{template!r}: {TOPIC_PLACEHOLDER} is the only placeholder")


def _check_id_columns(at: str, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    """`id_columns` key an upsert table: mapped columns that every record has (`required`, so a record without its
    id is an invalid record, not a row nobody can replace), or the record key `key`."""
    if mapping.mode == "append":
        if mapping.id_columns:
            problem(f"{at}.id_columns", "is only used with mode upsert (this mapping has mode append)")
        if mapping.cdc is not None:
            problem(f"{at}.cdc", "is only used with mode upsert (change events keep the latest state per key)")
        if mapping.order_column is not None:
            problem(f"{at}.order_column", "is only used with mode upsert (it orders the changes of a key)")
        return
    _check_order_column(at, mapping, problem)
    if not mapping.id_columns:
        problem(f"{at}.id_columns", "is required for mode upsert (the columns that identify a row, or [key])")
    if mapping.cdc is not None and mapping.cdc.format == "op_field":
        if not mapping.cdc.op_field:
            problem(f"{at}.cdc.op_field", "must name the value's field holding the operation")
        if not mapping.cdc.delete_ops:
            problem(f"{at}.cdc.delete_ops", "must list at least one operation that deletes the key")
    mapped = {column.name: column for column in mapping.schema_config.columns}
    for index, name in enumerate(mapping.id_columns):
        column_at = f"{at}.id_columns[{index}]"
        if name in mapping.id_columns[:index]:
            problem(column_at, f"{name!r} is listed twice")
        elif name == "key":
            if len(mapping.id_columns) > 1:
                problem(column_at, "the record key identifies a row on its own: use [key] alone")
        elif name in mapped:
            if not mapped[name].required:
                problem(column_at, f"{name!r} must be a required column (schema.columns: required: true): a record "
                        "without its id could never be replaced or deleted")
        elif mapping.schema_config.source != "registry":  # registry columns are only known at run time
            problem(column_at, f"{name!r} is neither a mapped column ({', '.join(mapped) or 'none'}) nor key")


ORDER_COLUMN_TYPES = ("int", "long", "float", "double", "string", "timestamp", "date")


def _check_order_column(at: str, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    """`order_column` is a mapped column of an ordered type, not an id column."""
    name = mapping.order_column
    if name is None:
        return
    mapped = {column.name: column for column in mapping.schema_config.columns}
    if name in mapping.id_columns:
        problem(f"{at}.order_column", f"{name!r} is an id column; it must be a column that orders a key's changes")
    elif name in mapped:
        if mapped[name].type not in ORDER_COLUMN_TYPES:
            problem(f"{at}.order_column", f"{name!r} is of type {mapped[name].type}, which does not order changes "
                    f"(use one of {', '.join(ORDER_COLUMN_TYPES)})")
    elif mapping.schema_config.source != "registry":  # registry columns are only known at run time
        problem(f"{at}.order_column", f"{name!r} is not a mapped column ({', '.join(mapped) or 'none'})")


def _check_key_format(at: str, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    """`key_format` json declares `key_columns`; a registry key format needs `schema_registry`."""
    if mapping.key_format == "json" and not mapping.key_columns:
        problem(f"{at}.key_columns", "must declare the key's fields for key_format json")
    if mapping.key_format != "json" and mapping.key_columns:
        problem(f"{at}.key_columns", f"is only used with key_format json (this mapping has {mapping.key_format})")
    if mapping.key_format in ("raw", "json"):
        return
    registry = mapping.schema_registry
    if registry is None:
        if mapping.value_format == "json":  # else _check_value_format says it
            problem(f"{at}.schema_registry", f"is required for key_format {mapping.key_format}")
    elif registry.subject_name_strategy != "topic" and not registry.key_record_name:
        problem(f"{at}.schema_registry.key_record_name",
                f"is required for key_format {mapping.key_format} with subject_name_strategy "
                f"{registry.subject_name_strategy}")


def _check_value_format(at: str, mapping: MappingConfig, problem) -> None:  # noqa: ANN001
    """`value_format` and `schema_registry` agree; values of a registry format bring their own columns."""
    registry = mapping.schema_registry
    registry_keys = mapping.key_format in ("avro", "protobuf", "json_schema")
    if mapping.value_format == "json" and registry is not None and not registry_keys:
        problem(f"{at}.schema_registry", "is only used with value_format (or key_format) avro, protobuf or "
                                         "json_schema (this mapping has json)")
        return
    if mapping.value_schema_file is not None:
        if mapping.value_format != "json_schema":
            problem(f"{at}.value_schema_file", f"is only used with value_format json_schema (this mapping has "
                                               f"{mapping.value_format})")
        elif registry is not None and not registry_keys:
            problem(f"{at}.value_schema_file", "and schema_registry both give the value's schemas; set only one")
        elif not mapping.value_schema_file.is_file():
            problem(f"{at}.value_schema_file", f"{str(mapping.value_schema_file)!r} is not a file")
    if registry is None:
        if mapping.value_format != "json" and mapping.value_schema_file is None:
            problem(f"{at}.schema_registry", f"is required for value_format {mapping.value_format}"
                                             + (" (or value_schema_file)" if mapping.value_format == "json_schema"
                                                else ""))
    else:
        if not re.match(r"^https?://[^/?#]+", registry.url):
            problem(f"{at}.schema_registry.url", f"{registry.url!r} is not an http(s) URL")
        values_registered = mapping.value_format != "json" and mapping.value_schema_file is None
        if registry.subject_name_strategy != "topic" and not registry.record_name and values_registered:
            problem(f"{at}.schema_registry.record_name",
                    f"is required for subject_name_strategy {registry.subject_name_strategy}")
        if registry.bearer_token is not None and registry.username is not None:
            problem(f"{at}.schema_registry.bearer_token", "set either bearer_token or username/password, not both")
        if registry.key_file is not None and registry.cert_file is None:
            problem(f"{at}.schema_registry.key_file", "needs cert_file")
    if mapping.value_format == "json":
        return
    if mapping.schema_config.source != "none":
        problem(f"{at}.schema.source", f"must be none (or unset) for value_format {mapping.value_format}: the "
                                       "columns come from the value's registered schema")
    if mapping.lfs.mode != "off":
        problem(f"{at}.lfs.mode", f"must be off for value_format {mapping.value_format}")


def _check_unique(config: LakehouseConfig, problem) -> None:  # noqa: ANN001
    # Offsets and leases are per topic/partition and the Dagster asset key is the table: both must be unique.
    first_by_topic: dict[str, int] = {}
    first_by_table: dict[str, int] = {}
    for index, mapping in enumerate(config.mappings):
        # A pattern's topics are checked when it is resolved (topic_patterns.py); its table template here.
        if mapping.topic_pattern is None and mapping.topic in first_by_topic:
            problem(
                f"mappings[{index}].topic",
                f"topic {mapping.topic!r} is already mapped by mappings[{first_by_topic[mapping.topic]}]",
            )
        if mapping.topic_pattern is None:
            first_by_topic.setdefault(mapping.topic, index)
        if mapping.topic_pattern is not None:
            continue  # a template: two patterns may share one, their topics are distinct (checked when resolved)
        if mapping.table in first_by_table:
            problem(
                f"mappings[{index}].table",
                f"table {mapping.table!r} is already the target of mappings[{first_by_table[mapping.table]}]",
            )
        first_by_table.setdefault(mapping.table, index)
    for index, mapping in enumerate(config.mappings):
        if mapping.dead_letter_table is not None and mapping.dead_letter_table in first_by_table:
            problem(
                f"mappings[{index}].dead_letter_table",
                f"{mapping.dead_letter_table!r} is the table of mappings[{first_by_table[mapping.dead_letter_table]}]",
            )


def table_identifier_problem(identifier: str) -> str | None:
    """Why `identifier` cannot be a mapped table, or None: `namespace.table` (or deeper), each part letters, digits,
    `_` or `-`.

    A name without a namespace (`orders`) is refused although the Go processor takes it: iceberg-go makes it the
    one-part identifier `["orders"]` (`catalog.ToIdentifier`), creates no namespace for it (sink/iceberg.go:295) and
    addresses it in the REST catalog's empty namespace (`/v1/namespaces//tables/orders`, iceberg-go rest.go:733),
    which pyiceberg refuses to address and most catalogs do not have."""
    parts = identifier.split(".")
    if len(parts) < 2:
        return (f"{identifier!r} has no namespace: write <namespace>.{identifier} (the Go processor puts it in "
                "the catalog's empty namespace, which pyiceberg cannot address; docs/configuration-compat.md)")
    bad = [part for part in parts if not _IDENTIFIER_PART.match(part)]
    if bad:
        return (f"{identifier!r} is not a table identifier namespace.table: part {bad[0]!r} is not made of letters, "
                "digits, _ and - (names the Dagster assets and jobs are built from)")
    return None


def _resolve_path(path: Path, base_dir: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else Path(os.path.normpath(base_dir / path))


def _resolve_sqlite_uri(uri: str, base_dir: Path) -> str:
    # SQLAlchemy: sqlite:///relative.db is relative to the cwd; we make it relative to the config file.
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return uri
    location, question, query = uri[len(prefix) :].partition("?")
    if not location or location == ":memory:" or location.startswith("/"):
        return uri
    return f"{prefix}{_resolve_path(Path(location), base_dir)}{question}{query}"


def _resolve_warehouse(warehouse: str, base_dir: Path) -> str | None:
    """A local warehouse as an absolute file:// URI; object-store URIs unchanged; None for a relative file:// URI."""
    if warehouse.startswith("file://"):
        return warehouse if warehouse.startswith("file:///") else None
    if "://" in warehouse:
        return warehouse
    return _resolve_path(Path(warehouse), base_dir).as_uri()
