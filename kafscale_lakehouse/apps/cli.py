"""`kafscale-lakehouse` command line: operator tools that run the same code as the Dagster assets."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Never

# Nothing of the package at module level: each command imports what it needs (pyspark, pyiceberg, boto3, dagster
# are 1 s of a short run's start, benchmarks/tiny_run.py), and `main` pauses the collector before any of it loads.
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafscale_lakehouse.config import LakehouseConfig
    from kafscale_lakehouse.engine.ingestion import IngestContext

log = logging.getLogger("kafscale_lakehouse.apps.cli")


class CommandError(Exception):
    """A failure to report as one line on stderr with exit code 2 (no traceback)."""


@contextlib.contextmanager
def startup_without_collections(own_process: bool) -> Iterator[None]:
    """In a process of its own, no garbage collection while the command starts (imports, config, Spark session), and
    what starting made is frozen (never walked by a later collection): those objects live as long as the process,
    and the collections that ~1,700 imported modules trigger cost 0.9 of 2.6 CPU-s of a process that imports what
    `ingest --once` does (benchmarks/cli_startup.py, load ~20). Called as a function (`main(argv)` in a caller's
    process), it does nothing."""
    if not own_process or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def run_ingest(config_path: str | None, *, topics: list[str] | None, once: bool, own_process: bool = False) -> int:
    """`--once`: one pass over every mapping; otherwise poll every `processor.poll_interval_seconds` until stopped."""
    with startup_without_collections(own_process):
        from kafscale_lakehouse.config import load_config
        from kafscale_lakehouse.engine.ingestion import IngestContext, spark_job
        from kafscale_lakehouse.engine.spark import get_spark_session, local_engine_request

        config = load_config(config_path)
        # SIGTERM (Kubernetes, `kill`) unwinds like Ctrl-C, so leases are released and no run is left half-done.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        # Without an engine configured, the local one (started by the first run, reused by the next): no JVM start.
        spark = get_spark_session(config.spark.master, dict(config.spark.conf), remote=config.spark.remote,
                                  local_engine=local_engine_request([spark_job.__name__]))
    with IngestContext.from_config(config, spark) as context:
        return _ingest_loop(config, spark, context, topics=topics, once=once)


def _ingest_loop(config: LakehouseConfig, spark: SparkSession, context: IngestContext, *, topics: list[str] | None,
                 once: bool) -> int:
    from kafscale_lakehouse.engine.ingestion import IngestFailedError, ingest

    while True:
        try:
            results = ingest(config, spark, topics=topics, context=context)
            status = 0
            for result in results:
                log.info("topic %s → %s: %d records, snapshot %s", result.topic, result.table, result.records,
                         result.snapshot_id)
        except IngestFailedError as err:
            log.error("%s", err)
            status = 1
        if once:
            return status
        time.sleep(config.processor.poll_interval_seconds)


def run_demo_producer_command(args: argparse.Namespace) -> int:
    """Run until stopped (SIGTERM, Ctrl-C) or until the parent process is gone (`make demo` killed hard)."""
    from kafscale_lakehouse.apps.demo_producer import run_demo_producer
    from kafscale_lakehouse.config import load_config

    config = load_config(args.config)
    options = {name: getattr(args, name) for name in ("topic", "partitions", "interval_seconds",
                                                      "records_per_segment", "rounds", "lfs", "avro", "cdc")
               if hasattr(args, name)}
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parent = os.getppid()
    try:
        run_demo_producer(config, keep_going=lambda: os.getppid() == parent, **options)
    except ValueError as err:
        raise CommandError(str(err)) from None
    except (KeyboardInterrupt, SystemExit):
        log.info("demo producer stopped")
    return 0


def run_report(config_path: str | None, *, table: str, output: str) -> int:
    """Write the data-owner report of `table` (check history from the Dagster instance at $DAGSTER_HOME)."""
    from kafscale_lakehouse.apps.report import ReportError
    from kafscale_lakehouse.apps.report_html import write_table_report
    from kafscale_lakehouse.config import load_config

    config = load_config(config_path)
    try:
        path = write_table_report(config, table, Path(output), dagster_home=os.environ.get("DAGSTER_HOME"))
    except ReportError as err:
        raise CommandError(str(err)) from None
    print(f"report of {table} written to {path}")
    return 0


def run_maintain(config_path: str | None, *, tables: list[str] | None, steps: list[str] | None) -> int:
    """Maintain each mapping's table (or those of `tables`) with its `maintenance:` settings; one JSON line each."""
    from kafscale_lakehouse.config import load_config
    from kafscale_lakehouse.connections import table_maintenance
    from kafscale_lakehouse.engine import EngineError
    from kafscale_lakehouse.engine.ingestion import with_pattern_topics
    from kafscale_lakehouse.engine.maintenance import MAINTENANCE_STEPS, maintain_mapping
    from kafscale_lakehouse.engine.spark import get_spark_session

    config = with_pattern_topics(load_config(config_path)).config  # topic_pattern: a mapping per matching topic
    mappings = [m for m in config.mappings if tables is None or m.table in tables]
    missing = sorted(set(tables or ()) - {m.table for m in mappings})
    if missing:
        mapped = [m.table for m in config.mappings]
        raise CommandError(f"no mapping lands in table(s) {missing}; mapped tables: {mapped}")
    steps = steps or list(MAINTENANCE_STEPS)
    spark = get_spark_session(config.spark.master, dict(config.spark.conf)) if "compact" in steps else None
    failed = 0
    for mapping in mappings:
        try:
            summary = maintain_mapping(spark, table_maintenance(config, mapping), steps=steps)
        except EngineError as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        print(json.dumps(summary.as_dict(), sort_keys=True))
    return 1 if failed else 0


