"""Typed configuration: one YAML file, a superset of KafScale's Go iceberg-processor config.

A config written for the Go processor loads unchanged and means the same: same keys, same defaults
(`discovery.mode: auto`, `schema.mode: off`, `offsets.backend: etcd`, `lease_ttl_seconds: 30`,
`key_prefix: processors`, `poll_interval_seconds: 5`, mapping `mode: append`, `schema.source` inferred),
and, as in Go, an empty string, a null or (for the Go integer settings) a 0 means "not set".
Differences from Go, all deliberate:
- validation is strict: an unknown key, a wrong type, a missing key, a bad enum value or identifier is an
  error naming the key path (Go silently ignores unknown keys); all problems are reported at once;
- YAML scalars are read as Go's yaml.v3 reads them into the Go processor's typed fields: a key Go types as a string
  takes the scalar's text as written (`topic: 2024` is "2024", `table: 0x1F.t` stays as written); a key Go types as
  a boolean also takes the YAML 1.1 words yaml.v3 accepts there (`y Y yes Yes YES on On ON` true, `n N no No NO off
  Off OFF` false, quoted or not) besides `true`/`false`; a key Go types as an integer also takes an integral number
  like `30.0` (Go would truncate `30.5`; we refuse it). Anywhere else `off`/`yes` stay strings, so `mode: off` is
  the string "off", and only `true`/`false` are booleans;
- the keys KafScale's Helm chart adds at the top of the config it renders (`existingConfigMap`, `path`) are
  accepted and ignored with a log line (they tell the chart where the config lives, nothing the processor uses);
- `s3.namespace` defaults to `default`, the broker's default namespace (Go lists from the bucket root);
  write `namespace: ""` for a broker without namespace;
- a topic may feed only one table and a table may be fed by only one mapping (Go keeps the last mapping
  of a topic without a word); offsets and leases are kept per topic and partition;
- `mappings[].schema.columns` is an error unless `schema.source` is `mapping` (Go ignores them).
Our additions (extensions) are listed on the models below. `${VAR}` in any string value is replaced by
the environment variable VAR (`$${` writes a literal `${`); a missing variable is an error.
Relative paths resolve against the directory of the config file. Secrets are `SecretStr`: `repr`,
`str` and `model_dump` show `**********`; read them with `.get_secret_value()`.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_serializer,
    model_validator,
)

from kafscale_lakehouse.format.lfs import LFS_METADATA_COLUMNS

log = logging.getLogger(__name__)

CONFIG_PATH_ENV_VAR = "KAFSCALE_LAKEHOUSE_CONFIG"
DEFAULT_CONFIG_PATH = "lakehouse.yaml"

# Column types of `mappings[].schema.columns[].type` (the Go processor's set; matched case-insensitively as in Go).
COLUMN_TYPES = ("boolean", "int", "long", "float", "double", "string", "binary", "timestamp", "date")
ColumnType = Literal["boolean", "int", "long", "float", "double", "string", "binary", "timestamp", "date"]

PARTITION_TRANSFORM_PATTERN = re.compile(r"^(identity|year|month|day|hour)$|^(bucket|truncate)\[([1-9][0-9]*)\]$")
# Which column types each partition transform accepts (Iceberg spec, "Partition Transforms").
PARTITION_TRANSFORM_SOURCE_TYPES: dict[str, frozenset[str]] = {
    "identity": frozenset(COLUMN_TYPES),
    "bucket": frozenset({"int", "long", "string", "binary", "date", "timestamp"}),
    "truncate": frozenset({"int", "long", "string", "binary"}),
    "year": frozenset({"date", "timestamp"}),
    "month": frozenset({"date", "timestamp"}),
    "day": frozenset({"date", "timestamp"}),
    "hour": frozenset({"timestamp"}),
}

_IDENTIFIER_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ENV_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """The config file cannot be used; `problems` holds one `key.path: what is wrong` line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(f"{source}: {problem}" for problem in self.problems))


def redact_url(url: str | None) -> str | None:
    """`url` with its user info (`user:password@`, `token@`), if any, replaced by `***@`: for messages and logs."""
    if url is None:
        return None
    scheme, separator, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not separator or "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rpartition('@')[2]}{slash}{path}"


