"""The config's sections as pydantic models: the Go processor's keys and defaults, and our extensions.

Invariants: every section is a `ConfigModel` (strict, unknown keys forbidden, keys decoded as Go's yaml.v3 decodes
them); a model built by `parse_config` has passed the cross-key rules (`rules.py`) and has its relative paths
resolved and its derived defaults filled in; secrets are `SecretStr`; mapped columns are the schema layer's
`Column`. Extensions (keys the Go processor does not have) are marked on the fields.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_serializer,
    field_validator,
)
from pydantic_core import PydanticCustomError

from kafscale_lakehouse.config.go_yaml import ConfigModel, ParsedAs
from kafscale_lakehouse.redaction import redact_url
from kafscale_lakehouse.schema.columns import COLUMN_TYPES, Column, ColumnType
from kafscale_lakehouse.schema.json_values import NumericTimestampUnit
from kafscale_lakehouse.storage.s3_store import SseType

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


class SseConfig(ConfigModel):
    """Extension `s3.sse`: server-side encryption of the objects we write, passed through to S3."""

    # the server-side encryption S3 applies: `AES256` (S3-managed keys) or `aws:kms`
    type: SseType
    # with `aws:kms`, the KMS key; default: the bucket's or account's default key
    kms_key_id: str | None = None


class S3ConnectionConfig(ConfigModel):
    """How to reach an S3 endpoint. Without `access_key_id` the standard AWS chain (env vars, profile, role) is used."""

    # the S3 endpoint URL (SeaweedFS, MinIO...); default: AWS's for the region
    endpoint: str | None = None
    # the S3 region
    region: str | None = None
    # path-style addressing (`endpoint/bucket/key`), as most S3-compatible stores need
    path_style: bool = False
    # extension: a static access key (with `secret_access_key`); without it, the AWS chain
    access_key_id: str | None = None
    # extension: the static key's secret (write `${VAR}`)
    secret_access_key: SecretStr | None = None
    # extension: server-side encryption of the objects we write
    sse: SseConfig | None = None


class S3Config(S3ConnectionConfig):
    """Where KafScale keeps segments: `s3://<bucket>/<namespace>/<topic>/<partition>/segment-<base>.kfs`."""

    _EMPTY_IS_A_VALUE = frozenset({"namespace"})

    bucket: str | None = None  # required unless segments.local_root is set
    # the KafScale namespace: the first directory of the segment keys (`""` is a value: no directory)
    namespace: str = "default"


class SegmentsConfig(ConfigModel):
    """Extension: read segments from a local directory (same layout as the bucket) instead of S3."""

    # the directory holding `<namespace>/<topic>/<partition>/segment-<base>.kfs` (relative to the config)
    local_root: LocalPath | None = None


# pyiceberg's catalog types (`pyiceberg.catalog.CatalogType`); the Go processor's config has `rest` only.
CatalogType = Literal["rest", "sql", "glue", "hive", "dynamodb", "bigquery", "in-memory"]
CATALOG_TYPES_WITH_URI = ("rest", "hive", "sql")
# `iceberg.catalog.properties` keys whose values are secrets (`glue.secret-access-key`, `client.session-token`,
# `credential`, `gcp.bigquery.credentials-info`...): shown as `**********`.
_SECRET_PROPERTY_WORDS = ("secret", "password", "token", "credential")


class CatalogConfig(ConfigModel):
    """`iceberg.catalog`. `type` is any catalog pyiceberg ships (extension: the Go processor has `rest`): `sql` is
    pyiceberg's SqlCatalog, e.g. `uri: sqlite:///var/catalog.db`; `glue`, `hive`, `dynamodb`, `bigquery` and
    `in-memory` take their pyiceberg properties from `properties` (secrets as `${VAR}`; shown masked)."""

    # the catalog: `rest` (the Go processor's), or another pyiceberg catalog type
    type: CatalogType
    # required for rest, hive (the thrift URI) and sql (an SQLAlchemy URL); glue, dynamodb... have none
    uri: str = Field(default="", validate_default=True)
    name: str = "default"  # extension: the pyiceberg catalog name (SqlCatalog stores it with every table)
    # the REST catalog's bearer token
    token: SecretStr | None = None
    # the REST catalog's user (with `password`)
    username: str | None = None
    # the REST catalog's password
    password: SecretStr | None = None
    credential: SecretStr | None = None  # extension: OAuth2 client credential `id:secret`
    # extension: passed to pyiceberg's catalog as they are (SigV4 `rest.sigv4-enabled`, OAuth `scope`, `header.*`,
    # `glue.region`, `hive.kerberos-authentication`, `dynamodb.table-name`, `gcp.bigquery.project-id`...)
    properties: StringMap = Field(default_factory=dict)

    @field_validator("uri")
    @classmethod
    def _uri_when_needed(cls, uri: str, info: ValidationInfo) -> str:
        # A field validator, so the error names iceberg.catalog.uri and shows no other (secret) key; reported like
        # any missing key.
        if info.data.get("type") in CATALOG_TYPES_WITH_URI and not uri:
            raise PydanticCustomError("missing", "Field required")
        return uri

    def __repr_args__(self):  # noqa: ANN204 - pydantic's signature
        for name, value in super().__repr_args__():
            yield name, _masked_properties(value) if name == "properties" else value

    @field_serializer("properties")
    def _properties_for_display(self, properties: dict[str, str]) -> dict[str, str]:
        return _masked_properties(properties)


def _masked_properties(properties: dict[str, str]) -> dict[str, str]:
    return {key: "**********" if any(word in key.lower() for word in _SECRET_PROPERTY_WORDS) else value
            for key, value in properties.items()}


class IcebergConfig(ConfigModel):
    # the Iceberg catalog the tables live in
    catalog: CatalogConfig
    warehouse: str | None = None  # for `sql`, a local path (made a file:// URI) or an object-store URI
    s3: S3ConnectionConfig | None = None  # extension: the warehouse FileIO when it is not the segment store's S3


class OffsetsConfig(ConfigModel):
    _ZERO_MEANS_DEFAULT = frozenset({"lease_ttl_seconds"})

    backend: Literal["etcd", "local"] = "etcd"  # `local` (extension): a sqlite file at `local_path`
    # the TTL of a partition's lease; a killed processor's leases expire after it
    lease_ttl_seconds: PositiveInt = 30
    # prefix of the KafScale keys we write: `<prefix>/offsets/...`, `/watermarks/...`, `/leases/...`
    key_prefix: str = "processors"
    # extension: the sqlite file of `backend: local` (relative to the config)
    local_path: LocalPath | None = None

    @field_validator("backend", mode="before")
    @classmethod
    def _known_backend(cls, backend: Any) -> Any:
        # The Go processor takes any other value and then keeps no offsets and holds no leases (checkpoint.go:51-55,
        # its no-op store, whose LoadOffset is always 0): every poll appends every completed segment again, and the
        # record at offset 0 never (processor.go:181, 259). That is refused here, with what to write instead.
        if isinstance(backend, str) and backend not in ("etcd", "local"):
            raise PydanticCustomError(
                "offsets_backend",
                "is not one of etcd, local: the Go processor keeps no offsets and holds no leases for any other value, "
                "so it appends every completed segment again at every poll; write etcd (shared, KafScale's keys) or "
                "local with offsets.local_path (one machine)",
            )
        return backend


class DiscoveryConfig(ConfigModel):
    # how topics and partitions are found: the broker's metadata snapshot in etcd (`etcd`), the topic and partition
    # directories in S3 (`s3`), or `auto`: S3 without etcd, else the snapshot, falling back to S3 (with a warning)
    # when it is absent or unreadable (storage/discovery.py)
    mode: Annotated[Literal["auto", "etcd", "s3"], BeforeValidator(_lowercase)] = "auto"


class EtcdTlsConfig(ConfigModel):
    """Extension `etcd.tls`: a CA to verify the server and an optional client certificate."""

    # the CA that signed etcd's certificate
    ca_file: LocalPath | None = None
    # a client certificate (with `key_file`)
    cert_file: LocalPath | None = None
    # the client certificate's key
    key_file: LocalPath | None = None


class EtcdConfig(ConfigModel):
    # etcd's client URLs (`http://etcd:2379`); required with `offsets.backend: etcd`
    endpoints: list[str] = Field(default_factory=list)
    # etcd user (with `password`)
    username: str | None = None
    # etcd password
    password: SecretStr | None = None
    # extension: TLS to etcd
    tls: EtcdTlsConfig | None = None


class RegistryConfig(ConfigModel):
    """`schema.registry`. Credentials in `base_url` (`https://user:secret@host/schemas`) show as `***@` in `repr`,
    `str` and `model_dump`; the registry client reads the attribute itself."""

    _ZERO_MEANS_DEFAULT = frozenset({"timeout_seconds", "cache_seconds"})

    # where each topic's JSON Schema is fetched: `<base_url>/<topic>.json`; required when `schema.mode` is not `off`
    base_url: str | None = None
    # timeout of one registry request
    timeout_seconds: PositiveInt = 5
    # how long a fetched schema is reused
    cache_seconds: PositiveInt = 300

    def __repr_args__(self):  # noqa: ANN204 - pydantic's signature
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "base_url" else value

    @field_serializer("base_url")
    def _base_url_for_display(self, base_url: str | None) -> str | None:
        return redact_url(base_url)


class SchemaValidationConfig(ConfigModel):
    """Top-level `schema`: JSON Schema validation of record values against `<base_url>/<topic>.json`."""

    # `off`: no validation; `lenient`: invalid records go to the dead-letter table; `strict`: an invalid record fails
    # the run before it commits
    mode: Annotated[Literal["off", "lenient", "strict"], BeforeValidator(_lowercase)] = "off"
    # the JSON Schema registry
    registry: RegistryConfig = Field(default_factory=RegistryConfig)


class ProcessorConfig(ConfigModel):
    _ZERO_MEANS_DEFAULT = frozenset({"poll_interval_seconds"})

    # the sensors' interval and the `ingest` loop's; the base of the retry backoff
    poll_interval_seconds: PositiveInt = 5
    max_bytes_per_run: PositiveInt = 1 << 30  # extension: segment bytes one run may read
    target_file_size_bytes: PositiveInt = 128 << 20  # extension: Parquet data file size before rolling over
    allow_gaps: bool = False  # extension: skip over (and record) offsets deleted before ingestion
    # Extension: how long a segment object without its pair (the broker uploads `.kfs` and `.index` in parallel) may
    # stop its partition before that is an error naming the object; before, its upload may still complete. 0: at once.
    orphan_segment_grace_seconds: NonNegativeInt = 300
    # Extension: how topics are watched. `per_table` (default): a sensor per mapping and a run per table. `namespace`:
    # one sensor lists the whole namespace once per tick and requests runs of `land_tables` that land many tables each
    # (orchestration/namespace_sensor.py), for deployments with tens to hundreds of topics.
    watch: Annotated[Literal["per_table", "namespace"], BeforeValidator(_lowercase)] = "per_table"
    # Extension: with `watch: namespace`, the pending segment bytes one `land_tables` run takes on (whole tables; a
    # table larger than the budget is a run of its own, itself bounded by `max_bytes_per_run`).
    max_bytes_per_batch_run: PositiveInt = 1 << 30
    # Extension: with `watch: namespace`, how many `land_tables` runs may be queued or running at once, over disjoint
    # tables (the watch splits the pending tables over the free ones), not counting those that committed every table
    # and only record their events (a third of a batch's time): up to twice as many runs may be in flight. Keep twice
    # it at most the Dagster instance's run limit (dagster.yaml `concurrency.runs.max_concurrent_runs`, 4 in ours),
    # less what other jobs need at the same time.
    # 2: a run's start costs ~5 CPU-s whatever it lands, and at 200 topics on 2 cores 2 runs of 100 tables beat 4 of
    # 50 (benchmarks/README.md, fanout.py: freshness p90 178 s against 235 s, tick p50 1.9 s against 4.5 s); raise it
    # where the runs have cores of their own (run pods).
    max_batch_runs: PositiveInt = 2


class SparkConfig(ConfigModel):
    """Extension `spark`: the Spark master and extra session settings, and `remote`, the long-lived Spark engine
    (Spark Connect, `sc://host:port`) runs connect to instead of starting Spark themselves; `$SPARK_REMOTE` wins over
    it. `master` is where the engine (`kafscale-lakehouse spark-engine`), or without `remote` the run, runs Spark."""

    # the Spark master (`local[*]`, `k8s://...`)
    master: str = "local[*]"
    # extra Spark settings (`spark.driver.memory: 2g`); `KAFSCALE_SPARK_CONF_<LABEL>=<key>=<value>` variables add
    # to them
    conf: StringMap = Field(default_factory=dict)
    # the Spark engine's address, `sc://host:port`; `$SPARK_REMOTE` wins over it
    remote: str | None = None


class ColumnEntry(ConfigModel):
    """`mappings[].schema.columns[]` as written: the top-level JSON key `name` of the record value, coerced to `type`
    (matched case-insensitively, as in Go). It is held as the schema layer's `Column` (`MappedColumn`)."""

    # the top-level JSON key of the record value, and the column's name
    name: str
    # the column type the value is coerced to
    type: Annotated[ColumnType, BeforeValidator(_lowercase)]
    # a record without a valid value for it is invalid (the column stays optional in the table: tombstones)
    required: bool = False

    def parsed(self) -> Column:
        return Column(name=self.name, type=self.type, required=self.required)


