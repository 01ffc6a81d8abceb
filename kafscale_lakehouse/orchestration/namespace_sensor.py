"""The namespace watch (`processor.watch: namespace`): ONE sensor for every mapping, for deployments with tens to
hundreds of topics, where a sensor per mapping would list S3 once per partition per mapping every tick and request a
run (a process, a pod) per table.

A tick while every batch-run slot is taken (`processor.max_batch_runs` `land_tables` runs queued or running) could
request nothing and scans nothing (`_slots_taken`). Any other tick:
1. scans every mapped topic (`engine.ingestion.scan_namespace`: only the partitions whose broker watermark moved past
   the segments seen are listed, each from its cursor, so an idle partition costs no request and nothing grows with
   the segments the namespace keeps; the topics' offsets, the stores' and the tables' (one catalog load each), are read
   on a few threads); each topic resumes from its own partition cursors, kept per table in the one cursor;
2. per topic, as the per-table sensor does (sensors.py): registers new Kafka partitions as the topic's dynamic
   partitions and reports an observation of the topic asset when its watermarks, offsets or segments moved (at
   most `OBSERVATIONS_PER_TICK` topics a tick, those observed longest ago first);
3. keeps out of this tick's batches each table with a run in flight (its own ingest job's, or a `land_tables` run
   listing it, `BATCH_TABLES_TAG`, until that run committed every table: `BATCH_COMMITTED_TAG`; the run that lands
   them next records its events after it, `RECORD_AFTER_TAG`): so a table's commits never overlap, as its
   concurrency pool does for its own job
   (its newest new segments are not even read: their footers wait for the tick after its run);
   and each table whose unchanged pending state was requested already and is not due again (`sensors.retry_wait`:
   the same backoff, per table, after the batch that carried it failed to land it);
4. packs the other tables with pending segments, the longest waiting first, into as many `land_tables` runs as
   there are free batch-run slots (`processor.max_batch_runs` less the `land_tables` runs queued or running that
   have not committed yet: one that has only records events), of at
   most `processor.max_bytes_per_batch_run` pending segment bytes each (a table larger than that is a run of its own)
   and at least `MIN_TABLES_PER_BATCH_RUN` tables each when there are that many, and requests them; the tables that
   fit in no run wait for a slot, and none waits behind a newer one (`pack_batches`). Runs over disjoint tables
   overlap where the machine has cores to spare (a batch's time is then mostly round trips: catalog, S3, etcd, event
   log); on a CPU-bound one fewer, larger runs cost less (benchmarks/README.md, fanout.py). Each run
   writes its tables in one Spark job and commits each on its own (land_tables.py); tables whose run did not land
   them are retried apart from the others, in halves per attempt.

A table's `pending_since` (the cursor) is when its oldest pending segment was first seen: kept across ticks while
its segments wait, and moved to the time of its last request once that request's segments landed (what is pending
then was not listed at that request), so a table that just landed does not go before tables waiting longer.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import dagster as dg

from kafscale_lakehouse.config import LakehouseConfig, MappingConfig
from kafscale_lakehouse.engine.ingestion import NamespaceScan, TopicScan, WatchSources, scan_namespace
from kafscale_lakehouse.offsets.ranges import OffsetRange, format_ranges
from kafscale_lakehouse.orchestration.land_tables import (
    BATCH_COMMITTED_TAG,
    BATCH_TABLES_TAG,
    LAND_TABLES_JOB,
    RECORD_AFTER_TAG,
    TableToLand,
    land_tables_run_config,
)
from kafscale_lakehouse.orchestration.naming import (
    ingest_job_name,
    mapping_asset_key,
    mapping_topic_key,
)
from kafscale_lakehouse.orchestration.partitions import unregistered_partitions
from kafscale_lakehouse.orchestration.sensors import (
    ACTIVE_RUN_STATUSES,
    CURSOR_VERSION,
    SENSOR_REQUEST_TAG,
    RequestedRuns,
    SensorCursor,
    SensorCursorError,
    SensorRequest,
    observed_state,
    offsets_disagreement,
    retry_wait,
    topic_observation,
)

NAMESPACE_SENSOR_NAME = "kafscale_namespace_sensor"
SKIP_REASONS_SHOWN = 10  # tables whose reason to wait a skipped tick names
# Topic observations (lag) one tick reports, those observed longest ago first: with steady traffic every topic moves
# every tick, and the daemon stored 200 observations per tick at 200 topics one by one (11-16 s of an 18-23 s tick on
# the loaded 2-core machine). At 200 topics and a 5 s interval a topic's lag is reported every 100 s or so.
OBSERVATIONS_PER_TICK = 10
# The fewest tables a tick puts in a `land_tables` run of its own when it could spread them over more free slots: each
# run is a process launch (1-2 s of CPU) and a Spark job, so a handful of tables is not split. Chosen by measurement
# (benchmarks/fanout.py at 50 and 200 topics).
MIN_TABLES_PER_BATCH_RUN = 10


@dataclass
class NamespaceCursor:
    """The namespace sensor's state: per table, the per-table sensor's cursor (listing cursors, last observation,
    last request), and since when each table has had pending segments (epoch seconds; the oldest go first)."""

    tables: dict[str, SensorCursor] = field(default_factory=dict)
    pending_since: dict[str, float] = field(default_factory=dict)
    observed_at: dict[str, float] = field(default_factory=dict)  # when each table's topic was last observed
    # The first tick since the last scan that did not scan (every batch-run slot taken, `_slots_taken`): the segments
    # the next scan finds pending for the first time may have landed any time since, so they are pending since then.
    unscanned_since: float | None = None

    def table(self, table: str) -> SensorCursor:
        return self.tables.setdefault(table, SensorCursor())

    def to_json(self) -> str:
        return json.dumps({"version": CURSOR_VERSION, "watch": "namespace",
                           "tables": {t: c.to_document() for t, c in sorted(self.tables.items())},
                           "pending_since": dict(sorted(self.pending_since.items())),
                           "observed_at": dict(sorted(self.observed_at.items())),
                           **({"unscanned_since": self.unscanned_since} if self.unscanned_since is not None else {})},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None, sensor: str) -> NamespaceCursor:
        if not text:
            return cls()
        try:
            document = json.loads(text)
            if document.get("version") != CURSOR_VERSION or document.get("watch") != "namespace":
                raise ValueError(f"version {document.get('version')!r} of watch {document.get('watch')!r}, expected "
                                 f"{CURSOR_VERSION} of watch 'namespace'")
            return cls(tables={t: SensorCursor.from_document(c) for t, c in document["tables"].items()},
                       pending_since={t: float(s) for t, s in document["pending_since"].items()},
                       observed_at={t: float(s) for t, s in document.get("observed_at", {}).items()},
                       unscanned_since=(float(document["unscanned_since"])
                                        if document.get("unscanned_since") is not None else None))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SensorCursorError(
                f"sensor {sensor}: cursor {text[:200]!r} is not readable ({exc}); reset the cursor in the Dagster UI "
                f"(the next tick lists from the committed offsets)") from None


@dataclass(frozen=True)
class _Candidate:
    """A table with pending segments that may go into a batch now."""

    mapping: MappingConfig
    planned: dict[int, OffsetRange]  # per pending partition

    @property
    def state(self) -> dict[int, tuple[int, int]]:
        return {p: (r.start, r.end) for p, r in self.planned.items()}
    pending_bytes: int
    attempt: int
    since: float
    last_requested: float  # when the table was last requested (0: never): of two waiting as long, the other goes first

    @property
    def waiting_order(self) -> tuple[float, float, str]:
        return self.since, self.last_requested, self.mapping.table


def build_namespace_sensor(config: LakehouseConfig, sources: Callable[[], WatchSources] | None = None,
                           clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
    """The one sensor of `processor.watch: namespace`, ticking every `processor.poll_interval_seconds`; `sources` and
    `clock` as for `sensors.build_sensors`."""
    built: list[WatchSources] = []

    def get_sources() -> WatchSources:
        if not built:
            built.append(sources() if sources is not None else WatchSources.from_config(config))
        return built[0]

    tables = {mapping.topic: mapping.table for mapping in config.mappings}
    poll = config.processor.poll_interval_seconds

    @dg.sensor(
        name=NAMESPACE_SENSOR_NAME,
        job_name=LAND_TABLES_JOB,
        minimum_interval_seconds=poll,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Lists the new segments of the {len(tables)} mapped topics each tick and requests "
                    f"{LAND_TABLES_JOB} runs over the tables with pending segments, at most "
                    f"{config.processor.max_batch_runs} at once over disjoint tables, at most "
                    f"{config.processor.max_bytes_per_batch_run} bytes each; registers new partitions; observes lag.",
    )
    def watch_namespace(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = NamespaceCursor.from_json(context.cursor, NAMESPACE_SENSOR_NAME)
        now = clock()
        mapped = set(tables.values())  # a mapping taken out of the config leaves nothing behind in the cursor
        cursor.tables = {t: c for t, c in cursor.tables.items() if t in mapped}
        cursor.pending_since = {t: s for t, s in cursor.pending_since.items() if t in mapped}
        cursor.observed_at = {t: s for t, s in cursor.observed_at.items() if t in mapped}
        flight = _tables_in_flight(context.instance, config.mappings)
        busy = flight.busy
        free_slots = config.processor.max_batch_runs - flight.batch_runs
        if free_slots <= 0:
            return _slots_taken(cursor, flight.batch_runs, config.processor.max_batch_runs, now)
        first_seen = cursor.unscanned_since if cursor.unscanned_since is not None else now
        cursor.unscanned_since = None
        # A table with a run in flight takes no new segment this tick: its newest ones' footers wait for a later tick.
        scan = scan_namespace(get_sources(), tables, {m.topic: cursor.table(m.table).partitions
                                                      for m in config.mappings},
                              unread_newest={m.topic for m in config.mappings if m.table in busy})
        partition_requests: list[dg.AddDynamicPartitionsRequest] = []
        moved: list[tuple[MappingConfig, dg.AssetObservation, TopicScan]] = []
        runs = RequestedRuns(context.instance, LAND_TABLES_JOB)
        candidates: list[_Candidate] = []
        skipped: dict[str, str] = {}
        for mapping in config.mappings:
            topic_scan = scan.topics[mapping.topic]
            table_cursor = cursor.table(mapping.table)
            if set(topic_scan.partitions) - set(table_cursor.partitions):  # else registered on an earlier tick
                partition_requests += unregistered_partitions(context.instance, mapping.topic, topic_scan.partitions)
            table_cursor.partitions = topic_scan.cursors
            observation = topic_observation(mapping_topic_key(mapping), topic_scan, table_cursor)
            if observation is not None:
                moved.append((mapping, observation, topic_scan))
            _log_problems(context, mapping, topic_scan)
            candidate, reason = _candidate(context, mapping, topic_scan, scan, cursor, busy, runs, poll, now,
                                           first_seen)
            if candidate is not None:
                candidates.append(candidate)
            elif reason is not None:
                skipped[mapping.table] = reason
        asset_events = _observe_longest_unobserved(moved, cursor, now)
        batches = pack_batches(candidates, config.processor.max_bytes_per_batch_run, free_slots,
                               batch_tables_cap(len(tables), config.processor.max_batch_runs))
        run_requests = [_batch_request(context, batch, cursor, now, flight.recording) for batch in batches]
        requested = {c.mapping.table for batch in batches for c in batch}
        context.log.info("namespace %s: %d partitions listed (%d list requests), %d topics, %d tables pending, %d runs "
                         "requested over %d tables", get_sources().store.namespace, scan.partitions_listed,
                         scan.list_requests, len(tables),
                         len(candidates) + len(skipped), len(run_requests), len(requested))
        for candidate in candidates:
            if candidate.mapping.table not in requested:
                skipped[candidate.mapping.table] = (
                    f"waiting for a batch run slot: the {len(batches)} runs requested now are full (their tables "
                    f"or processor.max_bytes_per_batch_run) and take the tables waiting longer")
        skip_reason = None
        if not run_requests:
            reasons = [f"{t}: {r}" for t, r in skipped.items()]
            if len(reasons) > SKIP_REASONS_SHOWN:  # hundreds of tables: the first few, and how many more
                reasons[SKIP_REASONS_SHOWN:] = [f"{len(reasons) - SKIP_REASONS_SHOWN} more tables waiting"]
            skip_reason = "; ".join(reasons) or "no completed segments beyond the committed offsets"
        return dg.SensorResult(run_requests=run_requests or None, skip_reason=skip_reason,
                               cursor=cursor.to_json(), dynamic_partitions_requests=partition_requests,
                               asset_events=asset_events)

    return watch_namespace


def _observe_longest_unobserved(moved: list[tuple[MappingConfig, dg.AssetObservation, TopicScan]],
                                cursor: NamespaceCursor, now: float) -> list[dg.AssetObservation]:
    """The observations of at most `OBSERVATIONS_PER_TICK` moved topics, those observed longest ago first; the others
    keep their last observed state in the cursor, so they are reported on a later tick."""
    moved = sorted(moved, key=lambda item: (cursor.observed_at.get(item[0].table, 0.0), item[0].table))
    for mapping, _, topic_scan in moved[:OBSERVATIONS_PER_TICK]:
        cursor.table(mapping.table).observed = observed_state(topic_scan)
        cursor.observed_at[mapping.table] = now
    return [observation for _, observation, _ in moved[:OBSERVATIONS_PER_TICK]]


def _candidate(context: dg.SensorEvaluationContext, mapping: MappingConfig, topic_scan: TopicScan,
               scan: NamespaceScan, cursor: NamespaceCursor, busy: dict[str, str], runs: RequestedRuns,
               poll_interval_seconds: float, now: float, first_seen: float) -> tuple[_Candidate | None, str | None]:
    """The table as a candidate for a batch now, or why not (None, None: nothing pending). `first_seen`: when
    segments found pending now for the first time are pending since (`NamespaceCursor.unscanned_since`)."""
    table = mapping.table
    planned = {p: r for p, s in topic_scan.partitions.items() if (r := s.pending_range) is not None}
    if not planned:
        if table not in busy:  # a busy table's new segments are left unread (`scan_namespace`), not absent
            cursor.pending_since.pop(table, None)
        return None, None
    since = cursor.pending_since.setdefault(table, first_seen)
    if table in busy:
        return None, busy[table]
    table_cursor = cursor.table(table)
    request = table_cursor.request
    if request is not None and request.requested_at > since and _landed(table_cursor.requested, planned):
        # Its last request landed: what is pending now arrived after it (it was not listed then).
        since = cursor.pending_since[table] = request.requested_at
    attempt = 1
    if {p: (r.start, r.end) for p, r in planned.items()} == table_cursor.requested and table_cursor.request is not None:
        wait, attempt = retry_wait(context, LAND_TABLES_JOB, table_cursor.request, poll_interval_seconds, now,
                                   mapping_asset_key(mapping), runs)
        if wait is not None:
            return None, wait
    return _Candidate(mapping, planned, scan.topic_pending_bytes(mapping.topic), attempt, since,
                      request.requested_at if request is not None else 0.0), None


def _landed(requested: dict[int, tuple[int, int]], planned: dict[int, OffsetRange]) -> bool:
    """Whether the pending ranges `planned` start where the `requested` ones ended, or beyond (they landed)."""
    return bool(requested) and all(p not in planned or planned[p].start >= end for p, (_, end) in requested.items())


def batch_tables_cap(tables: int, max_batch_runs: int) -> int:
    """The most tables a tick puts in one `land_tables` run: an even share of the mapped tables over the batch-run
    slots (at least `MIN_TABLES_PER_BATCH_RUN`). Without it a slot that frees while many tables wait takes them all,
    and that run, long, holds most tables while the few others cycle in short ones; with it the runs settle into
    even shares."""
    return max(MIN_TABLES_PER_BATCH_RUN, -(-tables // max_batch_runs))


def pack_batches(candidates: Iterable[_Candidate], max_bytes: int, slots: int,
                 max_tables: int) -> list[list[_Candidate]]:
    """The `land_tables` runs to request over the candidates: at most `slots`, each of at most `max_bytes` pending bytes
    (a larger table is a run of its own) and `max_tables` tables, the longest waiting first
    (`_Candidate.waiting_order`). A candidate that fits in none waits for a later tick, and so does every newer one: a
    table never waits behind newer ones.

    A batch's tables share one Spark job, so one table whose data fails that job fails all of them. Tables requested
    again because their run did not land them (attempt > 1) therefore never share a run with the others, and those
    of attempt `a` are split into up to 2^(a-1) runs: a table that keeps failing takes a half, then a quarter... of
    its former neighbours down with it on each backoff, until it fails alone, instead of all of them forever.
    Each such run takes a slot; the tables of a first attempt take the slots left (`_spread`). The retried runs and
    the first attempts (as one) are served in the order of their longest waiting table."""
    if slots <= 0:
        return []
    ordered = sorted(candidates, key=lambda c: c.waiting_order)
    fresh = [c for c in ordered if c.attempt == 1]
    units: list[list[_Candidate]] = [fresh] if fresh else []  # each a slot, but the first attempts take those left
    for attempt in sorted({c.attempt for c in ordered if c.attempt > 1}):
        again = [c for c in ordered if c.attempt == attempt]
        shares = min(len(again), 2 ** min(attempt - 1, 16))
        for share in range(shares):
            units += _by_budget(again[share::shares], max_bytes)
    chosen = sorted(units, key=lambda unit: unit[0].waiting_order)[:slots]
    batches: list[list[_Candidate]] = []
    for unit in chosen:
        batches += _spread(unit, max_bytes, slots - len(chosen) + 1, max_tables) if unit is fresh else [unit]
    return batches


def _spread(candidates: list[_Candidate], max_bytes: int, slots: int, max_tables: int) -> list[list[_Candidate]]:
    """`candidates` (in waiting order) over at most `slots` runs: one per `MIN_TABLES_PER_BATCH_RUN` tables, and one
    more for a candidate that fits in none (`max_bytes`, `max_tables`) while slots are left; the runs balanced by
    table count (a table's fixed cost in a run, its leases, plan, commit, checks and events, outweighs its segments'
    at a tick's usual sizes), then by bytes. Stops at the first candidate that fits in no run and finds no slot left:
    it and the newer ones wait."""
    batches: list[list[_Candidate]] = [[] for _ in range(max(1, min(slots, -(-len(candidates)
                                                                             // MIN_TABLES_PER_BATCH_RUN))))]
    sizes = [0] * len(batches)
    for candidate in candidates:
        fits = [i for i, batch in enumerate(batches) if not batch or (
            sizes[i] + candidate.pending_bytes <= max_bytes and len(batch) < max_tables)]
        if not fits and len(batches) < slots:
            batches.append([])
            sizes.append(0)
            fits = [len(batches) - 1]
        if not fits:
            break
        run = min(fits, key=lambda i: (len(batches[i]), sizes[i], i))
        batches[run].append(candidate)
        sizes[run] += candidate.pending_bytes
    return [batch for batch in batches if batch]


def _by_budget(candidates: list[_Candidate], max_bytes: int) -> list[list[_Candidate]]:
    batches: list[list[_Candidate]] = []
    size = 0
    for candidate in candidates:
        if not batches or size + candidate.pending_bytes > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(candidate)
        size += candidate.pending_bytes
    return batches


def _batch_request(context: dg.SensorEvaluationContext, batch: list[_Candidate], cursor: NamespaceCursor,
                   now: float, recording: dict[str, str]) -> dg.RunRequest:
    """The `land_tables` run of `batch`; records the request in each table's cursor. `recording`: the runs still
    recording the events of tables they committed (`_InFlight.recording`), which this run records after."""
    request_id = uuid.uuid4().hex
    entries = []
    for candidate in batch:
        table_cursor = cursor.table(candidate.mapping.table)
        table_cursor.requested = candidate.state
        table_cursor.request = SensorRequest(request_id, candidate.attempt, now)
        entries.append(TableToLand(table=candidate.mapping.table, partitions=sorted(candidate.planned),
                                   planned_ranges=format_ranges(candidate.planned)))
    tables = [candidate.mapping.table for candidate in batch]
    again = {c.mapping.table: f"attempt {c.attempt}, pending {format_ranges(c.planned)}" for c in batch
             if c.attempt > 1}
    if again:
        context.log.warning("requesting %d tables again, the run before did not land them: %s", len(again),
                            "; ".join(f"{table} ({what})" for table, what in again.items()))
    after = sorted({recording[table] for table in tables if table in recording})
    return dg.RunRequest(job_name=LAND_TABLES_JOB, run_config=land_tables_run_config(entries),
                         tags={SENSOR_REQUEST_TAG: request_id, BATCH_TABLES_TAG: ",".join(tables),
                               **({RECORD_AFTER_TAG: ",".join(after)} if after else {})})


def _slots_taken(cursor: NamespaceCursor, batch_runs: int, max_batch_runs: int, now: float) -> dg.SensorResult:
    """A tick while every batch-run slot is taken: no run could be requested, so nothing is scanned (no S3 listing,
    no etcd or catalog read). At hundreds of topics most ticks fall while the slots are taken (a batch of 100 tables
    takes a minute or more on 2 cores) and each listed every moved partition for nothing: ~1 CPU-s of the code server
    per tick at 200 topics, beside the runs it slowed down. New partitions, topic observations and problems wait for
    the next scan, the tick after a slot frees. The cursor changes only on the first such tick (`unscanned_since`)."""
    reason = (f"every batch run slot is taken ({batch_runs} {LAND_TABLES_JOB} runs queued or running, "
              f"processor.max_batch_runs {max_batch_runs}): the namespace is listed again once one frees")
    if cursor.unscanned_since is not None:
        return dg.SensorResult(skip_reason=reason)  # the cursor stays as it is
    cursor.unscanned_since = now
    return dg.SensorResult(skip_reason=reason, cursor=cursor.to_json())


@dataclass
class _InFlight:
    """The runs in flight as a tick sees them."""

    busy: dict[str, str] = field(default_factory=dict)  # table -> why: a queued or running run lands it
    batch_runs: int = 0  # `land_tables` runs queued or running that still commit: each takes a batch-run slot
    # table -> the `land_tables` run that committed it and still records its events (`BATCH_COMMITTED_TAG`): it takes
    # no slot and the table may go into a new batch, which records its events after that run's (`RECORD_AFTER_TAG`)
    recording: dict[str, str] = field(default_factory=dict)


def _tables_in_flight(instance: dg.DagsterInstance, mappings: Iterable[MappingConfig]) -> _InFlight:
    """Each table a queued or running run is landing (its own ingest job's, or a batch's), and the `land_tables`
    runs that take a slot."""
    by_job = {ingest_job_name(m.table): m.table for m in mappings}
    flight = _InFlight()
    busy = flight.busy
    for run in instance.get_runs(dg.RunsFilter(statuses=ACTIVE_RUN_STATUSES)):
        status = run.status.value.lower()
        if run.job_name == LAND_TABLES_JOB and run.tags.get(BATCH_COMMITTED_TAG):
            for table in filter(None, run.tags.get(BATCH_TABLES_TAG, "").split(",")):
                flight.recording[table] = run.run_id
        elif run.job_name == LAND_TABLES_JOB:
            flight.batch_runs += 1
            for table in filter(None, run.tags.get(BATCH_TABLES_TAG, "").split(",")):
                busy[table] = f"run {run.run_id} of {LAND_TABLES_JOB} landing it is {status}"
        elif run.job_name in by_job:
            busy[by_job[run.job_name]] = f"run {run.run_id} of {run.job_name} is {status}"
    return flight


def _log_problems(context: dg.SensorEvaluationContext, mapping: MappingConfig, scan: TopicScan) -> None:
    for error in [s.error for s in scan.partitions.values() if s.error is not None] + \
            ([scan.table_error] if scan.table_error is not None else []):
        context.log.error(error)
    disagree = offsets_disagreement(scan)
    if disagree:
        context.log.warning("topic %s: table %s and the offsets store disagree (next offsets %s); the table's are "
                            "used, the next run repairs the store", mapping.topic, mapping.table, disagree)
