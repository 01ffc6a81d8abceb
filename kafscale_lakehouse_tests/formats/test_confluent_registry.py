"""The Confluent-compatible registry server (kafscale_lakehouse_tests/support/schema_registry.py) answers as
Confluent's does, and our client (value_formats/confluent_registry.py) turns its answers into schemas and errors that
name the subject or id."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from kafscale_lakehouse.value_formats.confluent_registry import (
    ConfluentRegistryClient,
    ConfluentRegistrySettings,
    subject_name,
)
from kafscale_lakehouse.value_formats.registry import (
    SchemaNotFoundError,
    SchemaRegistryRequestError,
    SchemaRegistryUnavailableError,
)
from kafscale_lakehouse_tests.formats.avro_orders import ORDER_V1, ORDER_V2, ORDER_V3
from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry
from kafscale_lakehouse_tests.support.servers import free_ports


def _call(registry: ConfluentCompatibleRegistry, method: str, path: str, body: object = None,
          headers: dict[str, str] | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(registry.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_registry_answers_like_confluent(confluent_registry, unique_prefix) -> None:
    subject = f"{unique_prefix}-value"
    status, first = _call(confluent_registry, "POST", f"/subjects/{subject}/versions", {"schema": json.dumps(ORDER_V1)})
    assert status == 200 and set(first) == {"id"}
    # The same schema again keeps its id and adds no version.
    assert _call(confluent_registry, "POST", f"/subjects/{subject}/versions",
                 {"schema": json.dumps(ORDER_V1)}) == (200, first)
    status, second = _call(confluent_registry, "POST", f"/subjects/{subject}/versions",
                           {"schema": json.dumps(ORDER_V2)})
    assert status == 200 and second["id"] != first["id"]
    assert _call(confluent_registry, "GET", f"/subjects/{subject}/versions") == (200, [1, 2])
    status, latest = _call(confluent_registry, "GET", f"/subjects/{subject}/versions/latest")
    assert status == 200 and (latest["subject"], latest["version"], latest["id"]) == (subject, 2, second["id"])
    assert "schemaType" not in latest  # Avro: Confluent leaves it out
    status, by_id = _call(confluent_registry, "GET", f"/schemas/ids/{first['id']}")
    assert status == 200 and json.loads(by_id["schema"]) == ORDER_V1
    # Other tests' subjects may hold the same schema: it has one id everywhere.
    status, uses = _call(confluent_registry, "GET", f"/schemas/ids/{first['id']}/versions")
    assert status == 200 and {"subject": subject, "version": 1} in uses

    # store_id long → string cannot read the old data: refused under BACKWARD, and checkable beforehand.
    assert _call(confluent_registry, "POST", f"/compatibility/subjects/{subject}/versions/latest",
                 {"schema": json.dumps(ORDER_V3)}) == (200, {"is_compatible": False})
    status, refused = _call(confluent_registry, "POST", f"/subjects/{subject}/versions",
                            {"schema": json.dumps(ORDER_V3)})
    assert status == 409 and refused["error_code"] == 409
    assert _call(confluent_registry, "PUT", f"/config/{subject}", {"compatibility": "NONE"}) == (
        200, {"compatibility": "NONE"})
    assert _call(confluent_registry, "POST", f"/subjects/{subject}/versions",
                 {"schema": json.dumps(ORDER_V3)})[0] == 200

    # Confluent's error codes: 40401 subject, 40402 version, 40403 schema, 42201 invalid schema.
    assert _call(confluent_registry, "GET", f"/subjects/{unique_prefix}-nope/versions")[1]["error_code"] == 40401
    assert _call(confluent_registry, "GET", f"/subjects/{subject}/versions/9")[1]["error_code"] == 40402
    assert _call(confluent_registry, "GET", "/schemas/ids/999999") == (
        404, {"error_code": 40403, "message": "Schema 999999 not found"})
    assert _call(confluent_registry, "POST", f"/subjects/{subject}/versions",
                 {"schema": '{"type": "record"}'})[1]["error_code"] == 42201


def test_client_reads_versions_and_names_what_is_missing(confluent_registry, unique_prefix) -> None:
    subject = f"{unique_prefix}-value"
    ids = [confluent_registry.register(subject, ORDER_V1), confluent_registry.register(subject, ORDER_V2)]
    client = ConfluentRegistryClient(ConfluentRegistrySettings(confluent_registry.url))
    versions = client.subject_versions(subject)
    assert [(v.schema_id, v.version, v.schema_type) for v in versions] == [(ids[0], 1, "AVRO"), (ids[1], 2, "AVRO")]
    assert json.loads(client.schema_by_id(ids[1]).text) == ORDER_V2
    assert client.latest_version(subject).schema_id == ids[1]
    with pytest.raises(SchemaNotFoundError, match=f"subject {unique_prefix}-other.*40401"):
        client.subject_versions(f"{unique_prefix}-other")
    with pytest.raises(SchemaNotFoundError, match=r"schema id 987654.*40403"):
        client.schema_by_id(987654)


def test_client_authenticates_and_fails_loudly_on_outage() -> None:
    secured = ConfluentCompatibleRegistry(username="lake", password="s3cret").start()
    try:
        secured.register("orders-value", ORDER_V1)
        with pytest.raises(SchemaRegistryRequestError, match="answered 401"):
            ConfluentRegistryClient(ConfluentRegistrySettings(secured.url)).subject_versions("orders-value")
        client = ConfluentRegistryClient(ConfluentRegistrySettings(secured.url, username="lake", password="s3cret"))
        assert len(client.subject_versions("orders-value")) == 1
    finally:
        secured.stop()
    bearer = ConfluentCompatibleRegistry(bearer_token="tok").start()
    try:
        bearer.register("orders-value", ORDER_V1)
        client = ConfluentRegistryClient(ConfluentRegistrySettings(bearer.url, bearer_token="tok"))
        assert len(client.subject_versions("orders-value")) == 1
    finally:
        bearer.stop()
    [port] = free_ports(1)
    down = ConfluentRegistryClient(ConfluentRegistrySettings(f"http://127.0.0.1:{port}", timeout_seconds=1),
                                   max_attempts=2, retry_backoff_seconds=0.01)
    with pytest.raises(SchemaRegistryUnavailableError, match=r"subject orders-value.*failed 2 times"):
        down.subject_versions("orders-value")


def test_subject_name_strategies() -> None:
    assert subject_name("orders", "topic", None) == "orders-value"
    assert subject_name("orders", "record", "shop.Order") == "shop.Order"
    assert subject_name("orders", "topic_record", "shop.Order") == "orders-shop.Order"
