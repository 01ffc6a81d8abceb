"""What one Spark write task saw of the `kafscale` source: the rows to write, and what must not be written.

The sink writes rows of the `kafscale` source (one `SegmentRunPartition` per task, so one Kafka partition). Before
the rows reach Parquet, error-marker rows (a segment that could not be read) and invalid records (a required mapped
column missing or not coercible) are taken out and accounted for here, so the driver can decide what to commit:
offsets up to the first failed segment, and nothing at all while invalid records have nowhere to go.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from kafscale_lakehouse.engine.kafscale_source import (
    INVALID_REASON_COLUMN,
    SegmentReadFailure,
    error_markers,
    is_error_marker,
)

MAX_INVALID_SAMPLES = 20


@dataclass(frozen=True)
class InvalidRecord:
    record_id: str
    reason: str


@dataclass
class SourceTaskStats:
    """Per Kafka partition: offsets and rows of the valid records a task wrote, plus what it held back."""

    first_offset: dict[int, int] = field(default_factory=dict)
    last_offset: dict[int, int] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    value_bytes: dict[int, int] = field(default_factory=dict)
    max_timestamp_ms: dict[int, int] = field(default_factory=dict)
    failures: list[SegmentReadFailure] = field(default_factory=list)
    invalid_count: int = 0
    invalid_samples: list[InvalidRecord] = field(default_factory=list)

    @property
    def partitions(self) -> set[int]:
        return set(self.rows) | {f.partition for f in self.failures}


class SourceRowSplitter:
    """Filters a task's Arrow batches down to the valid records (without the reason column) and keeps stats."""

    def __init__(self) -> None:
        self.stats = SourceTaskStats()

    def rows_to_write(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            markers = is_error_marker(batch)
            if pc.any(markers).as_py():
                self.stats.failures.extend(error_markers(batch))
                batch = batch.filter(pc.invert(markers))
            if INVALID_REASON_COLUMN in batch.schema.names:
                reasons = batch.column(INVALID_REASON_COLUMN)
                if reasons.null_count < batch.num_rows:
                    self._hold_back_invalid(batch, reasons)
                    batch = batch.filter(pc.is_null(reasons))
                batch = batch.drop_columns([INVALID_REASON_COLUMN])
            if batch.num_rows:
                self._count(batch)
                yield batch

    def _hold_back_invalid(self, batch: pa.RecordBatch, reasons: pa.Array) -> None:
        invalid = batch.select(["record_id"]).append_column("reason", reasons).filter(pc.is_valid(reasons))
        self.stats.invalid_count += invalid.num_rows
        room = MAX_INVALID_SAMPLES - len(self.stats.invalid_samples)
        for row in invalid.slice(0, max(room, 0)).to_pylist():
            self.stats.invalid_samples.append(InvalidRecord(row["record_id"], row["reason"]))

    def _count(self, batch: pa.RecordBatch) -> None:
        s = self.stats
        partitions = pc.unique(batch.column("partition")).to_pylist()
        for partition in partitions:
            rows = batch if len(partitions) == 1 else batch.filter(pc.equal(batch.column("partition"), partition))
            offsets = pc.min_max(rows.column("offset"))
            first, last = offsets["min"].as_py(), offsets["max"].as_py()
            s.first_offset[partition] = min(first, s.first_offset.get(partition, first))
            s.last_offset[partition] = max(last, s.last_offset.get(partition, last))
            s.rows[partition] = s.rows.get(partition, 0) + rows.num_rows
            value_bytes = pc.sum(pc.binary_length(rows.column("value"))).as_py() or 0
            s.value_bytes[partition] = s.value_bytes.get(partition, 0) + value_bytes
            max_ts = pc.max(rows.column("timestamp_ms")).as_py()
            s.max_timestamp_ms[partition] = max(max_ts, s.max_timestamp_ms.get(partition, max_ts))
