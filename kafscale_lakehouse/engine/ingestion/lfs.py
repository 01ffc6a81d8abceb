"""Large File Support on the executors: what an ingestion task does with records whose value is an LFS envelope.

Per `mappings[].lfs` (config.LfsConfig, docs/kafscale-format.md §9), for each Arrow batch of decoded records:
- detection is vectorized (`format.lfs.lfs_envelope_mask`): a batch without envelopes passes through untouched;
- `skip`: envelope records are taken out and counted (`records_total{result="skipped_lfs"}`);
- `reference`: the value stays the envelope; `resolve`: the value becomes the blob; `hybrid`: resolve when
  `0 < size <= max_inline_size`, else reference;
- `store_metadata`: the six `lfs_*` columns (null for records that are no envelope).

Blobs are read from the envelope's bucket (Go reads `s3.bucket`) with the segment store's S3 settings (endpoint,
credentials, path style; reads need no SSE settings), or, for a local segment store, from `<local_root>/<bucket>/<key>`.
`resolve_concurrency` threads fetch them; each blob streams through its checksum, and a blob over the limit
(`max_inline_size` when > 0) is refused from its Content-Length or stops being read once past it, so it is never
held whole. Resolved bytes are held for at most `RESOLVE_BATCH_BYTES` (by envelope size) at a time: a batch with
more is split into smaller batches.

Where the Go processor drops a record (bad envelope, missing blob, checksum mismatch, blob over the limit) we never
do. With `on_error="dead_letter"` (schema mode lenient) the record keeps its envelope and gets an invalid reason,
so it goes to the dead-letter table. With `on_error="stop"` the batch ends before the record and the failure is
returned (`LfsFailure`), so the partition stops there; the reader raises it as a `SegmentReadError`
(out of band, like a segment that cannot be read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafscale_lakehouse.config import LfsConfig
from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.tables.summary import LfsStats
from kafscale_lakehouse.format.lfs import (
    LFS_METADATA_FIELDS,
    ChecksumVerifier,
    LfsChecksumError,
    LfsEnvelope,
    LfsEnvelopeError,
    lfs_envelope_mask,
    parse_envelope,
)
from kafscale_lakehouse.storage import (
    LocalSegmentStore,
    ObjectNotFoundError,
    S3SegmentStore,
    SegmentStore,
    StorageError,
)

log = logging.getLogger(__name__)

LfsOnError = Literal["dead_letter", "stop"]
RESOLVE_BATCH_BYTES = 64 << 20
STREAM_CHUNK_BYTES = 1 << 20
# Go's `lfs_resolution_errors_total` reasons: the envelope does not decode, or the blob cannot be resolved.
ERROR_DECODE = "decode"
ERROR_RESOLVE = "resolve"
LFS_ERROR_TYPE = "LfsResolutionError"


@dataclass(frozen=True)
class LfsReadSettings:
    """What a read does with envelopes: the mapping's `lfs` block and where failures go (in the task spec)."""

    config: LfsConfig
    on_error: LfsOnError = "stop"


def lfs_read_settings(config: LfsConfig, schema_mode: str) -> LfsReadSettings | None:
    """The settings of a mapping's reads, None when LFS changes nothing (mode off, no metadata columns)."""
    if config.mode == "off" and not config.store_metadata:
        return None
    return LfsReadSettings(config, "dead_letter" if schema_mode == "lenient" else "stop")


@dataclass(frozen=True)
class LfsFailure:
    """A record that could not be handled: which record, which blob, why."""

    record_id: str
    offset: int
    location: str | None  # s3://bucket/key, None when the envelope does not even decode
    reason: str  # ERROR_DECODE or ERROR_RESOLVE
    message: str

    def describe(self) -> str:
        blob = f" blob {self.location}:" if self.location else ""
        return f"record {self.record_id} (LFS{blob} {self.message})"


@dataclass
class LfsBatch:
    """`batch`: the records to go on (BASE_SCHEMA, values resolved); `metadata`: the `lfs_*` columns for them
    (empty unless `store_metadata`); `invalid_reasons`: per row, why the record is invalid (dead_letter), or None;
    `stop`: the record the partition stops at (on_error stop), the batch then holds only the rows before it."""

    batch: pa.RecordBatch
    metadata: dict[str, pa.Array]
    invalid_reasons: pa.Array | None = None
    stop: LfsFailure | None = None


class LfsBlobFetchError(EngineError):
    """A blob of an LFS envelope could not be fetched (missing, S3 error, over the size limit)."""


