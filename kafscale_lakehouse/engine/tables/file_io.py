"""The FileIO of our tables: pyiceberg's PyArrow FileIO, with the table's Avro and JSON metadata files (manifest
lists, manifests, `*.metadata.json`) read in one GET each.

pyiceberg reads those files whole (`AvroFile` reads all of the stream it opens; so does the metadata parser), but it
opens them for random access, and pyarrow's `open_input_file` on S3 first sends a HEAD for the object's size: a
HEAD before every GET, at hundreds of tables a few per table and run (issue 22). Here they are opened as a stream
(no HEAD) and read into memory, which is what pyiceberg did with them anyway; the reader it gets is still seekable.
Data files (Parquet) are opened as before: they are read in column ranges, and can be large.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

# Files pyiceberg reads whole: manifest lists and manifests (Avro), table metadata (JSON, `.gz.metadata.json` too).
_READ_WHOLE_SUFFIXES = (".avro", ".metadata.json")
WHOLE_METADATA_READS_FILE_IO = f"{__name__}.WholeMetadataReadsFileIO"


class WholeMetadataReadsFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose metadata files are read whole in one GET (see the module)."""

    def new_input(self, location: str) -> PyArrowFile:
        if not location.endswith(_READ_WHOLE_SUFFIXES):
            return super().new_input(location)
        scheme, netloc, path = self.parse_location(location, self.properties)
        return _WholeReadFile(fs=self.fs_by_scheme(scheme, netloc), location=location, path=path,
                              buffer_size=int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)))


class _WholeReadFile(PyArrowFile):
    def open(self, seekable: bool = True) -> pa.NativeFile:
        with super().open(seekable=False) as stream:  # a stream: a GET, no HEAD
            data = stream.read()
        return pa.BufferReader(data)