def run_offsets(config_path: str | None, *, command: str, topic: str, source: str | None, yes: bool) -> int:
    """`offsets show`: the table's, the store's and the broker's offsets of `topic` side by side; `offsets reset
    --from-table | --from-store`: one side set from the other (engine/ingestion/positions.py)."""
    from kafscale_lakehouse.config import load_config
    from kafscale_lakehouse.connections import catalog_settings, offset_store_from_config, segment_store_from_config
    from kafscale_lakehouse.engine import EngineError
    from kafscale_lakehouse.engine.ingestion import (
        offsets_view,
        reset_from_store,
        reset_from_table,
        stalled_partitions,
        with_pattern_topics,
    )
    from kafscale_lakehouse.engine.tables import load_catalog, open_table
    from kafscale_lakehouse.engine.tables.audit import AUDIT_COMMANDS, pending_audit
    from kafscale_lakehouse.offsets import OffsetStoreError

    config = with_pattern_topics(load_config(config_path)).config  # topic_pattern: a mapping per matching topic
    mapping = next((m for m in config.mappings if m.topic == topic), None)
    if mapping is None:
        raise CommandError(f"no mapping lands topic {topic!r}; mapped topics: {[m.topic for m in config.mappings]}")
    if command == "reset" and source is None:
        raise CommandError("offsets reset needs --from-table (the store is set from the table) or --from-store (the "
                           "table records the store's offsets)")
    try:
        table = open_table(load_catalog(catalog_settings(config)), mapping.table)
        pending = pending_audit(table, mapping.audit_branch) if mapping.publish == "audited" else None
        if command == "reset" and source == "store" and pending is not None:
            # A snapshot on main now would make the pending audit's fast-forward impossible.
            raise CommandError(f"table {mapping.table}: audit branch {pending.branch} holds snapshot "
                               f"{pending.snapshot_id} of run {pending.run_id} that main does not; settle it first: "
                               f"{AUDIT_COMMANDS.format(table=mapping.table)}")
        with offset_store_from_config(config) as store:
            view = offsets_view(table, topic, store)
            if command == "reset":
                if not yes:
                    print("\n".join([*view.lines(), "would set the store's offsets to the table's (partitions the "
                                      "table has none of: deleted, read again from their oldest segment)"
                                      if source == "table" else "would record the store's offsets in the table for "
                                      "the partitions it has none of (a snapshot without data files)",
                                      "add --yes to do it"]))
                    return 1
                if source == "table":
                    view = reset_from_table(table, topic, store)
                else:
                    view = reset_from_store(table, topic, store, audit_branch=mapping.audit_branch
                                            if mapping.publish == "audited" else None)
    except (OffsetStoreError, EngineError) as err:
        raise CommandError(str(err)) from err
    # A partition waiting behind an incomplete segment for longer than the grace: the object and the skip command.
    segments = segment_store_from_config(config)
    next_offsets: dict[int, int | None] = dict.fromkeys(segments.list_partitions(topic))  # nothing committed yet
    next_offsets.update({p.partition: p.table_next if p.table_next is not None else p.store_next
                         for p in view.partitions})
    stalled = stalled_partitions(segments, topic, next_offsets,
                                 grace_seconds=config.processor.orphan_segment_grace_seconds).stalled
    print("\n".join([*view.lines(), *(f"STALLED partition {p}: {s.describe()}" for p, s in stalled.items())]))
    return 0


