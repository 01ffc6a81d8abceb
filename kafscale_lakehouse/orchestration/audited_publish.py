"""Publication of the IO manager's audited writes (`publish: audited`): `main` fast-forwards to a run's audit
snapshot once the run succeeded with every blocking check of that asset passed.

Why a run status sensor on success: Dagster runs an asset's blocking checks in the run that materializes it, and a
blocking check that fails with severity ERROR fails that run; so a run's success is the one point where every check
of the audited snapshot has been evaluated, and the sensor only reads what the event log already holds (the run's
materializations with `published: false`, and its check evaluations) - no extra op in the user's job, and a failed
check needs nothing from us: the run fails naming the check, and `main` keeps its snapshot. The publication is one
ref update (`audit.publish_audit`: it requires `main` still at the audited snapshot's parent) and is reported as an
`AssetObservation` (`published: true`). The same function settles the audit at the next write of the table when the
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


@dataclass(frozen=True)
class AuditedWrite:
    """An audited write of a run: its asset, table, audit branch and snapshot, and the partitions it wrote."""

    asset_key: dg.AssetKey
    table: str
    branch: str
    snapshot_id: int
    partitions: tuple[str, ...]


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
        found[key] = AuditedWrite(materialization.asset_key, key[0], str(metadata[AUDIT_BRANCH_KEY]), key[1],
                                  partitions)
    return list(found.values())


def failed_blocking_checks(instance: dg.DagsterInstance, run_id: str, asset_key: dg.AssetKey) -> list[str]:
    """The blocking checks of `asset_key` that the run evaluated and that did not pass."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    failed = []
    for record in records:
        event = record.event_log_entry.dagster_event
        evaluation = event.event_specific_data if event is not None else None
        if (isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.asset_key == asset_key
                and evaluation.blocking and not evaluation.passed):
            failed.append(evaluation.check_name)
    return failed


def publish_run_audits(instance: dg.DagsterInstance, run_id: str, catalog: Catalog) -> list[AuditedWrite]:
    """Publish the audited writes of a successful run whose blocking checks passed; report each publication as an
    `AssetObservation`. Returns those this call published (one another process published is skipped)."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.status != dg.DagsterRunStatus.SUCCESS:
        return []
    published = []
    for write in audited_writes(instance, run_id):
        failed = failed_blocking_checks(instance, run_id, write.asset_key)
        if failed:  # a succeeded run with a failed blocking check (severity WARN): not published
            log.warning("table %s: snapshot %d of run %s is not published: blocking checks %s failed", write.table,
                        write.snapshot_id, run_id, failed)
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
                      description="Fast-forwards main to the audited snapshots of a succeeded run whose blocking "
                                  "checks passed (the IO manager's publish: audited)")
def audited_publish_sensor(context: dg.RunStatusSensorContext, iceberg_catalog: IcebergCatalogResource) -> None:
    publish_run_audits(context.instance, context.dagster_run.run_id, load_catalog(iceberg_catalog.settings()))
