"""Object keys of KafScale segments (docs/kafscale-format.md §1): `<namespace>/<topic>/<partition>/segment-<base>.kfs`
and `.index`.

Parsing is compatible with the Go iceberg-processor (`internal/discovery`), but stricter about numbers: only ASCII
digits are accepted (no sign), so negative partitions and `+5` are ignored rather than misread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

DEFAULT_NAMESPACE = "default"
SEGMENT_SUFFIX = ".kfs"
INDEX_SUFFIX = ".index"
PADDED_DIGITS = 20
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1

_SEGMENT_FILE = re.compile(r"segment-([0-9]+)\.(kfs|index)")
# Canonical decimal only, so a partition id maps to exactly one prefix (`0/`, never also `00/`).
_PARTITION = re.compile(r"0|[1-9][0-9]*")


class ObjectKind(Enum):
    SEGMENT = "kfs"
    INDEX = "index"

    @property
    def suffix(self) -> str:
        return "." + self.value


@dataclass(frozen=True)
class SegmentKey:
    """One parsed `.kfs` or `.index` key. `padded` is True when `<base>` has the writer's 20 digits."""

    key: str
    topic: str
    partition: int
    base_offset: int
    kind: ObjectKind
    padded: bool


def namespace_prefix(namespace: str) -> str:
    """`default` -> `default/`; empty (or only slashes) -> `` so keys start at the topic."""
    trimmed = namespace.strip("/")
    return f"{trimmed}/" if trimmed else ""


def _check_topic(topic: str) -> None:
    if not topic or "/" in topic:
        raise ValueError(f"topic name {topic!r} is not usable in an object key (empty or contains '/')")


def _check_partition(partition: int) -> None:
    if not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"partition {partition} is outside 0..{MAX_PARTITION}")


def topic_prefix(namespace: str, topic: str) -> str:
    _check_topic(topic)
    return f"{namespace_prefix(namespace)}{topic}/"


def partition_prefix(namespace: str, topic: str, partition: int) -> str:
    _check_partition(partition)
    return f"{topic_prefix(namespace, topic)}{partition}/"


def segment_key(namespace: str, topic: str, partition: int, base_offset: int, kind: ObjectKind) -> str:
    """The key a KafScale broker writes: base offset zero-padded to 20 digits."""
    if not 0 <= base_offset <= MAX_OFFSET:
        raise ValueError(f"base offset {base_offset} is outside 0..{MAX_OFFSET}")
    return f"{partition_prefix(namespace, topic, partition)}segment-{base_offset:0{PADDED_DIGITS}d}{kind.suffix}"


def parse_segment_key(key: str, namespace: str) -> SegmentKey | None:
    """Parse a segment or index key under `namespace`; None for anything else (manifest.json, `.kfst`, `.tmp`, ...)."""
    prefix = namespace_prefix(namespace)
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].split("/")
    if len(parts) != 3:
        return None
    topic, partition_text, filename = parts
    partition = parse_partition(partition_text)
    file_match = _SEGMENT_FILE.fullmatch(filename)
    if not topic or partition is None or file_match is None:
        return None
    digits = file_match.group(1)
    base_offset = int(digits)
    if base_offset > MAX_OFFSET:
        return None
    return SegmentKey(
        key=key,
        topic=topic,
        partition=partition,
        base_offset=base_offset,
        kind=ObjectKind(file_match.group(2)),
        padded=len(digits) == PADDED_DIGITS,
    )


def parse_partition(text: str) -> int | None:
    """A partition directory name: canonical non-negative decimal int32 (as the broker writes `%d`), else None."""
    if _PARTITION.fullmatch(text) is None:
        return None
    partition = int(text)
    return partition if partition <= MAX_PARTITION else None
