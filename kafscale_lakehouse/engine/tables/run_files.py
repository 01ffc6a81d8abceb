"""Clean-up that owns only its own files: a run's data files, removed once the run is known to have ended.

Every writer of an ingestion run (the mapping's table, its dead-letter table) writes its data files into a directory
of its own under that table's data path (`data_files.writer_data_dir`, never shared with another table of a batch,
another topic writing the same dead-letter table, or another attempt). Before it writes anything, and under the
leases it holds, the run records in the offsets store which directories those are, with each table's UUID
(`register_run`). A run that settles its files (committed them, or deleted what it did not commit) forgets its record
(`forget_run`). A record that is left behind belongs to a run that crashed or whose commit outcome was unknown; a
later run of the same topic settles it (`clean_ended_runs`) when, and only when:
- the run has ended: none of its partitions' leases is held by its owner any more (a live run is never touched,
  however old its files are);
- the table is the one the run wrote to (same UUID: a table renamed and recreated at the same location is another
  table, whose files are left to that table's orphan-file removal);
- the REFRESHED table (a view loaded before the leases were taken may predate the ended run's commit) proves that
  the run's commit can never land (`run_outcome`): no commit was ever sent, or the ref the commit was aimed at
  (`main`, or the audit branch of an audited publish) has moved past the snapshot the commit was built on
  (`record_commit_attempt` records ref and snapshot, fenced by the leases, before every attempt: a run that lost its
  leases sends nothing the record does not name), through a complete history, and no retained snapshot carries its
  run id. This reads table metadata only, back to that snapshot. While the ref is still at that snapshot the record
  stays for a later run; when the outcome cannot be proven (a record of an older version without the base, a staged
  dead-letter commit, snapshots expired since, the ref dropped) the files are left to orphan-file removal, which
  checks every reference;
- no snapshot of any ref (branches and tags included) written since the run started references a file of the
  directory (`referenced_files`: the manifests those snapshots added, never the table's older ones).
Then only that writer's directory is listed and deleted: the cost is what the run wrote, never the table's size or age.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyarrow.fs import FileSelector, FileType
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot

from kafscale_lakehouse.engine.errors import EngineError
from kafscale_lakehouse.engine.phases import timed
from kafscale_lakehouse.engine.tables.commits import delete_data_files
from kafscale_lakehouse.engine.tables.data_files import table_data_path, writer_data_dir
from kafscale_lakehouse.engine.tables.summary import RUN_ID_PROPERTY
from kafscale_lakehouse.offsets import Lease, OffsetStore
from kafscale_lakehouse.offsets.store import now_ms

log = logging.getLogger(__name__)

# Snapshot timestamps come from the catalog's or writer's clock, the run's start from ours: allow this much skew.
CLOCK_SKEW_MS = 10 * 60 * 1000


class RunRecordError(EngineError):
    """A run record in the offsets store cannot be read."""


# RunTable.attempt: what the run may have sent the catalog (None: a record written before this was recorded).
NO_ATTEMPT = "none"  # no commit sent: the run's files can never be referenced
ON_REF = "ref"  # a commit requiring the ref `ref` to be at `base_snapshot_id` (None: the ref did not exist)
STAGED = "staged"  # a commit no ref guards (a staged dead-letter snapshot): it can land whatever main does
_ON_MAIN_BEFORE_REFS = "main"  # records written before `ref` was recorded: a commit guarded by main


@dataclass(frozen=True)
class RunTable:
    name: str
    uuid: str
    data_dir: str  # the writer's own directory under the table's data path
    attempt: str | None = None
    base_snapshot_id: int | None = None
    ref: str = MAIN_BRANCH  # the ref an ON_REF commit requires at `base_snapshot_id`

    def encode(self) -> dict:
        encoded: dict = {"name": self.name, "uuid": self.uuid, "data_dir": self.data_dir}
        if self.attempt is not None:
            encoded.update(attempt=self.attempt, base=self.base_snapshot_id)
        if self.attempt == ON_REF:
            encoded.update(ref=self.ref)
        return encoded

    @classmethod
    def decode(cls, raw: dict) -> RunTable:
        base = raw.get("base")
        attempt = None if raw.get("attempt") is None else str(raw["attempt"])
        if attempt == _ON_MAIN_BEFORE_REFS:
            attempt = ON_REF
        return cls(str(raw["name"]), str(raw["uuid"]), str(raw["data_dir"]), attempt,
                   None if base is None else int(base), str(raw.get("ref") or MAIN_BRANCH))


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
            "tables": [t.encode() for t in self.tables],
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, where: str, value: bytes) -> RunRecord:
        try:
            raw = json.loads(value)
            return cls(run_id=str(raw["run_id"]), owner_id=str(raw["owner_id"]),
                       partitions=tuple(int(p) for p in raw["partitions"]), started_ms=int(raw["started_ms"]),
                       tables=tuple(RunTable.decode(t) for t in raw["tables"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise RunRecordError(f"{where}: run record {value[:200]!r} cannot be read ({exc})") from exc


def run_table(table: Table, run_id: str) -> RunTable:
    """`table` as a run's record names it, with a new writer directory of its own."""
    return RunTable(".".join(table.name()), str(table.metadata.table_uuid),
                    writer_data_dir(table_data_path(table), run_id), attempt=NO_ATTEMPT)


