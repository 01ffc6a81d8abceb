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
- `mappings[].topic_pattern` (extension): one mapping for every topic a regular expression matches, `table` a
  template with `{topic}`; `parse_config` keeps these apart (`pattern_mappings`) and `resolve_topic_patterns` adds a
  mapping per matched topic to `mappings`;
- a topic may feed only one table and a table may be fed by only one mapping (Go keeps the last mapping
  of a topic without a word); offsets and leases are kept per topic and partition;
- `mappings[].schema.columns` is an error unless `schema.source` is `mapping` (Go ignores them).
Our additions (extensions) are listed on the models below. `${VAR}` in any string value is replaced by
the environment variable VAR (`$${` writes a literal `${`); a missing variable is an error.
Relative paths resolve against the directory of the config file. Secrets are `SecretStr`: `repr`,
`str` and `model_dump` show `**********`; read them with `.get_secret_value()`.

The package sits above `schema`, `offsets`, `storage`, `etcd` and `format` and imports nothing from `engine` or
above: the layers below take their own small types (mapped columns are `schema.columns.Column`), and the config
validates against their vocabulary (column types, S3 server-side encryption types, the Spark Connect URL).
- `models.py`: the sections as pydantic models (keys, types, defaults, extensions);
- `go_yaml.py`: YAML read as Go's yaml.v3 reads it into the Go processor's typed fields;
- `loading.py`: `load_config`/`parse_config`: Helm chart keys, `${VAR}`, LFS environment overrides, then validation;
- `rules.py`: paths, defaults that depend on other keys, and the rules that span keys;
- `errors.py`: `ConfigError` and pydantic's errors translated into `key.path: problem` lines;
- `topic_patterns.py`: `mappings[].topic_pattern` resolved against the topics found (a mapping per matched topic);
- `spark_remote.py`: the Spark Connect URL of `spark.remote`, parsed once for the config and the engine.
"""

from kafscale_lakehouse.config.errors import (
    ConfigError,
)
from kafscale_lakehouse.config.go_yaml import (
    YAML11_FALSE,
    YAML11_TRUE,
    YamlScalar,
)
from kafscale_lakehouse.config.loading import (
    CONFIG_PATH_ENV_VAR,
    DEFAULT_CONFIG_PATH,
    HELM_CHART_KEYS,
    LFS_ENV_OVERRIDES,
    load_config,
    parse_config,
)
from kafscale_lakehouse.config.models import (
    PARTITION_TRANSFORM_PATTERN,
    PARTITION_TRANSFORM_SOURCE_TYPES,
    AssetConfig,
    CatalogConfig,
    CdcConfig,
    ColumnEntry,
    DiscoveryConfig,
    EtcdConfig,
    EtcdTlsConfig,
    IcebergConfig,
    LakehouseConfig,
    LfsConfig,
    MaintenanceConfig,
    MappedColumn,
    MappingConfig,
    MappingSchemaConfig,
    OffsetsConfig,
    PartitionFieldConfig,
    ProcessorConfig,
    RegistryConfig,
    S3Config,
    S3ConnectionConfig,
    SchemaValidationConfig,
    SegmentsConfig,
    SparkConfig,
    SseConfig,
)
from kafscale_lakehouse.config.rules import (
    TOPIC_PLACEHOLDER,
)
from kafscale_lakehouse.config.spark_remote import (
    ConnectAddress,
    parse_remote_url,
)
from kafscale_lakehouse.config.topic_patterns import (
    TopicPatternResolution,
    name_part,
    resolve_topic_patterns,
    table_for_topic,
)
from kafscale_lakehouse.redaction import (
    redact_url,
)

__all__ = [
    "CONFIG_PATH_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "HELM_CHART_KEYS",
    "LFS_ENV_OVERRIDES",
    "PARTITION_TRANSFORM_PATTERN",
    "PARTITION_TRANSFORM_SOURCE_TYPES",
    "TOPIC_PLACEHOLDER",
    "YAML11_FALSE",
    "YAML11_TRUE",
    "AssetConfig",
    "CatalogConfig",
    "CdcConfig",
    "ColumnEntry",
    "ConfigError",
    "ConnectAddress",
    "DiscoveryConfig",
    "EtcdConfig",
    "EtcdTlsConfig",
    "IcebergConfig",
    "LakehouseConfig",
    "LfsConfig",
    "MaintenanceConfig",
    "MappedColumn",
    "MappingConfig",
    "MappingSchemaConfig",
    "OffsetsConfig",
    "PartitionFieldConfig",
    "ProcessorConfig",
    "RegistryConfig",
    "S3Config",
    "S3ConnectionConfig",
    "SchemaValidationConfig",
    "SegmentsConfig",
    "SparkConfig",
    "SseConfig",
    "TopicPatternResolution",
    "YamlScalar",
    "load_config",
    "name_part",
    "parse_config",
    "parse_remote_url",
    "redact_url",
    "resolve_topic_patterns",
    "table_for_topic",
]
