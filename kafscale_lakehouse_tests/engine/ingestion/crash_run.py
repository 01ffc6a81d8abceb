"""Run `kafscale-lakehouse ingest --once` in this process and SIGKILL it right after its lease keeper renewed a lease.

    python -m kafscale_lakehouse_tests.engine.ingestion.crash_run renewing-lease --config lakehouse.yaml

Test-only: production code has no kill hooks, so this wraps the functions the ingest run calls (by module
attribute, as `mock.patch` would) and then hands over to the CLI's `main()`. `renewing-lease`: the lease keeper has
just renewed the lease while the main thread is parked inside the run (the Spark job never returns). Right before the
kill a `KILL POINT renewing-lease` line is logged (stderr), so the test can tell the kill from a crash. The kill
points of the commit protocol are the fault matrix actor's (engine/faults/actor.py; `IngestWorld.run_killed` runs
either).
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
    if point != "renewing-lease":
        raise SystemExit(f"unknown kill point {point!r} (the commit protocol's are engine/faults/actor.py's)")
    real_renew = EtcdOffsetStore._renew_lease

    def renew_then_die(self, lease):
        real_renew(self, lease)
        _die(point)

    EtcdOffsetStore._renew_lease = renew_then_die
    # Park the run while it holds its leases, so the keeper's first renewal is what happens next.
    ingest.run_ingestion_spark_job = lambda *args, **kwargs: threading.Event().wait()


if __name__ == "__main__":
    _install(sys.argv[1])
    sys.exit(cli.main(["ingest", *sys.argv[2:], "--once"]))