class BlobReader:
    """Reads blobs with the segment store's settings, from any bucket. Thread-safe (a store per bucket)."""

    def __init__(self, store: SegmentStore) -> None:
        self._store = store
        self._buckets: dict[str, SegmentStore] = {}

    def _store_for(self, bucket: str) -> tuple[SegmentStore, str]:
        if isinstance(self._store, LocalSegmentStore):
            return self._store, bucket
        if not isinstance(self._store, S3SegmentStore):
            raise TypeError(f"LFS blobs cannot be read through a {type(self._store).__name__}")
        if bucket == self._store.bucket:
            return self._store, ""
        if bucket not in self._buckets:  # benign race: two threads may both create one
            s = self._store
            access_key_id, secret_access_key, session_token = s.static_credentials
            self._buckets[bucket] = S3SegmentStore(
                bucket, namespace=s.namespace, endpoint=s.endpoint, region=s.region, path_style=s.path_style,
                access_key_id=access_key_id, secret_access_key=secret_access_key, session_token=session_token,
                max_attempts=s.max_attempts, connect_timeout_seconds=s.connect_timeout_seconds,
                read_timeout_seconds=s.read_timeout_seconds)
        return self._buckets[bucket], ""

    def read(self, envelope: LfsEnvelope, limit: int | None, verifier: ChecksumVerifier) -> bytes:
        """The blob, checked against `limit` and `verifier` while it streams."""
        store, prefix = self._store_for(envelope.bucket)
        key = f"{prefix}/{envelope.key}" if prefix else envelope.key
        try:
            size, chunks = store.open_stream(key, STREAM_CHUNK_BYTES)
        except ValueError as exc:  # a key the local store cannot map to a path
            raise LfsBlobFetchError(str(exc)) from None
        except ObjectNotFoundError:
            raise LfsBlobFetchError(f"blob not found in {store.location}") from None
        except StorageError as exc:
            raise LfsBlobFetchError(str(exc)) from None
        try:
            if limit is not None and size > limit:
                raise LfsBlobFetchError(f"blob is {size} bytes, over max_inline_size {limit}")
            parts, read = [], 0
            for chunk in chunks:
                read += len(chunk)
                if limit is not None and read > limit:  # the object grew since its Content-Length
                    raise LfsBlobFetchError(f"blob is over max_inline_size {limit} bytes")
                verifier.update(chunk)
                parts.append(chunk)
        except StorageError as exc:
            raise LfsBlobFetchError(str(exc)) from None
        finally:
            close = getattr(chunks, "close", None)  # a generator: stops its GET when not read to the end
            if close is not None:
                close()
        verifier.verify()
        return b"".join(parts)