# A mapped column: written and validated as a `ColumnEntry`, held as a `schema.columns.Column`, so the engine passes
# the config's columns on to the schema layer unchanged.
MappedColumn = Annotated[Column, ParsedAs(ColumnEntry)]


class MappingSchemaConfig(ConfigModel):
    # Resolved after loading (as in Go): `mapping` when columns are given, else `registry` when
    # `schema.registry.base_url` is set, else `none`.
    source: Literal["mapping", "registry", "none"] | None = None
    # the mapped columns, after the eight base columns
    columns: list[MappedColumn] = Field(default_factory=list)
    # allow a mapped column's type to widen in the table (`int` to `long`, `float` to `double`)
    allow_type_widening: bool = False
    # Extension: what a JSON number in a `timestamp` column counts since the epoch; micros is what the Go processor
    # stores (the raw number), so rows agree across a cut-over.
    numeric_timestamp_unit: Annotated[Literal["micros", "millis"], BeforeValidator(_lowercase)] = "micros"

    @property
    def timestamp_unit(self) -> NumericTimestampUnit:
        """`numeric_timestamp_unit` as the schema layer's type."""
        return NumericTimestampUnit(self.numeric_timestamp_unit)


class PartitionFieldConfig(ConfigModel):
    """Extension: one Iceberg partition field, e.g. `{source: date_ordered, transform: day}`."""

    # the column the field is derived from (a base, mapped or value column)
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