def _lowercase(value: Any) -> Any:
    # The Go processor lower-cases these enums before comparing them.
    return value.lower() if isinstance(value, str) else value


def _scalars_as_strings(value: Any) -> Any:
    # Spark settings and Iceberg table properties are strings; YAML makes `4` an int and `true` a bool.
    if not isinstance(value, dict):
        return value
    converted = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"
        elif isinstance(item, (int, float)):
            item = str(item)
        converted[key] = item
    return converted


StringMap = Annotated[dict[str, str], BeforeValidator(_scalars_as_strings)]
LocalPath = Annotated[Path, Field(strict=False)]


# ------------------------------------------------------------------------------ Go yaml.v3 scalar decoding

# What yaml.v3 accepts for a Go `bool` field besides true/false (decode.go: "compatibility with the 1.1 spec").
YAML11_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "on", "On", "ON"})
YAML11_FALSE = frozenset({"n", "N", "no", "No", "NO", "off", "Off", "OFF"})


class YamlScalar:
    """A plain (unquoted) YAML number or boolean from the config file: its value and its text as written, so that a
    key Go types as a string gets the text (`topic: 0x10` is "0x10", not "16") and any other key the value."""

    __slots__ = ("text", "value")

    def __init__(self, value: Any, text: str) -> None:
        self.value = value
        self.text = text

    def __repr__(self) -> str:
        return repr(self.value)


