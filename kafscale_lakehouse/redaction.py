"""Keeping secrets out of messages and logs: `redact_url` hides the credentials a URL may carry.

Stdlib only and imports nothing of the project, so every layer (the schema registry client, the Iceberg catalogs,
the config's display of `schema.registry.base_url`, the metrics server) redacts the same way.
"""

from __future__ import annotations

from typing import overload


@overload
def redact_url(url: str) -> str: ...
@overload
def redact_url(url: None) -> None: ...
def redact_url(url: str | None) -> str | None:
    """`url` with its user info (`user:password@`, `token@`), if any, replaced by `***@`: for messages and logs."""
    if url is None:
        return None
    scheme, separator, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not separator or "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rpartition('@')[2]}{slash}{path}"
