"""`kafscale-lakehouse serve-metrics`: the HTTP server that exposes the Go iceberg-processor's Prometheus metrics
and its health endpoints.

The series, and the durable state each is read from on every scrape, are in apps/metrics.py
(`LakehouseStateCollector`); this module serves them, with the process' own `process_*` series.

Endpoints: `/metrics`, `/healthz` (200 `ok` while the process runs: liveness) and `/readyz` (200 when etcd and the
catalog answer within a few seconds, else 503 naming the one that did not). Listens on `--address`, else
`$KAFSCALE_METRICS_ADDR`, else `:9093` (all interfaces), as the Go processor.
"""

from __future__ import annotations

import logging
import os
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from kafscale_lakehouse.apps.metrics import LakehouseStateCollector
from kafscale_lakehouse.config import ConfigError, LakehouseConfig

# serve-metrics logs under one name, as it did before its collector and its server were two modules.
log = logging.getLogger("kafscale_lakehouse.apps.metrics")

METRICS_ADDRESS_ENV = "KAFSCALE_METRICS_ADDR"
DEFAULT_METRICS_ADDRESS = ":9093"
METRICS_PATH, HEALTH_PATH, READY_PATH = "/metrics", "/healthz", "/readyz"


# ------------------------------------------------------------------------------------------- address


def parse_metrics_address(text: str, *, source: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces, as Go) or `[IPv6]:PORT` → (host, port); `source` names where it came
    from (`--address`, `KAFSCALE_METRICS_ADDR`) in the `ConfigError`."""
    host, separator, port_text = text.strip().rpartition(":")
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(source, [f"{text!r} is not HOST:PORT or :PORT with a port 0-65535 (e.g. :9093)"])
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(source, [f"{text!r}: write an IPv6 host in brackets, e.g. [::]:9093"])
    return host, int(port_text)


def resolve_metrics_address(option: str | None) -> tuple[str, int]:
    """`--address` when given, else `$KAFSCALE_METRICS_ADDR`, else `:9093`."""
    if option is not None:
        return parse_metrics_address(option, source="--address")
    from_env = os.environ.get(METRICS_ADDRESS_ENV)
    if from_env:
        return parse_metrics_address(from_env, source=METRICS_ADDRESS_ENV)
    return parse_metrics_address(DEFAULT_METRICS_ADDRESS, source="default address")


# ------------------------------------------------------------------------------------------- server


class _Handler(BaseHTTPRequestHandler):
    collector: LakehouseStateCollector  # set on the subclass made per server
    registry: CollectorRegistry

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(HTTPStatus.OK, encoder(self.registry), content_type)
        elif path == HEALTH_PATH:
            self._answer(HTTPStatus.OK, b"ok")
        elif path == READY_PATH:
            problems = self.collector.readiness_problems()
            if problems:
                body = "".join(f"{name}: {problem}\n" for name, problem in problems.items())
                log.warning("not ready: %s", body.strip().replace("\n", "; "))
                self._answer(HTTPStatus.SERVICE_UNAVAILABLE, body.encode())
            else:
                self._answer(HTTPStatus.OK, b"ok")
        else:
            self._answer(HTTPStatus.NOT_FOUND, f"not found; try {METRICS_PATH}, {HEALTH_PATH}, {READY_PATH}\n".encode())

    def _answer(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _IPv6ThreadingHTTPServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """`/metrics`, `/healthz` and `/readyz` for `collector` on (host, port); port 0 picks a free port."""

    def __init__(self, collector: LakehouseStateCollector, host: str, port: int) -> None:
        self.collector = collector
        # Our own registry: nothing else in the process (Dagster, libraries) ends up on this endpoint.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)  # process_* series (memory, CPU, open fds), as Go's default handler
        handler = type("MetricsHandler", (_Handler,), {"collector": collector, "registry": self.registry})
        server_class = _IPv6ThreadingHTTPServer if ":" in host else ThreadingHTTPServer
        try:
            self._httpd = server_class((host, port), handler)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {_format_address(host, port)}: {exc.strerror}") from exc
        self._httpd.daemon_threads = True

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        # The bound address comes from getsockname(): an IP socket's host is a str (the stub also allows bytes).
        host = cast(str, self._httpd.server_address[0])
        return f"http://{_format_address(host, self.port)}"

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.5)

    def shutdown(self) -> None:
        """Stop `serve_forever` running in another thread."""
        self._httpd.shutdown()

    def close(self) -> None:
        self._httpd.server_close()


def _format_address(host: str, port: int) -> str:
    shown = host or "0.0.0.0"  # noqa: S104 - shows the address the empty host binds
    return f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"


def serve_metrics(config: LakehouseConfig, host: str, port: int) -> None:
    """Serve until interrupted (KeyboardInterrupt, or SystemExit from the CLI's SIGTERM handler)."""
    collector = LakehouseStateCollector(config)
    try:
        server = MetricsServer(collector, host, port)
        try:
            log.info(
                "serving Prometheus metrics on %s%s (liveness %s, readiness %s) for %d mapping(s)",
                server.url,
                METRICS_PATH,
                HEALTH_PATH,
                READY_PATH,
                len(config.mappings),
            )
            server.serve_forever()
        finally:
            server.close()
    finally:
        collector.close()
