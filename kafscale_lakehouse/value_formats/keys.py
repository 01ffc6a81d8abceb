"""Decoded record keys (`mappings[].key_format`): the key's fields as columns named `key_<field>`.

The base column `key` keeps the raw bytes, byte for byte as the Go processor writes them; a `key_format` other than
`raw` adds the decoded fields beside them, after the value columns, each named with the prefix `key_` (as Flink's
Kafka connector does with `key.fields-prefix`): flat, so they can be filtered, sorted and partitioned by like any
column, and never clashing with the base column `key`. A value field with the same name as a prefixed key field
is `SchemaMappingError`.

- `json`: the key is a JSON object; `key_columns` (the mapping's declaration, as `schema.columns`) are coerced like
  mapped value columns (schema/coercion.py).
- `avro`, `protobuf`, `json_schema`: Confluent-framed keys with their schemas in the mapping's registry, subject
  `<topic>-key` (or the strategy's with `key_record_name`), decoded by the value decoders (value_formats/framed.py) and
  evolved by name like value columns.
A null key (records without one) is a row of null key columns; a key that does not decode is an invalid record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from kafscale_lakehouse.schema.coercion import JsonColumnCoercer
from kafscale_lakehouse.schema.columns import ARROW_TYPES, Column
from kafscale_lakehouse.value_formats.decoders import value_decoder
from kafscale_lakehouse.value_formats.framed import DecodedValues, FramedValueSchemas, ValueDecoder

KEY_COLUMN_PREFIX = "key_"


def key_column_name(field_name: str) -> str:
    return KEY_COLUMN_PREFIX + field_name


@dataclass(frozen=True)
class KeyDecoding:
    """How the tasks decode record keys (pickled into the task spec): `framed` for a registry format (its
    `value_schema` holds the key's fields, unprefixed, typed as the table's key columns), else `json_columns`."""

    framed: FramedValueSchemas | None = None
    json_columns: tuple[Column, ...] = ()

    def arrow_fields(self) -> list[pa.Field]:
        """The key columns the decoded batches carry, prefixed, in order."""
        if self.framed is not None:
            return [f.with_name(key_column_name(f.name)) for f in self.framed.value_schema]
        return [pa.field(key_column_name(c.name), ARROW_TYPES[c.type], nullable=True) for c in self.json_columns]


class KeyDecoder:
    """Decodes a batch of record keys into the key columns (one per executor task)."""

    def __init__(self, decoding: KeyDecoding) -> None:
        self.decoding = decoding
        self._framed: ValueDecoder | None = value_decoder(decoding.framed) if decoding.framed is not None else None
        self._coercer = JsonColumnCoercer(decoding.json_columns) if decoding.framed is None else None

    def decode(self, keys: pa.Array) -> DecodedValues:
        if self._framed is not None:
            decoded = self._framed.decode(keys)
            return DecodedValues(decoded.columns, _about_keys(decoded.invalid_reasons), decoded.stop)
        assert self._coercer is not None  # noqa: S101 - one of the two, by construction
        result = self._coercer.coerce(keys)
        return DecodedValues([result.columns[c.name] for c in self.decoding.json_columns],
                             _about_keys(result.invalid_reason))


def _about_keys(reasons: pa.StringArray) -> pa.StringArray:
    """Reasons about a value, said of the key."""
    if reasons.null_count == len(reasons):
        return reasons
    return pa.array([None if r is None else f"record key: {r}" for r in reasons.to_pylist()], pa.string())


def key_columns_clash(key_fields: Sequence[str], value_fields: Sequence[str]) -> list[str]:
    """The prefixed key column names that are also value columns."""
    values = set(value_fields)
    return [key_column_name(name) for name in key_fields if key_column_name(name) in values]
