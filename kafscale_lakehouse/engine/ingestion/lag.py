"""Lag: the one definition the sensor, the run, the freshness check, the report and `serve-metrics` share.

Lag is the number of records the log holds that the table does not: the log end (the broker's `next_offset`
watermark, docs/kafscale-format.md §6) minus the partition's next offset to ingest (nothing committed counts from 0),
never below 0. Without a broker watermark the freshness check measures against the end of the completed segments.
"""

from __future__ import annotations

BROKER_WATERMARK = "broker watermark"
COMPLETED_SEGMENTS = "completed segments"


def lag(log_end: int | None, next_offset: int | None) -> int | None:
    """Records in `[next_offset, log_end)`; None when the log end is unknown."""
    if log_end is None:
        return None
    return max(0, log_end - (next_offset or 0))


def lag_and_reference(log_end: int | None, segments_end: int | None, next_offset: int | None) -> tuple[int, str]:
    """The lag against the broker watermark (`log_end`), else against the end of the completed segments (0 when
    none were seen), and which of the two it was measured against."""
    if log_end is not None:
        return lag(log_end, next_offset), BROKER_WATERMARK  # type: ignore[return-value]
    return lag(segments_end, next_offset) or 0, COMPLETED_SEGMENTS