class LfsResolver:
    """One per task: turns batches of decoded records into `LfsBatch`es (module docstring); `stats` accumulates."""

    def __init__(self, settings: LfsReadSettings, store: SegmentStore, stats: LfsStats | None = None) -> None:
        self.settings = settings
        self.stats = stats if stats is not None else LfsStats()
        self._reader = BlobReader(store)
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def process(self, batch: pa.RecordBatch) -> Iterator[LfsBatch]:
        config = self.settings.config
        if config.mode == "off" or batch.num_rows == 0:
            yield LfsBatch(batch, self._null_metadata(batch.num_rows))
            return
        mask = lfs_envelope_mask(batch.column("value"))
        if not pc.any(mask).as_py():
            yield LfsBatch(batch, self._null_metadata(batch.num_rows))
            return
        if config.mode == "skip":
            kept = batch.filter(pc.invert(mask))
            self.stats.skipped += batch.num_rows - kept.num_rows
            yield LfsBatch(kept, self._null_metadata(kept.num_rows))
            return
        rows = pc.indices_nonzero(mask).to_pylist()
        values = batch.column("value").take(rows).to_pylist()
        record_ids = batch.column("record_id").take(rows).to_pylist()
        offsets = batch.column("offset").take(rows).to_pylist()
        # Split where the blobs to resolve would exceed RESOLVE_BATCH_BYTES, so only that much is held at once.
        start_row = 0
        pending: list[tuple[int, str, int, LfsEnvelope | LfsEnvelopeError, bool]] = []  # rows up to the next split
        budget = 0
        for i, row in enumerate(rows):
            envelope_or_error = _parse(values[i])
            resolve = isinstance(envelope_or_error, LfsEnvelope) and self._resolves(envelope_or_error)
            # An envelope without a size (0) counts as a full chunk: still bounded, if loosely.
            size = 0
            if resolve and isinstance(envelope_or_error, LfsEnvelope):
                size = envelope_or_error.size or STREAM_CHUNK_BYTES
            if pending and resolve and budget + size > RESOLVE_BATCH_BYTES:
                end_row = row
                result = self._finish(batch.slice(start_row, end_row - start_row), start_row, pending)
                yield result
                if result.stop is not None:
                    return
                start_row, pending, budget = end_row, [], 0
            pending.append((row, record_ids[i], offsets[i], envelope_or_error, resolve))
            budget += size
        yield self._finish(batch.slice(start_row), start_row, pending)

    def _resolves(self, envelope: LfsEnvelope) -> bool:
        config = self.settings.config
        if config.mode == "resolve":
            return True
        return config.mode == "hybrid" and 0 < envelope.size <= config.max_inline_size

    def _finish(self, batch: pa.RecordBatch, first_row: int, pending: list) -> LfsBatch:
        """Resolve the envelopes of `pending` (rows relative to the whole batch) within `batch`."""
        config = self.settings.config
        limit = config.max_inline_size if config.max_inline_size > 0 else None
        to_fetch = [item[3] for item in pending if item[4]]
        fetched = iter(self._fetch_all(to_fetch, limit)) if to_fetch else iter(())
        replaced: list[tuple[int, bytes]] = []  # (row in batch, resolved value)
        metadata_rows: list[tuple[int, dict]] = []
        failures: list[tuple[int, LfsFailure]] = []
        for row, record_id, offset, envelope, resolve in pending:
            local = row - first_row
            if isinstance(envelope, LfsEnvelopeError):
                failures.append((local, LfsFailure(record_id, offset, None, ERROR_DECODE, str(envelope))))
                continue
            if not resolve:
                metadata_rows.append((local, envelope.metadata()))
                continue
            outcome = next(fetched)
            if isinstance(outcome, LfsFailure):
                failures.append((local, LfsFailure(record_id, offset, envelope.location, outcome.reason,
                                                   outcome.message)))
                continue
            data, seconds = outcome
            replaced.append((local, data))
            metadata_rows.append((local, envelope.resolved_metadata(len(data))))
            self.stats.resolved += 1
            self.stats.resolved_bytes += len(data)
            self.stats.observe(seconds)

        stop = None
        reasons = None
        if failures and self.settings.on_error == "stop":
            cut, stop = failures[0]
            batch = batch.slice(0, cut)
            replaced = [(r, v) for r, v in replaced if r < cut]
            metadata_rows = [(r, m) for r, m in metadata_rows if r < cut]
            self.stats.errors[stop.reason] += 1
        elif failures:
            for _, failure in failures:
                self.stats.errors[failure.reason] += 1
                log.warning("%s: to the dead-letter table", failure.describe())
            reasons = _scatter(batch.num_rows, [(r, f"LFS{' blob ' + f.location if f.location else ''}: {f.message}")
                                                for r, f in failures], pa.string())
        if replaced:
            value_type = batch.schema.field("value").type
            column = _scatter_into(batch.column("value"), replaced, value_type)
            batch = batch.set_column(batch.schema.get_field_index("value"), batch.schema.field("value"), column)
        metadata = {}
        if config.store_metadata:
            for f in LFS_METADATA_FIELDS:
                metadata[f.name] = _scatter(batch.num_rows, [(r, m[f.name]) for r, m in metadata_rows], f.type)
        return LfsBatch(batch, metadata, reasons, stop)

    def _fetch_all(self, envelopes: list[LfsEnvelope], limit: int | None) -> list:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(1, self.settings.config.resolve_concurrency),
                                            thread_name_prefix="lfs-resolve")
        return list(self._pool.map(lambda envelope: self._fetch(envelope, limit), envelopes))

    def _fetch(self, envelope: LfsEnvelope, limit: int | None) -> tuple[bytes, float] | LfsFailure:
        started = time.perf_counter()
        try:
            verifier = ChecksumVerifier(envelope, enabled=self.settings.config.validate_checksum)
            data = self._reader.read(envelope, limit, verifier)
        except (LfsBlobFetchError, LfsChecksumError, LfsEnvelopeError) as exc:
            return LfsFailure("", -1, envelope.location, ERROR_RESOLVE, str(exc))
        return data, time.perf_counter() - started

    def _null_metadata(self, rows: int) -> dict[str, pa.Array]:
        if not self.settings.config.store_metadata:
            return {}
        return {f.name: pa.nulls(rows, f.type) for f in LFS_METADATA_FIELDS}


def _parse(value: bytes) -> LfsEnvelope | LfsEnvelopeError:
    try:
        return parse_envelope(value)
    except LfsEnvelopeError as exc:
        return exc


def _scatter(length: int, items: list[tuple[int, object]], type_: pa.DataType) -> pa.Array:
    """An array of `length` nulls with `items` (row, value) set, without per-row Python for the other rows."""
    return _scatter_into(pa.nulls(length, type_), items, type_)


def _scatter_into(array: pa.Array, items: Sequence[tuple[int, object]], type_: pa.DataType) -> pa.Array:
    if not items:
        return array
    mask = np.zeros(len(array), dtype=bool)
    mask[[row for row, _ in items]] = True
    return pc.replace_with_mask(array, mask, pa.array([value for _, value in items], type_))
