"""The demo producer: segments a broker would write (complete, contiguous, mixed codecs), watermarks, resuming."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.apps.demo_producer import DemoProducer, run_demo_producer, watermark_publisher
from kafscale_lakehouse.apps.workload import PIZZA_TOPIC, pizza_order
from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.connections import segment_store_from_config
from kafscale_lakehouse.format import decode_segment
from kafscale_lakehouse.offsets import LocalOffsetStore
from kafscale_lakehouse.storage import ObjectKind, segment_key

REPO_ROOT = Path(__file__).resolve().parents[3]
ORDER_FIELDS = {"order_id", "store_id", "sauce", "cheese", "meats", "veggies", "date_ordered"}


@pytest.fixture
def demo_config_path(tmp_path) -> Path:
    """The repository's lakehouse.yaml in a temporary directory, so its relative var/ lands there."""
    path = tmp_path / "lakehouse.yaml"
    shutil.copy(REPO_ROOT / "lakehouse.yaml", path)
    return path


@pytest.fixture
def restore_sigterm():
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_rounds_write_complete_contiguous_segments_with_mixed_codecs_and_watermarks(demo_config_path):
    config = load_config(demo_config_path)
    written = run_demo_producer(config, partitions=2, interval_seconds=0.01, records_per_segment=25, rounds=3)
    assert written == 6

    store = segment_store_from_config(config)
    offsets = LocalOffsetStore(config.offsets.local_path)
    assert offsets.broker_watermarks(PIZZA_TOPIC) == {0: 75, 1: 75}
    codecs = set()
    for partition in (0, 1):
        listing = store.list_segments(PIZZA_TOPIC, partition)
        assert [(s.base_offset, s.last_offset) for s in listing.segments] == [(0, 24), (25, 49), (50, 74)]
        assert listing.incomplete == []
        for ref in listing.segments:
            segment = decode_segment(store.read(ref.kfs_key), key=ref.kfs_key, topic=PIZZA_TOPIC, partition=partition)
            codecs.update(batch.codec for batch in segment.batches)
            rows = segment.records.to_pylist()
            assert [row["offset"] for row in rows] == list(range(ref.base_offset, ref.last_offset + 1))
            for row in rows:
                order = json.loads(row["value"])
                assert set(order) == ORDER_FIELDS
                expected = json.loads(pizza_order(row["offset"], partition=partition).value)
                assert order["order_id"] == expected["order_id"]  # the workload's order, stamped with the clock
    assert codecs == {"none", "gzip", "snappy", "lz4", "zstd"}


def test_a_restarted_producer_resumes_and_completes_an_orphan_kfs(demo_config_path):
    config = load_config(demo_config_path)
    config.segments.local_root.mkdir(parents=True)
    store = segment_store_from_config(config)
    first = DemoProducer(store, watermark_publisher(config), topic=PIZZA_TOPIC, partitions=1, records_per_segment=10)
    first.produce_round(now_ms=1_700_000_000_000, interval_ms=1000)
    # Killed between the two uploads of the next segment: only its .kfs exists.
    orphan = segment_key(store.namespace, PIZZA_TOPIC, 0, 10, ObjectKind.SEGMENT)
    store.put(orphan, b"KAFS partial")

    restarted = DemoProducer(store, watermark_publisher(config), topic=PIZZA_TOPIC, partitions=1,
                             records_per_segment=10)
    assert restarted.next_offsets == {0: 10}
    [segment] = restarted.produce_round(now_ms=1_700_000_003_000, interval_ms=1000)
    assert (segment.kfs_key, segment.base_offset, segment.last_offset) == (orphan, 10, 19)
    assert [(s.base_offset, s.last_offset) for s in store.list_segments(PIZZA_TOPIC, 0).segments] == [(0, 9), (10, 19)]


def test_cli_demo_producer_runs_rounds_and_names_a_config_without_mappings(demo_config_path, tmp_path,
                                                                          restore_sigterm, capsys):
    assert cli.main(["demo-producer", "--config", str(demo_config_path), "--rounds", "1", "--partitions", "2",
                     "--interval-seconds", "0.01"]) == 0
    root = tmp_path / "var" / "segments" / "default" / PIZZA_TOPIC
    assert sorted(p.name for p in (root / "1").iterdir()) == ["segment-00000000000000000000.index",
                                                               "segment-00000000000000000000.kfs"]

    no_mappings = tmp_path / "no-mappings.yaml"
    text = demo_config_path.read_text()
    no_mappings.write_text(text[:text.index("mappings:")])
    assert cli.main(["demo-producer", "--config", str(no_mappings), "--rounds", "1"]) == 2
    assert "mappings: the config maps no topic" in capsys.readouterr().err
