"""Retention headroom: how long until retention deletes a segment not landed yet, and how far back the log reaches.

KafScale keeps `retention.ms` and `retention.bytes` per topic in etcd (`/kafscale/topics/<topic>/config`, the protobuf
`TopicConfig` of `proto/metadata/metadata.proto`: fields 4 and 5; 0 or -1 mean unlimited; set with Kafka's
AlterConfigs). The broker stores and serves them; what deletes segments is whatever enforces retention (KafScale's
operator, an S3 lifecycle rule). Both act on whole segments, oldest first, as Kafka does:
- by time: a segment goes once its object is older than `retention.ms` (an S3 lifecycle rule counts from the object's
  last-modified time, which for an immutable segment is its upload);
- by size: the oldest segments go while the partition's other segments alone hold `retention.bytes` or more.

The segment at risk is the oldest one holding offsets not landed yet (it contains the committed next offset). Its
headroom is the time (and the bytes the partition may still grow) before one of the two rules deletes it. A gap is
certain when offsets not landed are already gone (the oldest segment starts after the committed next offset), or
when a rule's limit is already passed (the next enforcement deletes them). The replay window is how far back the log
still reaches: from its oldest segment's base offset, written that many seconds ago.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from kafscale_lakehouse.etcd import EtcdClient
from kafscale_lakehouse.storage.errors import StorageError
from kafscale_lakehouse.storage.keys import ObjectKind, parse_segment_key, partition_prefix, segment_key
from kafscale_lakehouse.storage.store import SegmentStore

TOPIC_CONFIG_PREFIX = "/kafscale/topics/"
_RETENTION_MS_FIELD = 4
_RETENTION_BYTES_FIELD = 5
_CONFIG_MAP_FIELD = 8


class TopicConfigError(StorageError):
    """The broker's topic config in etcd cannot be read as KafScale's `TopicConfig`."""


def topic_config_key(topic: str) -> str:
    """Where KafScale keeps a topic's config (`pkg/metadata/codec.go`, `TopicConfigKey`)."""
    return f"{TOPIC_CONFIG_PREFIX}{topic}/config"


@dataclass(frozen=True)
class RetentionPolicy:
    """A topic's retention; None: unlimited (KafScale's 0 or -1, or no config stored)."""

    retention_ms: int | None = None
    retention_bytes: int | None = None

    @property
    def limited(self) -> bool:
        return self.retention_ms is not None or self.retention_bytes is not None

    def describe(self) -> str:
        parts = [f"retention.ms {self.retention_ms}" if self.retention_ms is not None else None,
                 f"retention.bytes {self.retention_bytes}" if self.retention_bytes is not None else None]
        return ", ".join(p for p in parts if p) or "unlimited retention"


