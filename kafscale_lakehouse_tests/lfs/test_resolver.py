"""The executor-side LFS stage on its own (a real local segment directory holds the blobs, no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import kafscale_lakehouse.engine.ingestion.lfs as lfs_resolution
from kafscale_lakehouse.config import LfsConfig
from kafscale_lakehouse.engine.ingestion.lfs import LfsReadSettings, LfsResolver, LfsStats
from kafscale_lakehouse.format import BASE_SCHEMA
from kafscale_lakehouse.format.lfs import encode_envelope
from kafscale_lakehouse.storage import LocalSegmentStore


def batch_of(values: list[bytes | None]) -> pa.RecordBatch:
    n = len(values)
    columns = {"record_id": [f"t:0:{i}" for i in range(n)], "topic": ["t"] * n, "partition": [0] * n,
               "offset": list(range(n)), "timestamp_ms": [0] * n, "key": [None] * n, "value": values,
               "headers": [""] * n}
    return pa.RecordBatch.from_pydict(columns, schema=BASE_SCHEMA)


@pytest.fixture
def store(tmp_path) -> LocalSegmentStore:
    return LocalSegmentStore(tmp_path, create=True)


def put(store: LocalSegmentStore, key: str, blob: bytes) -> bytes:
    store.put(f"bucket/{key}", blob)
    return encode_envelope("bucket", key, blob)


def resolver(store, on_error="stop", **config) -> LfsResolver:
    return LfsResolver(LfsReadSettings(LfsConfig(**config), on_error), store, LfsStats())


def test_batches_are_split_so_only_a_bounded_amount_of_blob_bytes_is_held(store, monkeypatch):
    monkeypatch.setattr(lfs_resolution, "RESOLVE_BATCH_BYTES", 2500)
    blobs = [bytes([i]) * 1000 for i in range(5)]
    values = [b"plain-0"] + [put(store, f"k{i}", blob) for i, blob in enumerate(blobs)] + [b"plain-6"]
    stage = resolver(store, mode="resolve", resolve_concurrency=3)

    out = list(stage.process(batch_of(values)))

    assert [b.batch.num_rows for b in out] == [3, 2, 2], "two blobs (2000 bytes) per batch at most"
    landed = [v for b in out for v in b.batch.column("value").to_pylist()]
    assert landed == [b"plain-0", *blobs, b"plain-6"]
    assert [o for b in out for o in b.batch.column("offset").to_pylist()] == list(range(7))
    assert (stage.stats.resolved, stage.stats.resolved_bytes, sum(stage.stats.duration_buckets)) == (5, 5000, 5)
    stage.close()


def test_a_blob_over_the_limit_is_refused_before_it_is_read(store, monkeypatch):
    envelope = put(store, "big", b"x" * 5000)
    read_chunks = []
    original = LocalSegmentStore._stream

    def stream(self, key, chunk_size):
        size, chunks = original(self, key, chunk_size)

        def counted():
            for chunk in chunks:
                read_chunks.append(len(chunk))
                yield chunk
        return size, counted()
    monkeypatch.setattr(LocalSegmentStore, "_stream", stream)
    stage = resolver(store, on_error="dead_letter", mode="resolve", max_inline_size=4096)

    [out] = stage.process(batch_of([envelope, b"plain"]))

    assert out.invalid_reasons.to_pylist() == [
        "LFS blob s3://bucket/big: blob is 5000 bytes, over max_inline_size 4096", None]
    assert out.batch.column("value").to_pylist() == [envelope, b"plain"], "the dead letter keeps the envelope"
    assert read_chunks == [], "not a byte of the blob was read"
    assert stage.stats.errors == {"resolve": 1}


def test_stop_cuts_the_batch_before_the_first_failure(store):
    good = put(store, "good", b"g" * 10)
    stage = resolver(store, mode="resolve")

    [out] = stage.process(batch_of([b"plain", good, encode_envelope("bucket", "missing", b"m"), b"after"]))

    assert out.batch.column("offset").to_pylist() == [0, 1] and out.batch.column("value")[1].as_py() == b"g" * 10
    assert (out.stop.record_id, out.stop.offset, out.stop.location) == ("t:0:2", 2, "s3://bucket/missing")
    assert "blob not found" in out.stop.message


def test_a_key_that_leaves_the_local_root_is_an_error_not_a_read(store, tmp_path):
    (tmp_path.parent / "secret").write_bytes(b"s")
    stage = resolver(store, on_error="dead_letter", mode="resolve", validate_checksum=False)

    [out] = stage.process(batch_of([encode_envelope("bucket", "../../secret", b"s")]))

    assert "is not a relative '/'-separated path" in out.invalid_reasons[0].as_py()