def run_audit(config_path: str | None, *, command: str, table: str) -> int:
    """`audit show | publish | drop --table T` of a `publish: audited` mapping (engine/tables/audit.py): what its
    audit branch holds beyond main; main fast-forwarded to it as it is; or the branch dropped. After publish or drop
    the offsets store is set from main (`offsets reset --from-table`): the table is the truth, the store its mirror.
    A table no mapping lands (a downstream asset's, written by the IO manager with `publish: audited`) has the default
    audit branch and no offsets: show names the pending snapshot, publish and drop settle it."""
    from kafscale_lakehouse.config import load_config
    from kafscale_lakehouse.connections import catalog_settings, offset_store_from_config
    from kafscale_lakehouse.engine import EngineError
    from kafscale_lakehouse.engine.ingestion import reset_from_table, with_pattern_topics
    from kafscale_lakehouse.engine.tables import load_catalog, open_table
    from kafscale_lakehouse.engine.tables.audit import (
        DEFAULT_AUDIT_BRANCH,
        audit_snapshot,
        drop_audit,
        pending_audit,
        publish_audit,
    )
    from kafscale_lakehouse.offsets import OffsetStoreError

    config = with_pattern_topics(load_config(config_path)).config  # topic_pattern: a mapping per matching topic
    mapping = next((m for m in config.mappings if m.table == table), None)
    branch = mapping.audit_branch if mapping is not None else DEFAULT_AUDIT_BRANCH
    try:
        catalog = load_catalog(catalog_settings(config))
        if mapping is None and not catalog.table_exists(table):
            raise CommandError(f"no mapping lands in table {table!r} and the catalog has no such table; mapped "
                               f"tables: {[m.table for m in config.mappings]}")
        iceberg_table = open_table(catalog, table)
        pending = pending_audit(iceberg_table, branch)
        if pending is None:
            print(f"table {table}: nothing pending on audit branch {branch}")
            if command == "drop":
                drop_audit(iceberg_table, branch)  # a branch main already holds, if any
            return 0
        described = (f"table {table}: audit branch {branch} holds snapshot {pending.snapshot_id} of run "
                     f"{pending.run_id}; main is at {pending.main_snapshot_id}"
                     f"{'' if pending.based_on_main else ' and moved off its base (another writer committed)'}")
        if command == "show":
            if mapping is None:  # the IO manager's table: its checks are the asset's own
                print(described)
                return 0
            report = audit_snapshot(iceberg_table, branch, mapping.topic)
            print("\n".join([described, *(f"check {name}: {'passed' if ok else 'FAILED'}"
                                           for name, ok in report.checks.items()),
                             *(f"  {f.message}" for f in report.failures)]))
            return 0
        if command == "publish":
            publish_audit(iceberg_table, branch, pending.snapshot_id)
            print(f"{described}; main fast-forwarded to it")
        else:
            drop_audit(iceberg_table, branch)
            print(f"{described}; dropped (main unchanged: the next run lands its offsets again)")
        if mapping is None:
            return 0  # no offsets: nothing to reset
        with offset_store_from_config(config) as store:
            print("\n".join(reset_from_table(iceberg_table, mapping.topic, store).lines()))
    except (OffsetStoreError, EngineError) as err:
        raise CommandError(str(err)) from err
    return 0


