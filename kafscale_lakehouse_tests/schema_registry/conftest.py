"""A real JSON Schema registry for the tests: `http.server` on 127.0.0.1, serving canned answers by raw path."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

REGISTRY_PATH = "/registry/schemas"


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    delay_seconds: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SeenRequest:
    path: str
    authorization: str | None
    accept: str | None


class RegistryServer:
    """Answers `GET <raw path>` with the answers queued for that path (the last one repeats), 404 otherwise.
    Records every request it receives, in order."""

    def __init__(self) -> None:
        self.requests: list[SeenRequest] = []
        self._answers: dict[str, list[Answer]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="test-schema-registry", daemon=True
        )

    @property
    def origin(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.origin + REGISTRY_PATH

    def serve_json(self, path: str, document: Any) -> None:
        self.answer(path, Answer(body=json.dumps(document).encode()))

    def answer(self, path: str, *answers: Answer) -> None:
        with self._lock:
            self._answers[path] = list(answers)

    def paths_seen(self) -> list[str]:
        with self._lock:
            return [request.path for request in self.requests]

    def _next_answer(self, path: str) -> Answer:
        with self._lock:
            queued = self._answers.get(path)
            if not queued:
                return Answer(status=404, body=b'{"error": "not found"}')
            return queued.pop(0) if len(queued) > 1 else queued[0]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with registry._lock:
                    registry.requests.append(
                        SeenRequest(self.path, self.headers.get("Authorization"), self.headers.get("Accept"))
                    )
                answer = registry._next_answer(self.path)
                if answer.delay_seconds and registry._stopping.wait(answer.delay_seconds):
                    return
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/schema+json")
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> RegistryServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def registry() -> Iterator[RegistryServer]:
    server = RegistryServer().start()
    yield server
    server.stop()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
