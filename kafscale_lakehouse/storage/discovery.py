"""Which topics and partitions exist: `discovery.mode` `auto | etcd | s3` (docs/kafscale-format.md §6).

Compatible with the Go iceberg-processor (`internal/discovery/discovery.go`):
- `s3`: topics and partitions are the "directories" under the namespace.
- `etcd`: the broker's `/kafscale/metadata/snapshot`; topics or partitions with a non-zero ErrorCode are dropped,
  and so are topics left without partitions. No snapshot (or an etcd error) is an error.
- `auto`: `s3` when no etcd client is configured; else like `etcd`, falling back to `s3` when the snapshot is
  absent, unreadable or etcd fails. The Go processor falls back silently; we log a warning with the reason.
The snapshot is Go's `json.Marshal` of structs without tags, so field names are matched case-insensitively (as Go's
decoder does, the last matching key wins) and `null` slices are empty. Two shapes exist and both are read: KafScale
v1.5.0 and earlier (topic `Name`, partition `PartitionIndex`) and v1.6.0's franz-go `kmsg` types (topic `Topic`, a
string or null; partition `Partition`). Where a topic or partition carries both names, the franz-go one wins (the
v1.6.0 Go processor reads only that one). A snapshot that yields no topic while the segment store has some is logged
as a warning that names the keys found (a third shape would otherwise look like an idle cluster).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kafscale_lakehouse.etcd import EtcdClient, EtcdError
from kafscale_lakehouse.storage.errors import MetadataSnapshotError
from kafscale_lakehouse.storage.store import SegmentStore

log = logging.getLogger(__name__)

METADATA_SNAPSHOT_KEY = "/kafscale/metadata/snapshot"
_INT16 = (-(2**15), 2**15 - 1)
_INT32 = (-(2**31), 2**31 - 1)


class DiscoveryMode(str, Enum):  # noqa: UP042 - StrEnum would change str() of the members
    AUTO = "auto"
    ETCD = "etcd"
    S3 = "s3"

    @classmethod
    def parse(cls, value: str) -> DiscoveryMode:
        """`discovery.mode` as the Go processor reads it: case-insensitive, empty means `auto`."""
        text = value.strip().lower() or cls.AUTO.value
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"discovery mode {value!r} is not one of auto, etcd, s3") from None


@dataclass(frozen=True)
class Discovery:
    """`partitions` maps topic -> sorted partition ids; `source` says where they came from (ETCD or S3)."""

    source: DiscoveryMode
    partitions: dict[str, list[int]]


def discover_partitions(mode: DiscoveryMode, store: SegmentStore, etcd: EtcdClient | None = None,
                        topics: Iterable[str] | None = None) -> Discovery:
    """Topic -> partition ids, restricted to `topics` when given (the mapped topics, so S3 lists only those)."""
    wanted = None if topics is None else set(topics)
    if mode is DiscoveryMode.S3 or (mode is DiscoveryMode.AUTO and etcd is None):
        return Discovery(DiscoveryMode.S3, _from_store(store, wanted))
    if etcd is None:
        raise ValueError("discovery mode etcd needs an etcd client")
    where = f"{METADATA_SNAPSHOT_KEY} in etcd at {', '.join(etcd.endpoints)}"
    try:
        raw = etcd.get(METADATA_SNAPSHOT_KEY)
        if raw is None:
            raise MetadataSnapshotError(f"{where} does not exist (no KafScale broker has written metadata yet)",
                                        key=METADATA_SNAPSHOT_KEY)
        snapshot = parse_metadata_snapshot(raw, where)
        if not snapshot:
            _warn_if_store_has_topics(raw, where, store)
    except (EtcdError, MetadataSnapshotError) as exc:
        if mode is DiscoveryMode.ETCD:
            raise
        log.warning("discovery.mode auto: using S3 listing of %s because %s", store.location, exc)
        return Discovery(DiscoveryMode.S3, _from_store(store, wanted))
    if wanted is not None:
        snapshot = {topic: partitions for topic, partitions in snapshot.items() if topic in wanted}
    return Discovery(DiscoveryMode.ETCD, snapshot)


def _from_store(store: SegmentStore, wanted: set[str] | None) -> dict[str, list[int]]:
    names = store.list_topics() if wanted is None else sorted(wanted)
    return {topic: partitions for topic, partitions in list_partitions_of(store, names).items() if partitions}


# Listing is a round trip per topic: at hundreds of topics, one after another took seconds (a batch's checks wait
# for it).
PARTITION_LISTING_THREADS = 16


def list_partitions_of(store: SegmentStore, topics: Sequence[str],
                       threads: int = PARTITION_LISTING_THREADS) -> dict[str, list[int]]:
    """Each topic's partition "directories" in the store (one list request per topic, on `threads` threads)."""
    if len(topics) <= 1 or threads <= 1:
        return {topic: store.list_partitions(topic) for topic in topics}
    with ThreadPoolExecutor(max_workers=min(threads, len(topics)), thread_name_prefix="partition-listing") as pool:
        return dict(zip(topics, pool.map(store.list_partitions, topics), strict=True))