def _plain(value: Any) -> Any:
    """`value` with every `YamlScalar` replaced by its value (where no field type says otherwise)."""
    if isinstance(value, YamlScalar):
        return value.value
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _annotation_types(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of a field type: `str | None` -> (str, NoneType); `Annotated[X, ...]` -> X's."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _annotation_types(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return tuple(t for argument in get_args(annotation) for t in _annotation_types(argument))
    return (annotation,)


def _takes_text(types: tuple[Any, ...]) -> bool:
    return any(t is str or t is SecretStr or (get_origin(t) is Literal and all(isinstance(a, str) for a in get_args(t)))
               for t in types)


def _as_go_decodes(value: Any, annotation: Any) -> Any:
    """`value` as yaml.v3 would decode it into a Go field of this key's type (see the module docstring)."""
    types = _annotation_types(annotation)
    if isinstance(value, YamlScalar):
        if _takes_text(types):
            return value.text
        value = value.value
    if isinstance(value, str) and bool in types and not _takes_text(types):
        if value in YAML11_TRUE:
            return True
        if value in YAML11_FALSE:
            return False
    if isinstance(value, float) and int in types and float not in types and value.is_integer():
        return int(value)
    for t in types:
        if isinstance(value, dict) and isinstance(t, type) and issubclass(t, BaseModel):
            return value  # the nested model's own validator decodes its keys
        if isinstance(value, list) and get_origin(t) is list:
            [item_type] = get_args(t) or (Any,)
            return [_as_go_decodes(item, item_type) for item in value]
    return _plain(value)


class _ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # Keys for which the Go processor's zero value `0` means "use the default".
    _ZERO_MEANS_DEFAULT: ClassVar[frozenset[str]] = frozenset()
    # Keys where an empty string is a real value rather than "not set".
    _EMPTY_IS_A_VALUE: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _unset_go_zero_values(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return _plain(data)
        fields = {info.alias or name: info for name, info in cls.model_fields.items()}
        kept = {}
        for key, value in data.items():
            info = fields.get(key)
            value = _as_go_decodes(value, info.annotation) if info is not None else _plain(value)
            if info is not None and not info.is_required():
                if value is None or (value == "" and key not in cls._EMPTY_IS_A_VALUE):
                    continue
                if type(value) is int and value == 0 and key in cls._ZERO_MEANS_DEFAULT:
                    continue
            kept[key] = value
        return kept


# Server-side encryption we can request for written objects (S3's x-amz-server-side-encryption values).
SSE_TYPES = ("AES256", "aws:kms")


class SseConfig(_ConfigModel):
    """Extension `s3.sse`: server-side encryption of the objects we write, passed through to S3."""

    type: Literal["AES256", "aws:kms"]
    kms_key_id: str | None = None


class S3ConnectionConfig(_ConfigModel):
    """How to reach an S3 endpoint. Without `access_key_id` the standard AWS chain (env vars, profile, role) is used."""

    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    access_key_id: str | None = None  # extension
    secret_access_key: SecretStr | None = None  # extension
    sse: SseConfig | None = None  # extension


class S3Config(S3ConnectionConfig):
    """Where KafScale keeps segments: `s3://<bucket>/<namespace>/<topic>/<partition>/segment-<base>.kfs`."""

    _EMPTY_IS_A_VALUE = frozenset({"namespace"})

    bucket: str | None = None  # required unless segments.local_root is set
    namespace: str = "default"


class SegmentsConfig(_ConfigModel):
    """Extension: read segments from a local directory (same layout as the bucket) instead of S3."""

    local_root: LocalPath | None = None


class CatalogConfig(_ConfigModel):
    """`iceberg.catalog`. `type: sql` (extension) is pyiceberg's SqlCatalog, e.g. `uri: sqlite:///var/catalog.db`."""

    type: Literal["rest", "sql"]
    uri: str
    name: str = "default"  # extension: the pyiceberg catalog name (SqlCatalog stores it with every table)
    token: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    credential: SecretStr | None = None  # extension: OAuth2 client credential `id:secret`
    # extension: passed to pyiceberg's catalog as they are (SigV4 `rest.sigv4-enabled`, OAuth `scope`, `header.*`)
    properties: StringMap = Field(default_factory=dict)


class IcebergConfig(_ConfigModel):
    catalog: CatalogConfig
    warehouse: str | None = None  # for `sql`, a local path (made a file:// URI) or an object-store URI
    s3: S3ConnectionConfig | None = None  # extension: the warehouse FileIO when it is not the segment store's S3


class OffsetsConfig(_ConfigModel):
    _ZERO_MEANS_DEFAULT = frozenset({"lease_ttl_seconds"})

    backend: Literal["etcd", "local"] = "etcd"  # `local` (extension): a sqlite file at `local_path`
    lease_ttl_seconds: PositiveInt = 30
    key_prefix: str = "processors"
    local_path: LocalPath | None = None  # extension


class DiscoveryConfig(_ConfigModel):
    mode: Annotated[Literal["auto", "etcd", "s3"], BeforeValidator(_lowercase)] = "auto"


class EtcdTlsConfig(_ConfigModel):
    """Extension `etcd.tls`: a CA to verify the server and an optional client certificate."""

    ca_file: LocalPath | None = None
    cert_file: LocalPath | None = None
    key_file: LocalPath | None = None


class EtcdConfig(_ConfigModel):
    endpoints: list[str] = Field(default_factory=list)
    username: str | None = None
    password: SecretStr | None = None
    tls: EtcdTlsConfig | None = None  # extension


class RegistryConfig(_ConfigModel):
    """`schema.registry`. Credentials in `base_url` (`https://user:secret@host/schemas`) show as `***@` in `repr`,
    `str` and `model_dump`; the registry client reads the attribute itself."""

    _ZERO_MEANS_DEFAULT = frozenset({"timeout_seconds", "cache_seconds"})

    base_url: str | None = None
    timeout_seconds: PositiveInt = 5
    cache_seconds: PositiveInt = 300

    def __repr_args__(self):  # noqa: ANN204 - pydantic's signature
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "base_url" else value

    @field_serializer("base_url")
    def _base_url_for_display(self, base_url: str | None) -> str | None:
        return redact_url(base_url)


class SchemaValidationConfig(_ConfigModel):
    """Top-level `schema`: JSON Schema validation of record values against `<base_url>/<topic>.json`."""

    mode: Annotated[Literal["off", "lenient", "strict"], BeforeValidator(_lowercase)] = "off"
    registry: RegistryConfig = Field(default_factory=RegistryConfig)


class ProcessorConfig(_ConfigModel):
    _ZERO_MEANS_DEFAULT = frozenset({"poll_interval_seconds"})

    poll_interval_seconds: PositiveInt = 5
    max_bytes_per_run: PositiveInt = 1 << 30  # extension: segment bytes one run may read
    target_file_size_bytes: PositiveInt = 128 << 20  # extension: Parquet data file size before rolling over
    allow_gaps: bool = False  # extension: skip over (and record) offsets deleted before ingestion


class SparkConfig(_ConfigModel):
    """Extension `spark`: the Spark master and extra session settings, and `remote`, the long-lived Spark engine
    (Spark Connect, `sc://host:port`) runs connect to instead of starting Spark themselves; `$SPARK_REMOTE` wins over
    it. `master` is where the engine (`kafscale-lakehouse spark-engine`), or without `remote` the run, runs Spark."""

    master: str = "local[*]"
    conf: StringMap = Field(default_factory=dict)
    remote: str | None = None


class ColumnConfig(_ConfigModel):
    """A mapped column: the top-level JSON key `name` of the record value, coerced to `type`."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: Annotated[ColumnType, BeforeValidator(_lowercase)]
    required: bool = False


# The columns KafScale's Go processor writes first in every table (kafscale-format.md §8); the schema layer
# gives them Iceberg field ids 1-8 in this order. `headers` is compact JSON text, `""` when there are none.
BASE_COLUMNS: tuple[ColumnConfig, ...] = (
    ColumnConfig(name="record_id", type="string", required=True),  # <topic>:<partition>:<offset>
    ColumnConfig(name="topic", type="string", required=True),
    ColumnConfig(name="partition", type="int", required=True),
    ColumnConfig(name="offset", type="long", required=True),
    ColumnConfig(name="timestamp_ms", type="long", required=True),
    ColumnConfig(name="key", type="binary", required=False),
    ColumnConfig(name="value", type="binary", required=False),
    ColumnConfig(name="headers", type="string", required=False),
)


class MappingSchemaConfig(_ConfigModel):
    # Resolved after loading (as in Go): `mapping` when columns are given, else `registry` when
    # `schema.registry.base_url` is set, else `none`.
    source: Literal["mapping", "registry", "none"] | None = None
    columns: list[ColumnConfig] = Field(default_factory=list)
    allow_type_widening: bool = False


class PartitionFieldConfig(_ConfigModel):
    """Extension: one Iceberg partition field, e.g. `{source: date_ordered, transform: day}`."""

    source: str
    transform: str  # identity | year | month | day | hour | bucket[N] | truncate[W]
    name: str | None = None  # default: see field_name

    @property
    def transform_name(self) -> str:
        """`bucket` for `bucket[16]`."""
        return self._parsed_transform()[0]

    @property
    def transform_argument(self) -> int | None:
        """16 for `bucket[16]`, None for transforms without argument."""
        return self._parsed_transform()[1]

    @property
    def field_name(self) -> str:
        """The partition field's name: `name`, else the source column for identity, else `<source>_<transform>`
        with the argument after an underscore (`order_id_bucket_16`, `created_at_day`)."""
        if self.name is not None:
            return self.name
        if self.transform_name == "identity":
            return self.source
        argument = f"_{self.transform_argument}" if self.transform_argument is not None else ""
        return f"{self.source}_{self.transform_name}{argument}"

    def _parsed_transform(self) -> tuple[str, int | None]:
        match = PARTITION_TRANSFORM_PATTERN.match(self.transform)
        if match is None:  # parse_config rejects these; reaching here means the model was built by hand
            raise ValueError(f"partition transform {self.transform!r} is not one of identity, year, month, day, hour, "
                             "bucket[N], truncate[W]")
        if match.group(1):
            return match.group(1), None
        return match.group(2), int(match.group(3))


class MaintenanceConfig(_ConfigModel):
    """`mappings[].maintenance` (extension): the table's maintenance (engine/maintenance.py), run on a schedule by
    Dagster and by `kafscale-lakehouse maintain`."""

    enabled: bool = True
    cron_schedule: str = "17 * * * *"  # hourly, off the hour: a streaming table gains ~120 snapshots an hour
    snapshot_max_age_hours: PositiveInt = 120  # Iceberg's history.expire.max-snapshot-age-ms default (5 days)
    retain_last: PositiveInt = 1  # Iceberg's history.expire.min-snapshots-to-keep default
    # Snapshots kept at most (engine/maintenance.py DEFAULT_MAX_SNAPSHOTS: why); null: by age only.
    max_snapshots: PositiveInt | None = 1000
    # Files younger than this are never orphans: a writer may still be about to commit them (Iceberg: 3 days).
    orphan_min_age_hours: int = Field(default=72, ge=24)
    target_file_size_bytes: PositiveInt | None = None  # default: processor.target_file_size_bytes
    min_input_files: int = Field(default=5, ge=2)  # small files a partition needs before it is compacted
    # Data manifests of the current snapshot before they are merged (every fast append adds one); Iceberg's
    # commit.manifest.min-count-to-merge and commit.manifest.target-size-bytes defaults.
    manifest_min_count: int = Field(default=100, ge=2)
    manifest_target_size_bytes: PositiveInt = 8 * 1024 * 1024
# Environment variables that override `mappings[].lfs` of every mapping, as in the Go processor.
LFS_ENV_OVERRIDES = {
    "KAFSCALE_ICEBERG_LFS_MODE": "mode",
    "KAFSCALE_ICEBERG_LFS_MAX_INLINE_SIZE": "max_inline_size",
    "KAFSCALE_ICEBERG_LFS_STORE_METADATA": "store_metadata",
    "KAFSCALE_ICEBERG_LFS_VALIDATE_CHECKSUM": "validate_checksum",
    "KAFSCALE_ICEBERG_LFS_RESOLVE_CONCURRENCY": "resolve_concurrency",
}


def _lfs_mode_off(value: Any) -> Any:
    # Go's config.yaml writes `mode: off`; a YAML 1.1 reader (Helm rendering the chart's values) makes that the
    # boolean false, which reaches this string key as False or, from our loader (`YamlScalar`), as its text "false".
    if value is False or (isinstance(value, str) and value.lower() == "false"):
        return "off"
    return value


class LfsConfig(_ConfigModel):
    """`mappings[].lfs`: what to do with a record whose value is a KafScale LFS envelope (kafscale-format.md §9).

    Go's defaults and rules: `mode` off; `resolve_concurrency` 0 means 4, negative is an error; `validate_checksum`
    true unless set; `max_inline_size` (bytes) must be > 0 for hybrid, and in resolve mode a blob larger than it is
    an error when it is > 0.
    """

    model_config = ConfigDict(frozen=True)
    _ZERO_MEANS_DEFAULT = frozenset({"resolve_concurrency"})

    mode: Annotated[Literal["off", "resolve", "reference", "skip", "hybrid"], BeforeValidator(_lowercase),
                    BeforeValidator(_lfs_mode_off)] = "off"
    max_inline_size: Annotated[int, Field(ge=0)] = 0
    store_metadata: bool = False
    validate_checksum: bool = True
    resolve_concurrency: Annotated[int, Field(ge=0)] = 4


class MappingConfig(_ConfigModel):
    """`mappings[]`: one KafScale topic landed into one Iceberg table (`namespace.table`)."""

    topic: str
    table: str
    mode: Literal["append"] = "append"
    create_table_if_missing: bool = False
    schema_config: MappingSchemaConfig = Field(default_factory=MappingSchemaConfig, alias="schema")
    partition_spec: list[PartitionFieldConfig] = Field(default_factory=list)  # extension
    table_properties: StringMap = Field(default_factory=dict)  # extension
    dead_letter_table: str | None = None  # extension: where lenient validation puts invalid records
    allow_gaps: bool | None = None  # extension; resolved to processor.allow_gaps when not set
    freshness_max_lag_records: PositiveInt = 10_000  # extension: the freshness check warns above this lag
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)  # extension
    # extension: the table's Dagster FreshnessPolicy fails when no commit landed for this long (ingestion stalled)
    freshness_fail_window_seconds: PositiveInt = 3600
    freshness_warn_window_seconds: PositiveInt | None = None
    owners: list[str] = Field(default_factory=list)  # extension: Dagster asset owners (emails or team:name)
    tags: StringMap = Field(default_factory=dict)  # extension: Dagster asset tags
    lfs: LfsConfig = Field(default_factory=LfsConfig)

    @property
    def columns(self) -> list[ColumnConfig]:
        """The mapped columns (empty for `schema.source` registry/none until resolved elsewhere)."""
        return self.schema_config.columns

    @property
    def table_identifier(self) -> tuple[str, ...]:
        """`("prod", "orders")` for `prod.orders`."""
        return tuple(self.table.split("."))


class LakehouseConfig(_ConfigModel):
    """The whole config file. Build it with `load_config` or `parse_config`, which also apply the cross-key rules."""

    s3: S3Config = Field(default_factory=S3Config)
    segments: SegmentsConfig = Field(default_factory=SegmentsConfig)  # extension
    iceberg: IcebergConfig
    offsets: OffsetsConfig = Field(default_factory=OffsetsConfig)
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    etcd: EtcdConfig = Field(default_factory=EtcdConfig)
    schema_config: SchemaValidationConfig = Field(default_factory=SchemaValidationConfig, alias="schema")
    processor: ProcessorConfig = Field(default_factory=ProcessorConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)  # extension
    mappings: list[MappingConfig] = Field(default_factory=list)

    @property
    def warehouse_s3(self) -> S3ConnectionConfig:
        """S3 settings for the Iceberg warehouse FileIO: `iceberg.s3` when given (as a whole), else those of `s3`."""
        if self.iceberg.s3 is not None:
            return self.iceberg.s3
        fields = {name: getattr(self.s3, name) for name in S3ConnectionConfig.model_fields}
        return S3ConnectionConfig.model_construct(**fields)


# --------------------------------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike[str] | None = None) -> LakehouseConfig:
    """Load and validate the config file: `path`, else `$KAFSCALE_LAKEHOUSE_CONFIG`, else `lakehouse.yaml`."""
    if path is None:
        path = os.environ.get(CONFIG_PATH_ENV_VAR) or DEFAULT_CONFIG_PATH
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        hint = f" (set {CONFIG_PATH_ENV_VAR} or pass a path)" if isinstance(exc, FileNotFoundError) else ""
        raise ConfigError(source, [f"cannot read the config file: {exc.strerror or exc}{hint}"]) from exc
    try:
        document = yaml.load(text, Loader=_ConfigYamlLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        # Not chained: the parser's exception quotes the offending line, which may hold a secret.
        raise ConfigError(source, [f"not valid YAML: {_describe_yaml_error(exc)}"]) from None
    if document is None:
        document = {}
    config = parse_config(document, source=source, base_dir=Path(source).resolve().parent)
    log.info("loaded config %s: %d mapping(s)", source, len(config.mappings))
    return config


def parse_config(
    mapping: Mapping[str, Any],
    source: str = "<config>",
    base_dir: str | os.PathLike[str] | None = None,
) -> LakehouseConfig:
    """Validate an already-parsed config document. Relative paths resolve against `base_dir` (default: cwd)."""
    if not isinstance(mapping, Mapping):
        kind = _json_kind(_plain(mapping))
        raise ConfigError(source, [f"the config must be a mapping of keys to values, not {kind}"])
    problems: list[str] = []
    expanded = _expand_env(_without_helm_chart_keys(mapping, source), (), problems)
    _apply_lfs_env_overrides(expanded, os.environ, problems)
    try:
        config = LakehouseConfig.model_validate(expanded)
    except ValidationError as exc:
        problems.extend(_describe_validation_error(error) for error in exc.errors())
        raise ConfigError(source, problems) from None
    problems.extend(_resolve_paths_and_defaults(config, Path(base_dir) if base_dir is not None else Path.cwd()))
    problems.extend(_check_rules(config))
    if problems:
        raise ConfigError(source, problems)
    return config


# Top-level keys KafScale's Helm chart for the Go processor renders into the config (its `config:` values go through
# `toYaml` whole): where the chart mounts the file and which ConfigMap to use instead. Nothing for the processor.
HELM_CHART_KEYS = {
    "existingConfigMap": "the Helm chart's choice of an existing ConfigMap",
    "path": "the Helm chart's mount path of this file",
}


def _without_helm_chart_keys(mapping: Mapping[str, Any], source: str) -> dict[str, Any]:
    document = dict(mapping)
    for key, meaning in HELM_CHART_KEYS.items():
        if key in document:
            value = _plain(document.pop(key))
            log.info(
                "%s: ignoring top-level key %r = %r (%s; it carries nothing for kafscale-lakehouse)",
                source,
                key,
                value,
                meaning,
            )
    return document


def _apply_lfs_env_overrides(document: dict, environ: Mapping[str, str], problems: list[str]) -> None:
    """Set `lfs.<key>` of every mapping from the `KAFSCALE_ICEBERG_LFS_*` variables that are set and not blank (Go
    applies them before its defaults and validation). Go ignores a value it cannot parse; we report it."""
    overrides: dict[str, Any] = {}
    for variable, key in LFS_ENV_OVERRIDES.items():
        text = environ.get(variable, "").strip()
        if not text:
            continue
        if key in ("store_metadata", "validate_checksum"):
            value: Any = _GO_PARSE_BOOL.get(text)
            expected = "a boolean (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)"
        elif key == "mode":
            value, expected = text, ""
        else:
            value = int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None
            expected = "an integer"
        if value is None:
            problems.append(f"environment variable {variable}: {text!r} is not {expected}")
            continue
        overrides[key] = value
    mappings = document.get("mappings")
    if not overrides or not isinstance(mappings, list):
        return
    for mapping in mappings:
        lfs = mapping.get("lfs") if isinstance(mapping, dict) else None
        if isinstance(mapping, dict) and (lfs is None or isinstance(lfs, dict)):  # anything else: a type error below
            mapping["lfs"] = {**(lfs or {}), **overrides}
    log.info("lfs settings of every mapping overridden from the environment: %s", overrides)


# Go's strconv.ParseBool.
_GO_PARSE_BOOL = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}


class _ConfigYamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false, so `off`/`yes` stay strings) that rejects duplicate keys and
    keeps the text of plain numbers, booleans and dates (`YamlScalar`) for the keys Go reads as strings."""

    def construct_mapping(self, node, deep=False) -> dict[Any, Any]:  # noqa: ANN001 - PyYAML signature
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = _plain(self.construct_object(key_node, deep=deep))
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return {_plain(key): value for key, value in super().construct_mapping(node, deep=deep).items()}


def _construct_go_scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode, construct) -> YamlScalar:  # noqa: ANN001
    return YamlScalar(construct(loader, node), node.value)


for _tag, _construct in (
    ("int", yaml.SafeLoader.construct_yaml_int),
    ("float", yaml.SafeLoader.construct_yaml_float),
    ("bool", yaml.SafeLoader.construct_yaml_bool),
    ("timestamp", yaml.SafeLoader.construct_yaml_timestamp),
):
    _ConfigYamlLoader.add_constructor(
        f"tag:yaml.org,2002:{_tag}",
        lambda loader, node, construct=_construct: _construct_go_scalar(loader, node, construct),
    )

_ConfigYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return problem
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


# ------------------------------------------------------------------------------------------ env expansion


def _expand_env(value: Any, path: tuple[str | int, ...], problems: list[str]) -> Any:
    if isinstance(value, dict):
        return {key: _expand_env(item, (*path, key), problems) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item, (*path, index), problems) for index, item in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if not _ENV_NAME.match(name):
            problems.append(f"{_format_path(path)}: '${{{name}}}' is not a valid environment variable reference")
            return match.group(0)
        if name not in os.environ:
            problems.append(f"{_format_path(path)}: environment variable {name} is not set")
            return match.group(0)
        return os.environ[name]

    return _ENV_REFERENCE.sub(substitute, value)


# ------------------------------------------------------------------------------------- error translation


_SECRET_KEYS = frozenset({"password", "token", "secret_access_key", "credential"})
_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "bool_type": "true or false",
    "float_type": "a number",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path",
}


