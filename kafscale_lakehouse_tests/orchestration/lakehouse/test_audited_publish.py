"""Audited publish of the IO manager's partitioned writes (`publish: audited`, sqlite and SeaweedFS REST catalogs, a
real Dagster instance): the write goes to the audit branch, the asset's blocking check reads that snapshot, the run
status sensor fast-forwards main after a clean run; a partition with a bad row fails its check and main never holds
it; the next write refuses until the audit is dropped."""

# No `from __future__ import annotations`: Dagster reads the context parameter annotations at runtime.
from datetime import date

import dagster as dg
import pyarrow as pa
import yaml

from kafscale_lakehouse.apps.cli import main as cli_main
from kafscale_lakehouse.engine.tables.audit import DEFAULT_AUDIT_BRANCH, branch_head, pending_audit
from kafscale_lakehouse.orchestration.audited_publish import (
    AUDITED_PUBLISH_SENSOR,
    audited_publish_sensor,
    publish_run_audits,
)

DAYS = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-05")
BAD_DAY = "2026-11-02"


def _orders(day: str) -> pa.Table:
    ids = [f"{day}-{s}" for s in range(4)]
    if day == BAD_DAY:
        ids[-1] = ids[0]  # a duplicate order id: the check fails
    return pa.table({"order_id": ids, "store_id": pa.array(range(4), pa.int32()),
                     "order_date": [date.fromisoformat(day)] * 4})


def _table(resources, identifier: str):
    with dg.build_resources({"catalog": resources["iceberg_catalog"]}) as built:
        return built.catalog.load_table(identifier)


def _main_days(resources, identifier: str) -> list[tuple[str, int]]:
    """(day, rows) on main, as a pyiceberg reader of main sees them."""
    table = _table(resources, identifier)
    if table.current_snapshot() is None:
        return []
    counts = pa.TableGroupBy(table.scan().to_arrow(), "order_date").aggregate([("order_id", "count")]).to_pylist()
    return sorted((r["order_date"].isoformat(), r["order_id_count"]) for r in counts)