def parse_metadata_snapshot(raw: bytes, where: str = METADATA_SNAPSHOT_KEY) -> dict[str, list[int]]:
    """Healthy topics -> sorted healthy partition ids from the broker's metadata snapshot JSON.

    `where` names the snapshot in error messages (etcd key and endpoints).
    """
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataSnapshotError(f"{where} is not valid JSON: {exc}", key=METADATA_SNAPSHOT_KEY) from exc
    snapshot = _expect(document, dict, where, "the snapshot") or {}
    healthy: dict[str, list[int]] = {}
    for t, topic in enumerate(_expect(_field(snapshot, "Topics"), list, where, "Topics") or []):
        path = f"Topics[{t}]"
        topic = _expect(topic, dict, where, path) or {}
        if _int(_field(topic, "ErrorCode"), _INT16, where, f"{path}.ErrorCode") != 0:
            continue
        name = _first_present(topic, where, path, str, ("Topic", "Name")) or ""
        partitions: set[int] = set()
        for p, partition in enumerate(_expect(_field(topic, "Partitions"), list, where, f"{path}.Partitions") or []):
            partition_path = f"{path}.Partitions[{p}]"
            partition = _expect(partition, dict, where, partition_path) or {}
            if _int(_field(partition, "ErrorCode"), _INT16, where, f"{partition_path}.ErrorCode") != 0:
                continue
            index = _partition_index(partition, where, partition_path)
            if index >= 0:  # no object key can carry a negative partition
                partitions.add(index)
        if name and partitions:
            healthy[name] = sorted(partitions)
    return healthy


def _has_field(obj: dict[str, Any], name: str) -> bool:
    folded = name.casefold()
    return any(key.casefold() == folded for key in obj)


def _first_present(obj: dict[str, Any], where: str, path: str, kind: type, names: tuple[str, ...]) -> Any:
    """The value of the first of `names` (franz-go's, then v1.5.0's) that is present and not null."""
    for name in names:
        value = _expect(_field(obj, name), kind, where, f"{path}.{name}")
        if value is not None:
            return value
    return None


def _partition_index(partition: dict[str, Any], where: str, path: str) -> int:
    # `Partition` (franz-go) when the key is there, even as 0; else `PartitionIndex` (v1.5.0); neither means 0.
    name = "Partition" if _has_field(partition, "Partition") else "PartitionIndex"
    return _int(_field(partition, name), _INT32, where, f"{path}.{name}")


def _warn_if_store_has_topics(raw: bytes, where: str, store: SegmentStore) -> None:
    topics = store.list_topics()
    if topics:
        log.warning("%s lists no healthy topic but %s holds %d (%s); keys found in the snapshot: %s. If the broker "
                    "is healthy, its snapshot has a shape this version does not read", where, store.location,
                    len(topics), ", ".join(topics[:5]) + (", ..." if len(topics) > 5 else ""), snapshot_keys(raw))


def snapshot_keys(raw: bytes) -> str:
    """The keys found at the top level, in the topics and in their partitions, for the warning above."""
    document = json.loads(raw)
    if not isinstance(document, dict):
        return f"none (the snapshot is a JSON {type(document).__name__})"

    def objects(value: Any) -> list[dict]:
        return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []

    topics = objects(_field(document, "Topics"))
    partitions = [p for t in topics for p in objects(_field(t, "Partitions"))]
    topic_keys = sorted({k for t in topics for k in t})
    partition_keys = sorted({k for p in partitions for k in p})
    return f"top level {sorted(document)}, topics {topic_keys}, partitions {partition_keys}"


def _field(obj: dict[str, Any], name: str) -> Any:
    """Go's decoding of an untagged field: any key equal ignoring case; the last one in the document wins."""
    folded = name.casefold()
    value = None
    for key, item in obj.items():
        if key.casefold() == folded:
            value = item
    return value


def _expect(value: Any, kind: type, where: str, path: str) -> Any:
    if value is not None and not isinstance(value, kind):
        raise MetadataSnapshotError(f"{where}: {path} is {type(value).__name__} {value!r:.80}, expected "
                                    f"{kind.__name__} or null", key=METADATA_SNAPSHOT_KEY)
    return value


def _int(value: Any, bounds: tuple[int, int], where: str, path: str) -> int:
    """An integer field; null or absent is 0, as Go leaves the zero value."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise MetadataSnapshotError(f"{where}: {path} is {value!r:.80}, expected an integer in "
                                    f"{bounds[0]}..{bounds[1]}", key=METADATA_SNAPSHOT_KEY)
    return value
