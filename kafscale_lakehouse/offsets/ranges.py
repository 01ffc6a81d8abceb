"""The offset vocabulary above the KafScale keys: a partition's position is its *next offset* (the first offset not
yet committed; an exclusive end), `None` when nothing is committed (reading then starts at the oldest segment, like
a Kafka consumer with `auto.offset.reset=earliest`); a run's work on a partition is an `OffsetRange`.

Only `offsets/records.py` speaks KafScale's "last committed offset" (-1: nothing committed); it converts at the
edge with `next_offset_of` / `last_offset_of`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets `start .. end - 1` of one Kafka partition (`end` exclusive: the next offset after the range)."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        for name in ("partition", "start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"offset range {self.partition}:[{self.start}, {self.end}): {name} {value!r} is "
                                 "not an integer >= 0")
        if self.start > self.end:
            raise ValueError(f"partition {self.partition}: offset range [{self.start}, {self.end}) ends before it "
                             "starts")

    @property
    def count(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.partition}:[{self.start}, {self.end})"


def ranges_by_partition(ranges: Iterable[OffsetRange]) -> dict[int, OffsetRange]:
    by_partition: dict[int, OffsetRange] = {}
    for offset_range in ranges:
        if offset_range.partition in by_partition:
            raise ValueError(f"two offset ranges of partition {offset_range.partition}: "
                             f"{by_partition[offset_range.partition]} and {offset_range}")
        by_partition[offset_range.partition] = offset_range
    return by_partition


def format_ranges(ranges: Mapping[int, OffsetRange]) -> str:
    """`{"<partition>": [start, end]}`, compact, partitions in numeric order (run tags, run metadata)."""
    return json.dumps({str(p): [ranges[p].start, ranges[p].end] for p in sorted(ranges)}, separators=(",", ":"))


def parse_ranges(text: str, *, where: str) -> dict[int, OffsetRange]:
    """The inverse of `format_ranges`; a `ValueError` names `where` the text came from."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        return {int(p): OffsetRange(int(p), *_pair(r)) for p, r in raw.items()}
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {text[:200]!r} is not a partition → [start, end) map ({exc})") from None


def _pair(value: object) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2 or not all(type(v) is int for v in value):
        raise ValueError(f"{value!r} is not [start, end]")
    return value[0], value[1]
