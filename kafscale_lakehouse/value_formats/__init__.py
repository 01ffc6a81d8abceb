"""Value formats: record values and keys in the Confluent wire format (Avro, Protobuf, JSON Schema), decoded into
the table's Arrow columns; the registry clients (Confluent-compatible, and the Go processor's JSON Schema registry);
and the tables landed from registered schemas. Column types, coercion, validation and evolution are in `schema/`.

Nothing is imported here: each format's module (fastavro, protobuf, jsonschema) is imported by the first task that
decodes it (`decoders.value_decoder`), not by every run's driver."""