def _format_path(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _describe_validation_error(error: Mapping[str, Any]) -> str:
    loc = tuple(part for part in error["loc"] if part != "[key]")
    path = _format_path(loc)
    kind = error["type"]
    value = error.get("input")
    secret = bool(loc) and loc[-1] in _SECRET_KEYS
    shown = "(hidden)" if secret else repr(value)
    if kind == "missing":
        return f"{path}: is required"
    if kind == "extra_forbidden":
        return f"{path}: unknown key{_suggestion(loc)}"
    if kind == "literal_error":
        allowed = ", ".join(re.findall(r"'([^']*)'", error["ctx"]["expected"]))
        return f"{path}: {shown} is not one of {allowed}"
    if kind == "greater_than":
        return f"{path}: must be greater than {error['ctx']['gt']}, got {shown}"
    if kind in _TYPE_NAMES:
        return f"{path}: expected {_TYPE_NAMES[kind]}, got {_json_kind(value)}" + (
            "" if secret or isinstance(value, (dict, list)) else f" {shown}"
        )
    return f"{path}: {error['msg']} (got {shown})"


def _suggestion(loc: tuple[str | int, ...]) -> str:
    allowed = _allowed_keys(loc[:-1])
    if not allowed or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (expected one of {', '.join(sorted(allowed))})"


def _allowed_keys(parent: tuple[str | int, ...]) -> list[str]:
    """The YAML keys of the model at `parent`, found by walking the model classes along the error location."""
    model: type[BaseModel] = LakehouseConfig
    for part in parent:
        if isinstance(part, int):
            continue
        field = next((info for name, info in model.model_fields.items() if (info.alias or name) == part), None)
        if field is None:
            return []
        nested = _model_class_in(field.annotation)
        if nested is None:
            return []
        model = nested
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_class_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()):
        found = _model_class_in(argument)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------------------- cross-key rules


