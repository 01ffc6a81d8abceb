"""A small HTTP proxy in front of the REST catalog that misbehaves on table commits the way real proxies do."""

from __future__ import annotations

import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# POST /v1/[prefix/]namespaces/<ns>/tables/<table> is a table commit (create is POST .../tables).
_COMMIT_PATH = re.compile(r"/namespaces/[^/]+/tables/[^/]+$")
_SERVER_ERROR = b'{"error": {"message": "injected by the test proxy", "type": "InternalServerError", "code": 500}}'


class CommitProxy:
    """Forwards everything to `upstream`. For the first `misbehave_commits` table commits, `mode` says what happens:
    - `retry`: the POST is forwarded twice (a load balancer retrying after a slow answer); the client gets the
      second answer (409: the first one already moved the table);
    - `502`: the POST is forwarded once and the client gets 502 Bad Gateway whatever the catalog answered.
    `load-500` and `create-500` misbehave on the first `misbehave_commits` table loads (GET, not forwarded) or table
    creations (POST .../tables, forwarded: the table is created) instead, answering 500 (a catalog under load)."""

    def __init__(self, upstream: str, mode: str, misbehave_commits: int = 1):
        self.upstream = urlsplit(upstream)
        self.mode = mode
        self.remaining = misbehave_commits
        self.commits_forwarded = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> CommitProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> tuple[int, list, bytes]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _relay(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                path = self.path.split("?")[0]
                is_commit = method == "POST" and _COMMIT_PATH.search(path) is not None
                targeted = {"load-500": method == "GET" and _COMMIT_PATH.search(path) is not None,
                            "create-500": method == "POST" and path.endswith("/tables")}.get(proxy.mode, is_commit)
                with proxy._lock:
                    misbehave = targeted and proxy.remaining > 0
                    if misbehave:
                        proxy.remaining -= 1
                if misbehave and proxy.mode == "load-500":
                    status, response_headers, payload = 500, [("Content-Type", "application/json")], _SERVER_ERROR
                else:
                    status, response_headers, payload = proxy._forward(method, self.path, headers, body)
                if misbehave and proxy.mode == "create-500":
                    status, response_headers, payload = 500, [("Content-Type", "application/json")], _SERVER_ERROR
                if is_commit:
                    proxy.commits_forwarded += 1
                if misbehave and proxy.mode == "retry":
                    status, response_headers, payload = proxy._forward(method, self.path, headers, body)
                    proxy.commits_forwarded += 1
                elif misbehave and proxy.mode == "502":
                    status, response_headers, payload = 502, [("Content-Type", "text/plain")], b"bad gateway"
                self.send_response(status)
                for name, value in response_headers:
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._relay("GET")

            def do_POST(self) -> None:
                self._relay("POST")

            def do_HEAD(self) -> None:
                self._relay("HEAD")

            def do_DELETE(self) -> None:
                self._relay("DELETE")

        return Handler
