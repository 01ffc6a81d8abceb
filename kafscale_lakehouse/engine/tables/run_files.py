"""Clean-up that owns only its own files: a run's data files, removed once the run is known to have ended.

Every ingestion run writes its data files into a directory of its own under each table's data path
(`iceberg_sink.run_data_dir`). Before it writes anything, and under the leases it holds, it records in the offsets
store which directories those are, with the table's UUID (`register_run`). A run that settles its files (committed
them, or deleted what it did not commit) forgets its record (`forget_run`). A record that is left behind belongs to a
run that crashed or whose commit outcome was unknown; a later run of the same topic settles it
(`clean_ended_runs`) when, and only when:
- the run has ended: none of its partitions' leases is held by its owner any more (a live run is never touched,
  however old its files are);
- the table is the one the run wrote to (same UUID: a table renamed and recreated at the same location is another
  table, whose files are left to that table's orphan-file removal);
- the run did not commit to that table: no snapshot since the run started carries its run id. This reads the
  table metadata that is already loaded, newest first and only back to the run's start, never a manifest. If the
  table's retained history no longer reaches back to the run's start (snapshots expired since), the outcome is not
  known and the files are left to orphan-file removal, which checks every reference.
Then only that run's directory is listed and deleted: the cost is what the run wrote, never the table's size or age.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyarrow.fs import FileSelector, FileType
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.commits import delete_data_files
from kafscale_lakehouse.engine.tables.data_files import run_data_dir
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY
from kafscale_lakehouse.offsets import Lease, OffsetStore
from kafscale_lakehouse.offsets.store import now_ms

log = logging.getLogger(__name__)

# Snapshot timestamps come from the catalog's or writer's clock, the run's start from ours: allow this much skew.
CLOCK_SKEW_MS = 10 * 60 * 1000


class RunRecordError(EngineError):
    """A run record in the offsets store cannot be read."""


@dataclass(frozen=True)
class RunTable:
    name: str
    uuid: str
    data_dir: str  # the run's own directory under the table's data path


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    owner_id: str  # the owner id of the run's leases
    partitions: tuple[int, ...]
    started_ms: int
    tables: tuple[RunTable, ...]

    def encode(self) -> bytes:
        return json.dumps({
            "run_id": self.run_id, "owner_id": self.owner_id, "partitions": list(self.partitions),
            "started_ms": self.started_ms,
            "tables": [{"name": t.name, "uuid": t.uuid, "data_dir": t.data_dir} for t in self.tables],
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, where: str, value: bytes) -> RunRecord:
        try:
            raw = json.loads(value)
            return cls(run_id=str(raw["run_id"]), owner_id=str(raw["owner_id"]),
                       partitions=tuple(int(p) for p in raw["partitions"]), started_ms=int(raw["started_ms"]),
                       tables=tuple(RunTable(str(t["name"]), str(t["uuid"]), str(t["data_dir"]))
                                    for t in raw["tables"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise RunRecordError(f"{where}: run record {value[:200]!r} cannot be read ({exc})") from exc


def run_table(table: Table, run_id: str) -> RunTable:
    data_path = load_location_provider(table.location(), table.properties).data_path
    return RunTable(".".join(table.name()), str(table.metadata.table_uuid), run_data_dir(data_path, run_id))


def register_run(store: OffsetStore, leases: Sequence[Lease], run_id: str, tables: Sequence[Table]) -> RunRecord:
    """Record where `run_id` is going to write, fenced by its leases; call before any file is written."""
    leases = list(leases)
    record = RunRecord(run_id=run_id, owner_id=leases[0].owner_id,
                       partitions=tuple(sorted(lease.partition for lease in leases)), started_ms=now_ms(),
                       tables=tuple(run_table(table, run_id) for table in tables))
    store.record_run(leases, run_id, record.encode())
    return record


def forget_run(store: OffsetStore, topic: str, run_id: str) -> None:
    """The run's files are settled (committed, or deleted by the run itself)."""
    try:
        store.forget_run(topic, run_id)
    except Exception:
        log.warning("could not forget the record of run %s of topic %s in %s", run_id, topic, store.location,
                    exc_info=True)


@timed("ended-run clean-up")
def clean_ended_runs(store: OffsetStore, topic: str, tables: Sequence[Table]) -> list[str]:
    """Settle the records of ended runs of `topic` (see the module docstring); returns the deleted file paths."""
    deleted: list[str] = []
    by_uuid = {str(t.metadata.table_uuid): t for t in tables}
    for run_id, value in store.recorded_runs(topic):
        record = RunRecord.decode(f"{store.location} {store.keys.run(topic, run_id)}", value)
        live = [p for p in record.partitions if store.lease_holder(topic, p) == record.owner_id]
        if live:
            log.debug("run %s of topic %s still holds partitions %s: its files are left alone", run_id, topic, live)
            continue
        for recorded in record.tables:
            table = by_uuid.get(recorded.uuid)
            if table is None:
                log.info("run %s of topic %s wrote to table %s (uuid %s), which is not the table here any more; its "
                         "files in %s are left to that table's orphan-file removal", run_id, topic, recorded.name,
                         recorded.uuid, recorded.data_dir)
                continue
            committed = run_committed(table, run_id, record.started_ms)
            if committed is None:
                log.warning("table %s: cannot tell whether ended run %s committed (its snapshots may have been "
                            "expired); its files in %s are left to orphan-file removal", recorded.name, run_id,
                            recorded.data_dir)
            elif not committed:
                deleted.extend(remove_run_files(table, recorded.data_dir))
        store.forget_run(topic, run_id)
    return deleted


def run_committed(table: Table, run_id: str, started_ms: int) -> bool | None:
    """Whether a snapshot of `table` written since `started_ms` carries `run_id`; None when the retained history
    no longer reaches back that far. Reads only snapshot summaries, newest first, back to the run's start."""
    since = started_ms - CLOCK_SKEW_MS
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
    for snapshot in snapshots:
        if snapshot.timestamp_ms < since:
            return False  # history reaches back before the run: the run's commit would have been seen
        if snapshot.summary is not None and snapshot.summary.get(RUN_ID_PROPERTY) == run_id:
            return True
    # Every snapshot was looked at. If none was ever expired (each parent is still there), the run's commit would
    # have been seen; otherwise it may have been expired, and the outcome is unknown.
    ids = {s.snapshot_id for s in snapshots}
    complete = all(s.parent_snapshot_id is None or s.parent_snapshot_id in ids for s in snapshots)
    return False if complete else None


def remove_run_files(table: Table, data_dir: str) -> list[str]:
    """Delete every file in one run's directory (and the directory); returns the deleted paths."""
    io = table.io if isinstance(table.io, PyArrowFileIO) else PyArrowFileIO(table.io.properties)
    scheme, netloc, path = io.parse_location(data_dir, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    uris = [f"{scheme}://{info.path}" for info in infos if info.type == FileType.File]
    failed = set(delete_data_files(io, uris))
    if not failed:
        with contextlib.suppress(FileNotFoundError, OSError):  # object stores have no directories to remove
            fs.delete_dir(path)
    deleted = [uri for uri in uris if uri not in failed]
    log.info("table %s: deleted %d data files of an ended, uncommitted run in %s%s", ".".join(table.name()),
             len(deleted), data_dir, f" ({len(failed)} could not be deleted)" if failed else "")
    return deleted
