"""Run `kafscale-lakehouse ingest --once` in this process and SIGKILL it at one step of the commit protocol.

    python -m kafscale_lakehouse_tests.engine.ingestion.crash_run <kill point> --config lakehouse.yaml

Test-only: production code has no kill hooks, so this wraps the functions the ingest run calls (by module
attribute, as `mock.patch` would) and then hands over to the CLI's `main()`. Kill points:
- `before-iceberg-commit`: data files are written, `commit_append` is about to run;
- `after-iceberg-commit`: `commit_append` returned (snapshot committed), etcd offsets not yet written;
- `renewing-lease`: the lease keeper has just renewed the lease; the main thread is parked inside the run.
Right before the kill a `KILL POINT <name>` line is logged (stderr), so the test can tell the kill from a crash.
A process that is not killed exits with the CLI's code.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import kafscale_lakehouse.engine.ingestion.run as ingest
from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.offsets.etcd_store import EtcdOffsetStore

log = logging.getLogger("kafscale_lakehouse_tests.crash_run")


def _die(point: str) -> None:
    log.warning("KILL POINT %s", point)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _install(point: str) -> None:
    if point in ("before-iceberg-commit", "after-iceberg-commit"):
        real_commit_append = ingest.commit_append

        def commit_append(*args, **kwargs):
            if point == "before-iceberg-commit":
                _die(point)
            result = real_commit_append(*args, **kwargs)
            _die(point)
            return result

        ingest.commit_append = commit_append
    elif point == "renewing-lease":
        real_renew = EtcdOffsetStore._renew_lease

        def renew_then_die(self, lease):
            real_renew(self, lease)
            _die(point)

        EtcdOffsetStore._renew_lease = renew_then_die
        # Park the run while it holds its leases, so the keeper's first renewal is what happens next.
        ingest.run_ingestion_spark_job = lambda *args, **kwargs: threading.Event().wait()
    else:
        raise SystemExit(f"unknown kill point {point!r}")


if __name__ == "__main__":
    _install(sys.argv[1])
    sys.exit(cli.main(["ingest", *sys.argv[2:], "--once"]))
