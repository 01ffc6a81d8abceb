"""Our tables' FileIO opens the metadata files pyiceberg reads whole (manifest lists, manifests, table metadata) as
streams: on S3 a GET each, where pyarrow's random-access open first sends a HEAD for the size (issue 22: a HEAD
before every GET, a few per table and run). A table is written and read back through it on a local warehouse whose
filesystem counts the opens; data files are still opened for random access."""

from __future__ import annotations

from collections import Counter

import pyarrow.fs as pafs
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.io import PY_IO_IMPL

from kafscale_lakehouse.engine.tables import CatalogSettings
from kafscale_lakehouse.engine.tables.file_io import WHOLE_METADATA_READS_FILE_IO, WholeMetadataReadsFileIO
from kafscale_lakehouse.schema import table_schema
from kafscale_lakehouse_tests.orchestration.core.test_check_logic import append


class CountingHandler(pafs.FileSystemHandler):
    """The local filesystem, counting `(open kind, file kind)`: `input_file` is the random-access open (S3: a HEAD
    then GETs), `input_stream` the sequential one (S3: a GET)."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()
        self.opens: Counter[tuple[str, str]] = Counter()

    @staticmethod
    def kind(path: str) -> str:
        return path.rsplit(".", 1)[-1]

    def open_input_file(self, path):
        self.opens["input_file", self.kind(path)] += 1
        return self.local.open_input_file(path)

    def open_input_stream(self, path):
        self.opens["input_stream", self.kind(path)] += 1
        return self.local.open_input_stream(path)

    def __eq__(self, other): return self is other
    def __ne__(self, other): return self is not other
    def get_type_name(self): return "counting"
    def normalize_path(self, path): return path
    def get_file_info(self, paths): return self.local.get_file_info(paths)
    def get_file_info_selector(self, selector): return self.local.get_file_info(selector)
    def create_dir(self, path, recursive): self.local.create_dir(path, recursive=recursive)
    def delete_dir(self, path): self.local.delete_dir(path)
    def delete_dir_contents(self, path, missing_dir_ok=False): self.local.delete_dir_contents(path, missing_dir_ok)
    def delete_root_dir_contents(self): raise NotImplementedError
    def delete_file(self, path): self.local.delete_file(path)
    def move(self, src, dest): self.local.move(src, dest)
    def copy_file(self, src, dest): self.local.copy_file(src, dest)
    def open_output_stream(self, path, metadata):
        self.local.create_dir(path.rsplit("/", 1)[0], recursive=True)
        return self.local.open_output_stream(path, metadata=metadata)
    def open_append_stream(self, path, metadata): return self.local.open_append_stream(path, metadata=metadata)


@pytest.fixture
def counting(monkeypatch) -> CountingHandler:
    handler = CountingHandler()
    filesystem = pafs.PyFileSystem(handler)
    init = WholeMetadataReadsFileIO.__init__

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.fs_by_scheme = lambda scheme, netloc: filesystem

    monkeypatch.setattr(WholeMetadataReadsFileIO, "__init__", counted_init)
    return handler


def test_metadata_files_are_read_as_streams_and_data_files_for_random_access(tmp_path, counting):
    catalog = SqlCatalog("io", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri(),
                         **{PY_IO_IMPL: WHOLE_METADATA_READS_FILE_IO})
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", table_schema([]))
    assert isinstance(table.io, WholeMetadataReadsFileIO)
    for n in range(3):
        append(table, 0, range(10 * n, 10 * (n + 1)), next_offsets={0: 10 * (n + 1)})
    counting.opens.clear()

    table = catalog.load_table("shop.orders")  # the metadata json
    rows = table.scan(row_filter=EqualTo("partition", 0)).to_arrow()  # the manifest list, manifests, data files

    assert rows.num_rows == 30
    assert counting.opens == {("input_stream", "json"): 1, ("input_stream", "avro"): 4, ("input_file", "parquet"): 3}


def test_our_catalogs_use_it_unless_told_otherwise():
    assert CatalogSettings(type="rest", uri="http://catalog").catalog_properties()[PY_IO_IMPL] == \
        WHOLE_METADATA_READS_FILE_IO
    told = CatalogSettings(type="rest", uri="http://catalog", extra_properties={PY_IO_IMPL: "mine.FileIO"})
    assert told.catalog_properties()[PY_IO_IMPL] == "mine.FileIO"
