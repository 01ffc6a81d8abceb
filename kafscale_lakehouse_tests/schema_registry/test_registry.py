"""SchemaRegistryClient against a real HTTP server on 127.0.0.1: URLs, cache, retries, errors, credentials."""

from __future__ import annotations

import base64
import pickle
import socket
import threading
import time
import urllib.parse

import pytest
import yaml

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.connections import schema_registry_client
from kafscale_lakehouse.schema.columns import Column
from kafscale_lakehouse.schema.errors import SchemaMappingError
from kafscale_lakehouse.schema.validation import InvalidSchemaDocumentError
from kafscale_lakehouse.value_formats.registry import (
    SchemaNotFoundError,
    SchemaRegistryClient,
    SchemaRegistryError,
    SchemaRegistryRequestError,
    SchemaRegistryUnavailableError,
)
from kafscale_lakehouse_tests.config.test_config import MINIMAL_GO
from kafscale_lakehouse_tests.schema_registry.conftest import REGISTRY_PATH, Answer
from kafscale_lakehouse_tests.schema_registry.pizza_schema import PIZZA_JSON_SCHEMA

MINIMAL_CONFIG = yaml.safe_load(MINIMAL_GO)

PIZZA_PATH = f"{REGISTRY_PATH}/completed-pizzas.json"


def client_for(registry, **options) -> SchemaRegistryClient:
    options.setdefault("timeout_seconds", 2)
    options.setdefault("retry_backoff_seconds", 0.01)
    return SchemaRegistryClient(registry.base_url, **options)


def test_fetches_the_topic_schema_from_the_go_processor_url(registry):
    registry.serve_json(PIZZA_PATH, PIZZA_JSON_SCHEMA)
    client = client_for(registry)

    schema = client.get_schema("completed-pizzas")

    assert schema.document == PIZZA_JSON_SCHEMA
    assert schema.source == registry.base_url + "/completed-pizzas.json"
    assert schema.validator.is_valid(
        {"order_id": "x", "store_id": 1, "sauce": "bbq", "date_ordered": "2024-01-01 00:00:00"}
    )
    assert registry.paths_seen() == [PIZZA_PATH]
    assert "application/schema+json" in registry.requests[0].accept


def test_trailing_slash_in_base_url_does_not_double_the_separator(registry):
    registry.serve_json(PIZZA_PATH, PIZZA_JSON_SCHEMA)
    client = SchemaRegistryClient(registry.base_url + "/", retry_backoff_seconds=0.01)
    client.get_schema("completed-pizzas")
    assert registry.paths_seen() == [PIZZA_PATH]


@pytest.mark.parametrize(
    "topic", ["../../etc/passwd", "a/b", "a?x=1", "a#b", "%2e%2e", "..", ".", "/", "a/../../b", "ü/ß"]
)
def test_topic_names_stay_one_path_segment_inside_base_url(registry, topic):
    expected_path = f"{REGISTRY_PATH}/{urllib.parse.quote(topic, safe='')}.json"
    registry.serve_json(expected_path, {"type": "object"})
    client = client_for(registry)

    client.get_schema(topic)

    [received] = registry.paths_seen()
    assert received == expected_path
    assert client.schema_url(topic).startswith(registry.base_url + "/")
    segment = received.removeprefix(REGISTRY_PATH + "/")
    assert "/" not in segment and "?" not in segment and "#" not in segment
    assert urllib.parse.unquote(segment) == topic + ".json"


def test_cache_serves_within_cache_seconds_and_refetches_after(registry, clock):
    registry.serve_json(PIZZA_PATH, PIZZA_JSON_SCHEMA)
    client = client_for(registry, cache_seconds=300, clock=clock)

    first = client.get_schema("completed-pizzas")
    clock.now += 299.9
    assert client.get_schema("completed-pizzas") is first
    assert len(registry.requests) == 1

    changed = {**PIZZA_JSON_SCHEMA, "required": ["order_id"]}
    registry.serve_json(PIZZA_PATH, changed)
    clock.now += 0.1
    refetched = client.get_schema("completed-pizzas")
    assert len(registry.requests) == 2
    assert refetched.document == changed


