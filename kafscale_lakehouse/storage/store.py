"""`SegmentStore`: listing, reads and completeness of KafScale segments, on top of a few backend primitives.

Backends (S3, local directory) implement four primitives (`_list_page`, `_get`, `_head`, `_put`); everything
segment-specific lives here once, so both backends behave the same and count requests the same way.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from kafscale_lakehouse.format.errors import SegmentFormatError, SegmentMismatchError, TruncatedSegmentError
from kafscale_lakehouse.format.segment_frame import FOOTER_SIZE, HEADER_SIZE, SegmentFooter, parse_footer
from kafscale_lakehouse.storage.errors import DuplicateSegmentError, StorageRequestError
from kafscale_lakehouse.storage.keys import (
    DEFAULT_NAMESPACE,
    ObjectKind,
    namespace_prefix,
    parse_partition,
    parse_segment_key,
    partition_prefix,
    segment_key,
    topic_prefix,
)

log = logging.getLogger(__name__)

DEFAULT_LIST_PAGE_SIZE = 1000  # S3's maximum keys per ListObjectsV2 page
# Footer reads are latency-bound 16-byte GETs; a few in flight make a first listing of a large backlog fast.
FOOTER_READ_THREADS = 8

_T = TypeVar("_T")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime


@dataclass(frozen=True)
class ListPage:
    """One listing request's answer. `next_token` is None on the last page."""

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    next_token: str | None


@dataclass(frozen=True)
class SegmentRef:
    """A complete segment: both objects exist and the `.kfs` ends with a valid footer (read unless
    `end_from_footer` is False: then the reader checks it)."""

    topic: str
    partition: int
    base_offset: int
    last_offset: int
    kfs_key: str
    index_key: str
    kfs_size: int
    # False: `last_offset` is the next complete segment's base offset - 1 (`newest_footer_only`), not this segment's
    # footer, which is read only with its records; the reader then checks it (a gap or an overlap after it).
    end_from_footer: bool = True


@dataclass(frozen=True)
class IncompleteSegment:
    """A segment that is not (yet) readable: orphan `.kfs`, orphan `.index`, or a `.kfs` without `END!`.

    `last_modified` is the newest of its objects, so an operator can tell an upload in progress from a broker that
    died between the two uploads.
    """

    topic: str
    partition: int
    base_offset: int
    kfs_key: str | None
    index_key: str | None
    reason: str
    last_modified: datetime
    # Base offset of the next segment object listed after it (None: none yet): where the offsets it should hold end
    # when it has no readable footer, and a sign that the partition waits behind it (storage/stalls.py).
    next_base_offset: int | None = None


@dataclass(frozen=True)
class SegmentListing:
    """Result of `SegmentStore.list_segments`.

    `segments` are the new complete segments in offset order, up to (excluding) the first incomplete one;
    `incomplete` lists the incomplete segments seen; `cursor` is what to pass as `after` next time (the `.kfs` key
    of the last returned segment, or the previous cursor when nothing new is complete).
    """

    segments: list[SegmentRef]
    incomplete: list[IncompleteSegment]
    cursor: str | None
    # Base offset of the newest complete segment left unread (`read_newest_footer=False`): listed again next time.
    unread_base_offset: int | None = None


@dataclass
class _SegmentPair:
    kfs: ObjectInfo | None = None
    index: ObjectInfo | None = None


