"""Our Iceberg snapshot summaries (like pyiceberg's `table/snapshots.py`): every `kafscale.*` key, one parsed record
of a commit of ours (`KafscaleCommit`), one "is this ours" test and one ancestry walk.

A commit of ours carries, per topic, `kafscale.offsets.<topic>` = compact JSON `{"<partition>": <next offset>}` for
every topic and partition committed so far (carried forward), so the newest commit of ours has the full map.
Snapshots written by other engines (compaction, deletes) carry none of it. This is the only module that knows the
keys' spelling and encoding; writers build their properties and readers parse snapshots through it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import ADDED_RECORDS, Snapshot, ancestors_of

log = logging.getLogger(__name__)

# On the table's commits of ours.
OFFSETS_PROPERTY_PREFIX = "kafscale.offsets."  # + topic: {"<partition>": <next offset>}
SKIPPED_PROPERTY_PREFIX = "kafscale.skipped."  # + topic: {"<partition>": [from, to)} deleted before ingestion
# + topic: {"<partition>": [to, from)} on a commit that moved the partition's next offset back from `from` to `to`
# on purpose (`offsets reset --to-offset`, engine/ingestion/replay.py), removing the rows of those offsets to land
# them again: the offsets_contiguous check accepts exactly this move back and names it.
MOVED_BACK_PROPERTY_PREFIX = "kafscale.moved-back."
RUN_ID_PROPERTY = "kafscale.run-id"
COMMIT_ID_PROPERTY = "kafscale.commit-id"
# On a downstream write's snapshots (engine/tables/writes.py): the same for every attempt of one write, so that an
# append retried after its commit landed finds it instead of appending again.
WRITE_ID_PROPERTY = "kafscale.write-id"
# Milliseconds from the start of the write to the commit, the Go processor's write latency, for `serve-metrics`.
WRITE_LATENCY_PROPERTY = "kafscale.write-latency-ms"
# `{"<partition>": ms}`: the Kafka timestamp of the last record committed per partition, the Go processor's
# `watermark_timestamp_ms`, for `serve-metrics` (etcd's `last_timestamp_ms` is the commit time, as Go writes it).
WATERMARK_TIMESTAMP_PROPERTY = "kafscale.watermark-timestamp-ms"
# Where the commit's invalid records were staged (engine/tables/dead_letters.py).
DEAD_LETTER_TABLE_PROPERTY = "kafscale.dead-letter.table"
STAGED_SNAPSHOT_PROPERTY = "kafscale.dead-letter.staged-snapshot-id"
DEAD_LETTER_RECORDS_PROPERTY = "kafscale.dead-letter.records"
# On the dead-letter table's snapshots.
SOURCE_TABLE_PROPERTY = "kafscale.dead-letter.source-table"
SOURCE_SNAPSHOT_PROPERTY = "kafscale.dead-letter.source-snapshot-id"
OFFSET_RANGES_PROPERTY_PREFIX = "kafscale.dead-letter.offsets."  # + topic: {"<partition>": [start, end]}
# + topic: {"<partition>": end}, carried forward by every dead-letter snapshot of ours: the dead-letter table holds
# no dead letter of the partition at or beyond `end` (engine/tables/dead_letters.py: when a publication replaces).
DEAD_LETTER_ENDS_PROPERTY_PREFIX = "kafscale.dead-letter.ends."
# On the table's snapshot: every staged dead letter up to this table snapshot was published when the run started.
PUBLISHED_THROUGH_PROPERTY = "kafscale.dead-letter.published-through"
# On an empty dead-letter snapshot: the staged snapshot it stands for was gone, its records are reported lost.
LOST_RECORDS_PROPERTY = "kafscale.dead-letter.lost-records"
# LFS (engine/ingestion/lfs.py). Go's `lfs_resolution_duration_seconds` buckets (prometheus.DefBuckets).
LFS_DURATION_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Snapshot summary keys of a commit's LFS counts (the records that commit covers); `serve-metrics` sums them.
LFS_RESOLVED_PROPERTY = "kafscale.lfs.resolved"
LFS_RESOLVED_BYTES_PROPERTY = "kafscale.lfs.resolved-bytes"
LFS_SKIPPED_PROPERTY = "kafscale.lfs.skipped"
LFS_ERRORS_PROPERTY_PREFIX = "kafscale.lfs.errors."  # + reason
LFS_DURATION_SUM_PROPERTY = "kafscale.lfs.resolution-seconds"
# JSON list: blobs per LFS_DURATION_BUCKETS_SECONDS bucket (not cumulative), the last one above 10 s.
LFS_DURATION_BUCKETS_PROPERTY = "kafscale.lfs.resolution-buckets"
KAFSCALE_PROPERTY_PREFIX = "kafscale."

# {topic: {partition: next offset}}
CommittedOffsets = dict[str, dict[int, int]]


class CorruptOffsetsPropertyError(RuntimeError):
    """A `kafscale.offsets.<topic>` (or `kafscale.skipped.<topic>`) summary property that cannot be parsed."""


# ------------------------------------------------------------------------------------------ encoding


def parse_offsets_property(value: str, *, where: str) -> dict[int, int]:
    """`{"0": 1200}` → `{0: 1200}`; `where` names the snapshot and property for the error."""
    try:
        raw = json.loads(value)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        offsets = {int(p): o for p, o in raw.items()}
        if not all(type(o) is int and o >= 0 and p >= 0 for p, o in offsets.items()):
            raise ValueError("partitions and offsets must be non-negative integers")
    except ValueError as exc:
        raise CorruptOffsetsPropertyError(f"{where}: {value!r} is not a partition → offset map ({exc})") from exc
    return offsets


def format_offsets_property(offsets: Mapping[int, int]) -> str:
    """Compact JSON with partitions in numeric order: `{"0":1200,"1":980}`."""
    return json.dumps({str(p): offsets[p] for p in sorted(offsets)}, separators=(",", ":"))


def parse_skipped_property(value: str | None, *, where: str) -> dict[int, tuple[int, int]]:
    """`{"0": [10, 40]}` -> `{0: (10, 40)}` (offsets [from, to) skipped); None -> `{}`."""
    if value is None:
        return {}
    try:
        return {int(p): (int(r[0]), int(r[1])) for p, r in json.loads(value).items()}
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise CorruptOffsetsPropertyError(f"{where}: {value!r} is not a partition → [from, to) map ({exc})") from exc


def format_ranges_property(ranges: Mapping[int, tuple[int, int]]) -> str:
    """`{0: (10, 40)}` -> `{"0":[10,40]}` (partitions in numeric order)."""
    return json.dumps({str(p): list(ranges[p]) for p in sorted(ranges)}, separators=(",", ":"))


def offsets_summary_properties(committed: CommittedOffsets, topic: str,
                               new_offsets: Mapping[int, int]) -> dict[str, str]:
    """Summary properties for a snapshot that advances `topic` to `new_offsets`, carrying every other map forward.

    For any writer of ours (append, replay) so the latest snapshot always has the full map.
    """
    merged = {t: dict(o) for t, o in committed.items()}
    merged.setdefault(topic, {}).update(new_offsets)
    return {OFFSETS_PROPERTY_PREFIX + t: format_offsets_property(o) for t, o in merged.items()}


def skipped_summary_properties(topic: str, skipped: Mapping[int, tuple[int, int]]) -> dict[str, str]:
    """`kafscale.skipped.<topic>` for the gaps a commit skipped (nothing when it skipped none)."""
    return {SKIPPED_PROPERTY_PREFIX + topic: format_ranges_property(skipped)} if skipped else {}


def moved_back_summary_properties(topic: str, moved_back: Mapping[int, tuple[int, int]]) -> dict[str, str]:
    """`kafscale.moved-back.<topic>` for the partitions a commit moved back, `{p: (to, from)}` (nothing when none)."""
    return {MOVED_BACK_PROPERTY_PREFIX + topic: format_ranges_property(moved_back)} if moved_back else {}


def is_reserved_property(key: str) -> bool:
    """Keys the commit protocol sets itself (callers may not pass them as extra snapshot properties)."""
    return key.startswith(OFFSETS_PROPERTY_PREFIX) or key in (RUN_ID_PROPERTY, COMMIT_ID_PROPERTY)


@dataclass
class LfsStats:
    """What one task did with envelopes (summed on the driver into the commit's snapshot summary)."""

    resolved: int = 0
    resolved_bytes: int = 0
    skipped: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by reason (decode, resolve)
    resolution_seconds: float = 0.0
    duration_buckets: list[int] = field(default_factory=lambda: [0] * (len(LFS_DURATION_BUCKETS_SECONDS) + 1))

    def observe(self, seconds: float) -> None:
        self.resolution_seconds += seconds
        index = next((i for i, bound in enumerate(LFS_DURATION_BUCKETS_SECONDS) if seconds <= bound),
                     len(LFS_DURATION_BUCKETS_SECONDS))
        self.duration_buckets[index] += 1

    def add(self, other: LfsStats) -> None:
        self.resolved += other.resolved
        self.resolved_bytes += other.resolved_bytes
        self.skipped += other.skipped
        self.errors.update(other.errors)
        self.resolution_seconds += other.resolution_seconds
        self.duration_buckets = [a + b for a, b in zip(self.duration_buckets, other.duration_buckets, strict=False)]

    @property
    def empty(self) -> bool:
        return not (self.resolved or self.skipped or sum(self.errors.values()))


def lfs_summary_properties(stats: LfsStats) -> dict[str, str]:
    """The snapshot summary properties of a commit's LFS counts; none when it saw no envelope."""
    if stats.empty:
        return {}
    properties = {LFS_RESOLVED_PROPERTY: str(stats.resolved), LFS_RESOLVED_BYTES_PROPERTY: str(stats.resolved_bytes),
                  LFS_SKIPPED_PROPERTY: str(stats.skipped),
                  LFS_DURATION_SUM_PROPERTY: f"{stats.resolution_seconds:.6f}",
                  LFS_DURATION_BUCKETS_PROPERTY: json.dumps(stats.duration_buckets, separators=(",", ":"))}
    for reason, count in sorted(stats.errors.items()):
        properties[LFS_ERRORS_PROPERTY_PREFIX + reason] = str(count)
    return properties


def lfs_stats_from_summary(summary: Mapping[str, str]) -> LfsStats:
    """Inverse of `lfs_summary_properties`; `ValueError` for a malformed value."""
    stats = LfsStats(resolved=int(summary.get(LFS_RESOLVED_PROPERTY, 0)),
                     resolved_bytes=int(summary.get(LFS_RESOLVED_BYTES_PROPERTY, 0)),
                     skipped=int(summary.get(LFS_SKIPPED_PROPERTY, 0)),
                     resolution_seconds=float(summary.get(LFS_DURATION_SUM_PROPERTY, 0)))
    for key, value in summary.items():
        if key.startswith(LFS_ERRORS_PROPERTY_PREFIX):
            stats.errors[key[len(LFS_ERRORS_PROPERTY_PREFIX):]] = int(value)
    if LFS_DURATION_BUCKETS_PROPERTY in summary:
        buckets = json.loads(summary[LFS_DURATION_BUCKETS_PROPERTY])
        if not (isinstance(buckets, list) and len(buckets) == len(stats.duration_buckets)
                and all(type(b) is int for b in buckets)):
            raise ValueError(f"{LFS_DURATION_BUCKETS_PROPERTY} is not a list of "
                             f"{len(stats.duration_buckets)} integers")
        stats.duration_buckets = buckets
    return stats


# ------------------------------------------------------------------------------------------ one commit


@dataclass(frozen=True)
class KafscaleCommit:
    """One snapshot written by us, parsed."""

    snapshot: Snapshot
    offsets: CommittedOffsets  # every topic's next offset per partition after this commit
    skipped: dict[str, dict[int, tuple[int, int]]]  # topic -> partition -> [from, to) deleted before ingestion
    moved_back: dict[str, dict[int, tuple[int, int]]]  # topic -> partition -> [to, from) removed by a move back
    run_id: str | None
    commit_id: str | None
    added_records: int | None
    write_latency_ms: int | None
    dead_letter_records: int | None
    dead_letter_table: str | None
    watermark_timestamps: dict[int, int]  # partition -> Kafka timestamp of the last record committed
    lfs: LfsStats  # what the commit's records did with LFS envelopes (empty when none)

    @property
    def snapshot_id(self) -> int:
        return self.snapshot.snapshot_id

    @property
    def timestamp_ms(self) -> int:
        return self.snapshot.timestamp_ms

    def next_offsets(self, topic: str) -> dict[int, int]:
        return self.offsets.get(topic, {})

    def skipped_ranges(self, topic: str) -> dict[int, tuple[int, int]]:
        return self.skipped.get(topic, {})

    def moved_back_ranges(self, topic: str) -> dict[int, tuple[int, int]]:
        return self.moved_back.get(topic, {})


def summary_properties(snapshot: Snapshot) -> dict[str, str]:
    return snapshot.summary.additional_properties if snapshot.summary is not None else {}


def is_kafscale_commit(snapshot: Snapshot, topic: str | None = None) -> bool:
    """Whether `snapshot` is one of our commits (of `topic`, when given): it carries a `kafscale.offsets.` map."""
    properties = summary_properties(snapshot)
    if topic is not None:
        return OFFSETS_PROPERTY_PREFIX + topic in properties
    return any(key.startswith(OFFSETS_PROPERTY_PREFIX) for key in properties)


def parse_commit(snapshot: Snapshot, *, table_name: str) -> KafscaleCommit | None:
    """`snapshot` as a commit of ours, or None when it is not one. A corrupt offsets or skipped map raises
    `CorruptOffsetsPropertyError`; an unreadable counter is logged and left out (None)."""
    if not is_kafscale_commit(snapshot):
        return None
    properties = summary_properties(snapshot)
    where = f"table {table_name} snapshot {snapshot.snapshot_id} property {{}}"
    offsets = {key[len(OFFSETS_PROPERTY_PREFIX):]: parse_offsets_property(value, where=where.format(key))
               for key, value in properties.items() if key.startswith(OFFSETS_PROPERTY_PREFIX)}
    skipped = {key[len(SKIPPED_PROPERTY_PREFIX):]: parse_skipped_property(value, where=where.format(key))
               for key, value in properties.items() if key.startswith(SKIPPED_PROPERTY_PREFIX)}
    moved_back = {key[len(MOVED_BACK_PROPERTY_PREFIX):]: parse_skipped_property(value, where=where.format(key))
                  for key, value in properties.items() if key.startswith(MOVED_BACK_PROPERTY_PREFIX)}
    counter = lambda key: _int_property(table_name, snapshot, properties, key)  # noqa: E731
    return KafscaleCommit(
        snapshot=snapshot, offsets=offsets, skipped=skipped, moved_back=moved_back,
        run_id=properties.get(RUN_ID_PROPERTY),
        commit_id=properties.get(COMMIT_ID_PROPERTY), added_records=counter(ADDED_RECORDS),
        write_latency_ms=counter(WRITE_LATENCY_PROPERTY), dead_letter_records=counter(DEAD_LETTER_RECORDS_PROPERTY),
        dead_letter_table=properties.get(DEAD_LETTER_TABLE_PROPERTY),
        watermark_timestamps=_watermark_timestamps(table_name, snapshot, properties),
        lfs=_lfs_stats(table_name, snapshot, properties))


def _lfs_stats(table_name: str, snapshot: Snapshot, properties: Mapping[str, str]) -> LfsStats:
    """Unreadable LFS counts (logged) are left out, like an unreadable counter."""
    try:
        return lfs_stats_from_summary(properties)
    except (ValueError, TypeError) as exc:
        log.warning("table %s snapshot %d: LFS summary properties are malformed (%s); not counted", table_name,
                    snapshot.snapshot_id, exc)
        return LfsStats()


def _watermark_timestamps(table_name: str, snapshot: Snapshot, properties: Mapping[str, str]) -> dict[int, int]:
    """A summary written before the property existed, or unreadable (logged), has none: the metric is left out."""
    value = properties.get(WATERMARK_TIMESTAMP_PROPERTY)
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
        return {int(partition): int(timestamp) for partition, timestamp in parsed.items()
                if not isinstance(timestamp, bool)}
    except (ValueError, TypeError, AttributeError):
        log.warning("table %s snapshot %d: summary property %s is %r, not {partition: ms}; not used", table_name,
                    snapshot.snapshot_id, WATERMARK_TIMESTAMP_PROPERTY, value[:80])
        return {}


def _int_property(table_name: str, snapshot: Snapshot, properties: Mapping[str, str], key: str) -> int | None:
    value = properties.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        log.warning("table %s snapshot %d: summary property %s is %r, not an integer; left out", table_name,
                    snapshot.snapshot_id, key, value[:40])
        return None


# ------------------------------------------------------------------------------------------ history


def ancestry(table: Table) -> Iterator[Snapshot]:
    """The table's current snapshot and its ancestors, newest first (lazily: stop early by breaking)."""
    return iter(ancestors_of(table.current_snapshot(), table.metadata))


def kafscale_commits(table: Table, topic: str | None = None) -> Iterator[KafscaleCommit]:
    """Our commits (of `topic`, when given) in the table's current ancestry, newest first."""
    table_name = ".".join(table.name())
    for snapshot in ancestry(table):
        if is_kafscale_commit(snapshot, topic):
            commit = parse_commit(snapshot, table_name=table_name)
            if commit is not None:
                yield commit


def latest_commit(table: Table, topic: str | None = None) -> KafscaleCommit | None:
    return next(kafscale_commits(table, topic), None)


def read_committed_offsets(table: Table) -> CommittedOffsets:
    """Next offsets per topic and partition, from the latest commit of ours in the current ancestry.

    Reads the table object as it is; refresh it first for the catalog's latest state.
    """
    commit = latest_commit(table)
    return commit.offsets if commit is not None else {}


def read_topic_offsets(table: Table, topic: str) -> dict[int, int]:
    return read_committed_offsets(table).get(topic, {})


def find_commit(table: Table, commit_id: str, *, since: int | None = None) -> KafscaleCommit | None:
    """Our commit with `commit_id` in the table's current ancestry (as the table object is), or None. With `since`
    (the snapshot that was current before the commit was attempted) the walk stops there: it costs what was committed
    meanwhile, not the table's history."""
    table_name = ".".join(table.name())
    for snapshot in ancestry(table):
        if snapshot.snapshot_id == since:
            return None
        if summary_properties(snapshot).get(COMMIT_ID_PROPERTY) == commit_id:
            return parse_commit(snapshot, table_name=table_name)
    return None


def branch_head(table: Table, branch: str) -> int | None:
    ref = table.metadata.refs.get(branch)
    return ref.snapshot_id if ref is not None else None


def ref_view(table: Table, branch: str) -> Table:
    """`table` as of `branch`: a `Table` whose current snapshot (and `main`) is the branch's head, for reading
    (offsets, ancestry, scans, checks) with the functions that read a table's current state. A commit through it
    would require `main` to be the branch's head, which the catalog refuses while the two differ."""
    head = branch_head(table, branch)
    if branch == MAIN_BRANCH or head is None or head == table.metadata.current_snapshot_id:
        return table
    refs = {**table.metadata.refs, MAIN_BRANCH: table.metadata.refs[branch]}
    metadata = table.metadata.model_copy(update={"current_snapshot_id": head, "refs": refs})
    return Table(identifier=table.name(), metadata=metadata, metadata_location=table.metadata_location,
                 io=table.io, catalog=table.catalog)