class MaintenanceConfig(ConfigModel):
    """`mappings[].maintenance` (extension): the table's maintenance (engine/maintenance.py), run on a schedule by
    Dagster and by `kafscale-lakehouse maintain`."""

    # whether the table is maintained at all
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
    # the size of the manifests a merge writes
    manifest_target_size_bytes: PositiveInt = 8 * 1024 * 1024


def _lfs_mode_off(value: Any) -> Any:
    # Go's config.yaml writes `mode: off`; a YAML 1.1 reader (Helm rendering the chart's values) makes that the
    # boolean false, which reaches this string key as False or, from our loader (`YamlScalar`), as its text "false".
    if value is False or (isinstance(value, str) and value.lower() == "false"):
        return "off"
    return value


class LfsConfig(ConfigModel):
    """`mappings[].lfs`: what to do with a record whose value is a KafScale LFS envelope (docs/kafscale-format.md §9).

    Go's defaults and rules: `mode` off; `resolve_concurrency` 0 means 4, negative is an error; `validate_checksum`
    true unless set; `max_inline_size` (bytes) must be > 0 for hybrid, and in resolve mode a blob larger than it is
    an error when it is > 0.
    """

    model_config = ConfigDict(frozen=True)
    _ZERO_MEANS_DEFAULT = frozenset({"resolve_concurrency"})

    # `resolve`: the value becomes the blob; `reference`: the envelope stays; `skip`: not written; `hybrid`: resolve up
    # to `max_inline_size`, else reference
    mode: Annotated[Literal["off", "resolve", "reference", "skip", "hybrid"], BeforeValidator(_lowercase),
                    BeforeValidator(_lfs_mode_off)] = "off"
    # bytes: hybrid's limit; in resolve mode a larger blob is an error when it is > 0
    max_inline_size: Annotated[int, Field(ge=0)] = 0
    # add `lfs_content_type`, `lfs_blob_size`, `lfs_checksum`, `lfs_checksum_alg`, `lfs_bucket`, `lfs_key`
    store_metadata: bool = False
    # check the blob against the envelope's checksum (sha256, md5, crc32 or none)
    validate_checksum: bool = True
    # blob fetches in flight per Spark task
    resolve_concurrency: Annotated[int, Field(ge=0)] = 4