def test_cache_is_per_topic_and_invalidate_forgets(registry, clock):
    registry.serve_json(f"{REGISTRY_PATH}/a.json", {"type": "object"})
    registry.serve_json(f"{REGISTRY_PATH}/b.json", {"type": "array"})
    client = client_for(registry, clock=clock)

    assert client.get_schema("a").document == {"type": "object"}
    assert client.get_schema("b").document == {"type": "array"}
    client.get_schema("a")
    assert len(registry.requests) == 2

    client.invalidate("a")
    client.get_schema("a")
    client.get_schema("b")
    assert registry.paths_seen()[2:] == [f"{REGISTRY_PATH}/a.json"]


def test_timeout_is_retried_then_unavailable(registry):
    registry.answer(PIZZA_PATH, Answer(body=b"{}", delay_seconds=10))
    client = client_for(registry, timeout_seconds=0.2, max_attempts=3)

    started = time.monotonic()
    with pytest.raises(SchemaRegistryUnavailableError) as caught:
        client.get_schema("completed-pizzas")

    assert time.monotonic() - started < 3
    assert len(registry.requests) == 3
    assert caught.value.url == registry.base_url + "/completed-pizzas.json"
    assert "completed-pizzas" in str(caught.value) and caught.value.url in str(caught.value)


def test_server_down_is_unavailable_and_credentials_never_show():
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = SchemaRegistryClient(f"http://reader:s3cret-pw@127.0.0.1:{port}/schemas", retry_backoff_seconds=0.01)

    with pytest.raises(SchemaRegistryUnavailableError) as caught:
        client.get_schema("orders")

    message = str(caught.value)
    assert f"http://127.0.0.1:{port}/schemas/orders.json" in message
    assert "s3cret" not in message and "reader" not in message
    assert "refused" in message.lower()
    assert isinstance(caught.value, SchemaRegistryError)


def test_not_found_is_an_infrastructure_error_and_not_retried(registry):
    client = client_for(registry)
    with pytest.raises(SchemaNotFoundError) as caught:
        client.get_schema("no-such-topic")
    assert isinstance(caught.value, SchemaRegistryError)
    assert "404" in str(caught.value) and "no-such-topic" in str(caught.value)
    assert len(registry.requests) == 1


def test_server_errors_are_retried_until_an_answer(registry):
    registry.answer(PIZZA_PATH, Answer(status=503), Answer(status=500), Answer(body=b'{"type": "object"}'))
    client = client_for(registry, max_attempts=3)
    assert client.get_schema("completed-pizzas").document == {"type": "object"}
    assert len(registry.requests) == 3


def test_persistent_server_error_is_unavailable_after_max_attempts(registry):
    registry.answer(PIZZA_PATH, Answer(status=502))
    client = client_for(registry, max_attempts=4)
    with pytest.raises(SchemaRegistryUnavailableError, match="HTTP 502"):
        client.get_schema("completed-pizzas")
    assert len(registry.requests) == 4


def test_errors_are_not_cached(registry, clock):
    registry.answer(PIZZA_PATH, Answer(status=503), Answer(body=b'{"type": "object"}'))
    client = client_for(registry, max_attempts=1, clock=clock)
    with pytest.raises(SchemaRegistryUnavailableError):
        client.get_schema("completed-pizzas")
    assert client.get_schema("completed-pizzas").document == {"type": "object"}


def test_forbidden_is_a_request_error_and_not_retried(registry):
    registry.answer(PIZZA_PATH, Answer(status=403))
    client = client_for(registry)
    with pytest.raises(SchemaRegistryRequestError, match="403"):
        client.get_schema("completed-pizzas")
    assert len(registry.requests) == 1


def test_redirects_are_not_followed(registry):
    registry.answer(PIZZA_PATH, Answer(status=302, headers={"Location": registry.origin + "/elsewhere/x.json"}))
    registry.serve_json("/elsewhere/x.json", {"type": "object"})
    client = SchemaRegistryClient(
        "http://user:pw@" + registry.base_url.removeprefix("http://"), retry_backoff_seconds=0.01
    )

    with pytest.raises(SchemaRegistryRequestError) as caught:
        client.get_schema("completed-pizzas")

    assert registry.paths_seen() == [PIZZA_PATH]
    assert "/elsewhere/x.json" in str(caught.value)


