"""Publication of the IO manager's audited writes (`publish: audited`): `main` fast-forwards to a run's audit
snapshot once the run succeeded and evaluated, in that same run, every blocking check of that asset with a pass.

The blocking checks of the asset are those of its definitions (the code location's asset graph, not only the run's
selection); the IO manager records their names in the materialization (`audit_blocking_checks`), with those the
run's selection leaves out (`audit_checks_not_in_run`). A run that did not evaluate one of them - its selection
excluded the check, or the check's step did not run - publishes nothing: a check not evaluated has not passed. Its
audit stays pending on the branch, reported as an `AssetObservation` (`published: false`, the checks not evaluated
and the operator commands); an operator settles it with `kafscale-lakehouse audit show|publish|drop --table T`, or
drops it and materializes the asset with its checks.

Why a run status sensor on success: Dagster runs an asset's blocking checks in the run that materializes it, and a
blocking check that fails with severity ERROR fails that run; the sensor only reads what the event log already holds
(the run's materializations with `published: false`, and its check evaluations) - no extra op in the user's job, and
a failed check needs nothing from us: the run fails naming the check, and `main` keeps its snapshot. The publication
is one ref update (`audit.publish_audit`: it requires `main` still at the audited snapshot's parent) and is reported
as an `AssetObservation` (`published: true`). The same rule settles the audit at the next write of the table when the
sensor has not ticked yet (io_manager.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import dagster as dg
from pyiceberg.catalog import Catalog

from kafscale_lakehouse.engine.tables import load_catalog, open_table
from kafscale_lakehouse.engine.tables.audit import AuditError, publish_audit
from kafscale_lakehouse.orchestration.metadata import TABLE_NAME_KEY
from kafscale_lakehouse.orchestration.resources import IcebergCatalogResource

log = logging.getLogger(__name__)

AUDITED_PUBLISH_SENSOR = "kafscale_audited_publish"
# Keys of the IO manager's materialization metadata (io_manager.py imports them from here).
PUBLISHED_KEY = "published"
AUDIT_SNAPSHOT_ID_KEY = "audit_snapshot_id"
AUDIT_BRANCH_KEY = "audit_branch"
BLOCKING_CHECKS_KEY = "audit_blocking_checks"  # the asset's blocking checks: each must pass in the run
CHECKS_NOT_IN_RUN_KEY = "audit_checks_not_in_run"  # of those, the ones the run's selection leaves out
# Keys of the observation of an audit a succeeded run leaves pending.
CHECKS_NOT_EVALUATED_KEY = "audit_checks_not_evaluated"
CHECKS_FAILED_KEY = "audit_checks_failed"
AUDIT_PENDING_KEY = "audit_pending"


@dataclass(frozen=True)
class AuditedWrite:
    """An audited write of a run: its asset, table, audit branch and snapshot, and the partitions it wrote."""

    asset_key: dg.AssetKey
    table: str
    branch: str
    snapshot_id: int
    partitions: tuple[str, ...]
    blocking_checks: tuple[str, ...] | None  # None: the materialization does not name them


@dataclass(frozen=True)
class CheckVerdict:
    """The asset's blocking checks as the run evaluated them: failed (an evaluation that did not pass) and not
    evaluated (no evaluation in the run)."""

    failed: tuple[str, ...] = ()
    not_evaluated: tuple[str, ...] = ()
    unknown: bool = False  # the write does not name the asset's blocking checks

    @property
    def passed(self) -> bool:
        return not (self.failed or self.not_evaluated or self.unknown)

    def reasons(self, run_id: str) -> str:
        """Which blocking checks hold the run's audit back."""
        reasons = []
        if self.failed:
            reasons.append(f"blocking checks {list(self.failed)} failed in run {run_id}")
        if self.not_evaluated:
            reasons.append(f"blocking checks {list(self.not_evaluated)} were not evaluated in run {run_id} (not "
                           "in its selection, or their step did not run)")
        if self.unknown:
            reasons.append(f"the materialization of run {run_id} does not name the asset's blocking checks "
                           f"({BLOCKING_CHECKS_KEY})")
        return "; ".join(reasons)

    def describe(self, run_id: str, table: str) -> str:
        """Why the run's audit is not published, and how to settle it."""
        return (f"{self.reasons(run_id)}: main is not published. Materialize the asset with its blocking checks "
                f"after kafscale-lakehouse audit drop --table {table}, or publish it as it is after review "
                f"(kafscale-lakehouse audit show --table {table}, then kafscale-lakehouse audit publish --table "
                f"{table})")


def asset_blocking_checks(job_def: dg.JobDefinition, asset_key: dg.AssetKey) -> tuple[list[str], list[str]]:
    """The names of the asset's blocking checks in its definitions (the code location's asset graph, whatever the
    run selected), and those of them the job does not execute."""
    job_graph = job_def.asset_layer.asset_graph
    graph = job_graph.source_asset_graph
    if not graph.has(asset_key):
        return [], []
    keys = sorted((key for key in graph.get_check_keys_for_assets({asset_key}) if graph.get_check_spec(key).blocking),
                  key=lambda key: key.name)
    return [key.name for key in keys], [key.name for key in keys if key not in job_graph.asset_check_keys]