class ConfluentRegistryConfig(ConfigModel):
    """`mappings[].schema_registry` (extension): the Confluent-compatible registry that `value_format: avro`,
    `protobuf` and `json_schema` values name their schema ids in (value_formats/confluent_registry.py). Secrets through
    `${ENV}` references."""

    # the registry's base URL (Confluent, Karapace, Redpanda, Apicurio's ccompat API)
    url: str
    username: str | None = None  # HTTP Basic, with `password`
    # HTTP Basic password (write `${VAR}`)
    password: SecretStr | None = None
    # a bearer token instead of HTTP Basic (write `${VAR}`)
    bearer_token: SecretStr | None = None
    ca_file: LocalPath | None = None  # TLS: the CA that signed the registry's certificate
    cert_file: LocalPath | None = None  # TLS client certificate (and `key_file`)
    # the client certificate's key
    key_file: LocalPath | None = None
    # timeout of one registry request
    timeout_seconds: PositiveInt = 10
    # Kafka Connect's value.subject.name.strategy: TopicNameStrategy `<topic>-value`, RecordNameStrategy
    # `<record_name>`, TopicRecordNameStrategy `<topic>-<record_name>`.
    subject_name_strategy: Annotated[Literal["topic", "record", "topic_record"], BeforeValidator(_lowercase)] = "topic"
    # the value record's full name, for the record strategies; Protobuf: the message the columns come from (default:
    # the schema's first message), with any strategy
    record_name: str | None = None
    # key_format avro/protobuf/json_schema: the key record's full name, for the record strategies (Protobuf: the
    # key message, default the key schema's first message)
    key_record_name: str | None = None
    # Redpanda's value_schema_latest: values carry no wire-format prefix; decode them with the subject's latest version
    latest: bool = False


