"""One secured production world shared by the security tests, and one Dagster run in it.

Every credential is a distinctive random canary (`S3CRET-<what>-<hex>`) that a leak check can grep for: the segment
bucket's S3 key, the warehouse FileIO's S3 key (`iceberg.s3`), the REST catalog's OAuth2 client credential, the
etcd password (etcd with authentication on) and the schema registry's Basic credentials (in `base_url`). Every object
is written with `sse: {type: AES256}`. The servers are private to this package: a SeaweedFS that knows the canary
identities, an etcd with authentication, a schema registry.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.config import LakehouseConfig, parse_config
from kafscale_lakehouse.connections import segment_store_from_config
from kafscale_lakehouse.format import encode_segment
from kafscale_lakehouse.orchestration.resources import SECRET_ENV_PREFIX
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.orchestration.core.conftest import run_ingest_job
from kafscale_lakehouse_tests.schema_registry.conftest import RegistryServer
from kafscale_lakehouse_tests.support.servers import REGION, Etcd, SeaweedFS
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, SEGMENT_RECORDS, records_with_faults, serve_schema

# Loggers read at DEBUG during the run (others at their usual WARNING).
DEBUG_LOGGERS = ("kafscale_lakehouse", "pyiceberg", "dagster")
ETCD_USER = "lakehouse"
REGISTRY_USER = "schema-reader"
SSE = {"type": "AES256"}


def canary(what: str) -> str:
    return f"S3CRET-{what}-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Credentials:
    """The canary credentials of the secured world; `secrets()` are the values that must never show anywhere."""

    segments_access_key: str = field(default_factory=lambda: f"segments-{secrets.token_hex(4)}")
    segments_secret: str = field(default_factory=lambda: canary("segments-s3"))
    warehouse_access_key: str = field(default_factory=lambda: f"warehouse-{secrets.token_hex(4)}")
    warehouse_secret: str = field(default_factory=lambda: canary("warehouse-s3"))
    catalog_client_id: str = field(default_factory=lambda: f"catalog-{secrets.token_hex(4)}")
    catalog_secret: str = field(default_factory=lambda: canary("catalog"))
    etcd_password: str = field(default_factory=lambda: canary("etcd"))
    registry_password: str = field(default_factory=lambda: canary("registry"))
    # Wrong values the failure paths are given; they must not show either.
    wrong: dict[str, str] = field(default_factory=lambda: {
        name: canary(f"wrong-{name}") for name in ("s3", "warehouse-s3", "catalog", "token", "etcd", "registry")})

    def secrets(self) -> dict[str, str]:
        """Name -> text that must not appear: each secret, and the Basic/OAuth2 forms that carry one."""
        plain = {
            "s3.secret_access_key": self.segments_secret,
            "iceberg.s3.secret_access_key": self.warehouse_secret,
            "iceberg.catalog.password": self.catalog_secret,
            "etcd.password": self.etcd_password,
            "schema.registry.base_url password": self.registry_password,
            **{f"wrong {name}": value for name, value in self.wrong.items()},
        }
        basic = {
            "registry Basic authorization": f"{REGISTRY_USER}:{self.registry_password}",
            "catalog client credential": f"{self.catalog_client_id}:{self.catalog_secret}",
        }
        return {**plain, **{f"{name} (base64)": base64.b64encode(value.encode()).decode()
                            for name, value in basic.items()}}


def assert_no_secret(text: str, credentials: Credentials, where: str) -> None:
    """Fail naming the secret and the place (never printing the secret) when `text` holds one."""
    found = [name for name, value in credentials.secrets().items() if value in text]
    if found:
        contexts = []
        for name in found:
            value = credentials.secrets()[name]
            at = text.index(value)
            contexts.append(text[max(0, at - 200):at + len(value) + 80].replace(value, f"<{name}>"))
        pytest.fail(f"{where} leaks {found}:\n" + "\n---\n".join(contexts))


@dataclass
class CapturedOutput:
    """Log records (formatted with their tracebacks) and what was written to file descriptors 1 and 2."""

    records: list[str] = field(default_factory=list)
    fd_output: str = ""

    @property
    def text(self) -> str:
        return "\n".join(self.records) + "\n" + self.fd_output


class _Collector(logging.Handler):
    def __init__(self, captured: CapturedOutput):
        super().__init__(level=logging.DEBUG)
        self.captured = captured
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.captured.records.append(self.format(record))


@contextmanager
def captured_output() -> Iterator[CapturedOutput]:
    """Collect every log record (DEBUG for `DEBUG_LOGGERS`) and everything this process writes to stdout/stderr
    (`sys.stdout`/`sys.stderr` and fds 1/2, so native code too) while the block runs. pytest's caplog/capfd do this
    per test; the run is shared by the package. (Spark's JVM and its Python workers keep the stderr they started
    with, so their output is not in here.)"""
    captured = CapturedOutput()
    handler = _Collector(captured)
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in DEBUG_LOGGERS}
    root.addHandler(handler)
    for name in DEBUG_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
    streams = sys.stdout, sys.stderr
    with tempfile.TemporaryFile() as sink:
        for stream in streams:
            stream.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        sink_stream = open(sink.fileno(), "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            sys.stdout = sys.stderr = sink_stream
            yield captured
        finally:
            sink_stream.flush()
            sys.stdout, sys.stderr = streams
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            root.removeHandler(handler)
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            sink.seek(0)
            captured.fd_output = sink.read().decode("utf-8", errors="replace")


@contextmanager
def secrets_exported_only_by_this_package() -> Iterator[None]:
    """Resources export config secrets as KAFSCALE_LAKEHOUSE_SECRET_* (one value per process): start without the
    other tests' values and put them back afterwards."""
    saved = {name: value for name, value in os.environ.items() if name.startswith(SECRET_ENV_PREFIX)}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        for name in [name for name in os.environ if name.startswith(SECRET_ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(saved)


@pytest.fixture(scope="package")
def credentials() -> Credentials:
    return Credentials()


@pytest.fixture(scope="package")
def secured_seaweedfs(tmp_path_factory, credentials) -> Iterator[SeaweedFS]:
    server = SeaweedFS(tmp_path_factory.mktemp("secured-seaweedfs"), extra_credentials={
        credentials.segments_access_key: credentials.segments_secret,
        credentials.warehouse_access_key: credentials.warehouse_secret,
        credentials.catalog_client_id: credentials.catalog_secret,
    }).start()
    yield server
    server.stop()


@pytest.fixture(scope="package")
def secured_etcd(tmp_path_factory, credentials) -> Iterator[Etcd]:
    server = Etcd(tmp_path_factory.mktemp("secured-etcd")).start()
    try:
        server.enable_auth(ETCD_USER, credentials.etcd_password)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def secured_registry() -> Iterator[RegistryServer]:
    server = RegistryServer().start()
    yield server
    server.stop()


@dataclass
class SecuredRun:
    """The secured world after one successful Dagster run of its ingest job over partitions 0 and 1."""

    world: IngestWorld
    registry: RegistryServer
    config: LakehouseConfig
    document: dict[str, Any]
    config_path: Path
    dagster_home: Path
    result: dg.ExecuteInProcessResult
    run_events: list[dg.EventLogEntry]
    output: CapturedOutput

    @property
    def dead_letter_table(self) -> str:
        return self.config.mappings[0].dead_letter_table


def registry_url(registry: RegistryServer, password: str) -> str:
    """The registry's base URL with Basic credentials in it, as `schema.registry.base_url` carries them."""
    return registry.base_url.replace("://", f"://{REGISTRY_USER}:{password}@", 1)


def secured_document(world: IngestWorld, seaweedfs: SeaweedFS, etcd: Etcd, registry: RegistryServer,
                     credentials: Credentials) -> dict[str, Any]:
    """The world's production config with every credential a canary, lenient validation and SSE everywhere."""
    document = world.config_document()
    document["s3"].update(access_key_id=credentials.segments_access_key,
                          secret_access_key=credentials.segments_secret, sse=dict(SSE))
    document["iceberg"]["s3"] = {"endpoint": seaweedfs.s3_endpoint, "region": REGION, "path_style": True,
                                 "access_key_id": credentials.warehouse_access_key,
                                 "secret_access_key": credentials.warehouse_secret, "sse": dict(SSE)}
    document["iceberg"]["catalog"].update(username=credentials.catalog_client_id, password=credentials.catalog_secret)
    document["etcd"] = {"endpoints": [f"http://{etcd.endpoint}"], "username": ETCD_USER,
                        "password": credentials.etcd_password}
    document["schema"] = {"mode": "lenient",
                          "registry": {"base_url": registry_url(registry, credentials.registry_password)}}
    [mapping] = document["mappings"]
    mapping["dead_letter_table"] = world.table_name.replace(".orders", ".orders_dead_letters")
    return document


@pytest.fixture(scope="package")
def secured_run(tmp_path_factory, secured_seaweedfs, secured_etcd, secured_registry, credentials,
                spark) -> Iterator[SecuredRun]:
    root = tmp_path_factory.mktemp("secured-world")
    name = f"sec-{secrets.token_hex(4)}"
    world = IngestWorld("production", root, name, seaweedfs=secured_seaweedfs, etcd_endpoint=secured_etcd.endpoint,
                        topic=f"pizzas-{name}")
    document = secured_document(world, secured_seaweedfs, secured_etcd, secured_registry, credentials)
    config_path = root / "lakehouse.yaml"
    config_path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = parse_config(document, source=str(config_path), base_dir=root)
    serve_schema(secured_registry, world.topic)
    # Segments go in through our S3 store (the demo producer's write path): partition 0 holds invalid records.
    store = segment_store_from_config(config)
    for partition, records in ((0, records_with_faults(0, partition=0)), (1, pizza_orders(0, SEGMENT_RECORDS,
                                                                                            partition=1))):
        segment = encode_segment(records, base_offset=0, codec="zstd", records_per_batch=10)
        store.write_segment(world.topic, partition, 0, segment.kfs, segment.index)
    dagster_home = root / "dagster_home"
    dagster_home.mkdir()
    with secrets_exported_only_by_this_package():
        with dg.DagsterInstance.local_temp(str(dagster_home)) as instance:
            with captured_output() as output:
                result = run_ingest_job(config, instance, [0, 1])
            run_events = list(instance.all_logs(result.run_id))
        yield SecuredRun(world=world, registry=secured_registry, config=config, document=document,
                         config_path=config_path, dagster_home=dagster_home, result=result, run_events=run_events,
                         output=output)


EXPECTED_INVALID_RECORDS = len(FAULTS)
EXPECTED_VALID_RECORDS = 2 * SEGMENT_RECORDS - len(FAULTS)
