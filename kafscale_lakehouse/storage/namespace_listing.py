"""`NamespaceListing`: every object under a store's namespace, listed once, served as a `SegmentStore`.

A watch over many topics lists the namespace once (`ListObjectsV2` pages of 1000 keys) instead of once per partition;
the per-partition logic (`list_segments`, `segments_from`, `find_stalled_segment`, S3 discovery) then runs unchanged
against this view, whose listings are answered from memory. Reads (footers of new segments, stalled footers) go to
the store it was listed from, which counts them. A tick of such a watch costs `ceil(objects / 1000)` list requests,
against one per partition: fewer as long as the namespace holds fewer than 1000 objects per watched partition
(retention keeps it bounded; a namespace keeping months of small segments is cheaper listed per partition).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from kafscale_lakehouse.storage.keys import ObjectKind, namespace_prefix, parse_segment_key, partition_prefix
from kafscale_lakehouse.storage.store import ListPage, ObjectInfo, SegmentStore


class NamespaceListing(SegmentStore):
    """The objects of `store`'s namespace as one listing found them (sorted by key); a read-only view."""

    def __init__(self, store: SegmentStore, objects: list[ObjectInfo]) -> None:
        super().__init__(namespace=store.namespace, list_page_size=store.list_page_size)
        self.source = store
        self.objects = sorted(objects, key=lambda info: info.key)
        self._keys = [info.key for info in self.objects]

    @classmethod
    def from_store(cls, store: SegmentStore) -> NamespaceListing:
        """List the whole namespace of `store` now (its `list` requests count on `store`)."""
        return cls(store, list(store.list_objects(namespace_prefix(store.namespace))))

    @property
    def location(self) -> str:
        return self.source.location

    def _list_page(self, prefix: str, *, start_after: str | None, delimiter: str | None,
                   token: str | None) -> ListPage:
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        for info in self._under(prefix, start_after):
            rest = info.key[len(prefix):]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if not prefixes or prefixes[-1] != common:  # keys are sorted: a prefix's keys are adjacent
                    prefixes.append(common)
            else:
                objects.append(info)
        return ListPage(objects, prefixes, None)

    def _under(self, prefix: str, start_after: str | None) -> Iterator[ObjectInfo]:
        start = bisect.bisect_left(self._keys, prefix)
        if start_after is not None:
            start = max(start, bisect.bisect_right(self._keys, start_after))
        for index in range(start, len(self.objects)):
            if not self._keys[index].startswith(prefix):
                return
            yield self.objects[index]

    def _get(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        if byte_range is None:
            return self.source.read(key)
        return self.source.read_range(key, byte_range[0], byte_range[1] - byte_range[0] + 1)

    def _head(self, key: str) -> int:
        return self.source.size(key)

    def _stream(self, key: str, chunk_size: int) -> tuple[int, Iterator[bytes]]:
        return self.source.open_stream(key, chunk_size)

    def _put(self, key: str, data: bytes) -> None:
        raise PermissionError(f"{key}: a namespace listing of {self.location} is read-only")

    def segment_bytes(self, topic: str, partition: int, start: int, end: int) -> int:
        """Bytes of the `.kfs` objects listed that hold offsets in `[start, end)`: a segment holds its base offset up
        to the next segment's (the newest one, up to `end`), so no footer is read."""
        bases = sorted((parsed.base_offset, info.size) for info in self._under(partition_prefix(
            self.namespace, topic, partition), None)
            if (parsed := parse_segment_key(info.key, self.namespace)) is not None
            and parsed.kind is ObjectKind.SEGMENT)
        total = 0
        for index, (base, size) in enumerate(bases):
            following = bases[index + 1][0] if index + 1 < len(bases) else end
            if base < end and following > start:
                total += size
        return total
