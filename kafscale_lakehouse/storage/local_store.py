"""`LocalSegmentStore`: the S3 layout in a local directory (embedded default, demo producer, tests)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from kafscale_lakehouse.storage.errors import (
    BucketNotFoundError,
    ObjectNotFoundError,
    StorageError,
    StorageRequestError,
)
from kafscale_lakehouse.storage.keys import DEFAULT_NAMESPACE
from kafscale_lakehouse.storage.store import DEFAULT_LIST_PAGE_SIZE, ListPage, ObjectInfo, SegmentStore

# Prefix of in-flight uploads; they never parse as segment keys, so a crash mid-write leaves nothing readable.
_PARTIAL_PREFIX = ".partial-"


class LocalSegmentStore(SegmentStore):
    """Keys are `/`-separated paths relative to `root`. Listing pages and order follow S3 (lexicographic keys)."""

    def __init__(self, root: str | os.PathLike[str], *, namespace: str = DEFAULT_NAMESPACE,
                 list_page_size: int = DEFAULT_LIST_PAGE_SIZE, create: bool = False) -> None:
        super().__init__(namespace=namespace, list_page_size=list_page_size)
        self.root = Path(root).resolve()
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    @property
    def location(self) -> str:
        return f"local directory {self.root}"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(part in ("", ".", "..") for part in parts) or "\\" in key:
            raise ValueError(f"object key {key!r} is not a relative '/'-separated path usable under {self.root}")
        return self.root.joinpath(*parts)

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise BucketNotFoundError(f"segment root {self.root} does not exist or is not a directory",
                                      location=self.location)

    def _error(self, exc: OSError, action: str, key: str) -> StorageError:
        if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
            return ObjectNotFoundError(f"object {key} not found in {self.location}", location=self.location, key=key)
        return StorageRequestError(f"could not {action} {key} in {self.location}: {exc.strerror or exc}",
                                   location=self.location, key=key)

    def _list_page(self, prefix: str, *, start_after: str | None, delimiter: str | None,
                   token: str | None) -> ListPage:
        self._check_root()
        marker = max(filter(None, (start_after, token)), default=None)
        entries = sorted(entry for entry in self._entries(prefix, delimiter) if marker is None or entry[0] > marker)
        page = entries[: self.list_page_size]
        next_token = page[-1][0] if len(entries) > len(page) else None
        objects = [self._stat(key, path) for key, path in page if path is not None]
        prefixes = [key for key, path in page if path is None]
        return ListPage(objects, prefixes, next_token)

    def _entries(self, prefix: str, delimiter: str | None) -> Iterator[tuple[str, Path | None]]:
        """(key, path) for objects and (common prefix, None) for "directories" when `delimiter` is `/`."""
        directory_key, _, _ = prefix.rpartition("/")
        directory = self.root.joinpath(*directory_key.split("/")) if directory_key else self.root
        if not directory.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(directory, onerror=self._raise_walk_error):
            relative = Path(dirpath).relative_to(self.root).as_posix()
            base = "" if relative == "." else relative + "/"
            if delimiter is not None:
                yield from ((base + name + "/", None) for name in dirnames if (base + name + "/").startswith(prefix))
                dirnames.clear()  # one level only, like S3's Delimiter
            else:
                # Descend only where keys can start with the prefix.
                dirnames[:] = [name for name in dirnames if (base + name + "/").startswith(prefix)
                               or prefix.startswith(base + name + "/")]
            for name in filenames:
                key = base + name
                if key.startswith(prefix) and not name.startswith(_PARTIAL_PREFIX):
                    yield key, Path(dirpath, name)

    def _raise_walk_error(self, exc: OSError) -> None:
        raise StorageRequestError(f"could not list {exc.filename} in {self.location}: {exc.strerror or exc}",
                                  location=self.location, key=str(exc.filename))

    def _stat(self, key: str, path: Path) -> ObjectInfo:
        try:
            stat = path.stat()
        except OSError as exc:
            raise self._error(exc, "stat", key) from exc
        return ObjectInfo(key, stat.st_size, datetime.fromtimestamp(stat.st_mtime, tz=UTC))

    def _get(self, key: str, byte_range: tuple[int, int] | None) -> bytes:
        path = self._path(key)
        self._check_root()
        try:
            with path.open("rb") as handle:
                if byte_range is None:
                    return handle.read()
                first, last = byte_range
                handle.seek(first)
                return handle.read(last - first + 1)
        except OSError as exc:
            raise self._error(exc, "read", key) from exc

    def _stream(self, key: str, chunk_size: int) -> tuple[int, Iterator[bytes]]:
        path = self._path(key)
        self._check_root()
        try:
            handle = path.open("rb")
            size = os.fstat(handle.fileno()).st_size
        except OSError as exc:
            raise self._error(exc, "read", key) from exc

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(chunk_size):
                    yield chunk
        return size, chunks()

    def _head(self, key: str) -> int:
        path = self._path(key)
        self._check_root()
        try:
            if not path.is_file():
                raise FileNotFoundError(path)
            return path.stat().st_size
        except OSError as exc:
            raise self._error(exc, "stat", key) from exc

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._check_root()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename: readers see the whole object or nothing, as with S3.
            fd, partial = tempfile.mkstemp(prefix=_PARTIAL_PREFIX, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(partial, path)
            except BaseException:
                Path(partial).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise self._error(exc, "write", key) from exc