def register_run(store: OffsetStore, leases: Sequence[Lease], run_id: str, tables: Sequence[Table]) -> RunRecord:
    """Record where `run_id` is going to write, fenced by its leases; call before any file is written."""
    leases = list(leases)
    record = RunRecord(run_id=run_id, owner_id=leases[0].owner_id,
                       partitions=tuple(sorted(lease.partition for lease in leases)), started_ms=now_ms(),
                       tables=tuple(run_table(table, run_id) for table in tables))
    store.record_run(leases, run_id, record.encode())
    return record


def record_commit_attempt(store: OffsetStore, leases: Sequence[Lease], record: RunRecord, table: Table, *,
                          staged: bool = False, ref: str = MAIN_BRANCH) -> RunRecord:
    """Record, fenced by the run's leases, the commit the run is about to send to `table`: built on the current head
    of `ref` (the ref the commit requires there: `main`, or the audit branch of an audited publish) of the refreshed
    `table`, or `staged`. Call right before every commit attempt, and send nothing when it raises
    (`LeaseLostError`): a run that lost a lease can then never send a commit the record does not name, so clean-up,
    which reads the record only once every lease is gone, knows which commit could still land."""
    uuid = str(table.metadata.table_uuid)
    current = next((t for t in record.tables if t.uuid == uuid), None)
    if current is None:
        raise RunRecordError(f"table {'.'.join(table.name())}: run {record.run_id} did not register it")
    attempt = replace(current, attempt=STAGED if staged else ON_REF,
                      base_snapshot_id=None if staged else ref_head(table, ref), ref=ref)
    updated = replace(record, tables=tuple(attempt if t.uuid == uuid else t for t in record.tables))
    store.record_run(leases, record.run_id, updated.encode())
    return updated


def forget_run(store: OffsetStore, topic: str, run_id: str) -> None:
    """The run's files are settled (committed, or deleted by the run itself)."""
    try:
        store.forget_run(topic, run_id)
    except Exception:
        log.warning("could not forget the record of run %s of topic %s in %s", run_id, topic, store.location,
                    exc_info=True)