class CdcConfig(ConfigModel):
    """`mappings[].cdc` (extension, with `mode: upsert`): the record values are change events. `debezium`: Debezium's
    envelope (`op` c/u/r take `after`, d deletes the key of `before`; a `{schema, payload}` wrapper is unwrapped);
    `op_field`: the value is the row itself and its field `op_field` deletes the key when it is one of
    `delete_ops`. A tombstone (null value) deletes its key in both."""

    # the change events' shape
    format: Literal["debezium", "op_field"] = "debezium"
    # with `op_field`: the value's field naming the operation
    op_field: str = "op"
    # with `op_field`: the operations that delete the key
    delete_ops: list[str] = Field(default_factory=lambda: ["d"])


class AssetConfig(ConfigModel):
    """Extension `mappings[].asset`: how the mapping's Dagster assets are named and described (the translation
    dagster-dbt and dagster-sling offer). Unset keys take the component's `translation`, then the defaults below.
    `description` may name `{table}` and `{topic}`."""

    key: list[str] | None = None  # the table asset; default: the table identifier split on `.`
    key_prefix: list[str] | None = None  # put before the table asset's key
    topic_key: list[str] | None = None  # the topic asset; default kafscale/<topic>
    group: str | None = None  # both assets' group; default `kafscale`
    description: str | None = None  # the table asset's
    kinds: list[str] | None = None  # the table asset's; default iceberg, pyspark

    @field_validator("key", "key_prefix", "topic_key")
    @classmethod
    def _no_empty_parts(cls, parts: list[str] | None) -> list[str] | None:
        if parts is not None and (not all(parts) or parts == []):
            raise ValueError("an asset key is a list of non-empty strings")
        return parts