def run_move_position(config_path: str | None, *, topic: str, partition: int, next_offset: int, yes: bool) -> int:
    """`offsets reset --to-offset N --partition P`: the table's position of one partition set explicitly
    (engine/replay.move_position); without --yes, what would change."""
    from kafscale_lakehouse.engine.ingestion import move_position

    def move(context, mapping) -> int:  # noqa: ANN001
        moved = move_position(context, mapping, partition, next_offset, dry_run=not yes)
        if not yes:
            print(f"would set the next offset of topic {topic} partition {partition} in table {moved.table} from "
                  f"{'none' if moved.before is None else moved.before} to {next_offset} (forward: the offsets "
                  "between are skipped; backward: the table's rows from it on are removed and land again)")
            print("add --yes to do it")
            return 1
        print(moved.describe())
        return 0

    return _with_ingest_context(config_path, topic, move)


def run_skip(config_path: str | None, *, topic: str, partition: int, segment: str | None, to: int | None,
             yes: bool) -> int:
    """`offsets skip`: the offsets of the incomplete segment a partition waits behind (`--segment KEY`), or up to
    `--to`, recorded as skipped in the table (`kafscale.skipped.<topic>`) with the position moved past them, in one
    snapshot (engine/ingestion/planning.plan_skip, replay.move_position); without --yes, what would be skipped."""
    from kafscale_lakehouse.engine.ingestion import (
        ReplayError,
        move_position,
        open_mapping_table,
        plan_skip,
        resolve_record_validation,
    )
    from kafscale_lakehouse.engine.tables import read_topic_offsets

    def skip(context, mapping) -> int:  # noqa: ANN001
        # A registry format's table opens (or is created) with its registered schemas, as a run opens it
        validation = resolve_record_validation(context.config, mapping, context.registry)
        table = open_mapping_table(context, mapping, validation.columns, validation.registered_values)
        next_offset = read_topic_offsets(table, topic).get(partition)
        plan = plan_skip(context.store, topic, partition, next_offset, segment_key=segment, to=to)
        if not yes:
            print(f"would skip: {plan.describe()}")
            print("add --yes to do it")
            return 1
        try:
            moved = move_position(context, mapping, partition, plan.end, skipping_from=plan.start)
        except ReplayError as err:  # the partition moved since it was planned
            raise CommandError(str(err)) from err
        print(moved.describe())
        return 0

    return _with_ingest_context(config_path, topic, skip)