def audited_writes(instance: dg.DagsterInstance, run_id: str) -> list[AuditedWrite]:
    """The run's materializations with `published: false` (one per table snapshot)."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    found: dict[tuple[str, int], AuditedWrite] = {}
    for record in records:
        materialization = record.event_log_entry.asset_materialization
        if materialization is None:
            continue
        metadata = {k: v.value for k, v in materialization.metadata.items()}
        snapshot_id = metadata.get(AUDIT_SNAPSHOT_ID_KEY)
        if metadata.get(PUBLISHED_KEY) is not False or not isinstance(snapshot_id, int):
            continue
        key = (str(metadata[TABLE_NAME_KEY]), snapshot_id)
        previous = found.get(key)
        partitions = (previous.partitions if previous else ()) + (
            (materialization.partition,) if materialization.partition else ())
        checks = metadata.get(BLOCKING_CHECKS_KEY)
        found[key] = AuditedWrite(materialization.asset_key, key[0], str(metadata[AUDIT_BRANCH_KEY]), key[1],
                                  partitions, tuple(checks) if isinstance(checks, list) else None)
    return list(found.values())


def blocking_check_verdict(instance: dg.DagsterInstance, run_id: str, write: AuditedWrite) -> CheckVerdict:
    """The run's evaluations of the write's blocking checks: each must have one or more evaluations in the run, all
    passed. A blocking evaluation that did not pass fails the verdict even when the write does not name its check."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    passed: dict[str, bool] = {}
    blocking: set[str] = set()
    for record in records:
        event = record.event_log_entry.dagster_event
        evaluation = event.event_specific_data if event is not None else None
        if isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.asset_key == write.asset_key:
            passed[evaluation.check_name] = passed.get(evaluation.check_name, True) and evaluation.passed
            if evaluation.blocking:
                blocking.add(evaluation.check_name)
    required = set(write.blocking_checks or ()) | blocking
    return CheckVerdict(failed=tuple(sorted(name for name in required if passed.get(name) is False)),
                        not_evaluated=tuple(sorted(name for name in required if name not in passed)),
                        unknown=write.blocking_checks is None)


def publish_run_audits(instance: dg.DagsterInstance, run_id: str, catalog: Catalog, *,
                       report_held: bool = False) -> list[AuditedWrite]:
    """Publish the audited writes of a successful run that evaluated every blocking check of their asset with a
    pass; report each publication as an `AssetObservation`, and with `report_held` each write the checks hold back
    (`published: false`, why, and the commands). Returns those this call published (one another process published
    is skipped)."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.status != dg.DagsterRunStatus.SUCCESS:
        return []
    published = []
    for write in audited_writes(instance, run_id):
        verdict = blocking_check_verdict(instance, run_id, write)
        if not verdict.passed:
            # A succeeded run with a failed blocking check (severity WARN), or one that did not evaluate them all.
            reason = verdict.describe(run_id, write.table)
            log.warning("table %s: snapshot %d of run %s (asset %s): %s", write.table, write.snapshot_id, run_id,
                        write.asset_key.to_user_string(), reason)
            if report_held:
                for partition in write.partitions or (None,):
                    instance.report_runless_asset_event(dg.AssetObservation(
                        write.asset_key, partition=partition,
                        metadata={PUBLISHED_KEY: False, AUDIT_SNAPSHOT_ID_KEY: dg.MetadataValue.int(write.snapshot_id),
                                  "audited_run_id": run_id, TABLE_NAME_KEY: write.table,
                                  CHECKS_NOT_EVALUATED_KEY: dg.MetadataValue.json(list(verdict.not_evaluated)),
                                  CHECKS_FAILED_KEY: dg.MetadataValue.json(list(verdict.failed)),
                                  AUDIT_PENDING_KEY: reason}))
            continue
        try:
            if not publish_audit(open_table(catalog, write.table), write.branch, write.snapshot_id):
                continue
        except AuditError as exc:
            # E.g. main moved off the audited snapshot's base: the branch keeps it, the next write of the table
            # refuses naming the commands. Not raised: the sensor goes on with the next runs.
            log.error("table %s: snapshot %d of run %s is not published: %s", write.table, write.snapshot_id, run_id,
                      exc)
            continue
        log.info("table %s: main fast-forwarded to snapshot %d of run %s (asset %s, partitions %s)", write.table,
                 write.snapshot_id, run_id, write.asset_key.to_user_string(), list(write.partitions))
        for partition in write.partitions or (None,):
            instance.report_runless_asset_event(dg.AssetObservation(
                write.asset_key, partition=partition,
                metadata={PUBLISHED_KEY: True, "snapshot_id": dg.MetadataValue.int(write.snapshot_id),
                          "audited_run_id": run_id, TABLE_NAME_KEY: write.table}))
        published.append(write)
    return published


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.SUCCESS, name=AUDITED_PUBLISH_SENSOR,
                      default_status=dg.DefaultSensorStatus.RUNNING,
                      description="Fast-forwards main to the audited snapshots of a succeeded run that evaluated "
                                  "every blocking check of their asset with a pass (the IO manager's publish: "
                                  "audited)")
def audited_publish_sensor(context: dg.RunStatusSensorContext, iceberg_catalog: IcebergCatalogResource) -> None:
    publish_run_audits(context.instance, context.dagster_run.run_id, load_catalog(iceberg_catalog.settings()),
                       report_held=True)
