"""Offsets, watermarks and leases of the processor behind one interface (`OffsetStore`), with an `etcd` backend
(KafScale-compatible keys and bytes) and a `local` sqlite backend with the same semantics."""

from kafscale_lakehouse.offsets.errors import (
    CommitConflictError,
    CorruptOffsetRecordError,
    LeaseHeldError,
    LeaseLostError,
    OffsetRegressionError,
    OffsetStoreError,
    OffsetStoreUnavailableError,
)
from kafscale_lakehouse.offsets.etcd_store import EtcdOffsetStore
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore
from kafscale_lakehouse.offsets.records import NOT_COMMITTED, NOTHING_COMMITTED, CommittedOffset, TableIdentity
from kafscale_lakehouse.offsets.store import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_LEASE_TTL_SECONDS,
    Lease,
    OffsetStore,
)

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_LEASE_TTL_SECONDS",
    "NOTHING_COMMITTED",
    "NOT_COMMITTED",
    "CommitConflictError",
    "CommittedOffset",
    "CorruptOffsetRecordError",
    "EtcdOffsetStore",
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "LocalOffsetStore",
    "OffsetRegressionError",
    "OffsetStore",
    "OffsetStoreError",
    "OffsetStoreUnavailableError",
    "TableIdentity",
]