def _with_ingest_context(config_path: str | None, topic: str, action) -> int:  # noqa: ANN001
    """`action(context, mapping)` with the IngestContext of the config and the mapping of `topic`; the errors of an
    offsets command become `CommandError`s."""
    from kafscale_lakehouse.config import load_config
    from kafscale_lakehouse.engine import EngineError
    from kafscale_lakehouse.engine.ingestion import IngestContext, with_pattern_topics
    from kafscale_lakehouse.engine.spark import get_spark_session
    from kafscale_lakehouse.offsets import OffsetStoreError

    config = with_pattern_topics(load_config(config_path)).config  # topic_pattern: a mapping per matching topic
    mapping = next((m for m in config.mappings if m.topic == topic), None)
    if mapping is None:
        raise CommandError(f"no mapping lands topic {topic!r}; mapped topics: {[m.topic for m in config.mappings]}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    spark = get_spark_session(config.spark.master, dict(config.spark.conf), remote=config.spark.remote)
    try:
        with IngestContext.from_config(config, spark) as context:
            return action(context, mapping)
    except (OffsetStoreError, EngineError) as err:
        raise CommandError(str(err)) from err


def run_replay(config_path: str | None, *, topic: str, partition: int, start: int, end: int | None,
               yes: bool) -> int:
    """`offsets replay`: the rows of one partition's offset range replaced by the records read again, in one commit
    (engine/ingestion/replay.py); without --yes, what would be replaced."""
    from kafscale_lakehouse.engine.ingestion import (
        open_mapping_table,
        plan_replay,
        replay_range,
        resolve_record_validation,
    )
    from kafscale_lakehouse.engine.tables import RecordRange, read_topic_offsets
    from kafscale_lakehouse.offsets.ranges import OffsetRange

    def replay(context, mapping) -> int:  # noqa: ANN001
        validation = resolve_record_validation(context.config, mapping, context.registry)
        table = open_mapping_table(context, mapping, validation.columns, validation.registered_values)
        last = end if end is not None else read_topic_offsets(table, topic).get(partition, start)
        try:
            offsets = OffsetRange(partition, start, last)
        except ValueError as err:
            raise CommandError(f"--partition/--from/--to: {err}") from err
        if not yes:
            print(plan_replay(table, RecordRange(topic, offsets)).describe())
            print("add --yes to do it")
            return 1
        print(replay_range(context, mapping, offsets).describe())
        return 0

    return _with_ingest_context(config_path, topic, replay)


def run_serve_metrics_command(config_path: str | None, *, address: str | None) -> int:
    """Serve /metrics, /healthz and /readyz until SIGTERM or Ctrl-C (kafscale_lakehouse/apps/metrics_server.py)."""
    from kafscale_lakehouse.apps.metrics_server import resolve_metrics_address, serve_metrics
    from kafscale_lakehouse.config import load_config

    host, port = resolve_metrics_address(address)
    config = load_config(config_path)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        serve_metrics(config, host, port)
    except (KeyboardInterrupt, SystemExit):
        log.info("serve-metrics stopped")
    return 0


def run_spark_engine_command(config_path: str | None, *, address: str | None) -> int:
    """Run the Spark engine (a Spark Connect server, `spark.master` and `spark.conf` of the config) until SIGTERM or
    Ctrl-C, or until the parent process is gone (`make demo` killed hard); runs connect to it with `SPARK_REMOTE`."""
    from kafscale_lakehouse.config import load_config
    from kafscale_lakehouse.engine.ingestion import spark_job
    from kafscale_lakehouse.engine.spark import (
        DEFAULT_ENGINE_ADDRESS,
        ENGINE_ADDRESS_VARIABLE,
        SparkEngineError,
        parse_engine_address,
        serve,
        spark_settings_from_env,
    )

    try:
        engine_address = parse_engine_address(
            address or os.environ.get(ENGINE_ADDRESS_VARIABLE, DEFAULT_ENGINE_ADDRESS)
        )
    except ValueError as err:
        raise CommandError(str(err)) from None
    config = load_config(config_path)
    env_master, env_conf = spark_settings_from_env(os.environ)  # the pod's KAFSCALE_SPARK_* win, as for runs
    try:
        return serve(engine_address, env_master or config.spark.master, {**config.spark.conf, **env_conf},
                     warm_modules=[spark_job.__name__])
    except SparkEngineError as err:
        raise CommandError(str(err)) from None


class EndWithoutTeardown:
    """An exit function that ends the process once the interpreter has joined its threads and run the exit functions
    registered after this one (pyspark's, the collector's freeze): logging is shut down, stdout and stderr flushed,
    then `os._exit(status)`, skipping the teardown of ~1,700 modules' objects one by one: 0.5 of 2.6 CPU-s of a
    process that imports what `ingest --once` does (benchmarks/cli_startup.py, load ~20). Without a `status` (the
    command raised) the ordinary exit goes on."""

    def __init__(self) -> None:
        self.status: int | None = None

    def __call__(self) -> None:
        if self.status is None:
            return
        logging.shutdown()  # registered before this one (by `import logging`), so it would run after it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.status)


def _reported_errors() -> tuple[type[Exception], ...]:
    """The errors `main` reports as one line with exit code 2, imported once one is raised (see the imports above)."""
    from kafscale_lakehouse.apps.segment_inspect import SegmentLocationError
    from kafscale_lakehouse.config import ConfigError
    from kafscale_lakehouse.format import SegmentFormatError
    from kafscale_lakehouse.storage import StorageError

    return CommandError, SegmentLocationError, SegmentFormatError, StorageError, OSError, ConfigError


def _exit_on_sigterm(signum, frame) -> Never:  # noqa: ANN001 - signal handler signature
    raise SystemExit(128 + signum)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafscale-lakehouse", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("KAFSCALE_LAKEHOUSE_LOG_LEVEL", "INFO"))
    # The Go iceberg-processor's command line (its Helm chart runs the image with `-config=<path>`): without a
    # command, `-config FILE` runs the ingest loop until stopped, as the Go processor does.
    parser.add_argument(
        "--config", dest="processor_config", default=None,
        help="without a command: run `ingest --config FILE` (the Go processor's `-config=FILE` works too)",
    )
    commands = parser.add_subparsers(dest="command")
    segment = commands.add_parser("segment", help="look at KafScale segment objects")
    segment_commands = segment.add_subparsers(dest="segment_command", required=True)
    inspect = segment_commands.add_parser("inspect", help="print header, footer, batches and optionally records")
    inspect.add_argument("location", help="local path or s3://bucket/key of a .kfs (its .index is read beside it)")
    inspect.add_argument("--records", action="store_true", help="one JSON line per record")
    inspect.add_argument("--topic", help="topic name when the path is not …/<topic>/<partition>/segment-<base>.kfs")
    inspect.add_argument("--partition", type=int, help="partition id, likewise")

    ingest = commands.add_parser("ingest", help="ingest completed segments into Iceberg (the Go processor's loop)")
    ingest.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    ingest.add_argument("--topic", action="append", help="only this mapping's topic (repeatable)")
    ingest.add_argument(
        "--once",
        action="store_true",
        help="ingest what is completed now and exit (0 = all ingested, 1 = a partition failed)",
    )

    producer = commands.add_parser("demo-producer", help="write pizza-order segments like a KafScale broker (demo)")
    producer.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    # Unset options keep run_demo_producer's defaults (one place for them).
    producer.add_argument("--topic", default=argparse.SUPPRESS, help="topic to write (default: the first mapping's)")
    producer.add_argument("--partitions", type=int, default=argparse.SUPPRESS, help="write partitions 0..N-1")
    producer.add_argument(
        "--interval-seconds", type=float, default=argparse.SUPPRESS, help="seconds between two segments of a partition"
    )
    producer.add_argument("--records-per-segment", type=int, default=argparse.SUPPRESS, help="orders per segment")
    producer.add_argument(
        "--lfs",
        action="store_true",
        default=argparse.SUPPRESS,
        help="send some orders (with a photo) as KafScale LFS blobs + envelopes",
    )
    producer.add_argument(
        "--avro",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also write the orders as Avro (Confluent wire format) to the value_format avro mappings' topics, "
        "registering their schema in the mapping's registry (make demo starts one)",
    )
    producer.add_argument(
        "--cdc",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also write Debezium change events of stores to the cdc.format debezium mappings' topics",
    )
    producer.add_argument(
        "--rounds",
        type=int,
        default=argparse.SUPPRESS,
        help="stop after this many segments per partition (default: run until stopped)",
    )

    report = commands.add_parser("report", help="write a table's data-owner report (self-contained HTML)")
    report.add_argument("--table", required=True, help="Iceberg table of a mapping (namespace.table)")
    report.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    report.add_argument("--output", default="report.html", help="HTML file to write (default: report.html)")

    maintain = commands.add_parser(
        "maintain",
        help="table maintenance: metadata properties, compaction, manifest rewrite, snapshot expiry, orphan files"
    )
    maintain.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    maintain.add_argument("--table", action="append", help="only this mapped table (repeatable; default: all)")
    maintain.add_argument(
        "--step",
        action="append",
        choices=["properties", "compact", "manifests", "expire", "orphans"],
        help="only this step (repeatable; default: all, in that order)",
    )

    audit = commands.add_parser("audit", help="a publish: audited table's pending audit (its audit branch)")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    for name, text in (("show", "what the audit branch holds beyond main, and its checks"),
                       ("publish", "fast-forward main to the audited snapshot as it is; the store follows"),
                       ("drop", "drop the audited snapshot (main unchanged, its offsets land again); the store "
                        "follows main")):
        command = audit_commands.add_parser(name, help=text)
        command.add_argument("--table", required=True, help="Iceberg table of a mapping (namespace.table)")
        command.add_argument(
            "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
        )

    offsets = commands.add_parser("offsets", help="a topic's offsets in its table and in the offsets store")
    offsets_commands = offsets.add_subparsers(dest="offsets_command", required=True)
    for name, text in (("show", "the table's, the store's and the broker's next offsets side by side"),
                       ("reset", "set the store from the table, the table from the store, or a partition's "
                        "position explicitly (--from-table | --from-store | --to-offset N --partition P; --yes)")):
        command = offsets_commands.add_parser(name, help=text)
        command.add_argument("--topic", required=True, help="a mapped topic")
        command.add_argument(
            "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
        )
        if name == "reset":
            source = command.add_mutually_exclusive_group(required=True)
            source.add_argument("--from-table", dest="source", action="store_const", const="table",
                                help="the store is set from the table (partitions it lacks: read from the start)")
            source.add_argument("--from-store", dest="source", action="store_const", const="store",
                                help="the table records the store's offsets of the partitions it lacks")
            source.add_argument("--to-offset", dest="to_offset", type=int, default=None,
                                help="the table's next offset of --partition set to this, in a snapshot (forward: "
                                "the offsets between are skipped; backward: the rows from it on are removed and "
                                "land again), then the store")
            command.add_argument("--partition", type=int, default=None, help="the partition of --to-offset")
            command.add_argument("--yes", action="store_true", help="do it (without: only show what would change)")
    skip = offsets_commands.add_parser(
        "skip", help="record the offsets of the incomplete segment a partition waits behind (or up to an offset) as "
        "skipped in the table and move the partition past them, in one snapshot")
    skip.add_argument("--topic", required=True, help="a mapped topic")
    skip.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    skip.add_argument("--partition", type=int, required=True, help="the Kafka partition")
    skipped = skip.add_mutually_exclusive_group(required=True)
    skipped.add_argument("--segment", default=None,
                         help="the object key (.kfs or .index) of the incomplete segment it waits behind, as the "
                         "error and `offsets show` name it: its offsets are skipped")
    skipped.add_argument("--to", dest="to", type=int, default=None,
                         help="skip from the partition's next offset up to (excluding) this offset")
    skip.add_argument("--yes", action="store_true", help="do it (without: only show what would be skipped)")
    replay = offsets_commands.add_parser(
        "replay", help="replace the rows of one partition's offset range by the records read again, in one commit")
    replay.add_argument("--topic", required=True, help="a mapped topic")
    replay.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    replay.add_argument("--partition", type=int, required=True, help="the Kafka partition")
    replay.add_argument("--from", dest="start", type=int, required=True, help="first offset replayed")
    replay.add_argument("--to", dest="end", type=int, default=None,
                        help="offset after the last one replayed (default: the table's next offset)")
    replay.add_argument("--yes", action="store_true", help="do it (without: only show what would be replaced)")

    serve_metrics = commands.add_parser(
        "serve-metrics",
        help="serve the Go processor's Prometheus metrics (read from etcd and the catalog), /healthz and /readyz",
    )
    serve_metrics.add_argument(
        "--config", default=None, help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml)"
    )
    serve_metrics.add_argument(
        "--address", default=None, help="HOST:PORT or :PORT to listen on (default: $KAFSCALE_METRICS_ADDR, then :9093)"
    )

    engine = commands.add_parser(
        "spark-engine",
        help="run the long-lived Spark engine (a Spark Connect server) that runs connect to "
        "with SPARK_REMOTE=sc://HOST:PORT, so no run starts a JVM",
    )
    engine.add_argument(
        "--config",
        default=None,
        help="config file (default: $KAFSCALE_LAKEHOUSE_CONFIG, then lakehouse.yaml); its "
        "spark.master and spark.conf configure the engine",
    )
    engine.add_argument(
        "--address",
        default=None,
        # The names of engine/spark/engine.py (ENGINE_ADDRESS_VARIABLE, DEFAULT_ENGINE_ADDRESS), written out: importing
        # them loads pyspark for every command (test_run_startup.py checks they agree).
        help="HOST:PORT to listen on (default: $KAFSCALE_SPARK_ENGINE_ADDR, then 127.0.0.1:15002; 0.0.0.0:15002 in a "
        "pod)",
    )
    dagster_home = commands.add_parser(
        "dagster-home",
        help="make DIR a Dagster instance directory (DAGSTER_HOME) for local use: its dagster.yaml is the template, "
        "Dagster's own run launcher and sqlite storage unless an opt-in below is given (an existing dagster.yaml "
        "stays as it is)",
    )
    dagster_home.add_argument("directory", help="the DAGSTER_HOME directory (created if missing)")
    dagster_home.add_argument("--template", default="dagster.yaml",
                              help="the instance settings to start from (default: ./dagster.yaml, the repository's)")
    dagster_home.add_argument("--kept-connections", action="store_true",
                              help="opt-in for one host of hundreds of topics: the sqlite storage keeping its "
                              "connections open (docs/operations-one-host.md)")
    dagster_home.add_argument("--forking-launcher", action="store_true",
                              help="opt-in for one host of hundreds of topics: each run's process forked from one "
                              "that has loaded the code location (docs/operations-one-host.md)")
    return parser


