"""`spark.remote` / `$SPARK_REMOTE`: the address of the long-lived Spark engine, a Spark Connect URL.

The one parser of that URL: the config validates `spark.remote` with it, and the engine (`engine/spark`) connects
with it. Pure string parsing, no Spark. A bad URL is a `ValueError` whose message starts with the setting's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_CONNECT_PORT = 15002  # Spark Connect's default


@dataclass(frozen=True)
class ConnectAddress:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"


def parse_remote_url(url: str, *, setting: str = "spark.remote") -> ConnectAddress:
    """`sc://host[:port][/;param=value...]` (pyspark's connection string) -> address."""
    parts = urlsplit(url.strip())
    if parts.scheme != "sc" or not parts.hostname or not (parts.path in ("", "/") or parts.path.startswith("/;")):
        raise ValueError(f"{setting}: {url!r} is not a Spark Connect URL sc://<host>:<port>")
    try:
        port = parts.port or DEFAULT_CONNECT_PORT
    except ValueError:
        raise ValueError(f"{setting}: {url!r} has an invalid port") from None
    return ConnectAddress(parts.hostname, port)
