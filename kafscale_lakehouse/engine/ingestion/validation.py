"""How a run of a mapping judges its records: mapped columns, JSON Schema validation and where invalid records go.

Resolved on the driver once per run (`resolve_record_validation`), before any data is read:
- columns: `schema.source: mapping` → `schema.columns`; `registry` → derived from `<base_url>/<topic>.json`
  (`SchemaRegistryClient.columns`); `none` → base columns only.
- JSON Schema (`schema.mode` lenient or strict): the topic's compiled schema, handed to the `kafscale` source so the
  executors validate every value while they decode (`jsonschema` is per-record Python work: it scales with tasks).
- Values in the Confluent wire format (`mappings[].value_format: avro`, `protobuf`, `json_schema`): every version
  of the value subject, from the mapping's Confluent-compatible `schema_registry`, fetched here once per run
  (Protobuf ones as their serialized FileDescriptorProto); once the table is open, `with_registered_schemas` evolves
  it through them and gives what the executors decode with (value_formats/registered_tables.py). The columns are the
  value schema's fields; `schema.mode` does not judge them (json_schema values are validated by their own schema).
- Decoded keys (`mappings[].key_format`, value_formats/keys.py): the key subject's versions (registry formats) are
  fetched here too, and the `key_<field>` columns added once the table is open, by the same `with_registered_schemas`.
- A registry that is down, answers 404 or serves a document that is no JSON Schema raises here
  (`SchemaRegistryError`, `InvalidSchemaDocumentError`): the run fails before it reads anything, and no record is
  ever judged invalid because of the registry.
- dead-letter table (`dead_letters.mapping_dead_letter_table`, which maintenance follows too): lenient →
  `mappings[].dead_letter_table`, default `<table>_dead_letters`; off → the configured one only (coercion failures
  of required columns go there; without one they fail the run); strict → none: any invalid record fails the run
  before it commits, naming the record_id and the violated schema path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, cast

from pyiceberg.table import Table

from kafscale_lakehouse.config import ConfigError, LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.tables.dead_letters import mapping_dead_letter_table
from kafscale_lakehouse.schema.columns import LFS_METADATA_COLUMNS, Column
from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.schema.validation import CompiledJsonSchema
from kafscale_lakehouse.value_formats.confluent_registry import (
    ConfluentRegistryClient,
    ConfluentRegistrySettings,
    RegisteredSchema,
    subject_name,
)
from kafscale_lakehouse.value_formats.framed import FramedValueFormat, FramedValueSchemas
from kafscale_lakehouse.value_formats.keys import KEY_COLUMN_PREFIX, KeyDecoding, key_columns_clash
from kafscale_lakehouse.value_formats.registered_tables import (
    RegisteredValueSchemas,
    evolve_table_to_key_columns,
    evolve_table_to_registered_versions,
)
from kafscale_lakehouse.value_formats.registry import SchemaRegistryClient

SchemaMode = Literal["off", "lenient", "strict"]


@dataclass(frozen=True)
class RecordValidation:
    mode: SchemaMode
    columns: tuple[Column, ...]  # the mapped columns of the table and of the read
    json_schema: CompiledJsonSchema | None  # validate every value against it (lenient, strict)
    dead_letter_table: str | None  # where invalid records go; None: invalid records fail the run
    registered_values: RegisteredValueSchemas | None = None  # a registry value format: the subject's versions
    # a registry value format, once the table is open: what the executors decode the values with
    framed_values: FramedValueSchemas | None = None
    registered_keys: RegisteredValueSchemas | None = None  # key_format avro/protobuf/json_schema: the key subject's
    key_columns: tuple[Column, ...] = ()  # key_format json: the key's declared fields
    keys: KeyDecoding | None = None  # key_format other than raw, once the table is open: how the keys decode


def resolve_record_validation(config: LakehouseConfig, mapping: MappingConfig,
                              registry: SchemaRegistryClient | None) -> RecordValidation:
    """See the module docstring; raises the registry's errors for `mapping.topic` as they are."""
    mode: SchemaMode = config.schema_config.mode
    json_values = mapping.value_format == "json"
    needs_registry = (mode != "off" and json_values) or mapping.schema_config.source == "registry"
    if needs_registry and registry is None:
        raise ConfigError("record validation", [f"schema.registry.base_url: is required for topic {mapping.topic} "
                                                f"(schema.mode {mode}, schema.source {mapping.schema_config.source})"])
    if mapping.schema_config.source == "registry" and registry is not None:  # not None: needs_registry above
        columns = tuple(registry.columns(mapping.topic))
    else:
        columns = tuple(mapping.schema_config.columns)
    if mapping.lfs.store_metadata:
        columns += LFS_METADATA_COLUMNS
    json_schema = registry.get_schema(mapping.topic) if mode != "off" and json_values and registry is not None else None
    dead_letter_table = mapping_dead_letter_table(mode, mapping.table, mapping.dead_letter_table)
    # A configured name is checked when the config loads; the default one could still be another mapping's table.
    clash = next((other for other in config.mappings if other.table == dead_letter_table), None)
    if clash is not None:
        raise ConfigError("record validation", [
            f"mappings[].dead_letter_table of topic {mapping.topic}: the default {dead_letter_table!r} is the table "
            f"of the mapping of topic {clash.topic}; set dead_letter_table explicitly"])
    registry_keys = mapping.key_format not in ("raw", "json")
    return RecordValidation(mode=mode, columns=columns, json_schema=json_schema, dead_letter_table=dead_letter_table,
                            registered_values=None if json_values else registered_value_schemas(mapping),
                            registered_keys=registered_value_schemas(mapping, key=True) if registry_keys else None,
                            key_columns=tuple(mapping.key_columns) if mapping.key_format == "json" else ())