class MappingConfig(ConfigModel):
    """`mappings[]`: one KafScale topic landed into one Iceberg table (`namespace.table`); or, with `topic_pattern`,
    a template for every topic the pattern matches (`config/topic_patterns.py`)."""

    topic: str = ""  # required unless topic_pattern is set
    # Extension: a regular expression (full match) of topics; `table` is then a template with `{topic}` (the topic
    # escaped as in Dagster names: `orders-eu` -> `orders_dash_eu`) and every other key applies to each topic.
    topic_pattern: str | None = None
    # the Iceberg table, `namespace.table` (with `topic_pattern`, a template with `{topic}`)
    table: str
    # `upsert` (extension): the table holds the latest row per `id_columns` (engine/tables/upserts.py)
    mode: Literal["append", "upsert"] = "append"
    id_columns: list[str] = Field(default_factory=list)  # extension: the key of an upsert table
    # extension: a mapped column ordering an upsert table's changes of a key across Kafka partitions and runs (the
    # greater value wins over the table's row; docs/architecture.md, "Upsert tables"); with cdc debezium, an image
    # without it takes the envelope's source.ts_ms, and without order_column source.ts_ms orders the changes
    order_column: str | None = None
    cdc: CdcConfig | None = None  # extension: values are change events (mode upsert)
    # create the table at the first run when it does not exist
    create_table_if_missing: bool = False
    # the mapped columns
    schema_config: MappingSchemaConfig = Field(default_factory=MappingSchemaConfig, alias="schema")
    # extension: the table's partition fields; a change evolves the table's spec at the next run
    partition_spec: list[PartitionFieldConfig] = Field(default_factory=list)
    # extension: Iceberg table properties set at creation
    table_properties: StringMap = Field(default_factory=dict)
    dead_letter_table: str | None = None  # extension: where lenient validation puts invalid records
    allow_gaps: bool | None = None  # extension; resolved to processor.allow_gaps when not set
    freshness_max_lag_records: PositiveInt = 10_000  # extension: the freshness check warns above this lag
    # extension: the retention_headroom check warns when retention would delete offsets not landed within this
    retention_headroom_warn_seconds: NonNegativeInt = 24 * 3600
    # extension: the table's maintenance
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    # extension: the table's Dagster FreshnessPolicy fails when no commit landed for this long (ingestion stalled)
    freshness_fail_window_seconds: PositiveInt = 3600
    # extension: the FreshnessPolicy warns when no commit landed for this long
    freshness_warn_window_seconds: PositiveInt | None = None
    owners: list[str] = Field(default_factory=list)  # extension: Dagster asset owners (emails or team:name)
    tags: StringMap = Field(default_factory=dict)  # extension: Dagster asset tags
    asset: AssetConfig = Field(default_factory=AssetConfig)  # extension: Dagster asset keys, group, description, kinds
    # records whose value is a KafScale LFS envelope
    lfs: LfsConfig = Field(default_factory=LfsConfig)
    # extension: `json` (the Go processor's JSON values), or `avro` / `protobuf` / `json_schema` in the Confluent wire
    # format through `schema_registry` (Kafka Connect's AvroConverter / ProtobufConverter / JsonSchemaConverter)
    value_format: Annotated[Literal["json", "avro", "protobuf", "json_schema"], BeforeValidator(_lowercase)] = "json"
    schema_registry: ConfluentRegistryConfig | None = None  # extension, for the registry formats
    # extension: `raw` (default: only the base column `key`, the bytes), or the record key decoded into columns
    # `key_<field>` beside it (value_formats/keys.py): `json` with `key_columns`, or a registry format (subject
    # <topic>-key)
    key_format: Annotated[Literal["raw", "json", "avro", "protobuf", "json_schema"],
                          BeforeValidator(_lowercase)] = "raw"
    key_columns: list[MappedColumn] = Field(default_factory=list)  # extension: key_format json's key fields
    # extension: value_format json_schema without a registry: this JSON Schema document (relative to the config)
    # types the plain JSON values, nested columns included (value_formats/json_schema_values.py)
    value_schema_file: LocalPath | None = None
    # extension: a `kafka_timestamp` timestamptz column from the record timestamp, which partition_spec can take
    # hour/day of (`timestamp_ms` stays the Go processor's long)
    kafka_timestamp_column: bool = False
    # extension: `audited` commits each run to the branch `audit_branch` and fast-forwards `main` to it only when
    # the blocking checks pass on that snapshot (engine/tables/audit.py); `direct` commits to `main`
    publish: Annotated[Literal["direct", "audited"], BeforeValidator(_lowercase)] = "direct"
    audit_branch: str = "kafscale-audit"  # extension, for publish audited

    @property
    def columns(self) -> list[Column]:
        """The mapped columns (empty for `schema.source` registry/none until resolved elsewhere)."""
        return self.schema_config.columns

    @property
    def table_identifier(self) -> tuple[str, ...]:
        """`("prod", "orders")` for `prod.orders`."""
        return tuple(self.table.split("."))


