"""Typed config: Go processor compatibility, strict validation naming the key and file, secrets, env, paths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kafscale_lakehouse.config import CONFIG_PATH_ENV_VAR, ConfigError, LakehouseConfig, load_config, parse_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.schema import NumericTimestampUnit

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"

MINIMAL_GO = """
s3:
  bucket: kafscale-data
iceberg:
  catalog:
    type: rest
    uri: http://catalog:8181
etcd:
  endpoints: [http://etcd:2379]
mappings:
  - topic: orders
    table: prod.orders
"""


def write_config(directory: Path, text: str, name: str = "lakehouse.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(directory: Path, text: str) -> list[str]:
    path = write_config(directory, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert all(line.startswith(f"{path}: ") for line in message.splitlines()), message
    return caught.value.problems


def test_go_processor_example_loads_unchanged():
    config = load_config(EXAMPLES / "go-processor.yaml")
    assert config.s3.bucket == "kafscale-data"
    assert config.s3.namespace == "production"
    assert config.s3.region == "us-east-1" and config.s3.path_style is False
    assert config.iceberg.catalog.type == "rest"
    assert config.iceberg.catalog.uri == "https://iceberg-catalog.example.com"
    assert config.iceberg.catalog.token is None  # Go: "" means no token
    assert config.iceberg.warehouse == "s3://iceberg-warehouse/production"
    assert (config.offsets.backend, config.offsets.lease_ttl_seconds, config.offsets.key_prefix) == (
        "etcd",
        30,
        "processors",
    )
    assert config.etcd.endpoints == ["http://etcd.kafscale.svc.cluster.local:2379"]
    assert config.schema_config.mode == "off"
    assert config.schema_config.registry.base_url == "https://schemas.example.com"
    (mapping,) = config.mappings
    assert (mapping.topic, mapping.table, mapping.mode, mapping.create_table_if_missing) == (
        "orders",
        "prod.orders",
        "append",
        True,
    )
    assert mapping.schema_config.source == "mapping"  # inferred from the columns, as in Go
    assert mapping.schema_config.allow_type_widening is True
    assert [(c.name, c.type, c.required) for c in mapping.columns] == [
        ("order_id", "long", True),
        ("status", "string", False),
    ]


def test_go_defaults_for_a_minimal_config(tmp_path):
    config = load_config(write_config(tmp_path, MINIMAL_GO))
    assert config.discovery.mode == "auto"
    assert config.schema_config.mode == "off"
    assert config.offsets.backend == "etcd"
    assert config.offsets.lease_ttl_seconds == 30
    assert config.offsets.key_prefix == "processors"
    assert config.processor.poll_interval_seconds == 5
    assert config.schema_config.registry.timeout_seconds == 5 and config.schema_config.registry.cache_seconds == 300
    (mapping,) = config.mappings
    assert mapping.mode == "append"
    assert mapping.schema_config.source == "none"  # no columns, no registry
    assert mapping.create_table_if_missing is False
    assert config.s3.namespace == "default"


def test_schema_source_is_registry_when_a_registry_is_configured(tmp_path):
    config = load_config(write_config(tmp_path, MINIMAL_GO + "schema:\n  registry:\n    base_url: http://schemas\n"))
    assert config.mappings[0].schema_config.source == "registry"


def test_go_zero_values_mean_default_and_go_spellings_are_accepted(tmp_path):
    text = MINIMAL_GO.replace("s3:\n", 's3:\n  endpoint: ""\n  namespace: ""\n') + textwrap.dedent(
        """
        offsets:
          backend: ""
          lease_ttl_seconds: 0
        processor:
          poll_interval_seconds: 0
        discovery:
          mode: S3
        schema:
          mode: off
        """
    )
    text = text.replace(
        "    table: prod.orders\n",
        "    table: prod.orders\n    schema:\n      columns:\n        - {name: id, type: LONG}\n",
    )
    config = load_config(write_config(tmp_path, text))
    assert config.s3.endpoint is None
    assert config.s3.namespace == ""  # an empty namespace is meaningful: keys start at the topic
    assert config.offsets.backend == "etcd" and config.offsets.lease_ttl_seconds == 30
    assert config.processor.poll_interval_seconds == 5
    assert config.discovery.mode == "s3"  # Go lower-cases the mode
    assert config.schema_config.mode == "off"  # unquoted `off` is a string, not YAML 1.1's false
    assert config.mappings[0].columns[0].type == "long"


def test_error_names_file_key_and_allowed_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    columns = "    schema:\n      columns:\n        - {name: id, type: long}\n        - {name: price, type: decimal}\n"
    write_config(tmp_path, MINIMAL_GO + columns)
    with pytest.raises(ConfigError) as caught:
        load_config()  # the default path, lakehouse.yaml in the working directory
    assert str(caught.value) == (
        "lakehouse.yaml: mappings[0].schema.columns[1].type: 'decimal' is not one of "
        "boolean, int, long, float, double, string, binary, timestamp, date"
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda t: t.replace("  bucket: kafscale-data", "  bucket: kafscale-data\n  buckett: x"),
            "s3.buckett: unknown key (did you mean 'bucket'?)",
        ),
        (
            lambda t: t + "offsets:\n  lease_ttl_seconds: soon\n",
            "offsets.lease_ttl_seconds: expected an integer, got a string 'soon'",
        ),
        (
            lambda t: t + "offsets:\n  lease_ttl_seconds: -3\n",
            "offsets.lease_ttl_seconds: must be greater than 0, got -3",
        ),
        (
            lambda t: t + "processor:\n  orphan_segment_grace_seconds: -1\n",
            "processor.orphan_segment_grace_seconds: must be at least 0, got -1",
        ),
        (lambda t: t.replace("    uri: http://catalog:8181\n", ""), "iceberg.catalog.uri: is required"),
        (
            lambda t: t.replace("  bucket: kafscale-data", "  region: x"),
            "s3.bucket: is required (or set segments.local_root to read segments from a local directory)",
        ),
        (lambda t: t.replace("type: rest", "type: nessie"),
         "iceberg.catalog.type: 'nessie' is not one of rest, sql, glue, hive, dynamodb, bigquery, in-memory"),
        (lambda t: t + "s3x: 1\n", "s3x: unknown key (did you mean 's3'?)"),
        (
            lambda t: t.replace("[http://etcd:2379]", "http://etcd:2379"),
            "etcd.endpoints: expected a list, got a string 'http://etcd:2379'",
        ),
        (
            lambda t: t.replace("table: prod.orders", "table: orders"),
            "mappings[0].table: 'orders' has no namespace: write <namespace>.orders (the Go processor puts it in "
            "the catalog's empty namespace",
        ),
        (
            lambda t: t.replace("table: prod.orders", "table: 'prod.or ders'"),
            "mappings[0].table: 'prod.or ders' is not a table identifier namespace.table: part 'or ders'",
        ),
        (
            lambda t: t + "offsets:\n  backend: memory\n",
            "offsets.backend: is not one of etcd, local: the Go processor keeps no offsets and holds no leases for "
            "any other value",
        ),
        (
            lambda t: t.replace("topic: orders", "topic: 'bad topic'"),
            "mappings[0].topic: 'bad topic' is not a valid Kafka topic name",
        ),
        (
            lambda t: t + "  - topic: orders\n    table: prod.orders2\n",
            "mappings[1].topic: topic 'orders' is already mapped by mappings[0]",
        ),
        (
            lambda t: t + "  - topic: orders2\n    table: prod.orders\n",
            "mappings[1].table: table 'prod.orders' is already the target of mappings[0]",
        ),
        (lambda t: t + "    mode: merge\n", "mappings[0].mode: 'merge' is not one of append, upsert"),
        (
            lambda t: t.replace("etcd:\n  endpoints: [http://etcd:2379]\n", ""),
            "etcd.endpoints: is required for offsets.backend etcd",
        ),
        (lambda t: t + "schema:\n  mode: strict\n", "schema.registry.base_url: is required when schema.mode is strict"),
        (
            lambda t: t + "    schema:\n      source: registry\n",
            "schema.registry.base_url: is required for mappings[0].schema.source registry",
        ),
        (
            lambda t: t + "    schema:\n      source: mapping\n",
            "mappings[0].schema.columns: is required for schema.source mapping",
        ),
        # yaml.v3 takes `yes`/`on` for a bool, but a quoted "true" is a string it refuses, and so do we.
        (
            lambda t: t + "    create_table_if_missing: 'true'\n",
            "mappings[0].create_table_if_missing: expected true or false, got a string 'true'",
        ),
        (
            lambda t: t + "    create_table_if_missing: yess\n",
            "mappings[0].create_table_if_missing: expected true or false, got a string 'yess'",
        ),
        (
            lambda t: t + "offsets:\n  lease_ttl_seconds: 30.5\n",
            "offsets.lease_ttl_seconds: expected an integer, got a number 30.5",
        ),
        (lambda t: t + "    lfs_x: 1\n", "mappings[0].lfs_x: unknown key"),
        (lambda t: t + "pathx: /config/config.yaml\n", "pathx: unknown key"),
        (
            lambda t: t + "    schema:\n      columns: [{name: offset, type: long}]\n",
            "mappings[0].schema.columns[0].name: 'offset' is a base column",
        ),
        (
            lambda t: t + "    schema:\n      columns: [{name: a, type: long}, {name: a, type: int}]\n",
            "mappings[0].schema.columns[1].name: 'a' is declared twice",
        ),
        (
            lambda t: t + "    schema:\n      columns: [{type: long}]\n",
            "mappings[0].schema.columns[0].name: is required",
        ),
        (
            lambda t: t + "    partition_spec: [{source: created, transform: day}]\n",
            "mappings[0].partition_spec[0].source: 'created' is not a column of this mapping",
        ),
        (
            lambda t: t + "    partition_spec: [{source: timestamp_ms, transform: day}]\n",
            "mappings[0].partition_spec[0].transform: day cannot partition 'timestamp_ms' of type long (it takes "
            "date, timestamp)",
        ),
        (
            lambda t: t + "    partition_spec: [{source: topic, transform: 'bucket[0]'}]\n",
            "mappings[0].partition_spec[0].transform: 'bucket[0]' is not one of identity",
        ),
        (
            lambda t: (
                t
                + "    partition_spec: [{source: topic, transform: identity}, {source: offset, transform: "
                  "'bucket[4]', name: topic}]\n"
            ),
            "mappings[0].partition_spec[1].name: partition field name 'topic' is used twice",
        ),
        (
            lambda t: t + "    partition_spec: [{source: record_id, transform: 'truncate[4]', name: offset}]\n",
            "mappings[0].partition_spec[0].name: partition field name 'offset' is already a column name",
        ),
        (
            lambda t: t + "    dead_letter_table: prod.orders\n",
            "mappings[0].dead_letter_table: must differ from the mapping's table",
        ),
        (lambda t: t + "offsets:\n  backend: local\n", "offsets.local_path: is required for offsets.backend local"),
        (
            lambda t: t + "segments:\n  local_root: /data\n",
            "segments.local_root: and s3.bucket both say where segments are; set only one",
        ),
        (
            lambda t: t.replace("iceberg:", "iceberg:\n  warehouse: file://var/w").replace("type: rest", "type: sql"),
            "iceberg.warehouse: 'file://var/w' is not an absolute file URI",
        ),
        (
            lambda t: t.replace("  bucket: kafscale-data", "  bucket: kafscale-data\n  bucket: other"),
            "not valid YAML: found duplicate key 'bucket' at line 4",
        ),
        (lambda t: t + "spark:\n  conf:\n    spark.x: [1]\n", "spark.conf.spark.x: expected a string, got a list"),
        (
            lambda t: t + "spark:\n  remote: http://engine:15002\n",
            "spark.remote: 'http://engine:15002' is not a Spark Connect URL",
        ),
    ],
)
def test_each_problem_names_its_key(tmp_path, change, expected):
    problems = problems_of(tmp_path, change(MINIMAL_GO))
    assert any(problem.startswith(expected) for problem in problems), problems


def test_all_problems_are_reported_at_once(tmp_path):
    text = (
        MINIMAL_GO.replace("type: rest", "type: nessie").replace("  bucket: kafscale-data", "  buckt: x")
        + "offsets:\n  lease_ttl_seconds: x\n"
    )
    problems = problems_of(tmp_path, text)
    assert len(problems) == 3, problems
    assert {problem.split(":")[0] for problem in problems} == {
        "s3.buckt",
        "iceberg.catalog.type",
        "offsets.lease_ttl_seconds",
    }


def test_not_a_mapping_and_invalid_yaml(tmp_path):
    assert problems_of(tmp_path, "- a\n- b\n") == ["the config must be a mapping of keys to values, not a list"]
    (problem,) = problems_of(tmp_path, "s3: [unclosed\n")
    assert problem.startswith("not valid YAML:") and "line 2" in problem


def test_missing_file_names_the_path_and_the_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv(CONFIG_PATH_ENV_VAR, str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert str(caught.value).startswith(f"{tmp_path / 'nope.yaml'}: cannot read the config file")
    assert CONFIG_PATH_ENV_VAR in str(caught.value)


def test_config_path_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CONFIG_PATH_ENV_VAR, str(write_config(tmp_path, MINIMAL_GO, "elsewhere.yaml")))
    assert load_config().mappings[0].table == "prod.orders"


SECRETS = {
    "S3_SECRET": "s3-secret-value-1",
    "CATALOG_PASSWORD": "catalog-password-2",
    "CATALOG_TOKEN": "catalog-token-3",
    "ETCD_PASSWORD": "etcd-password-4",
    "WAREHOUSE_SECRET": "warehouse-secret-5",
}

SECRET_CONFIG = """
s3:
  bucket: kafscale-data
  access_key_id: AKIA123
  secret_access_key: ${S3_SECRET}
iceberg:
  catalog:
    type: rest
    uri: http://catalog:8181
    token: ${CATALOG_TOKEN}
    username: lakehouse
    password: ${CATALOG_PASSWORD}
  s3:
    endpoint: http://warehouse-s3:9000
    access_key_id: AKIA456
    secret_access_key: ${WAREHOUSE_SECRET}
etcd:
  endpoints: [http://etcd:2379]
  username: root
  password: "${ETCD_PASSWORD}"
"""


def test_secrets_never_show_in_repr_str_or_dump(tmp_path, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    config = load_config(write_config(tmp_path, SECRET_CONFIG))
    renderings = [
        repr(config),
        str(config),
        str(config.model_dump()),
        str(config.model_dump(by_alias=True)),
        config.model_dump_json(),
        repr(config.iceberg.catalog),
        repr(config.warehouse_s3),
        repr(catalog_settings(config)),
    ]
    for secret in SECRETS.values():
        assert not any(secret in text for text in renderings), secret
    # ...but the values are there for the code that needs them.
    assert config.etcd.password.get_secret_value() == SECRETS["ETCD_PASSWORD"]
    assert catalog_settings(config).catalog_properties()["credential"] == f"lakehouse:{SECRETS['CATALOG_PASSWORD']}"
    assert config.warehouse_s3.secret_access_key.get_secret_value() == SECRETS["WAREHOUSE_SECRET"]


def test_secret_with_wrong_type_is_not_echoed(tmp_path):
    (problem,) = problems_of(
        tmp_path,
        MINIMAL_GO.replace("[http://etcd:2379]", "[http://etcd:2379]\n  username: root\n  password: [hunter2-secret]"),
    )
    assert problem == "etcd.password: expected a string, got a list"
    etcd = "[http://etcd:2379]\n  username: root\n  password: "
    (problem,) = problems_of(tmp_path, MINIMAL_GO.replace("[http://etcd:2379]", etcd + "{p: 987654321}"))
    assert "987654321" not in problem and problem.startswith("etcd.password: expected a string, got a mapping")
    # A number is a password as written, as Go's yaml.v3 reads it into its string field (`0x1F` stays `0x1F`).
    path = write_config(tmp_path, MINIMAL_GO.replace("[http://etcd:2379]", etcd + "0x1F"))
    assert load_config(path).etcd.password.get_secret_value() == "0x1F"


def test_environment_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKE_BUCKET", "from-env")
    monkeypatch.setenv("LAKE_NS", "ns1")
    text = MINIMAL_GO.replace(
        "bucket: kafscale-data", "bucket: ${LAKE_BUCKET}\n  namespace: prefix-${LAKE_NS}-$${LITERAL}"
    )
    config = load_config(write_config(tmp_path, text))
    assert config.s3.bucket == "from-env"
    assert config.s3.namespace == "prefix-ns1-${LITERAL}"


@pytest.mark.parametrize("table", ["prod.orders-v2", "prod.1orders", "prod.eu.orders_2024"])
def test_table_names_the_go_processor_lands_load(tmp_path, table):
    config = load_config(write_config(tmp_path, MINIMAL_GO.replace("table: prod.orders", f"table: {table}")))
    assert config.mappings[0].table == table


def test_dollar_brace_inside_a_secret_is_kept_as_written_as_go_reads_it(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    password = "pa${NOT_SET_ANYWHERE}ss${a-b}${}!"
    text = MINIMAL_GO.replace("[http://etcd:2379]", f"[http://etcd:2379]\n  username: u\n  password: '{password}'")
    assert load_config(write_config(tmp_path, text)).etcd.password.get_secret_value() == password


def test_missing_environment_variable_names_key_and_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    problems = problems_of(
        tmp_path,
        MINIMAL_GO.replace("[http://etcd:2379]", "[http://etcd:2379]\n  username: u\n  password: ${NOT_SET_ANYWHERE}"),
    )
    assert problems == ["etcd.password: environment variable NOT_SET_ANYWHERE is not set"]
    problems = problems_of(tmp_path, MINIMAL_GO.replace("[http://etcd:2379]", "['${NOT_SET_ANYWHERE}']"))
    assert problems == ["etcd.endpoints[0]: environment variable NOT_SET_ANYWHERE is not set"]


def test_embedded_example_resolves_paths_against_the_config_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the examples directory
    config = load_config(EXAMPLES / "embedded.yaml")
    assert config.segments.local_root == EXAMPLES / "var" / "segments"
    assert config.s3.bucket is None
    assert config.iceberg.catalog.type == "sql"
    assert config.iceberg.catalog.uri == f"sqlite:///{EXAMPLES / 'var' / 'catalog.db'}"
    assert config.iceberg.warehouse == (EXAMPLES / "var" / "warehouse").as_uri()
    assert (config.offsets.backend, config.offsets.local_path) == ("local", EXAMPLES / "var" / "offsets.db")
    (mapping,) = config.mappings
    assert (mapping.topic, mapping.table, mapping.table_identifier) == (
        "completed-pizzas",
        "rpc.pizzas",
        ("rpc", "pizzas"),
    )
    assert [(c.name, c.type, c.required) for c in mapping.columns] == [
        ("order_id", "string", True),
        ("store_id", "int", False),
        ("sauce", "string", False),
        ("cheese", "string", False),
        ("meats", "string", False),
        ("veggies", "string", False),
        ("date_ordered", "timestamp", False),
    ]
    assert [(f.source, f.transform_name, f.field_name) for f in mapping.partition_spec] == [
        ("date_ordered", "day", "date_ordered_day")
    ]


def test_production_example_loads(monkeypatch):
    for name in ("LAKEHOUSE_KMS_KEY_ID", "ICEBERG_CLIENT_ID", "ICEBERG_CLIENT_SECRET", "ETCD_PASSWORD"):
        monkeypatch.setenv(name, f"value-of-{name}")
    config = load_config(EXAMPLES / "production.yaml")
    assert (
        catalog_settings(config).catalog_properties()["credential"]
        == "value-of-ICEBERG_CLIENT_ID:value-of-ICEBERG_CLIENT_SECRET"
    )
    assert config.s3.sse.type == "aws:kms" and config.s3.sse.kms_key_id == "value-of-LAKEHOUSE_KMS_KEY_ID"
    assert config.etcd.tls.ca_file == Path("/etc/kafscale/etcd/ca.crt")
    assert config.spark.conf["spark.executor.instances"] == "4"  # Spark settings are strings
    orders, payments = config.mappings
    assert [(f.field_name, f.transform_argument) for f in orders.partition_spec] == [
        ("created_at_day", None),
        ("order_id_bucket_16", 16),
    ]
    assert orders.dead_letter_table == "prod.orders_invalid"
    assert payments.schema_config.source == "registry" and payments.columns == []


def test_warehouse_s3_falls_back_to_s3_settings(tmp_path):
    config = load_config(
        write_config(
            tmp_path,
            MINIMAL_GO.replace("bucket: kafscale-data", "bucket: b\n  endpoint: http://s3:9000\n  path_style: true"),
        )
    )
    assert (config.warehouse_s3.endpoint, config.warehouse_s3.path_style) == ("http://s3:9000", True)
    config = load_config(
        write_config(tmp_path, MINIMAL_GO.replace("iceberg:", "iceberg:\n  s3:\n    endpoint: http://other:9000"))
    )
    assert (config.warehouse_s3.endpoint, config.warehouse_s3.path_style) == ("http://other:9000", False)


def test_allow_gaps_inherits_from_processor(tmp_path):
    text = (
        MINIMAL_GO + "  - topic: other\n    table: prod.other\n    allow_gaps: false\nprocessor:\n  allow_gaps: true\n"
    )
    orders, other = load_config(write_config(tmp_path, text)).mappings
    assert orders.allow_gaps is True and other.allow_gaps is False


def test_parse_config_resolves_relative_paths_against_base_dir(tmp_path):
    document = {
        "segments": {"local_root": "segs"},
        "iceberg": {"catalog": {"type": "sql", "uri": "sqlite:///cat.db?check_same_thread=false"}, "warehouse": "wh"},
        "offsets": {"backend": "local", "local_path": "off.db"},
    }
    config = parse_config(document, source="<test>", base_dir=tmp_path)
    assert isinstance(config, LakehouseConfig)
    assert config.segments.local_root == tmp_path / "segs"
    assert config.iceberg.catalog.uri == f"sqlite:///{tmp_path / 'cat.db'}?check_same_thread=false"
    assert config.iceberg.warehouse == (tmp_path / "wh").as_uri()
    with pytest.raises(ConfigError) as caught:
        parse_config({"iceberg": {"catalog": {"type": "rest"}}}, source="<test>")
    assert str(caught.value).splitlines() == [
        "<test>: iceberg.catalog.uri: is required",
    ]


def test_numeric_timestamp_unit_defaults_to_go_micros_and_a_wrong_one_names_the_key(tmp_path):
    # The Go processor stores a JSON number in a timestamp column as microseconds.
    (mapping,) = load_config(write_config(tmp_path, MINIMAL_GO)).mappings
    assert mapping.schema_config.timestamp_unit is NumericTimestampUnit.MICROS
    millis = MINIMAL_GO + "    schema:\n      numeric_timestamp_unit: MILLIS\n"
    (mapping,) = load_config(write_config(tmp_path, millis)).mappings
    assert mapping.schema_config.timestamp_unit is NumericTimestampUnit.MILLIS
    problems = problems_of(tmp_path, MINIMAL_GO + "    schema:\n      numeric_timestamp_unit: seconds\n")
    key = "mappings[0].schema.numeric_timestamp_unit: "
    assert any(p.startswith(key) and "micros" in p for p in problems), problems
