"""The FileIO of our tables: pyiceberg's PyArrow FileIO, with small files written in one PUT each.

pyarrow's S3 output stream starts a multipart upload when it is opened: a data file, manifest or manifest list of a
few KB was three requests (create the upload, its one part, complete it), and a multipart upload is the heaviest
write for the store (SeaweedFS: 6.6-9.5 ms of its CPU per 30 KB file against 2.9-3.7 ms for a PUT, 300 files each
way). With `allow_delayed_open` the upload starts only once a part's worth is buffered, and a file that never gets
there is one PUT; an error of the store (a refused key) is then raised by the write or the close instead of the
open, and every writer of ours and pyiceberg's closes its files before it uses them.

Reads are pyiceberg's: on S3 a HEAD then a GET per file, whether opened as a stream or for random access (pyarrow's
S3 input files ask for the size first, and its Python API takes no size to skip that). An earlier version of this
class opened the metadata files as streams to save the HEAD; counted on the wire, it saved none.
"""

from __future__ import annotations

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io import S3_RETRY_STRATEGY_IMPL
from pyiceberg.io.pyarrow import PyArrowFileIO

TABLES_FILE_IO = f"{__name__}.TablesFileIO"


class TablesFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose small files are one PUT on S3 (see the module)."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        fs = super()._initialize_s3_fs(netloc)
        if self.properties.get(S3_RETRY_STRATEGY_IMPL) or not isinstance(fs, S3FileSystem):
            return fs  # pyarrow's settings below do not carry a retry strategy: pyiceberg's filesystem as it is
        # pyiceberg passes no `allow_delayed_open`: the same settings (pyarrow's, as it pickles them) with it on.
        reconstruct, (settings,) = fs.__reduce__()
        return reconstruct({**settings, "allow_delayed_open": True})