class LakehouseConfig(ConfigModel):
    """The whole config file. Build it with `load_config` or `parse_config`, which also apply the cross-key rules."""

    # the segment store: KafScale's bucket
    s3: S3Config = Field(default_factory=S3Config)
    # extension: segments from a local directory instead of S3
    segments: SegmentsConfig = Field(default_factory=SegmentsConfig)
    # the Iceberg catalog and warehouse
    iceberg: IcebergConfig
    # the offsets store: offsets, watermarks and leases
    offsets: OffsetsConfig = Field(default_factory=OffsetsConfig)
    # how topics and partitions are found
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    # the etcd cluster of the broker's metadata and of `offsets.backend: etcd`
    etcd: EtcdConfig = Field(default_factory=EtcdConfig)
    # JSON Schema validation of record values
    schema_config: SchemaValidationConfig = Field(default_factory=SchemaValidationConfig, alias="schema")
    # polling, run sizes and the watch
    processor: ProcessorConfig = Field(default_factory=ProcessorConfig)
    # extension: the Spark master and settings, and the Spark engine runs connect to
    spark: SparkConfig = Field(default_factory=SparkConfig)
    # one entry per topic (or topic pattern) and table
    mappings: list[MappingConfig] = Field(default_factory=list)
    # The `topic_pattern` mappings with their index in `mappings[]`, taken out of `mappings` by `parse_config` (which
    # then holds the mappings of one topic each); `config/topic_patterns.py` resolves them against the topics found.
    _pattern_mappings: list[tuple[int, MappingConfig]] = PrivateAttr(default_factory=list)

    @property
    def pattern_mappings(self) -> list[tuple[int, MappingConfig]]:
        """`(index in mappings[], mapping)` of each `topic_pattern` mapping, in config order."""
        return self._pattern_mappings

    @property
    def warehouse_s3(self) -> S3ConnectionConfig:
        """S3 settings for the Iceberg warehouse FileIO: `iceberg.s3` when given (as a whole), else those of `s3`."""
        if self.iceberg.s3 is not None:
            return self.iceberg.s3
        fields = {name: getattr(self.s3, name) for name in S3ConnectionConfig.model_fields}
        return S3ConnectionConfig.model_construct(**fields)
