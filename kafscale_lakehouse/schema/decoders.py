"""The decoder of a mapping's framed values (schema/framed.py), by its `value_format`."""

from __future__ import annotations

from kafscale_lakehouse.schema.avro import AvroValueDecoder
from kafscale_lakehouse.schema.framed import FramedValueSchemas, ValueDecoder
from kafscale_lakehouse.schema.json_schema_values import JsonSchemaValueDecoder
from kafscale_lakehouse.schema.protobuf import ProtobufValueDecoder


def value_decoder(schemas: FramedValueSchemas) -> ValueDecoder:
    """A decoder of `schemas.value_format` values (one per executor task: it caches parsed schemas)."""
    if schemas.value_format == "protobuf":
        return ProtobufValueDecoder(schemas)
    if schemas.value_format == "json_schema":
        return JsonSchemaValueDecoder(schemas)
    return AvroValueDecoder(schemas)
