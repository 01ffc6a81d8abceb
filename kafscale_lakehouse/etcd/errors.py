"""Errors of the etcd client; each message names the endpoints (and the user, never the password)."""

from __future__ import annotations

from collections.abc import Sequence


class EtcdError(Exception):
    """Base class of every error raised by `EtcdClient`."""


class EtcdUnavailableError(EtcdError):
    """etcd could not be reached (or kept timing out) for the whole retry window."""

    def __init__(
        self, endpoints: Sequence[str], operation: str, attempts: int, waited_seconds: float, cause: str,
    ) -> None:
        self.endpoints = list(endpoints)
        self.operation = operation
        super().__init__(
            f"etcd unreachable at {', '.join(self.endpoints)}: {operation} failed {attempts} times "
            f"over {waited_seconds:.1f}s (last error: {cause})"
        )


class EtcdAuthError(EtcdError):
    """Authentication failed, or the user may not access a key."""


class EtcdRequestError(EtcdError):
    """etcd rejected a request for another reason (bad argument, too large, ...)."""
