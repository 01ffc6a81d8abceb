"""KafScale's own broker (tools/kafscale/go.mod pins its version) in front of the suite's SeaweedFS, with an etcd of
its own: the broker writes `/kafscale/metadata/snapshot`, one key for the whole etcd, which would change what other
tests of the run discover on the shared server. One broker per test module; each test has topics of its own."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.format.base_columns import record_id
from kafscale_lakehouse.format.headers_json import go_headers_json
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.real_broker.clients import Acked
from kafscale_lakehouse_tests.support.servers import Etcd, KafScaleBroker

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker_etcd(tmp_path_factory) -> Etcd:
    server = Etcd(tmp_path_factory.mktemp("broker-etcd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def kafscale_broker(tmp_path_factory, seaweedfs, broker_etcd) -> KafScaleBroker:
    broker = KafScaleBroker(tmp_path_factory.mktemp("kafscale-broker"), seaweedfs.s3_endpoint, broker_etcd.endpoint,
                            namespace=f"kafscale-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS)
    try:
        yield broker.start()
    finally:
        broker.stop()


@dataclass
class BrokerWorld(IngestWorld):
    """A topic of the broker's namespace landed into a table of base columns only; partitions discovered from the
    broker's metadata snapshot."""

    s3_namespace: str = ""
    bootstrap: str = ""
    word: str = "orders"

    @property
    def table_name(self) -> str:
        return f"{self.name.replace('-', '_')}.{self.word}"

    def config_document(self, **processor: Any) -> dict[str, Any]:
        document = super().config_document(**processor)
        document["s3"]["namespace"] = self.s3_namespace
        document["discovery"] = {"mode": "etcd"}
        del document["mappings"][0]["schema"]
        return document

    def land_with_cli(self) -> None:
        """`kafscale-lakehouse ingest --config F --once` in this process (the shared Spark session), with the config
        file written last (`write_config_file`), else this world's own."""
        config_path = self.root / "lakehouse.yaml"
        if not config_path.exists():
            self.write_config_file()
        assert cli.main(["ingest", "--config", str(config_path), "--once"]) == 0

    def assert_lands(self, acked: Sequence[Acked], *, runs: int) -> None:
        """Every acknowledged (partition, offset) is in the table once with the key, value, headers and timestamp
        the client sent, and nothing else is."""
        offsets = Counter((a.partition, a.offset) for a in acked)
        assert not [k for k, n in offsets.items() if n > 1], "the broker acknowledged an offset twice"
        expected: dict[int, set[int]] = {}
        for partition, offset in offsets:
            expected.setdefault(partition, set()).add(offset)
        table = self.assert_exactly_once(runs=runs, expected=expected)
        rows = table.scan(selected_fields=("record_id", "partition", "offset", "timestamp_ms", "key", "value",
                                           "headers")).to_arrow().to_pylist()
        by_position = {(row["partition"], row["offset"]): row for row in rows}
        for sent in acked:
            row = by_position[sent.partition, sent.offset]
            record = sent.record
            where = f"{self.topic}/{sent.partition}@{sent.offset} ({sent.compression})"
            assert row["record_id"] == record_id(self.topic, sent.partition, sent.offset), where
            assert row["key"] == record.key, where
            assert row["value"] == record.value, where
            assert row["timestamp_ms"] == record.timestamp_ms, where
            assert row["headers"] == go_headers_json([(k.encode(), v) for k, v in record.headers]), where


@pytest.fixture
def broker_world(tmp_path, seaweedfs, broker_etcd, kafscale_broker, unique_prefix, spark):
    """Makes worlds on the module's broker: `broker_world(word)` names a topic and a table of its own (`word` a
    lower-case identifier)."""

    def make(suffix: str = "orders") -> BrokerWorld:
        root = tmp_path / suffix
        root.mkdir()
        return BrokerWorld("production", root, unique_prefix, f"{suffix}-{unique_prefix}", seaweedfs=seaweedfs,
                           etcd_endpoint=broker_etcd.endpoint, s3_namespace=kafscale_broker.namespace,
                           bootstrap=kafscale_broker.bootstrap, word=suffix)

    return make


def partitions_of(acked: Iterable[Acked]) -> set[int]:
    return {a.partition for a in acked}
