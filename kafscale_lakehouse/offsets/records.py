"""Keys and values of the processor's offsets, watermarks and leases (docs/kafscale-format.md §6-7), byte-compatible
with KafScale's Go iceberg-processor (`internal/checkpoint/etcd.go`).

Go's `json.Marshal` of its structs gives compact JSON with the fields in declaration order (strings escaped by the
shared Go-compatible `go_json_string`); the encoders here produce the same bytes. Both backends store exactly these
keys and bytes. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kafscale_lakehouse.format.headers_json import go_json_string
from kafscale_lakehouse.offsets.errors import CorruptOffsetRecordError, OffsetRegressionError

# KafScale's last-offset value for "nothing committed"; above this module that is a next offset of None.
NOTHING_COMMITTED = -1
# The Go processor writes generation 1 on every claim and renewal and never reads it back; we match its bytes and
# fence on the lease key's identity (etcd create_revision / local claim token) instead.
LEASE_GENERATION = 1

BROKER_TOPICS_PREFIX = "/kafscale/topics/"
_BROKER_NEXT_OFFSET_SUFFIX = "/next_offset"


@dataclass(frozen=True)
class CommittedOffset:
    """The value of an offsets or watermarks key. `offset` is the last committed offset (-1: nothing committed)."""

    offset: int
    last_timestamp_ms: int
    updated_at_ms: int

    @property
    def next_offset(self) -> int | None:
        """The next offset to read (None: nothing committed)."""
        return next_offset_of(self.offset)


def next_offset_of(last_offset: int) -> int | None:
    """KafScale's last committed offset as a next offset: the one conversion from the stored form."""
    return None if last_offset == NOTHING_COMMITTED else last_offset + 1


def last_offset_of(next_offset: int) -> int:
    """A next offset as KafScale's last committed offset: the one conversion to the stored form."""
    return next_offset - 1


NOT_COMMITTED = CommittedOffset(offset=NOTHING_COMMITTED, last_timestamp_ms=0, updated_at_ms=0)


def validate_topic(topic: str) -> None:
    # A '/' would make `<prefix>/offsets/<topic>/<p>` ambiguous; Kafka topic names never contain one.
    if not topic or "/" in topic:
        raise ValueError(f"topic {topic!r}: must be non-empty and contain no '/'")


def validate_partition(partition: int) -> None:
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"partition {partition!r}: expected an integer >= 0")


@dataclass(frozen=True)
class OffsetKeys:
    """The key layout under `offsets.key_prefix` (Go: `fmt.Sprintf("%s/leases/%s/%d", prefix, topic, partition)`)."""

    prefix: str

    def lease(self, topic: str, partition: int) -> str:
        return f"{self.prefix}/leases/{topic}/{partition}"

    def offset(self, topic: str, partition: int) -> str:
        return f"{self.prefix}/offsets/{topic}/{partition}"

    def offsets_prefix(self, topic: str) -> str:
        return f"{self.prefix}/offsets/{topic}/"

    def all_offsets_prefix(self) -> str:
        return f"{self.prefix}/offsets/"

    def partition_watermark(self, topic: str, partition: int) -> str:
        return f"{self.prefix}/watermarks/{topic}/{partition}"

    def partition_watermarks_prefix(self, topic: str) -> str:
        return f"{self.prefix}/watermarks/{topic}/"

    def topic_watermark(self, topic: str) -> str:
        return f"{self.prefix}/watermarks/{topic}"

    def run(self, topic: str, run_id: str) -> str:
        """Our own key (not KafScale's): where a run's data files are, until the run is known to have ended."""
        return f"{self.prefix}/runs/{topic}/{run_id}"

    def runs_prefix(self, topic: str) -> str:
        return f"{self.prefix}/runs/{topic}/"

    def table(self, topic: str) -> str:
        """Our own key (not KafScale's): the Iceberg table whose position the topic's offsets are."""
        return f"{self.prefix}/tables/{topic}"


@dataclass(frozen=True)
class TableIdentity:
    """The table (name and UUID) our offsets of a topic belong to, and the partitions it holds offsets of. The Go
    processor writes none: offsets without it are its own, the migration path."""

    name: str
    uuid: str
    partitions: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return json.dumps({"table": self.name, "uuid": self.uuid, "partitions": sorted(self.partitions)},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, location: str, key: str, value: bytes) -> TableIdentity:
        parsed = _json_object(location, key, value)
        name, uuid, partitions = parsed.get("table"), parsed.get("uuid"), parsed.get("partitions", [])
        if (not isinstance(name, str) or not isinstance(uuid, str) or not uuid or not isinstance(partitions, list)
                or not all(type(p) is int and p >= 0 for p in partitions)):
            raise CorruptOffsetRecordError(location, key, f"not a table identity: {value[:200]!r}")
        return cls(name, uuid, tuple(sorted(partitions)))


def broker_partitions_prefix(topic: str) -> str:
    return f"{BROKER_TOPICS_PREFIX}{topic}/partitions/"


def broker_next_offset_key(topic: str, partition: int) -> str:
    return f"{broker_partitions_prefix(topic)}{partition}{_BROKER_NEXT_OFFSET_SUFFIX}"


def encode_offset(record: CommittedOffset) -> bytes:
    return (
        f'{{"offset":{record.offset},"last_timestamp_ms":{record.last_timestamp_ms},'
        f'"updated_at":{record.updated_at_ms}}}'
    ).encode()