def _varint(raw: bytes, at: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(raw):
            raise TopicConfigError(f"{where}: truncated varint at byte {at}")
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise TopicConfigError(f"{where}: varint longer than 10 bytes at byte {at}")


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(raw: bytes, where: str) -> Iterable[tuple[int, int | bytes]]:
    """(field number, varint value or length-delimited bytes) of a protobuf message; fixed32/64 are skipped."""
    at = 0
    while at < len(raw):
        tag, at = _varint(raw, at, where)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, at = _varint(raw, at, where)
            yield number, value
        elif wire_type == 2:
            length, at = _varint(raw, at, where)
            if at + length > len(raw):
                raise TopicConfigError(f"{where}: field {number} runs past the end ({length} bytes at byte {at})")
            yield number, raw[at:at + length]
            at += length
        elif wire_type == 1:
            at += 8
        elif wire_type == 5:
            at += 4
        else:
            raise TopicConfigError(f"{where}: field {number} has wire type {wire_type}, which TopicConfig never uses")
    if at != len(raw):
        raise TopicConfigError(f"{where}: a fixed-size field runs past the end")


def _limit(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def parse_topic_config(raw: bytes, where: str) -> RetentionPolicy:
    """The retention of a `TopicConfig`. The typed fields win; `retention.ms`/`retention.bytes` in its free-form
    config map (field 8) count where a typed field is unset."""
    typed: dict[int, int] = {}
    extra: dict[str, str] = {}
    for number, value in _fields(raw, where):
        if number in (_RETENTION_MS_FIELD, _RETENTION_BYTES_FIELD) and isinstance(value, int):
            typed[number] = _signed64(value)
        elif number == _CONFIG_MAP_FIELD and isinstance(value, bytes):
            entry = {n: v for n, v in _fields(value, f"{where} config entry") if isinstance(v, bytes)}
            extra[entry.get(1, b"").decode("utf-8", "replace")] = entry.get(2, b"").decode("utf-8", "replace")

    def pick(number: int, name: str) -> int | None:
        if typed.get(number):
            return _limit(typed[number])
        text = extra.get(name)
        if text is None:
            return None
        try:
            return _limit(int(text))
        except ValueError as exc:
            raise TopicConfigError(f"{where}: {name} is {text!r}, not an integer") from exc

    return RetentionPolicy(pick(_RETENTION_MS_FIELD, "retention.ms"), pick(_RETENTION_BYTES_FIELD, "retention.bytes"))


def read_retention(etcd: EtcdClient, topic: str) -> RetentionPolicy:
    """The topic's retention as the broker keeps it in etcd; unlimited when no config is stored (KafScale's
    default). `EtcdError` when etcd fails, `TopicConfigError` for a value that is not a `TopicConfig`."""
    key = topic_config_key(topic)
    raw = etcd.get(key)
    return RetentionPolicy() if raw is None else parse_topic_config(raw, f"etcd key {key}")


@dataclass(frozen=True)
class LogSegment:
    """A segment object of a partition's log as listed: base offset, size, upload time."""

    base_offset: int
    size: int
    last_modified: datetime
    key: str


@dataclass(frozen=True)
class PartitionRetention:
    """Retention headroom and replay window of one partition at `now`."""

    partition: int
    # Seconds until retention deletes the oldest segment holding offsets not landed; None: none at risk (nothing
    # pending in the log, or retention unlimited by time). Negative: past due.
    headroom_seconds: float | None
    # Bytes the partition may still grow before `retention.bytes` deletes that segment; None as above.
    headroom_bytes: int | None
    log_start_offset: int | None  # the oldest offset the log still holds (None: no segment)
    replay_window_seconds: float | None  # age of the oldest segment: how far back a replay can reach
    replay_window_records: int | None  # offsets the log holds behind the committed next offset
    at_risk_key: str | None  # the segment the headroom is about
    gap: str | None = None  # why offsets not landed are gone or certain to go; None: no gap

    def headroom_below(self, seconds: float) -> bool:
        return self.headroom_seconds is not None and self.headroom_seconds < seconds


@dataclass(frozen=True)
class PartitionLog:
    """What retention acts on in one partition: its oldest segment, and the segments holding offsets not landed."""

    oldest: LogSegment | None  # None: the partition holds no segment
    pending: list[LogSegment]  # from the segment holding the committed next offset on, oldest first


def _segments(store: SegmentStore, prefix: str, partition: int, start_after: str | None = None
              ) -> Iterator[LogSegment]:
    for info in store.list_objects(prefix, start_after=start_after):
        parsed = parse_segment_key(info.key, store.namespace)
        if parsed is not None and parsed.kind is ObjectKind.SEGMENT and parsed.partition == partition:
            yield LogSegment(parsed.base_offset, info.size, info.last_modified, info.key)


def read_partition_log(store: SegmentStore, topic: str, partition: int, next_offset: int | None,
                       log_end: int | None) -> PartitionLog:
    """The partition's oldest segment (one listing page) and its pending segments, listed from the committed next
    offset on: the cost follows the data not landed, not what retention keeps. Runs commit whole segments, so a
    segment normally starts at the next offset; when one holds it inside (offsets committed by the Go processor), the
    partition is listed in full to find it."""
    prefix = partition_prefix(store.namespace, topic, partition)
    if next_offset is None:  # nothing landed: every segment is pending, one listing
        every = list(_segments(store, prefix, partition))
        return PartitionLog(every[0] if every else None, every)
    oldest = next(_segments(store, prefix, partition), None)
    if oldest is None:
        return PartitionLog(None, [])
    if next_offset <= oldest.base_offset:
        return PartitionLog(oldest, list(_segments(store, prefix, partition)))
    after = segment_key(store.namespace, topic, partition, next_offset - 1, ObjectKind.SEGMENT)
    listed = list(_segments(store, prefix, partition, start_after=after))
    starts_at_next = listed[0].base_offset == next_offset if listed else (log_end is None or log_end <= next_offset)
    if starts_at_next:
        return PartitionLog(oldest, listed)
    holder = [s for s in _segments(store, prefix, partition) if s.base_offset < next_offset][-1:]
    return PartitionLog(oldest, holder + listed)


def partition_retention(partition: int, log: PartitionLog, next_offset: int | None, policy: RetentionPolicy,
                        now: datetime, log_end: int | None = None) -> PartitionRetention:
    """Headroom and replay window of one partition from its log, its committed next offset (None: nothing landed:
    every segment is pending) and the broker's watermark (None: unknown)."""
    oldest = log.oldest
    if oldest is None:
        gap = None
        if next_offset is not None and log_end is not None and next_offset < log_end:
            gap = f"offsets {next_offset}..{log_end - 1} are not landed and the log holds no segment any more"
        return PartitionRetention(partition, None, None, None, None, None, None, gap)
    replay_seconds = (now - oldest.last_modified).total_seconds()
    replay_records = None if next_offset is None else max(0, next_offset - oldest.base_offset)
    gap = None
    if next_offset is not None and next_offset < oldest.base_offset:
        gap = (f"offsets {next_offset}..{oldest.base_offset - 1} are not landed and no longer in the log (it starts "
               f"at {oldest.key})")
    if not log.pending:
        return PartitionRetention(partition, None, None, oldest.base_offset, replay_seconds, replay_records, None, gap)
    at_risk = log.pending[0]
    headroom_seconds = headroom_bytes = None
    if policy.retention_ms is not None:
        headroom_seconds = policy.retention_ms / 1000 - (now - at_risk.last_modified).total_seconds()
    if policy.retention_bytes is not None:
        headroom_bytes = policy.retention_bytes - sum(s.size for s in log.pending[1:])
    if gap is None:
        pending = f"{at_risk.key}, which holds offsets not landed yet,"
        if headroom_seconds is not None and headroom_seconds <= 0:
            gap = (f"{pending} is {-headroom_seconds:.0f} s past retention.ms {policy.retention_ms}: the next "
                   "retention pass deletes it")
        elif headroom_bytes is not None and headroom_bytes <= 0:
            newer = sum(s.size for s in log.pending[1:])
            gap = (f"{pending} is followed by {newer} bytes of newer segments, over retention.bytes "
                   f"{policy.retention_bytes}: the next retention pass deletes it")
    return PartitionRetention(partition, headroom_seconds, headroom_bytes, oldest.base_offset, replay_seconds,
                              replay_records, at_risk.key, gap)


@dataclass(frozen=True)
class TopicRetention:
    """A topic's retention and, per partition, its headroom and replay window."""

    topic: str
    policy: RetentionPolicy
    partitions: dict[int, PartitionRetention]

    @property
    def gaps(self) -> dict[int, str]:
        return {p: r.gap for p, r in sorted(self.partitions.items()) if r.gap is not None}

    @property
    def min_headroom_seconds(self) -> float | None:
        return min((r.headroom_seconds for r in self.partitions.values() if r.headroom_seconds is not None),
                   default=None)


def topic_retention(store: SegmentStore, etcd: EtcdClient | None, topic: str,
                    positions: Mapping[int, tuple[int | None, int | None]], now: datetime, *,
                    list_unlimited: bool = True) -> TopicRetention:
    """Retention of `topic` for the partitions in `positions` (`{partition: (committed next offset, broker
    watermark)}`). Without etcd (offsets backend local, no broker metadata) retention is taken as unlimited: the
    replay window is still reported, unless `list_unlimited` is False (a batch over many topics lists the segments
    of limited topics only: nothing of an unlimited one is at risk). Raises `EtcdError`, `TopicConfigError`,
    `StorageError`."""
    policy = read_retention(etcd, topic) if etcd is not None else RetentionPolicy()
    partitions: dict[int, PartitionRetention] = {}
    if not policy.limited and not list_unlimited:
        return TopicRetention(topic, policy, partitions)
    for partition, (next_offset, log_end) in sorted(positions.items()):
        log = read_partition_log(store, topic, partition, next_offset, log_end)
        partitions[partition] = partition_retention(partition, log, next_offset, policy, now, log_end)
    return TopicRetention(topic, policy, partitions)