def go_flags_as_options(argv: list[str]) -> list[str]:
    """`-config=FILE` and `-config FILE` (Go's flag syntax, one dash) as `--config`, which every command takes."""
    return ["--config" + arg[len("-config"):] if arg == "-config" or arg.startswith("-config=") else arg
            for arg in argv]


def main(argv: list[str] | None = None) -> int:
    own_process = argv is None  # the console script, not a caller's function call
    end = EndWithoutTeardown()
    if own_process:
        atexit.register(end)  # before anything the command loads registers its own: runs after them
        # pydantic looks for plugins in the entry points of every installed distribution (~180 here) when the first
        # model is defined, 0.02-0.12 s of each start; no command of ours uses one. Set, the user's value wins.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    with startup_without_collections(own_process):
        parser = _build_parser()
        args = parser.parse_args(go_flags_as_options(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        if args.processor_config is None:
            parser.error("a command is required (or -config FILE, which runs the ingest loop like the Go processor)")
        args.command, args.config, args.topic, args.once = "ingest", args.processor_config, None, False
    elif getattr(args, "config", None) is None and args.processor_config is not None:
        args.config = args.processor_config  # `-config FILE ingest --once`: the flag before the command
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if own_process:
        # What is left at the end goes with the process: otherwise the interpreter's last garbage collection walks
        # every object pyspark, pyiceberg and pandas made: 0.5 of 2.6 CPU-s after the imports of `ingest --once`
        # alone, more after a run (benchmarks/cli_startup.py; about 1 s of each `ingest --once`, tiny_run.py).
        atexit.register(gc.freeze)
    try:
        if args.command == "segment" and args.segment_command == "inspect":
            from kafscale_lakehouse.apps.segment_inspect import inspect_segment

            return inspect_segment(
                args.location, records=args.records, out=sys.stdout, topic=args.topic, partition=args.partition
            )
        if args.command == "ingest" and own_process and args.once:
            with startup_without_collections(own_process):
                from kafscale_lakehouse.apps import warm_cli

                if not warm_cli.in_warm_child and warm_cli.enabled():
                    # Handed to the warm process: none of the run's imports here (benchmarks/tiny_run.py); None:
                    # no warm process took it (one starts for the next command), it runs here.
                    end.status = warm_cli.run_warm(sys.argv[1:])
            if end.status is not None:
                return end.status
        if args.command == "ingest":
            end.status = run_ingest(args.config, topics=args.topic, once=args.once, own_process=own_process)
            return end.status
        if args.command == "demo-producer":
            return run_demo_producer_command(args)
        if args.command == "report":
            return run_report(args.config, table=args.table, output=args.output)
        if args.command == "maintain":
            return run_maintain(args.config, tables=args.table, steps=args.step)
        if args.command == "offsets" and getattr(args, "to_offset", None) is not None:
            if args.partition is None:
                raise CommandError("offsets reset --to-offset needs --partition")
            return run_move_position(args.config, topic=args.topic, partition=args.partition,
                                     next_offset=args.to_offset, yes=args.yes)
        if args.command == "offsets" and args.offsets_command == "skip":
            return run_skip(args.config, topic=args.topic, partition=args.partition, segment=args.segment, to=args.to,
                            yes=args.yes)
        if args.command == "offsets" and args.offsets_command == "replay":
            return run_replay(args.config, topic=args.topic, partition=args.partition, start=args.start,
                              end=args.end, yes=args.yes)
        if args.command == "offsets":
            return run_offsets(args.config, command=args.offsets_command, topic=args.topic,
                               source=getattr(args, "source", None), yes=getattr(args, "yes", False))
        if args.command == "audit":
            return run_audit(args.config, command=args.audit_command, table=args.table)
        if args.command == "serve-metrics":
            return run_serve_metrics_command(args.config, address=args.address)
        if args.command == "spark-engine":
            return run_spark_engine_command(args.config, address=args.address)
        if args.command == "dagster-home":
            from kafscale_lakehouse.orchestration.dagster_home import DagsterHomeError, write_dagster_home

            try:
                print(write_dagster_home(Path(args.directory), Path(args.template),
                                         kept_connections=args.kept_connections,
                                         forking_launcher=args.forking_launcher))
            except DagsterHomeError as err:
                raise CommandError(str(err)) from None
            return 0
    except _reported_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