@timed("ended-run clean-up")
def clean_ended_runs(store: OffsetStore, topic: str, tables: Sequence[Table]) -> list[str]:
    """Settle the records of ended runs of `topic` (see the module docstring); returns the deleted file paths.

    Call under the leases just taken: each table is refreshed here (once, when an ended run wrote to it), since a
    view loaded before the leases may predate an ended run's commit. A record whose commit may still land (main is
    still at the snapshot that commit was built on) is kept for a later run; an unknown outcome is left to
    orphan-file removal. A crash here leaves the records, which the next run settles the same way."""
    deleted: list[str] = []
    by_uuid = {str(t.metadata.table_uuid): t for t in tables}
    refreshed: set[str] = set()
    for run_id, value in store.recorded_runs(topic):
        record = RunRecord.decode(f"{store.location} {store.keys.run(topic, run_id)}", value)
        live = [p for p in record.partitions if store.lease_holder(topic, p) == record.owner_id]
        if live:
            log.debug("run %s of topic %s still holds partitions %s: its files are left alone", run_id, topic, live)
            continue
        pending = False
        for recorded in record.tables:
            table = by_uuid.get(recorded.uuid)
            if table is None:
                log.info("run %s of topic %s wrote to table %s (uuid %s), which is not the table here any more; its "
                         "files in %s are left to that table's orphan-file removal", run_id, topic, recorded.name,
                         recorded.uuid, recorded.data_dir)
                continue
            if recorded.uuid not in refreshed:
                table.refresh()
                refreshed.add(recorded.uuid)
            outcome = run_outcome(table, recorded, run_id, record.started_ms)
            if outcome == PENDING:
                log.info("table %s: the commit of ended run %s may still land (%s is still at snapshot %s it was "
                         "built on); its record and files in %s stay for a later run", recorded.name, run_id,
                         recorded.ref, recorded.base_snapshot_id, recorded.data_dir)
                pending = True
            elif outcome == UNKNOWN:
                log.warning("table %s: cannot tell whether ended run %s committed (no record of its commit's base, or "
                            "snapshots expired since); its files in %s are left to orphan-file removal",
                            recorded.name, run_id, recorded.data_dir)
            elif outcome == NEVER:
                referenced = referenced_files(table, recorded.data_dir, record.started_ms)
                if referenced is None or referenced:
                    log.warning("table %s: %s of ended run %s in %s; its files are left to orphan-file removal",
                                recorded.name, "a snapshot references files" if referenced else
                                "cannot tell whether a snapshot references files", run_id, recorded.data_dir)
                else:
                    deleted.extend(remove_run_files(table, recorded.data_dir))
        if not pending:
            store.forget_run(topic, run_id)
    return deleted


COMMITTED, NEVER, PENDING, UNKNOWN = "committed", "never", "pending", "unknown"


def run_outcome(table: Table, recorded: RunTable, run_id: str, started_ms: int) -> str:
    """What the REFRESHED `table` proves about an ended run's commit to it: COMMITTED (a retained snapshot carries
    the run id), NEVER (no commit was sent; or the ref the commit required at a snapshot has moved past it, through
    a complete history, without it: the catalog refuses it whenever it arrives), PENDING (the ref is still at that
    snapshot: the commit may land yet) or UNKNOWN (no base recorded, a staged commit, the ref dropped, or a hole in
    the history). Only NEVER allows deleting the run's files. Reads only the table metadata, back to the commit's
    base."""
    committed = run_committed(table, run_id, started_ms)
    if committed:
        return COMMITTED
    if recorded.attempt == NO_ATTEMPT:
        return NEVER
    if recorded.attempt != ON_REF:
        return UNKNOWN
    ref = table.metadata.refs.get(recorded.ref)
    if ref is None and recorded.ref != MAIN_BRANCH:
        # A dropped branch may be created again at the commit's base (an audit branch starts at main's head).
        return PENDING if recorded.base_snapshot_id is None else UNKNOWN
    head = ref.snapshot_id if ref is not None else None
    if head == recorded.base_snapshot_id:
        return PENDING
    walked = []
    snapshot = table.metadata.snapshot_by_id(head) if head is not None else None
    while snapshot is not None:
        walked.append(snapshot)
        if snapshot.parent_snapshot_id == recorded.base_snapshot_id:
            return NEVER if history_complete(table.metadata.snapshots, walked) else UNKNOWN
        if snapshot.parent_snapshot_id is None:
            break
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
    return UNKNOWN  # the base is not an ancestor of main (rolled back?) or the walk reached an expired snapshot


