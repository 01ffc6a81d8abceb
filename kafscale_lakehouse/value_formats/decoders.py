"""The decoder of a mapping's framed values (value_formats/framed.py), by its `value_format`."""

from __future__ import annotations

from kafscale_lakehouse.value_formats.framed import FramedValueSchemas, ValueDecoder


def value_decoder(schemas: FramedValueSchemas) -> ValueDecoder:
    """A decoder of `schemas.value_format` values (one per executor task: it caches parsed schemas)."""
    # Each format's module (fastavro, protobuf, jsonschema) is imported by the first task that decodes it, not by
    # every run's driver that imports this module (the fixed cost of a run).
    if schemas.value_format == "protobuf":
        from kafscale_lakehouse.value_formats.protobuf import ProtobufValueDecoder

        return ProtobufValueDecoder(schemas)
    if schemas.value_format == "json_schema":
        from kafscale_lakehouse.value_formats.json_schema_values import JsonSchemaValueDecoder

        return JsonSchemaValueDecoder(schemas)
    from kafscale_lakehouse.value_formats.avro import AvroValueDecoder

    return AvroValueDecoder(schemas)