def registered_value_schemas(mapping: MappingConfig, *, key: bool = False) -> RegisteredValueSchemas:
    """Every version of the value (or `key`) subject of a mapping of a registry format; the registry's errors
    (down, 404) as they are."""
    registry = mapping.schema_registry
    data_format = mapping.key_format if key else mapping.value_format
    if not key and mapping.value_schema_file is not None:
        return _value_schema_file(mapping, mapping.value_schema_file)
    if registry is None:  # parse_config requires it for the registry formats
        raise ConfigError("record validation", [f"mappings[].schema_registry: is required for topic {mapping.topic} "
                                                f"({'key' if key else 'value'}_format {data_format})"])
    client = ConfluentRegistryClient(ConfluentRegistrySettings(
        url=registry.url, username=registry.username,
        password=registry.password.get_secret_value() if registry.password is not None else None,
        bearer_token=registry.bearer_token.get_secret_value() if registry.bearer_token is not None else None,
        ca_file=registry.ca_file, cert_file=registry.cert_file, key_file=registry.key_file,
        timeout_seconds=registry.timeout_seconds))
    record_name = registry.key_record_name if key else registry.record_name
    subject = subject_name(mapping.topic, registry.subject_name_strategy, record_name, key=key)
    value_format = cast(FramedValueFormat, data_format)  # not json nor raw: resolve_record_validation
    protobuf = value_format == "protobuf"
    versions = client.subject_versions(subject, "serialized" if protobuf else None)
    imports = {v.schema_id: client.serialized_imports(v) for v in versions if protobuf and v.references}
    return RegisteredValueSchemas(subject, tuple(versions), latest=registry.latest and not key,
                                  value_format=value_format, message_name=record_name if protobuf else None,
                                  imports=imports)


def _value_schema_file(mapping: MappingConfig, path: Path) -> RegisteredValueSchemas:
    """`value_schema_file`: one JSON Schema (schema id 0) typing every plain JSON value (no wire-format prefix)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("record validation", [f"mappings[].value_schema_file of topic {mapping.topic}: cannot read "
                                                f"{path}: {exc}"]) from None
    return RegisteredValueSchemas(f"file {path}", (RegisteredSchema(0, "JSON", text, 1),), latest=True,
                                  value_format="json_schema")


def with_registered_schemas(validation: RecordValidation, table: Table, table_name: str) -> RecordValidation:
    """For a mapping of a registry value format: `table` evolved through the value subject's versions, and what the
    executors decode with; with decoded keys (the key subject's versions, or the declared `key_columns` of JSON
    keys), the key columns added the same way. Other mappings unchanged."""
    registered = validation.registered_values
    if registered is not None:
        framed_values = evolve_table_to_registered_versions(table, table_name, registered)
        validation = replace(validation, framed_values=framed_values)
    keys: KeyDecoding | None = None
    if validation.registered_keys is not None:
        keys = KeyDecoding(framed=evolve_table_to_registered_versions(
            table, table_name, validation.registered_keys, prefix=KEY_COLUMN_PREFIX))
    elif validation.key_columns:
        keys = evolve_table_to_key_columns(table, table_name, validation.key_columns)
    if keys is None:
        return validation
    value_names = validation.framed_values.value_schema.names if validation.framed_values is not None else [
        c.name for c in validation.columns]
    clashes = key_columns_clash([f.name[len(KEY_COLUMN_PREFIX):] for f in keys.arrow_fields()], value_names)
    if clashes:
        raise SchemaMappingError(f"table {table_name}: the decoded key columns {clashes} are also value columns")
    return replace(validation, keys=keys)