def run_committed(table: Table, run_id: str, started_ms: int) -> bool | None:
    """Whether a snapshot of `table` carries `run_id`: True when one does; False only when the retained history
    proves none ever did; None (unknown: keep the files) otherwise. Reads only the loaded table metadata.

    Absence is proven when every snapshot written since the run started (less the clock skew) still has its parent:
    then no snapshot of that time was expired, and the run's commit, which is one of them, would be seen. A retained
    snapshot older than the run's start (a tag, a branch head, a staged dead-letter snapshot) proves nothing about
    the snapshots after it: one of those may be the run's, expired since."""
    snapshots = table.metadata.snapshots
    if any(s.summary is not None and s.summary.get(RUN_ID_PROPERTY) == run_id for s in snapshots):
        return True
    since = started_ms - CLOCK_SKEW_MS
    return False if history_complete(snapshots, [s for s in snapshots if s.timestamp_ms >= since]) else None


def history_complete(snapshots: Sequence[Snapshot], walked: Sequence[Snapshot]) -> bool:
    """Whether no snapshot just before any of `walked` (a subset of the table's retained `snapshots`) was expired.

    An expired parent shows in two ways: Java Iceberg keeps the child's parent id, which no longer resolves;
    pyiceberg clears it, so a v2 table shows a gap in the sequence numbers (each commit takes the next one) and any
    table shows a second root."""
    ids = {s.snapshot_id for s in snapshots}
    sequence_numbers = {s.sequence_number for s in snapshots}
    for snapshot in walked:
        if snapshot.parent_snapshot_id is not None and snapshot.parent_snapshot_id not in ids:
            return False
        number = snapshot.sequence_number
        if number is not None and number > 1 and number - 1 not in sequence_numbers:
            return False
    return sum(1 for s in snapshots if s.parent_snapshot_id is None) <= 1


def ref_head(table: Table, ref: str) -> int | None:
    """The snapshot `ref` of `table` points at (None: no such ref, or an empty table's main)."""
    found = table.metadata.refs.get(ref)
    return found.snapshot_id if found is not None else None


def referenced_files(table: Table, data_dir: str, since_ms: int) -> list[str] | None:
    """The files under `data_dir` that a snapshot of `table` (of any ref, branches and tags included) references,
    read from the manifests added by the snapshots written since `since_ms` (less the clock skew): a writer's
    directory does not exist before its run starts, so no older manifest can name its files. None when the
    snapshots of that time are not all retained (one expired may have been the only one naming a file there)."""
    since = since_ms - CLOCK_SKEW_MS
    snapshots = table.metadata.snapshots
    recent = [s for s in snapshots if s.timestamp_ms >= since]
    if not history_complete(snapshots, recent):
        return None
    prefix = _without_scheme(data_dir.rstrip("/")) + "/"
    referenced: set[str] = set()
    seen: set[str] = set()
    for snapshot in recent:
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            seen.add(manifest.manifest_path)
            referenced.update(entry.data_file.file_path for entry in manifest.fetch_manifest_entry(table.io)
                              if _without_scheme(entry.data_file.file_path).startswith(prefix))
    return sorted(referenced)


def _without_scheme(path: str) -> str:
    return path.split("://", 1)[-1]


def remove_run_files(table: Table, data_dir: str) -> list[str]:
    """Delete every file in one writer's directory (and the directory); returns the deleted paths. Only for a
    directory whose files no snapshot references (`clean_ended_runs` checks; a writer whose commit was never sent
    knows)."""
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
    log.info("table %s: deleted %d uncommitted data files in %s%s", ".".join(table.name()),
             len(deleted), data_dir, f" ({len(failed)} could not be deleted)" if failed else "")
    return deleted