def _last_audit_snapshot(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None
    return event.asset_materialization.metadata["audit_snapshot_id"].value


def _publish(resources, instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> None:
    """The sensor's evaluation for the run's success event, as the daemon does it."""
    [success] = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.RUN_SUCCESS)
    context = dg.build_run_status_sensor_context(
        sensor_name=AUDITED_PUBLISH_SENSOR, dagster_event=success.dagster_event, dagster_instance=instance,
        dagster_run=instance.get_run_by_id(result.run_id), resources={"iceberg_catalog": resources["iceberg_catalog"]})
    audited_publish_sensor(context)


def test_a_clean_partition_publishes_and_a_bad_one_never_reaches_main(resources, namespace, config_document, tmp_path,
                                                                     capsys):
    identifier = f"{namespace}.audited_orders"
    seen: dict[str, int] = {}

    @dg.asset(key=[namespace, "audited_orders"], partitions_def=DAYS, io_manager_key="iceberg_io_manager",
              metadata={"partition_expr": "order_date", "publish": "audited"})
    def audited_orders(context: dg.AssetExecutionContext) -> pa.Table:
        return _orders(context.partition_key)

    @dg.asset_check(asset=audited_orders, blocking=True)
    def order_id_unique(context: dg.AssetCheckExecutionContext, audited_orders) -> dg.AssetCheckResult:
        ids = [r.order_id for r in audited_orders.select("order_id").collect()]
        seen[context.run.tags.get("dagster/partition", "")] = len(ids)
        return dg.AssetCheckResult(passed=len(ids) == len(set(ids)), severity=dg.AssetCheckSeverity.ERROR)

    @dg.asset(key=[namespace, "order_count"], io_manager_key="iceberg_io_manager",
              ins={"orders": dg.AssetIn(key=audited_orders.key)})
    def order_count(orders) -> pa.Table:
        seen["downstream"] = orders.count()
        return pa.table({"orders": [seen["downstream"]]})

    instance = dg.DagsterInstance.ephemeral()

    def run(day: str) -> dg.ExecuteInProcessResult:
        return dg.materialize([audited_orders, order_id_unique], resources=resources, partition_key=day,
                              instance=instance, raise_on_error=False)

    clean = run("2026-11-01")
    assert clean.success
    [materialization] = clean.get_asset_materialization_events()
    metadata = materialization.materialization.metadata
    assert metadata["published"].value is False
    audit_snapshot = metadata["audit_snapshot_id"].value
    assert branch_head(_table(resources, identifier), DEFAULT_AUDIT_BRANCH) == audit_snapshot
    assert seen["2026-11-01"] == 4  # the check read the audit snapshot (main has nothing yet)
    assert _main_days(resources, identifier) == []  # not published yet

    _publish(resources, instance, clean)
    assert _main_days(resources, identifier) == [("2026-11-01", 4)]
    assert _table(resources, identifier).current_snapshot().snapshot_id == audit_snapshot
    assert DEFAULT_AUDIT_BRANCH not in _table(resources, identifier).metadata.refs
    [observation] = instance.fetch_observations(audited_orders.key, limit=10).records
    assert observation.asset_observation.metadata["published"].value is True
    assert observation.asset_observation.partition == "2026-11-01"

    bad = run(BAD_DAY)
    assert not bad.success
    assert seen[BAD_DAY] == 8  # the check read the audit snapshot: main's day and the bad one
    [evaluation] = bad.get_asset_check_evaluations()
    assert evaluation.check_name == "order_id_unique" and not evaluation.passed
    assert publish_run_audits(instance, bad.run_id, _table(resources, identifier).catalog) == []
    assert _main_days(resources, identifier) == [("2026-11-01", 4)]  # main never holds the bad day
    pending = pending_audit(_table(resources, identifier), DEFAULT_AUDIT_BRANCH)
    assert pending is not None and pending.run_id == bad.run_id
    # A downstream asset reads main, not the failed audit snapshot (8 rows on the branch).
    assert dg.materialize([audited_orders, order_count], resources=resources, instance=instance,
                          selection=[order_count]).success
    assert seen["downstream"] == 4

    refused = run("2026-11-03")  # the next write refuses while the failed audit is pending
    assert not refused.success
    message = refused.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert bad.run_id in message and "(FAILURE)" in message and f"audit drop --table {identifier}" in message
    assert _main_days(resources, identifier) == [("2026-11-01", 4)]

    # The commands the refusal names work on a table no mapping lands.
    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text(yaml.safe_dump(config_document))
    assert cli_main(["audit", "show", "--table", identifier, "--config", str(config_path)]) == 0
    assert f"holds snapshot {pending.snapshot_id} of run {bad.run_id}" in capsys.readouterr().out
    assert cli_main(["audit", "drop", "--table", identifier, "--config", str(config_path)]) == 0
    assert pending_audit(_table(resources, identifier), DEFAULT_AUDIT_BRANCH) is None
    assert _main_days(resources, identifier) == [("2026-11-01", 4)]
    retried = run("2026-11-03")
    assert retried.success
    # The next partition's write before the sensor ticked: it publishes the succeeded run's audit first.
    assert run("2026-11-04").success
    assert _main_days(resources, identifier) == [("2026-11-01", 4), ("2026-11-03", 4)]
    _publish(resources, instance, retried)  # already published: nothing to do
    assert _main_days(resources, identifier) == [("2026-11-01", 4), ("2026-11-03", 4)]
    pending = pending_audit(_table(resources, identifier), DEFAULT_AUDIT_BRANCH)
    assert pending is not None and pending.snapshot_id == _last_audit_snapshot(instance, audited_orders.key)


def test_a_wrong_publish_value_names_the_key_and_the_asset(resources, namespace):
    @dg.asset(key=[namespace, "wrongly_published"], io_manager_key="iceberg_io_manager",
              metadata={"publish": "later"})
    def wrongly_published() -> pa.Table:
        return pa.table({"a": [1]})

    result = dg.materialize([wrongly_published], resources=resources, raise_on_error=False)
    message = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert f"asset {namespace}/wrongly_published: publish='later'" in message


def test_main_moved_by_another_writer_is_not_overwritten_and_the_next_write_says_so(resources, namespace):
    identifier = f"{namespace}.moved_orders"

    @dg.asset(key=[namespace, "moved_orders"], partitions_def=DAYS, io_manager_key="iceberg_io_manager",
              metadata={"partition_expr": "order_date", "publish": "audited"})
    def moved_orders(context: dg.AssetExecutionContext) -> pa.Table:
        return _orders(context.partition_key)

    instance = dg.DagsterInstance.ephemeral()
    clean = dg.materialize([moved_orders], resources=resources, partition_key="2026-11-01", instance=instance)
    assert clean.success
    table = _table(resources, identifier)
    table.append(_orders("2026-11-04"))  # another writer commits to main while the audit waits for the sensor

    _publish(resources, instance, clean)  # refused (main moved): logged, the sensor does not fail
    assert _main_days(resources, identifier) == [("2026-11-04", 4)]
    assert pending_audit(_table(resources, identifier), DEFAULT_AUDIT_BRANCH) is not None

    refused = dg.materialize([moved_orders], resources=resources, partition_key="2026-11-03", instance=instance,
                             raise_on_error=False)
    assert not refused.success
    message = refused.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert clean.run_id in message and "(SUCCESS)" in message and f"audit drop --table {identifier}" in message
    assert _main_days(resources, identifier) == [("2026-11-04", 4)]


def test_a_run_that_did_not_evaluate_a_blocking_check_never_publishes(resources, namespace, config_document, tmp_path,
                                                                     capsys):
    identifier = f"{namespace}.unchecked_orders"
    day = {"value": BAD_DAY}  # its rows fail the blocking check

    @dg.asset(key=[namespace, "unchecked_orders"], io_manager_key="iceberg_io_manager",
              metadata={"publish": "audited"})
    def unchecked_orders() -> pa.Table:
        return _orders(day["value"])

    @dg.asset_check(asset=unchecked_orders, blocking=True)
    def unchecked_id_unique(unchecked_orders) -> dg.AssetCheckResult:
        ids = [r.order_id for r in unchecked_orders.select("order_id").collect()]
        return dg.AssetCheckResult(passed=len(ids) == len(set(ids)), severity=dg.AssetCheckSeverity.ERROR)

    @dg.asset_check(asset=unchecked_orders)  # not blocking: publication does not wait for it
    def unchecked_row_count(unchecked_orders) -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    instance = dg.DagsterInstance.ephemeral()
    definitions = [unchecked_orders, unchecked_id_unique, unchecked_row_count]
    without_checks = dg.AssetSelection.assets(unchecked_orders).without_checks()

    unchecked = dg.materialize(definitions, resources=resources, instance=instance, selection=without_checks)
    assert unchecked.success and unchecked.get_asset_check_evaluations() == []
    [materialization] = unchecked.get_asset_materialization_events()
    metadata = materialization.materialization.metadata
    assert metadata["published"].value is False
    assert metadata["audit_blocking_checks"].value == ["unchecked_id_unique"]
    assert metadata["audit_checks_not_in_run"].value == ["unchecked_id_unique"]

    _publish(resources, instance, unchecked)  # the run succeeded, but evaluated no blocking check
    assert _main_days(resources, identifier) == []  # main never holds the rows the check rejects
    pending = pending_audit(_table(resources, identifier), DEFAULT_AUDIT_BRANCH)
    assert pending is not None and pending.run_id == unchecked.run_id
    [observation] = instance.fetch_observations(unchecked_orders.key, limit=10).records
    held = observation.asset_observation.metadata
    assert held["published"].value is False
    assert held["audit_checks_not_evaluated"].value == ["unchecked_id_unique"]
    assert f"audit publish --table {identifier}" in held["audit_pending"].value

    # A later run's write does not publish the unchecked audit either: it refuses, naming the check.
    day["value"] = "2026-11-03"
    refused = dg.materialize(definitions, resources=resources, instance=instance, raise_on_error=False)
    assert not refused.success
    message = refused.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert unchecked.run_id in message and "unchecked_id_unique" in message and "not evaluated" in message
    assert f"audit drop --table {identifier}" in message
    assert _main_days(resources, identifier) == []

    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text(yaml.safe_dump(config_document))
    assert cli_main(["audit", "drop", "--table", identifier, "--config", str(config_path)]) == 0
    # The blocking check evaluated and passing in the run publishes; the non-blocking one need not run.
    checked = dg.materialize(definitions, resources=resources, instance=instance,
                             selection=without_checks | dg.AssetSelection.checks(unchecked_id_unique))
    assert checked.success
    [evaluation] = checked.get_asset_check_evaluations()
    assert evaluation.check_name == "unchecked_id_unique" and evaluation.passed
    _publish(resources, instance, checked)
    assert _main_days(resources, identifier) == [("2026-11-03", 4)]
    assert pending_audit(_table(resources, identifier), DEFAULT_AUDIT_BRANCH) is None
