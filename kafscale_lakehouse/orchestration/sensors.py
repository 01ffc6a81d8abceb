"""Sensors: one per mapping, watching the topic's completed segments (S3 or the local segment root) and the broker
watermarks (etcd or the local offsets store), and requesting ingest runs of the mapping's table.

A tick of the sensor of `topic → table`:
1. discovers the topic's Kafka partitions (`discovery.mode`) and registers new ones as Dagster dynamic partitions;
2. lists, per partition, only the segments after the cursor's last seen `.kfs` key (`SegmentStore.list_segments`),
   so a tick costs one listing request per partition plus one footer read per new segment; a partition seen for the
   first time is listed from its committed next offset on (`storage.segments_from`, engine/ingestion/topic_scan.py), so
   segments ingested long ago are never read;
3. reads the committed offsets and the broker watermarks (one range read each) and the table's offsets (one catalog
   load of the table, `TableOffsetsReader`): the table's win where it holds the partition, so after an operator rolls
   the table back the rolled-back offsets are pending again (the run starts from the table's offsets and repairs the
   store, engine/ingestion/positions.py `partition_starts`);
4. reports an observation of the topic asset (`kafscale/<topic>`) when a watermark, a committed offset or the end of
   the completed segments moved: per partition broker next offset, committed next offset (and the store's and the
   table's when they disagree), completed end and lag;
5. requests ONE run of the table's ingest job covering every partition with pending data (a completed segment whose
   last offset is at or after the committed next offset), as a Dagster partition key range (tags
   `dagster/asset_partition_range_start|end`, read by the single-run-backfill asset as `context.partition_keys`;
   dynamic partitions are ordered by insertion, so partitions inside the range without pending data are part of
   the run and simply have nothing to ingest), with the offset ranges it planned (tag `kafscale/planned_ranges`),
   which the run re-checks against the table's committed offsets (the table wins).
No run is requested while a run of the job is queued or in progress (runs would pile up behind the table's pool
faster than they finish; the first tick after it requests whatever is still pending). For exactly the state an
earlier request covered (tag `kafscale/sensor_request`, recorded in the cursor), the run it launched decides:
- it failed (a transient error, say): it is requested again after a backoff of `poll_interval_seconds * 2^(n-1)`
  after its n-th consecutive failure, at most `RETRY_BACKOFF_CAP_SECONDS`; the skip reason says when;
- no run was launched for it: requested again after the same backoff;
- it succeeded without committing anything (nothing it could ingest) or was canceled by an operator: not requested
  again, so nothing loops; new segments, progress on any partition or a manual materialization start the next one;
- it committed (its materializations record committed offset ranges), yet the same state is pending again: the table
  went back (an operator's rollback), so it is requested again at once, as a first attempt.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import PartitionCursor, PartitionState, TopicScan, WatchSources, scan_topic
from kafscale_lakehouse.offsets.ranges import format_ranges
from kafscale_lakehouse.orchestration.metadata import committed_ranges_from_metadata
from kafscale_lakehouse.orchestration.naming import (
    dagster_name_part,
    ingest_job_name,
    kafka_partition_key,
    partitions_def_name,
    topic_asset_key,
    topic_partitions_def,
)
from kafscale_lakehouse.storage import TopicRetention

CURSOR_VERSION = 1
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"
# The offset ranges the sensor planned, `{"<partition>": [start, end]}`: the run re-checks them against the table.
PLANNED_RANGES_TAG = "kafscale/planned_ranges"
# One id per run request of a sensor: how the next ticks find the run it launched and how it ended.
SENSOR_REQUEST_TAG = "kafscale/sensor_request"
# A failed run of an unchanged state is requested again after poll_interval * 2^(failures - 1), at most this.
RETRY_BACKOFF_CAP_SECONDS = 300
ACTIVE_RUN_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


class SensorCursorError(ValueError):
    """A sensor cursor that this code cannot read (edited by hand, or from another version)."""


def sensor_name(table: str) -> str:
    return f"kafscale_{dagster_name_part(table)}_sensor"


# ---------------------------------------------------------------------------------------------- cursor


@dataclass(frozen=True)
class SensorRequest:
    """The last run request: its `SENSOR_REQUEST_TAG` id, which attempt at the same state it is (1 for the first),
    and when it was requested (epoch seconds)."""

    request_id: str
    attempt: int
    requested_at: float


@dataclass
class SensorCursor:
    """The persisted state of one mapping's sensor (JSON in Dagster's cursor).

    `observed` is the last reported `(log end, committed next offset, segments end, store's next offset)` per
    partition; `requested` is the `(start, end)` planned per pending partition of the last requested run, and
    `request` that request (None in cursors written before it was recorded).
    """

    partitions: dict[int, PartitionCursor] = field(default_factory=dict)
    observed: dict[int, tuple[int | None, ...]] = field(default_factory=dict)
    requested: dict[int, tuple[int, int]] = field(default_factory=dict)
    request: SensorRequest | None = None

    def to_json(self) -> str:
        return json.dumps({"version": CURSOR_VERSION, **self.to_document()}, separators=(",", ":"))

    def to_document(self) -> dict[str, object]:
        """The cursor as JSON-ready data (without the version; the namespace sensor keeps one per table)."""
        document: dict[str, object] = {
            "partitions": {str(p): [c.last_kfs_key, c.segments_end, c.next_offset]
                           for p, c in sorted(self.partitions.items())},
            "observed": {str(p): list(state) for p, state in sorted(self.observed.items())},
            "requested": {str(p): list(state) for p, state in sorted(self.requested.items())},
        }
        if self.request is not None:
            document["request"] = [self.request.request_id, self.request.attempt, self.request.requested_at]
        return document

    @classmethod
    def from_json(cls, text: str | None, sensor: str) -> SensorCursor:
        """The cursor `text` of `sensor` (None or empty: a fresh cursor); `SensorCursorError` names what is wrong."""
        if not text:
            return cls()
        try:
            document = json.loads(text)
            if document.get("version") != CURSOR_VERSION:
                raise ValueError(f"version {document.get('version')!r}, expected {CURSOR_VERSION}")
            return cls.from_document(document)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SensorCursorError(
                f"sensor {sensor}: cursor {text[:200]!r} is not readable ({exc}); reset the cursor in the Dagster UI "
                f"(the next tick lists from the committed offsets)") from None

    @classmethod
    def from_document(cls, document: dict) -> SensorCursor:
        """The cursor of `to_document`'s data; ValueError, KeyError, TypeError or AttributeError when unreadable."""
        request = document.get("request")
        return cls(
            # [key, end] in cursors written before the committed next offset was recorded
            partitions={int(p): PartitionCursor(*state) for p, state in document["partitions"].items()},
            observed={int(p): tuple(state) for p, state in document["observed"].items()},
            requested={int(p): (committed, end) for p, (committed, end) in document["requested"].items()},
            request=SensorRequest(str(request[0]), int(request[1]), float(request[2])) if request else None,
        )