def _resolve_paths_and_defaults(config: LakehouseConfig, base_dir: Path) -> list[str]:
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
        if schema.source is None:
            if schema.columns:
                schema.source = "mapping"
            elif config.schema_config.registry.base_url is not None:
                schema.source = "registry"
            else:
                schema.source = "none"
    return problems


def _check_rules(config: LakehouseConfig) -> list[str]:
    """Rules that span keys (most are the Go processor's); run after `_resolve_paths_and_defaults`."""
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
        from kafscale_lakehouse.engine.spark.engine import parse_remote_url  # stdlib only

        try:
            parse_remote_url(config.spark.remote)
        except ValueError as exc:
            problems.append(str(exc))

    if config.schema_config.mode != "off" and config.schema_config.registry.base_url is None:
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
    if not _KAFKA_TOPIC.match(mapping.topic) or mapping.topic in (".", ".."):
        problem(f"{at}.topic", f"{mapping.topic!r} is not a valid Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
    for key, identifier in (("table", mapping.table), ("dead_letter_table", mapping.dead_letter_table)):
        if identifier is not None and not _is_table_identifier(identifier):
            problem(
                f"{at}.{key}",
                f"{identifier!r} is not a table identifier namespace.table (each part a letter or _ "
                "then letters, digits, _)",
            )
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
    for column_index, column in enumerate(schema.columns):
        column_at = f"{at}.schema.columns[{column_index}].name"
        if not column.name:
            problem(column_at, "must not be empty")
        elif column.name in base_types:
            problem(column_at, f"{column.name!r} is a base column KafScale always writes ({', '.join(base_types)})")
        elif column.name in column_types:
            problem(column_at, f"{column.name!r} is declared twice")
        column_types.setdefault(column.name, column.type)

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
            if schema.source != "registry":
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


def _check_unique(config: LakehouseConfig, problem) -> None:  # noqa: ANN001
    # Offsets and leases are per topic/partition and the Dagster asset key is the table: both must be unique.
    first_by_topic: dict[str, int] = {}
    first_by_table: dict[str, int] = {}
    for index, mapping in enumerate(config.mappings):
        if mapping.topic in first_by_topic:
            problem(
                f"mappings[{index}].topic",
                f"topic {mapping.topic!r} is already mapped by mappings[{first_by_topic[mapping.topic]}]",
            )
        first_by_topic.setdefault(mapping.topic, index)
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


def _is_table_identifier(identifier: str) -> bool:
    parts = identifier.split(".")
    return len(parts) >= 2 and all(_IDENTIFIER_PART.match(part) for part in parts)


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
