"""Our tables' FileIO on S3 (SeaweedFS behind a proxy that records the requests): a small file (a manifest, a data
file of a few seconds of traffic) is one PUT, not a multipart upload of three requests; a large one is still written
in parts as it goes; a store's refusal still reaches the writer; our catalogs use it unless told otherwise."""

from __future__ import annotations

import http.client
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from pyiceberg.io import PY_IO_IMPL, load_file_io

from kafscale_lakehouse.engine.tables import CatalogSettings
from kafscale_lakehouse.engine.tables.file_io import TABLES_FILE_IO
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, S3_BUCKET, SECRET_KEY


def test_our_catalogs_use_it_unless_told_otherwise():
    assert CatalogSettings(type="rest", uri="http://catalog").catalog_properties()[PY_IO_IMPL] == \
        TABLES_FILE_IO
    told = CatalogSettings(type="rest", uri="http://catalog", extra_properties={PY_IO_IMPL: "mine.FileIO"})
    assert told.catalog_properties()[PY_IO_IMPL] == "mine.FileIO"


class RecordingS3Proxy:
    """Forwards every request to `upstream` as it came (its Host header too: S3 signs it) and records `(method, the
    query's parameter names)` of each."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                chunked = "chunked" in self.headers.get("Transfer-Encoding", "")
                body = self._raw_chunked() if chunked else self.rfile.read(length) if length else None
                query = urlsplit(self.path).query
                proxy.requests.append((self.command, ",".join(sorted(p.split("=")[0] for p in query.split("&")
                                                                     if p))))
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                try:
                    upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() != "expect":  # this proxy answered it (100 Continue), and has the body
                            upstream.putheader(name, value)
                    upstream.endheaders(body)
                    response = upstream.getresponse()
                    payload = response.read()
                finally:
                    upstream.close()
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                # A HEAD's length is the object's (no body follows)
                self.send_header("Content-Length", response.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def _raw_chunked(self) -> bytes:
                """A chunked body as it came (aws-chunked PUTs: chunks, then a checksum trailer)."""
                raw = b""
                while True:
                    line = self.rfile.readline()
                    raw += line
                    size = int(line.split(b";")[0], 16)
                    if size == 0:
                        while (trailer := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                            raw += trailer
                        return raw + b"\r\n"
                    raw += self.rfile.read(size + 2)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay  # noqa: N815 - http.server's names

        return Handler

    def __enter__(self) -> RecordingS3Proxy:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def s3_proxy(seaweedfs) -> Iterator[RecordingS3Proxy]:
    with RecordingS3Proxy(seaweedfs.s3_endpoint) as proxy:
        yield proxy


def s3_file_io(endpoint: str, secret_key: str = SECRET_KEY):
    return load_file_io({PY_IO_IMPL: TABLES_FILE_IO, "s3.endpoint": endpoint, "s3.region": "us-east-1",
                         "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": secret_key}, f"s3://{S3_BUCKET}")


def test_a_small_file_is_one_put_and_a_large_one_a_multipart_upload(s3_proxy):
    io = s3_file_io(s3_proxy.endpoint)
    small = f"s3://{S3_BUCKET}/file-io/{uuid.uuid4().hex}/small.avro"
    payload = bytes(range(256)) * 120  # 30 KB: a manifest, or a data file of a table's few seconds of traffic
    with io.new_output(small).create(overwrite=True) as stream:
        stream.write(payload)
    writes = [request for request in s3_proxy.requests if request[0] in ("PUT", "POST")]
    assert writes == [("PUT", "")]
    assert io.new_input(small).open().read() == payload

    s3_proxy.requests.clear()
    large = f"s3://{S3_BUCKET}/file-io/{uuid.uuid4().hex}/large.parquet"
    big = payload * 400  # 12 MB: more than a part, still written in parts as it goes
    with io.new_output(large).create(overwrite=True) as stream:
        stream.write(big)
    writes = [request for request in s3_proxy.requests if request[0] in ("PUT", "POST")]
    assert writes[0] == ("POST", "uploads") and writes[-1] == ("POST", "uploadId"), writes
    assert len(io.new_input(large).open().read()) == len(big)


def test_an_error_of_the_store_reaches_the_writer_of_a_small_file(seaweedfs):
    """Opened without a request, the file's refusal (here a wrong secret key) comes with its one PUT, at the close."""
    io = s3_file_io(seaweedfs.s3_endpoint, secret_key="not-the-secret")
    refused = f"s3://{S3_BUCKET}/file-io/{uuid.uuid4().hex}/small.parquet"
    with pytest.raises(OSError, match=r"small\.parquet"), io.new_output(refused).create(overwrite=True) as stream:
        stream.write(b"x" * 1000)
    assert not s3_file_io(seaweedfs.s3_endpoint).new_input(refused).exists()