# ---------------------------------------------------------------------------------------------- sensors


def build_sensors(config: LakehouseConfig, sources: Callable[[], WatchSources] | None = None,
                  clock: Callable[[], float] = time.time) -> list[dg.SensorDefinition]:
    """One sensor per mapping, on by default, ticking every `processor.poll_interval_seconds`.

    `sources` builds the connections (default: from `config`, on the first tick, then kept for the process); `clock`
    tells the time the retry backoff is measured with (epoch seconds, as Dagster's run end times).
    """
    get_sources = sources or _cached(lambda: WatchSources.from_config(config))
    return [_mapping_sensor(config, mapping, get_sources, clock) for mapping in config.mappings]


def _cached(build: Callable[[], WatchSources]) -> Callable[[], WatchSources]:
    built: list[WatchSources] = []

    def get() -> WatchSources:
        if not built:
            built.append(build())
        return built[0]

    return get


def _mapping_sensor(config: LakehouseConfig, mapping: MappingConfig, get_sources: Callable[[], WatchSources],
                    clock: Callable[[], float]) -> dg.SensorDefinition:
    topic, table = mapping.topic, mapping.table
    name = sensor_name(table)
    job_name = ingest_job_name(table)
    partitions_def = topic_partitions_def(topic)

    @dg.sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=config.processor.poll_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Requests one run of {job_name} over the Kafka partitions of topic {topic!r} with completed "
                    f"segments beyond their committed offsets; registers new partitions; observes lag.",
    )
    def watch_topic(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = SensorCursor.from_json(context.cursor, name)
        scan = scan_topic(get_sources(), topic, cursor.partitions, table=table)
        new_cursor = SensorCursor(partitions=scan.cursors, observed=cursor.observed, requested=cursor.requested,
                                  request=cursor.request)
        if not scan.partitions:
            return dg.SensorResult(cursor=new_cursor.to_json(),
                                   skip_reason=f"no partitions of topic {topic!r} in {get_sources().store.location}")

        registered = list(context.instance.get_dynamic_partitions(partitions_def_name(topic)))
        known = set(registered)
        new_keys = [kafka_partition_key(p) for p in sorted(scan.partitions) if kafka_partition_key(p) not in known]
        partition_requests = [partitions_def.build_add_request(new_keys)] if new_keys else []

        observation = topic_observation(topic, scan, cursor)
        if observation is not None:
            new_cursor.observed = observed_state(scan)
        asset_events = [observation] if observation is not None else []

        pending = {p: s for p, s in scan.partitions.items() if s.pending}
        run_request, skip = _run_request(context, job_name, registered + new_keys, pending, new_cursor,
                                         config.processor.poll_interval_seconds, clock())
        errors = [s.error for s in scan.partitions.values() if s.error is not None]
        if scan.table_error is not None:
            errors.append(scan.table_error)
        for error in errors:
            context.log.error(error)
        if errors and skip:
            skip = f"{skip}; " + "; ".join(errors)
        disagree = offsets_disagreement(scan)
        if disagree:
            context.log.warning("topic %s: table %s and the offsets store disagree (next offsets %s); the table's "
                                "are used, the next run repairs the store", topic, table, disagree)
        context.log.info("topic %s: %d partitions (%d new), %d new segments, pending %s%s", topic,
                         len(scan.partitions), len(new_keys), scan.new_segments,
                         {p: str(s.pending_range) for p, s in pending.items()} or "none",
                         f"; {skip}" if skip else "")
        return dg.SensorResult(
            run_requests=[run_request] if run_request is not None else None,
            skip_reason=skip,
            cursor=new_cursor.to_json(),
            dynamic_partitions_requests=partition_requests,
            asset_events=asset_events,
        )

    return watch_topic


def _run_request(context: dg.SensorEvaluationContext, job_name: str, ordered_keys: list[str],
                 pending: dict[int, PartitionState], cursor: SensorCursor, poll_interval_seconds: float,
                 now: float) -> tuple[dg.RunRequest | None, str | None]:
    """The run to request for `pending` partitions, or why none is requested; records the request in `cursor`."""
    if not pending:
        return None, "no completed segments beyond the committed offsets"
    planned = {p: r for p, s in pending.items() if (r := s.pending_range) is not None}  # all of them: pending
    state = {p: (r.start, r.end) for p, r in planned.items()}
    attempt = 1
    if state == cursor.requested:
        if cursor.request is None:  # a cursor from before requests were recorded: no run to look at
            return None, ("a run was already requested for exactly these pending segments; waiting for new "
                          "segments, progress or a manual materialization")
        wait, attempt = retry_wait(context, job_name, cursor.request, poll_interval_seconds, now)
        if wait is not None:
            return None, wait
    active = context.instance.get_runs(dg.RunsFilter(job_name=job_name, statuses=ACTIVE_RUN_STATUSES), limit=1)
    if active:
        return None, f"run {active[0].run_id} of {job_name} is {active[0].status.value.lower()}; it or the next one " \
                     f"ingests these segments"
    positions = {key: index for index, key in enumerate(ordered_keys)}
    pending_keys = sorted((kafka_partition_key(p) for p in pending), key=positions.__getitem__)
    cursor.requested = state
    cursor.request = SensorRequest(uuid.uuid4().hex, attempt, now)
    if attempt > 1:
        context.log.warning("requesting the run of %s for pending %s again (attempt %d): the previous one did not "
                            "ingest them", job_name, format_ranges(planned), attempt)
    return dg.RunRequest(
        job_name=job_name,
        tags={PARTITION_RANGE_START_TAG: pending_keys[0], PARTITION_RANGE_END_TAG: pending_keys[-1],
              PLANNED_RANGES_TAG: format_ranges(planned), SENSOR_REQUEST_TAG: cursor.request.request_id},
    ), None


def retry_backoff_seconds(poll_interval_seconds: float, failures: int) -> float:
    """How long after its `failures`-th consecutive failure a run of an unchanged state is requested again."""
    return min(poll_interval_seconds * 2 ** max(0, failures - 1), RETRY_BACKOFF_CAP_SECONDS)


class RequestedRuns:
    """The runs of a job that sensor requests launched, looked up once per request id and the assets each run
    committed once per run: a namespace tick asks about many tables whose requests share one run."""

    def __init__(self, instance: dg.DagsterInstance, job_name: str) -> None:
        self.instance = instance
        self.job_name = job_name
        self._records: dict[str, dg.RunRecord | None] = {}
        self._committed: dict[str, set[dg.AssetKey]] = {}

    def record(self, request_id: str) -> dg.RunRecord | None:
        """The run launched for the request, if any."""
        if request_id not in self._records:
            records = self.instance.get_run_records(
                dg.RunsFilter(job_name=self.job_name, tags={SENSOR_REQUEST_TAG: request_id}), limit=1)
            self._records[request_id] = records[0] if records else None
        return self._records[request_id]

    def committed(self, run_id: str, asset_key: dg.AssetKey | None) -> bool:
        """Whether the run committed offsets (of `asset_key`'s table, when given): one of its materializations
        records committed offset ranges."""
        if run_id not in self._committed:
            records = self.instance.get_records_for_run(
                run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
            self._committed[run_id] = {
                materialization.asset_key for record in records
                if (materialization := record.event_log_entry.asset_materialization) is not None
                and committed_ranges_from_metadata(materialization.metadata)}
        committed = self._committed[run_id]
        return bool(committed) if asset_key is None else asset_key in committed


def retry_wait(context: dg.SensorEvaluationContext, job_name: str, request: SensorRequest,
               poll_interval_seconds: float, now: float, asset_key: dg.AssetKey | None = None,
               runs: RequestedRuns | None = None) -> tuple[str | None, int]:
    """Why the state `request` covered is not requested again now (None: it is due), and the attempt it would be.
    `asset_key`: the table the state is of, when the run lands several (only its materializations say it landed);
    `runs`: the tick's lookups of `job_name`'s runs, shared across tables."""
    runs = runs or RequestedRuns(context.instance, job_name)
    record = runs.record(request.request_id)
    run = record.dagster_run if record is not None else None
    waiting = "waiting for new segments, progress or a manual materialization"
    if run is not None and run.status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELED):
        if runs.committed(run.run_id, asset_key):
            # It landed them, yet they are pending again: the table went back (an operator's rollback), a new episode.
            return None, 1
        if run.status == dg.DagsterRunStatus.SUCCESS:
            return (f"run {run.run_id} requested for exactly these pending segments succeeded without committing "
                    f"anything; not requested again, {waiting}"), request.attempt
        return (f"run {run.run_id} requested for exactly these pending segments was canceled; not retried, "
                f"{waiting}"), request.attempt
    if run is not None and run.status != dg.DagsterRunStatus.FAILURE:
        return (f"run {run.run_id} requested for exactly these pending segments is {run.status.value.lower()}",
                request.attempt)
    backoff = retry_backoff_seconds(poll_interval_seconds, request.attempt)
    if record is None:
        what, since = f"no run was launched for request {request.request_id}", request.requested_at
    else:
        what, since = f"run {record.dagster_run.run_id} failed", record.end_time or request.requested_at
    remaining = since + backoff - now
    if remaining > 0:
        return (f"a run was already requested for exactly these pending segments and {what} (attempt "
                f"{request.attempt}); requested again in {remaining:.0f} s (backoff {backoff:.0f} s)"), request.attempt
    return None, request.attempt + 1


def observed_state(scan: TopicScan) -> dict[int, tuple[int | None, ...]]:
    return {p: (s.log_end, s.next_offset, s.segments_end, s.store_next_offset) for p, s in scan.partitions.items()}


def offsets_disagreement(scan: TopicScan) -> dict[int, dict[str, int | None]]:
    """`{partition: {"store": next offset, "table": next offset}}` where the table and the offsets store disagree."""
    return {p: {"store": s.store_next_offset, "table": s.table_next_offset}
            for p, s in sorted(scan.partitions.items()) if s.offsets_disagree}


def topic_observation(topic: str, scan: TopicScan, cursor: SensorCursor) -> dg.AssetObservation | None:
    """An observation of the topic asset when any partition's watermark, committed offset or segments end moved."""
    if observed_state(scan) == cursor.observed:
        return None
    return dg.AssetObservation(asset_key=topic_asset_key(topic), metadata=topic_observation_metadata(scan))


def retention_metadata(retention: TopicRetention | None, error: str | None) -> dict[str, dg.RawMetadataValue]:
    """The topic's retention in an observation: per partition the seconds before retention deletes records not landed
    (`retention_headroom_seconds`, absent when none is at risk) and how far back the log reaches (its oldest offset
    and that segment's age); the smallest headroom as a number, so the UI plots it."""
    if retention is None:
        return {"retention_error": error or "unknown"}
    parts = retention.partitions.items()
    metadata: dict[str, dg.RawMetadataValue] = {
        "retention": retention.policy.describe(),
        "retention_headroom_seconds": dg.MetadataValue.json(
            {str(p): round(r.headroom_seconds) for p, r in parts if r.headroom_seconds is not None}),
        "replay_window": dg.MetadataValue.json(
            {str(p): {"log_start_offset": r.log_start_offset, "age_seconds": round(r.replay_window_seconds)}
             for p, r in parts if r.replay_window_seconds is not None}),
    }
    if retention.min_headroom_seconds is not None:
        metadata["min_retention_headroom_seconds"] = round(retention.min_headroom_seconds)
    if retention.gaps:
        metadata["retention_gaps"] = dg.MetadataValue.json({str(p): gap for p, gap in retention.gaps.items()})
    return metadata


def topic_observation_metadata(scan: TopicScan) -> dict[str, dg.RawMetadataValue]:
    """What an observation of the topic asset reports: per partition the broker watermark, the committed next offset
    (the table's, else the store's), the end of the completed segments and the lag, the pending partitions, the
    total lag (plotted by the UI), and where the table and the offsets store disagree, both sides."""
    states = [scan.partitions[p] for p in sorted(scan.partitions)]
    metadata: dict[str, dg.RawMetadataValue] = {
        "partitions": len(states),
        "broker_next_offset": dg.MetadataValue.json({str(s.partition): s.log_end for s in states}),
        "committed_next_offset": dg.MetadataValue.json({str(s.partition): s.next_offset for s in states}),
        "completed_segments_end": dg.MetadataValue.json({str(s.partition): s.segments_end for s in states}),
        "lag_by_partition": dg.MetadataValue.json({str(s.partition): s.lag for s in states}),
        "pending_partitions": dg.MetadataValue.json(sorted(s.partition for s in states if s.pending)),
    }
    errors = {str(s.partition): s.error for s in states if s.error is not None}
    if errors:
        metadata["partition_errors"] = dg.MetadataValue.json(errors)
    disagree = offsets_disagreement(scan)
    if disagree:
        metadata["offsets_disagree"] = dg.MetadataValue.json({str(p): sides for p, sides in disagree.items()})
    if scan.table_error is not None:
        metadata["table_error"] = scan.table_error
    if states:
        metadata["lag"] = sum(s.lag for s in states)  # an int, so the UI plots it over time
    return metadata