class SegmentStore(ABC):
    """Object store holding KafScale segments under `namespace` (docs/kafscale-format.md §1).

    Object keys are full keys relative to the bucket (or root directory), e.g. `default/orders/0/segment-…kfs`.
    `request_counts` counts requests by kind (`list` per page, `get`, `head`, `put`) since construction.
    """

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE, list_page_size: int = DEFAULT_LIST_PAGE_SIZE) -> None:
        if not 1 <= list_page_size <= DEFAULT_LIST_PAGE_SIZE:
            raise ValueError(f"list_page_size {list_page_size} is outside 1..{DEFAULT_LIST_PAGE_SIZE}")
        self.namespace = namespace
        self.list_page_size = list_page_size
        self._request_counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    # ---- backend primitives -------------------------------------------------------------------------------
    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store is, for messages: `s3://bucket at endpoint` or `local directory /path`."""

    @abstractmethod
    def _list_page(self, prefix: str, *, start_after: str | None, delimiter: str | None,
                   token: str | None) -> ListPage: ...

    @abstractmethod
    def _get(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        """Whole object, or the inclusive byte range (first, last)."""

    @abstractmethod
    def _head(self, key: str) -> int:
        """Object size in bytes."""

    @abstractmethod
    def _put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def _stream(self, key: str, chunk_size: int) -> tuple[int, Iterator[bytes]]:
        """Object size and a lazy iterator of its bytes (one GET)."""

    # ---- request counting and pickling (Spark ships stores to executors) ----------------------------------
    @property
    def request_counts(self) -> Counter[str]:
        """A snapshot copy; subtract two snapshots to measure an operation."""
        with self._counts_lock:
            return Counter(self._request_counts)

    def _counted(self, kind: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        with self._counts_lock:
            self._request_counts[kind] += 1
        return call(*args, **kwargs)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_counts_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._counts_lock = threading.Lock()

    # ---- object operations --------------------------------------------------------------------------------
    def _pages(self, prefix: str, start_after: str | None, delimiter: str | None) -> Iterator[ListPage]:
        token = None
        while True:
            page = self._counted("list", self._list_page, prefix, start_after=start_after, delimiter=delimiter,
                                 token=token)
            yield page
            if page.next_token is None:
                return
            token = page.next_token

    def list_objects(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """All objects whose key starts with `prefix` (and sorts after `start_after`), in key order, page by page."""
        for page in self._pages(prefix, start_after, None):
            yield from page.objects

    def list_common_prefixes(self, prefix: str) -> list[str]:
        """The `<prefix><name>/` "directories" directly under `prefix` (ListObjectsV2 with `Delimiter='/'`)."""
        return [common for page in self._pages(prefix, None, "/") for common in page.common_prefixes]

    def read(self, key: str) -> bytes:
        return self._counted("get", self._get, key, None)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Exactly `length` bytes from byte `start`; a shorter object is an error, never a silent short read."""
        if start < 0 or length <= 0:
            raise ValueError(f"invalid byte range start={start} length={length} for {key}")
        data = self._counted("get", self._get, key, (start, start + length - 1))
        if len(data) != length:
            raise StorageRequestError(
                f"short read of {key} in {self.location}: asked for {length} bytes at byte {start}, got {len(data)}",
                location=self.location, key=key)
        return data

    def size(self, key: str) -> int:
        return self._counted("head", self._head, key)

    def open_stream(self, key: str, chunk_size: int = 1 << 20) -> tuple[int, Iterator[bytes]]:
        """(object size, its bytes in chunks of at most `chunk_size`), one GET: for objects too large to hold
        whole (LFS blobs). Close the iterator (`.close()`) when not reading it to the end."""
        return self._counted("get", self._stream, key, chunk_size)

    def put(self, key: str, data: bytes) -> None:
        self._counted("put", self._put, key, data)

    # ---- segments -----------------------------------------------------------------------------------------
    def write_segment(self, topic: str, partition: int, base_offset: int, segment: bytes,
                      index: bytes) -> tuple[str, str]:
        """Upload a segment's `.kfs`, then its `.index` (the broker uploads both at once; the segment is complete when
        both exist)."""
        kfs_key = segment_key(self.namespace, topic, partition, base_offset, ObjectKind.SEGMENT)
        index_key = segment_key(self.namespace, topic, partition, base_offset, ObjectKind.INDEX)
        self.put(kfs_key, segment)
        self.put(index_key, index)
        return kfs_key, index_key

    def read_footer(self, kfs_key: str, kfs_size: int) -> SegmentFooter:
        """The 16-byte footer with one ranged read; raises `SegmentFormatError` (key + byte offset) if absent."""
        if kfs_size < HEADER_SIZE + FOOTER_SIZE:
            raise TruncatedSegmentError(kfs_key, kfs_size, f"object has {kfs_size} bytes, a finished segment has at "
                                        f"least {HEADER_SIZE + FOOTER_SIZE} (header and footer)")
        position = kfs_size - FOOTER_SIZE
        return parse_footer(self.read_range(kfs_key, position, FOOTER_SIZE), kfs_key, position)

    def list_topics(self) -> list[str]:
        """Topic names under the namespace, sorted."""
        prefix = namespace_prefix(self.namespace)
        return sorted(p[len(prefix):-1] for p in self.list_common_prefixes(prefix) if p[len(prefix):-1])

    def list_partitions(self, topic: str) -> list[int]:
        """Partition ids of `topic` (directories that are canonical non-negative int32), sorted."""
        prefix = topic_prefix(self.namespace, topic)
        names = (p[len(prefix):-1] for p in self.list_common_prefixes(prefix))
        return sorted(partition for partition in map(parse_partition, names) if partition is not None)

    def list_segments(self, topic: str, partition: int, after: str | None = None,
                      limit: int | None = None, *, newest_footer_only: bool = False,
                      read_newest_footer: bool = True) -> SegmentListing:
        """Complete segments of one partition that follow the cursor `after` (a `.kfs` key from a previous listing).

        Cost: listing pages from the cursor on, plus one 16-byte footer read per new complete segment (read
        concurrently). With padded keys (what brokers write) the listing starts after the cursor (`StartAfter`);
        an unpadded cursor does not sort numerically against newer keys, so the partition is listed in full and
        filtered by base offset. Segments are returned in offset order and stop at the first incomplete one, so
        the cursor never moves past a segment whose `.index` has not arrived yet. `limit` caps how many segments
        (and footer reads) one call returns, to bound the cost of a sensor tick over a large backlog.

        `newest_footer_only` (a watch's listings, which only need where the completed segments end): a segment
        followed by another complete one (both objects listed) ends where that one begins (segments are contiguous,
        §1), so only the newest segment's footer is read, one read per partition however many segments arrived. The
        segments in between are then not checked for `END!` nor for a gap before their successor: the run that reads
        them does both (it reads every footer it ingests). With `read_newest_footer=False` as well (a watch that
        cannot use the newest segment now: its table has a run in flight) the newest complete segment is left out, its
        base offset in `unread_base_offset`, and the cursor stays before it: no footer is read at all.
        """
        if not read_newest_footer and not newest_footer_only:
            raise ValueError("read_newest_footer=False needs newest_footer_only=True (every footer is read otherwise)")
        if limit is not None and limit < 1:
            raise ValueError(f"limit {limit} must be at least 1")
        prefix = partition_prefix(self.namespace, topic, partition)
        after_base, start_after = self._resume_point(topic, partition, after)
        pairs = self._pair_objects(prefix, start_after, after_base)

        incomplete: list[IncompleteSegment] = []
        # Both objects present (the pair, its .kfs, its .index), before any orphan.
        candidates: list[tuple[int, _SegmentPair, ObjectInfo, ObjectInfo]] = []
        ordered = sorted(pairs)
        next_base = {base: ordered[i + 1] if i + 1 < len(ordered) else None for i, base in enumerate(ordered)}
        for base_offset in ordered:
            pair = pairs[base_offset]
            if pair.kfs is None or pair.index is None:
                missing = "no .index (orphan .kfs)" if pair.index is None else "no .kfs (orphan .index)"
                incomplete.append(_incomplete(topic, partition, base_offset, pair, missing, next_base[base_offset]))
            elif not incomplete and (limit is None or len(candidates) < limit):
                candidates.append((base_offset, pair, pair.kfs, pair.index))

        segments: list[SegmentRef] = []
        # Per candidate: its footer, why it has none, or (newest_footer_only) its last offset as its successor says.
        ends: list[SegmentFooter | SegmentFormatError | int] = []
        unread = None
        if newest_footer_only:
            # Each candidate but the newest is followed by a complete candidate, whose base offset ends it.
            ends += [following[0] - 1 for following in candidates[1:]]
            if read_newest_footer:
                ends += self._read_footers([kfs for _, _, kfs, _ in candidates[-1:]])
            elif candidates:
                unread = candidates.pop()[0]
        else:
            ends += self._read_footers([kfs for _, _, kfs, _ in candidates])
        for (base_offset, pair, kfs, index), end in zip(candidates, ends, strict=True):
            if isinstance(end, SegmentFormatError):
                incomplete.insert(0, _incomplete(topic, partition, base_offset, pair, f"not finished: {end}",
                                                 next_base[base_offset]))
                break
            last_offset = end if isinstance(end, int) else end.last_offset
            if last_offset < base_offset:
                raise SegmentMismatchError(
                    kfs.key,
                    kfs.size - FOOTER_SIZE + 4,
                    f"footer last offset {last_offset} is below the key's base offset {base_offset}",
                )
            segments.append(SegmentRef(topic, partition, base_offset, last_offset, kfs.key, index.key, kfs.size,
                                       end_from_footer=not isinstance(end, int)))
        for item in incomplete:
            log.info(
                "incomplete segment in %s, not returned: %s / %s: %s",
                self.location,
                item.kfs_key,
                item.index_key,
                item.reason,
            )
        cursor = segments[-1].kfs_key if segments else after
        return SegmentListing(segments, incomplete, cursor, unread)

    def _read_footers(self, objects: list[ObjectInfo]) -> list[SegmentFooter | SegmentFormatError]:
        """Footers in order; a missing `END!` is returned (it means "not finished"), other errors raise."""

        def footer_or_format_error(info: ObjectInfo) -> SegmentFooter | SegmentFormatError:
            try:
                return self.read_footer(info.key, info.size)
            except SegmentFormatError as exc:
                return exc

        if len(objects) <= 1:
            return [footer_or_format_error(info) for info in objects]
        with ThreadPoolExecutor(max_workers=min(FOOTER_READ_THREADS, len(objects))) as pool:
            return list(pool.map(footer_or_format_error, objects))

    def _resume_point(self, topic: str, partition: int, after: str | None) -> tuple[int | None, str | None]:
        """(base offset to skip up to, StartAfter key) for the cursor `after`."""
        if after is None:
            return None, None
        parsed = parse_segment_key(after, self.namespace)
        if (
            parsed is None
            or parsed.kind is not ObjectKind.SEGMENT
            or (parsed.topic, parsed.partition) != (topic, partition)
        ):
            raise ValueError(
                f"cursor {after!r} is not a .kfs key of topic {topic!r} partition {partition} "
                f"under namespace {self.namespace!r}"
            )
        if not parsed.padded:
            log.debug("unpadded cursor %s: listing %s/%d in full", after, topic, partition)
        return parsed.base_offset, after if parsed.padded else None

    def _pair_objects(self, prefix: str, start_after: str | None, after_base: int | None) -> dict[int, _SegmentPair]:
        pairs: dict[int, _SegmentPair] = {}
        for info in self.list_objects(prefix, start_after=start_after):
            parsed = parse_segment_key(info.key, self.namespace)
            if parsed is None or (after_base is not None and parsed.base_offset <= after_base):
                continue
            pair = pairs.setdefault(parsed.base_offset, _SegmentPair())
            slot = "kfs" if parsed.kind is ObjectKind.SEGMENT else "index"
            existing = getattr(pair, slot)
            if existing is not None:
                raise DuplicateSegmentError(
                    f"{existing.key} and {info.key} in {self.location} both claim base offset "
                    f"{parsed.base_offset}; remove one",
                    location=self.location,
                    key=info.key,
                )
            setattr(pair, slot, info)
        return pairs


def _incomplete(topic: str, partition: int, base_offset: int, pair: _SegmentPair, reason: str,
                next_base_offset: int | None) -> IncompleteSegment:
    infos = [info for info in (pair.kfs, pair.index) if info is not None]
    return IncompleteSegment(
        topic=topic,
        partition=partition,
        base_offset=base_offset,
        kfs_key=pair.kfs.key if pair.kfs else None,
        index_key=pair.index.key if pair.index else None,
        reason=reason,
        last_modified=max(info.last_modified for info in infos),
        next_base_offset=next_base_offset,
    )