def encode_lease(owner_id: str, lease_expires_at_ms: int) -> bytes:
    return (
        f'{{"owner_id":{go_json_string(owner_id.encode())},"lease_expires_at":{lease_expires_at_ms},'
        f'"generation":{LEASE_GENERATION}}}'
    ).encode()


def _json_object(location: str, key: str, value: bytes) -> dict:
    try:
        parsed = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptOffsetRecordError(location, key, f"value is not JSON ({exc}): {value[:200]!r}") from None
    if not isinstance(parsed, dict):
        raise CorruptOffsetRecordError(location, key, f"value is not a JSON object: {value[:200]!r}")
    return parsed


def _int_field(location: str, key: str, parsed: dict, name: str) -> int:
    # Go unmarshals a missing field as 0, so do we; a wrong type is an error in Go and here.
    value = parsed.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptOffsetRecordError(location, key, f"field {name!r} is {value!r}, expected an integer")
    return value


def decode_offset(location: str, key: str, value: bytes) -> CommittedOffset:
    parsed = _json_object(location, key, value)
    return CommittedOffset(
        offset=_int_field(location, key, parsed, "offset"),
        last_timestamp_ms=_int_field(location, key, parsed, "last_timestamp_ms"),
        updated_at_ms=_int_field(location, key, parsed, "updated_at"),
    )


def decode_lease_owner(location: str, key: str, value: bytes) -> str:
    owner = _json_object(location, key, value).get("owner_id", "")
    if not isinstance(owner, str):
        raise CorruptOffsetRecordError(location, key, f"field 'owner_id' is {owner!r}, expected a string")
    return owner


def partition_from_key(location: str, key: str, prefix: str) -> int:
    """The partition number that follows `prefix` in `key`."""
    suffix = key[len(prefix):]
    if not suffix.isdigit() or not suffix.isascii():
        raise CorruptOffsetRecordError(location, key, f"expected <partition> after {prefix!r}, found {suffix!r}")
    return int(suffix)


def decode_partition_offsets(location: str, prefix: str,
                             entries: Iterable[tuple[str, bytes]]) -> dict[int, CommittedOffset]:
    """`{partition: value}` of the `<prefix><partition>` keys among `entries`."""
    return {partition_from_key(location, key, prefix): decode_offset(location, key, value) for key, value in entries}


def decode_broker_watermarks(location: str, topic: str, entries: Iterable[tuple[str, bytes]]) -> dict[int, int]:
    """`{partition: next_offset}` from the broker's `/kafscale/topics/<topic>/partitions/<p>/next_offset` keys.

    Other keys under the partitions prefix (the protobuf PartitionState at `.../partitions/<p>`) are not ours.
    """
    prefix = broker_partitions_prefix(topic)
    watermarks: dict[int, int] = {}
    for key, value in entries:
        if not key.endswith(_BROKER_NEXT_OFFSET_SUFFIX):
            continue
        partition = partition_from_key(location, key.removesuffix(_BROKER_NEXT_OFFSET_SUFFIX), prefix)
        text = value.decode("ascii", errors="replace").strip()
        if not text.isdigit():
            raise CorruptOffsetRecordError(location, key, f"next_offset is {value[:40]!r}, expected ASCII decimal")
        watermarks[partition] = int(text)
    return watermarks


def plan_offset_writes(
    location: str,
    keys: OffsetKeys,
    topic: str,
    new_offsets: Mapping[int, tuple[int, int]],
    committed: Mapping[int, CommittedOffset],
    partition_watermarks: Mapping[int, CommittedOffset],
    now_ms: int,
    allow_backwards: bool,
) -> dict[str, bytes]:
    """Every key a commit writes, with its bytes: per partition the offsets and watermarks keys (same value, as in
    Go), and the topic watermark = the partition watermark with the minimum offset over all partitions of the topic.

    `new_offsets` is `{partition: (next offset, last_timestamp_ms)}`; the keys hold the last offset (next - 1).

    `committed` and `partition_watermarks` are the current values; a commit below `committed` is refused unless
    `allow_backwards` (repair from the table).
    """
    writes: dict[str, bytes] = {}
    watermarks = dict(partition_watermarks)
    for partition, (next_offset, last_timestamp_ms) in sorted(new_offsets.items()):
        if isinstance(next_offset, bool) or not isinstance(next_offset, int) or next_offset < 0:
            raise ValueError(f"{topic}/{partition}: next offset {next_offset!r} is not an integer >= 0")
        offset = last_offset_of(next_offset)
        current = committed.get(partition, NOT_COMMITTED).offset
        if offset < current and not allow_backwards:
            raise OffsetRegressionError(location, keys.offset(topic, partition), current, offset)
        record = CommittedOffset(offset=offset, last_timestamp_ms=last_timestamp_ms, updated_at_ms=now_ms)
        value = encode_offset(record)
        writes[keys.offset(topic, partition)] = value
        writes[keys.partition_watermark(topic, partition)] = value
        watermarks[partition] = record
    # Go takes the first minimum in etcd key order (lexicographic: "10" sorts before "2").
    minimum = min((watermarks[p] for p in sorted(watermarks, key=str)), key=lambda record: record.offset)
    writes[keys.topic_watermark(topic)] = encode_offset(minimum)
    return writes