def test_credentials_in_base_url_become_basic_authorization(registry):
    registry.serve_json(PIZZA_PATH, PIZZA_JSON_SCHEMA)
    client = SchemaRegistryClient("http://svc%40corp:p%3Ass@" + registry.base_url.removeprefix("http://"))

    schema = client.get_schema("completed-pizzas")

    assert registry.requests[0].authorization == "Basic " + base64.b64encode(b"svc@corp:p:ss").decode()
    assert client.base_url == registry.base_url
    assert "p%3Ass" not in schema.source and "svc" not in schema.source


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "is not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "not an array"),
        (b'{"properties": {"store_id": {"type": 5}}}', "at $.properties.store_id.type"),
        (b'{"type": "object", "pattern": "("}', "at $.pattern"),
        (b'{"$schema": "https://example.com/my-dialect", "type": "object"}', "https://example.com/my-dialect"),
    ],
)
def test_invalid_schema_documents(registry, body, problem):
    registry.answer(PIZZA_PATH, Answer(body=body))
    client = client_for(registry)
    with pytest.raises(InvalidSchemaDocumentError) as caught:
        client.get_schema("completed-pizzas")
    assert problem in str(caught.value)
    assert caught.value.source == registry.base_url + "/completed-pizzas.json"


def test_concurrent_callers_share_one_fetch(registry):
    registry.answer(PIZZA_PATH, Answer(body=b'{"type": "object"}', delay_seconds=0.3))
    client = client_for(registry)
    results = []
    errors = []

    def fetch() -> None:
        try:
            results.append(client.get_schema("completed-pizzas"))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert errors == []
    assert len(results) == 8 and all(result is results[0] for result in results)
    assert len(registry.requests) == 1


@pytest.mark.parametrize(
    "base_url",
    [
        "ftp://host/schemas",
        "http://host/schemas?token=x",
        "http://host/schemas#frag",
        "host/schemas",
        "http:///schemas",
        "http://host:port/",
    ],
)
def test_unusable_base_urls_are_config_errors_naming_the_key(base_url):
    with pytest.raises(ValueError, match=r"^base_url: "):
        SchemaRegistryClient(base_url)
    # The config key is named where config becomes a client (connections.py), not in the schema layer.
    config = parse_config({**MINIMAL_CONFIG, "schema": {"registry": {"base_url": base_url}}})
    with pytest.raises(ConfigError, match=r"schema\.registry\.base_url: "):
        schema_registry_client(config)


def test_the_client_of_a_config(registry):
    registry.serve_json(PIZZA_PATH, PIZZA_JSON_SCHEMA)
    config = parse_config({**MINIMAL_CONFIG, "schema": {"registry": {"base_url": registry.base_url,
                                                                      "timeout_seconds": 1, "cache_seconds": 60}}})
    assert schema_registry_client(config).get_schema("completed-pizzas").document == PIZZA_JSON_SCHEMA
    assert schema_registry_client(parse_config(MINIMAL_CONFIG)) is None


def test_registry_columns_follow_the_go_processor_mapping(registry):
    registry.serve_json(PIZZA_PATH, PIZZA_JSON_SCHEMA)
    client = client_for(registry)

    columns = client.columns("completed-pizzas")

    # Sorted by name; strings stay strings whatever their format; `toppings` (array) and `sauce` (enum, no type) get
    # none.
    assert columns == [
        Column(name="cheese", type="string"),
        Column(name="date_ordered", type="string", required=True),
        Column(name="meats", type="string"),
        Column(name="order_id", type="string", required=True),
        Column(name="store_id", type="long", required=True),
        Column(name="veggies", type="string"),
    ]


def test_boolean_registry_schema_gives_no_columns(registry):
    registry.answer(PIZZA_PATH, Answer(body=b"true"))
    client = client_for(registry)
    assert client.get_schema("completed-pizzas").validator.is_valid(["anything"])
    with pytest.raises(SchemaMappingError, match="boolean schema true"):
        client.columns("completed-pizzas")


def test_errors_pickle_with_their_url():
    error = SchemaNotFoundError("no schema", url="http://host/s/t.json")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is SchemaNotFoundError and copy.url == error.url and str(copy) == "no schema"
