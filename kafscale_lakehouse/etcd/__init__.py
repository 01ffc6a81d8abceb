"""etcd: the one client the project talks to etcd through (offsets and leases, broker metadata and watermarks).

Below storage and offsets: it knows etcd's keys, values, revisions, leases and transactions, nothing of what the
layers above store there. Errors name the endpoints (and the user, never the password).
"""

from kafscale_lakehouse.etcd.client import (
    EtcdClient,
    EtcdCompare,
    EtcdEntry,
    EtcdOp,
    LeaseIs,
    ModRevisionIs,
    PutOp,
    VersionIs,
)
from kafscale_lakehouse.etcd.errors import EtcdAuthError, EtcdError, EtcdRequestError, EtcdUnavailableError

__all__ = [
    "EtcdAuthError",
    "EtcdClient",
    "EtcdCompare",
    "EtcdEntry",
    "EtcdError",
    "EtcdOp",
    "EtcdRequestError",
    "EtcdUnavailableError",
    "LeaseIs",
    "ModRevisionIs",
    "PutOp",
    "VersionIs",
]
