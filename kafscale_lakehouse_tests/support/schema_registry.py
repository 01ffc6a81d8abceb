"""A Confluent-compatible schema registry for the tests and the demo, in memory.

No real one installs from the registries we reach (Karapace is not on PyPI and needs Kafka; Confluent's and
Apicurio's are Java distributions), so this serves the part of Confluent's REST API that clients use, with its
status codes and error bodies (`{"error_code": 40401, "message": ...}`):

- `GET /schemas/ids/{id}` (`schemaType` omitted for Avro, as Confluent does; `?format=serialized` gives a Protobuf
  schema as the base64 of its `FileDescriptorProto`, compiled from the registered .proto text by protoc from
  grpcio-tools, a test dependency), `GET /schemas/ids/{id}/versions`
- `GET /subjects`, `GET /subjects/{s}/versions`, `GET /subjects/{s}/versions/{v|latest}` (`?format=serialized` too),
  `DELETE /subjects/{s}`
- `POST /subjects/{s}/versions` (the same schema again gets its id back; an equal schema under another subject
  shares the id), `POST /subjects/{s}` (is this schema registered?)
- `POST /compatibility/subjects/{s}/versions/{v|latest}`, `GET/PUT /config` and `/config/{s}`; Avro
  compatibility `BACKWARD` (the default), `FORWARD`, `FULL` (and `_TRANSITIVE`) or `NONE`, by Avro's schema
  resolution rules; other schema types are accepted as they are.
- optional HTTP Basic or bearer authentication (401 `{"error_code": 401, ...}` otherwise).

`python -m kafscale_lakehouse_tests.support.schema_registry --port 8081` serves it until interrupted (`make demo`).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import tempfile
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException

log = logging.getLogger(__name__)

COMPATIBILITY_LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                        "FULL_TRANSITIVE", "NONE")
_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
               ("float", "double"), ("string", "bytes"), ("bytes", "string")}


class RegistryHttpError(Exception):
    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message


@dataclass
class _Schema:
    schema_id: int
    text: str
    schema_type: str  # AVRO, PROTOBUF, JSON
    references: list[dict[str, Any]]
    serialized: str | None = None  # Protobuf: the base64 FileDescriptorProto served with format=serialized

    def canonical(self) -> tuple[str, str]:
        if self.schema_type == "AVRO":
            return self.schema_type, json.dumps(json.loads(self.text), sort_keys=True, separators=(",", ":"))
        return self.schema_type, self.text.strip()


@dataclass
class RegistryState:
    """Schemas by id and the versions of each subject; thread-safe through `lock`."""

    schemas: dict[int, _Schema] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)  # subject → schema id of version i+1
    compatibility: str = "BACKWARD"
    subject_compatibility: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, subject: str, text: str, schema_type: str = "AVRO",
                 references: list[dict[str, Any]] | None = None) -> int:
        candidate = _Schema(0, text, schema_type, references or [])
        _check_parses(candidate, self.referenced_texts(candidate.references))
        with self.lock:
            key = candidate.canonical()
            versions = self.subjects.get(subject, [])
            for schema_id in versions:
                if self.schemas[schema_id].canonical() == key:
                    return schema_id
            level = self.subject_compatibility.get(subject, self.compatibility)
            if versions and not _compatible(candidate, [self.schemas[i] for i in versions], level):
                raise RegistryHttpError(409, 409, f"Schema being registered is incompatible with an earlier schema for "
                                                  f"subject \"{subject}\" (compatibility {level})")
            shared = next((s.schema_id for s in self.schemas.values() if s.canonical() == key), None)
            schema_id = shared if shared is not None else max(self.schemas, default=0) + 1
            if shared is None:
                self.schemas[schema_id] = _Schema(schema_id, candidate.text, schema_type, candidate.references,
                                                  candidate.serialized)
            self.subjects.setdefault(subject, []).append(schema_id)
            log.info("registry: subject %s version %d is schema id %d", subject, len(self.subjects[subject]),
                     schema_id)
            return schema_id

    def version(self, subject: str, version: str, schema_format: str | None = None) -> dict[str, Any]:
        versions = self._versions(subject)
        if version in ("latest", "-1"):
            number = len(versions)
        else:
            try:
                number = int(version)
            except ValueError:
                raise RegistryHttpError(422, 42202, f"The specified version '{version}' is not a valid version id. "
                                        "Allowed values are between [1, 2^31-1] and the string \"latest\"") from None
            if not 1 <= number <= len(versions):
                raise RegistryHttpError(404, 40402, f"Version {version} not found.")
        schema = self.schemas[versions[number - 1]]
        return {"subject": subject, "version": number, "id": schema.schema_id, **_schema_body(schema, schema_format)}

    def referenced_texts(self, references: list[dict[str, Any]]) -> dict[str, str]:
        """Import name → schema text of `references` and of theirs (a Protobuf schema's imports, compiled with it)."""
        texts: dict[str, str] = {}
        for reference in references:
            try:
                name, subject, version = reference["name"], reference["subject"], str(reference["version"])
            except (KeyError, TypeError):
                raise RegistryHttpError(422, 42201, f"Invalid schema reference {reference!r}") from None
            schema = self.schema(self.version(subject, version)["id"])
            texts.update(self.referenced_texts(schema.references))
            texts[name] = schema.text
        return texts

    def _versions(self, subject: str) -> list[int]:
        versions = self.subjects.get(subject)
        if not versions:
            raise RegistryHttpError(404, 40401, f"Subject '{subject}' not found.")
        return versions

    def schema(self, schema_id: int) -> _Schema:
        schema = self.schemas.get(schema_id)
        if schema is None:
            raise RegistryHttpError(404, 40403, f"Schema {schema_id} not found")
        return schema


def _schema_body(schema: _Schema, schema_format: str | None = None) -> dict[str, Any]:
    """The schema as Confluent answers it; `format=serialized` gives a Protobuf schema as the base64 of its
    FileDescriptorProto (other types ignore the format, as Confluent does)."""
    text = schema.serialized if schema_format == "serialized" and schema.serialized is not None else schema.text
    body: dict[str, Any] = {"schema": text}
    if schema.schema_type != "AVRO":  # Confluent leaves schemaType out for Avro
        body["schemaType"] = schema.schema_type
    if schema.references:
        body["references"] = schema.references
    return body


def _check_parses(schema: _Schema, referenced: Mapping[str, str] | None = None) -> None:
    if schema.schema_type not in ("AVRO", "PROTOBUF", "JSON"):
        raise RegistryHttpError(422, 42201, f"Invalid schema type {schema.schema_type}")
    if schema.schema_type == "PROTOBUF":
        described = _serialized_descriptor(schema.text)
        if described is not None:  # what confluent-kafka's ProtobufSerializer registers
            schema.text, schema.serialized = _proto_text(described), schema.text
        else:
            schema.serialized = _compile_proto(schema.text, referenced or {})
    if schema.schema_type != "AVRO":
        return
    try:
        fastavro.parse_schema(json.loads(schema.text))
    except (ValueError, SchemaParseException, TypeError, KeyError) as exc:
        raise RegistryHttpError(422, 42201, f"Invalid schema: {exc}") from None


_PROTOC_LOCK = threading.Lock()


def _compile_proto(text: str, referenced: Mapping[str, str]) -> str:
    """The base64 FileDescriptorProto of .proto `text`, compiled by protoc (grpcio-tools: the registry needs a real
    .proto parser, as Confluent's has) with its references' texts under their import names (`referenced`); imports
    of Google's well-known types resolve from protoc's own includes."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise RegistryHttpError(422, 42201, "Invalid schema: Protobuf schemas need grpcio-tools (pip install "
                                            "'kafscale-lakehouse[test]') in this test registry") from None
    from google.protobuf import descriptor_pb2

    includes = Path(grpc_tools.__file__).parent / "_proto"
    with _PROTOC_LOCK, tempfile.TemporaryDirectory(prefix="registry-proto-") as directory:
        for name, imported in referenced.items():
            path = Path(directory, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(imported)
        source = Path(directory) / "schema.proto"
        source.write_text(text)
        out = Path(directory) / "schema.pb"
        code = protoc.main(["protoc", f"-I{includes}", f"-I{directory}", f"--descriptor_set_out={out}",
                            str(source)])
        if code != 0 or not out.exists():
            raise RegistryHttpError(422, 42201, "Invalid schema: protoc could not compile the Protobuf schema "
                                                "(its messages are on the registry's standard error)")
        [file] = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return base64.b64encode(file.SerializeToString()).decode("ascii")


def _serialized_descriptor(text: str) -> Any | None:
    """The FileDescriptorProto a schema given as base64 (Confluent accepts that form too) holds; None for .proto
    text, which is never valid base64 (spaces, quotes, semicolons)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    return file if file.message_type or file.enum_type else None


_SCALAR_NAMES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool",
                 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64"}


def _proto_text(file: Any) -> str:
    """.proto text of a FileDescriptorProto, as Confluent answers for a schema registered as a descriptor."""
    lines = [f'syntax = "{file.syntax or "proto2"}";']
    if file.package:
        lines.append(f"package {file.package};")
    lines += [f'import "{dependency}";' for dependency in file.dependency]
    for enum in file.enum_type:
        lines += _enum_lines(enum, "")
    for message in file.message_type:
        lines += _message_lines(message, "", file.syntax or "proto2")
    return "\n".join(lines) + "\n"


def _enum_lines(enum: Any, indent: str) -> list[str]:
    return [f"{indent}enum {enum.name} {{", *(f"{indent}  {v.name} = {v.number};" for v in enum.value), f"{indent}}}"]


def _message_lines(message: Any, indent: str, syntax: str) -> list[str]:
    entries = {nested.name: nested for nested in message.nested_type if nested.options.map_entry}
    lines = [f"{indent}message {message.name} {{"]
    for enum in message.enum_type:
        lines += _enum_lines(enum, indent + "  ")
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += _message_lines(nested, indent + "  ", syntax)
    oneofs: dict[int, list[str]] = {}
    for proto_field in message.field:
        kind = _SCALAR_NAMES.get(proto_field.type, proto_field.type_name)
        entry = entries.get(proto_field.type_name.rsplit(".", 1)[-1]) if proto_field.type == 11 else None
        if entry is not None:
            key, value = entry.field
            line = (f"map<{_SCALAR_NAMES.get(key.type, key.type_name)}, "
                    f"{_SCALAR_NAMES.get(value.type, value.type_name)}> {proto_field.name} = {proto_field.number};")
        else:
            label = {3: "repeated ", 2: "required "}.get(proto_field.label, "")
            in_oneof = proto_field.HasField("oneof_index")
            if proto_field.proto3_optional or (syntax == "proto2" and proto_field.label == 1 and not in_oneof):
                label = "optional "
            line = f"{label}{kind} {proto_field.name} = {proto_field.number};"
        if proto_field.HasField("oneof_index") and not proto_field.proto3_optional:
            oneofs.setdefault(proto_field.oneof_index, []).append(line)
            if len(oneofs[proto_field.oneof_index]) == 1:
                lines.append(f"{indent}  oneof {message.oneof_decl[proto_field.oneof_index].name} {{")
                lines.append(f"__oneof_{proto_field.oneof_index}__")
        else:
            lines.append(f"{indent}  {line}")
    for index, members in oneofs.items():
        at = lines.index(f"__oneof_{index}__")
        lines[at:at + 1] = [*(f"{indent}    {member}" for member in members), f"{indent}  }}"]
    lines.append(f"{indent}}}")
    return lines


def _compatible(candidate: _Schema, earlier: list[_Schema], level: str) -> bool:
    if level == "NONE" or candidate.schema_type != "AVRO":
        return True
    against = earlier if level.endswith("_TRANSITIVE") else earlier[-1:]
    new = _expanded(candidate.text)
    for old_schema in against:
        if old_schema.schema_type != "AVRO":
            continue
        old = _expanded(old_schema.text)
        if level.startswith(("BACKWARD", "FULL")) and not avro_can_read(new, old):
            return False
        if level.startswith(("FORWARD", "FULL")) and not avro_can_read(old, new):
            return False
    return True


def _expanded(text: str) -> Any:
    return fastavro.parse_schema(json.loads(text), expand=True, _write_hint=False)


def avro_can_read(reader: Any, writer: Any) -> bool:
    """Whether data written with `writer` can be read with `reader` (Avro schema resolution, expanded schemas)."""
    if isinstance(writer, list):
        return all(avro_can_read(reader, branch) for branch in writer)
    if isinstance(reader, list):
        return any(avro_can_read(branch, writer) for branch in reader)
    reader_type, writer_type = _type_name(reader), _type_name(writer)
    if reader_type != writer_type:
        return (writer_type, reader_type) in _PROMOTIONS
    if reader_type == "record":
        writer_fields = {f["name"]: f for f in writer["fields"]}
        for reader_field in reader["fields"]:
            names = [reader_field["name"], *reader_field.get("aliases", [])]
            written = next((writer_fields[n] for n in names if n in writer_fields), None)
            if written is None:
                if "default" not in reader_field:
                    return False
            elif not avro_can_read(reader_field["type"], written["type"]):
                return False
        return True
    if reader_type == "enum":
        return "default" in reader or set(writer["symbols"]) <= set(reader["symbols"])
    if reader_type == "array":
        return avro_can_read(reader["items"], writer["items"])
    if reader_type == "map":
        return avro_can_read(reader["values"], writer["values"])
    if reader_type == "fixed":
        return reader["size"] == writer["size"]
    return True


def _type_name(schema: Any) -> str:
    if isinstance(schema, Mapping):
        return _type_name(schema["type"]) if isinstance(schema["type"], (Mapping, list)) else schema["type"]
    return schema


# ------------------------------------------------------------------------------------------------------ HTTP


class _Handler(BaseHTTPRequestHandler):
    server: SchemaRegistryHttpServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("registry %s: " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        try:
            self._check_auth()
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null") if length else None
            url = urllib.parse.urlsplit(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
            query = dict(urllib.parse.parse_qsl(url.query))
            status, answer = 200, self.server.route(method, parts, body, query)
        except RegistryHttpError as exc:
            status, answer = exc.status, {"error_code": exc.error_code, "message": exc.message}
        except (ValueError, TypeError) as exc:
            status, answer = 422, {"error_code": 422, "message": f"Unprocessable entity: {exc}"}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _check_auth(self) -> None:
        expected = self.server.authorization
        if expected is not None and self.headers.get("Authorization") != expected:
            raise RegistryHttpError(401, 401, "Unauthorized")


class SchemaRegistryHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: RegistryState, authorization: str | None) -> None:
        super().__init__(address, _Handler)
        self.state = state
        self.authorization = authorization

    def route(self, method: str, parts: list[str], body: Any, query: Mapping[str, str] | None = None) -> Any:
        state = self.state
        schema_format = (query or {}).get("format")
        match method, parts:
            case "GET", ["schemas", "ids", schema_id]:
                return _schema_body(state.schema(_int(schema_id)), schema_format)
            case "GET", ["schemas", "ids", schema_id, "versions"]:
                wanted = state.schema(_int(schema_id)).schema_id
                return [{"subject": s, "version": i + 1} for s, ids in state.subjects.items()
                        for i, sid in enumerate(ids) if sid == wanted]
            case "GET", ["subjects"]:
                return sorted(state.subjects)
            case "GET", ["subjects", subject, "versions"]:
                return list(range(1, len(state._versions(subject)) + 1))
            case "GET", ["subjects", subject, "versions", version]:
                return state.version(subject, version, schema_format)
            case "GET", ["subjects", subject, "versions", version, "schema"]:
                return json.loads(state.version(subject, version)["schema"])
            case "DELETE", ["subjects", subject]:
                versions = state._versions(subject)
                with state.lock:
                    del state.subjects[subject]
                return list(range(1, len(versions) + 1))
            case "POST", ["subjects", subject, "versions"]:
                text, schema_type, references = _schema_of(body)
                return {"id": state.register(subject, text, schema_type, references)}
            case "POST", ["subjects", subject]:
                text, schema_type, _ = _schema_of(body)
                key = _Schema(0, text, schema_type, []).canonical()
                for number, registered_id in enumerate(state._versions(subject), start=1):
                    if state.schemas[registered_id].canonical() == key:
                        return state.version(subject, str(number))
                raise RegistryHttpError(404, 40403, "Schema not found")
            case "POST", ["compatibility", "subjects", subject, "versions", version]:
                text, schema_type, references = _schema_of(body)
                candidate = _Schema(0, text, schema_type, references)
                _check_parses(candidate, state.referenced_texts(references))
                earlier = state.schema(state.version(subject, version)["id"])
                level = state.subject_compatibility.get(subject, state.compatibility)
                return {"is_compatible": _compatible(candidate, [earlier], level)}
            case "GET", ["config"]:
                return {"compatibilityLevel": state.compatibility}
            case "GET", ["config", subject]:
                if subject not in state.subject_compatibility:
                    raise RegistryHttpError(404, 40408, f"Subject '{subject}' does not have subject-level "
                                                        "compatibility configured")
                return {"compatibilityLevel": state.subject_compatibility[subject]}
            case "PUT", ["config"] | ["config", _]:
                level = str((body or {}).get("compatibility"))
                if level not in COMPATIBILITY_LEVELS:
                    raise RegistryHttpError(422, 42203, f"Invalid compatibility level {level!r}")
                if len(parts) == 1:
                    state.compatibility = level
                else:
                    state.subject_compatibility[parts[1]] = level
                return {"compatibility": level}
        raise RegistryHttpError(404, 404, "HTTP 404 Not Found")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RegistryHttpError(404, 40403, f"Schema {text} not found") from None


def _schema_of(body: Any) -> tuple[str, str, list[dict[str, Any]]]:
    if not isinstance(body, Mapping) or not isinstance(body.get("schema"), str):
        raise RegistryHttpError(422, 42201, "Invalid schema: the request body needs a 'schema' string")
    return body["schema"], body.get("schemaType", "AVRO"), list(body.get("references") or [])


class ConfluentCompatibleRegistry:
    """The registry on 127.0.0.1 (port 0: a free one), served by a daemon thread until `stop`."""

    def __init__(self, port: int = 0, *, username: str | None = None, password: str | None = None,
                 bearer_token: str | None = None) -> None:
        authorization = None
        if bearer_token is not None:
            authorization = f"Bearer {bearer_token}"
        elif username is not None:
            authorization = "Basic " + base64.b64encode(f"{username}:{password or ''}".encode()).decode()
        self.state = RegistryState()
        self._server = SchemaRegistryHttpServer(("127.0.0.1", port), self.state, authorization)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ConfluentCompatibleRegistry:
        self._thread = threading.Thread(target=self._server.serve_forever, name="schema-registry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def register(self, subject: str, schema: Any, schema_type: str = "AVRO",
                 references: list[dict[str, Any]] | None = None) -> int:
        """Register `schema` (a JSON-able Avro schema or the schema text) under `subject`, with Confluent's
        `references` (`{name, subject, version}`: a Protobuf schema's imports); returns its id."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return self.state.register(subject, text, schema_type, references)

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        if subject is None:
            self.state.compatibility = level
        else:
            self.state.subject_compatibility[subject] = level


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    registry = ConfluentCompatibleRegistry(args.port)
    log.info("Confluent-compatible schema registry at %s", registry.url)
    try:
        registry._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        registry._server.server_close()


if __name__ == "__main__":
    main()
