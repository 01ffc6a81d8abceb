"""Offsets in snapshot summaries and the commit protocol against real catalogs (sqlite and SeaweedFS REST)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

import kafscale_lakehouse.engine.tables.appends as table_offsets
import kafscale_lakehouse.engine.tables.run_files as run_files
from kafscale_lakehouse.engine.tables.appends import (
    CommitOutcomeUnknownError,
    CommitRetriesExhaustedError,
    OffsetConflictError,
    commit_append,
)
from kafscale_lakehouse.engine.tables.audit import start_audit_branch
from kafscale_lakehouse.engine.tables.rewrites import PositionsMovedError, commit_rewrite
from kafscale_lakehouse.engine.tables.run_files import (
    clean_ended_runs,
    record_commit_attempt,
    register_run,
    remove_run_files,
    run_committed,
    run_table,
)
from kafscale_lakehouse.engine.tables.summary import (
    COMMIT_ID_PROPERTY,
    OFFSETS_PROPERTY_PREFIX,
    RUN_ID_PROPERTY,
    CorruptOffsetsPropertyError,
    format_offsets_property,
    offsets_summary_properties,
    parse_offsets_property,
    read_committed_offsets,
    read_topic_offsets,
)
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore
from kafscale_lakehouse_tests.engine.tables.helpers import start_end, write_batch

pytestmark = pytest.mark.integration


def _plain_append(catalog, table, rows: int = 1, **snapshot_properties) -> None:
    """A commit by another engine: plain pyiceberg through its own table handle, no kafscale offsets."""
    other = catalog.load_table(table.name())
    arrow = pa.table({
        "record_id": [f"other:{i}" for i in range(rows)], "topic": ["other"] * rows,
        "partition": pa.array([0] * rows, pa.int32()), "offset": list(range(rows)),
        "timestamp_ms": [0] * rows,
    }, schema=pa.schema([
        pa.field("record_id", pa.string(), nullable=False), pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False), pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
    ]))
    other.append(arrow, snapshot_properties=snapshot_properties)


def _exists(table, data_files) -> list[bool]:
    return [table.io.new_input(f.file_path).exists() for f in data_files]


def test_offsets_carry_forward_across_topics_and_partitions(make_table):
    table = make_table()
    steps = [
        ("orders", {0: (0, 10), 1: (0, 5)}),
        ("orders", {1: (5, 8)}),
        ("refunds", {0: (0, 3)}),
        ("orders", {2: (40, 41)}),
    ]
    for step, (topic, ranges) in enumerate(steps):
        files = write_batch(table, topic, ranges, run_id=f"run-{step}", tasks=1)
        result = commit_append(table, files, topic, *start_end(ranges), f"run-{step}")
        assert result.attempts == 1

    summary = table.current_snapshot().summary
    assert summary[OFFSETS_PROPERTY_PREFIX + "orders"] == '{"0":10,"1":8,"2":41}'
    assert summary[OFFSETS_PROPERTY_PREFIX + "refunds"] == '{"0":3}'
    assert summary[RUN_ID_PROPERTY] == "run-3" and summary[COMMIT_ID_PROPERTY]
    assert result.topic_offsets == {0: 10, 1: 8, 2: 41}
    assert read_committed_offsets(table) == {"orders": {0: 10, 1: 8, 2: 41}, "refunds": {0: 3}}
    assert len(table.metadata.snapshots) == 4
    assert table.scan().to_arrow().num_rows == 10 + 5 + 3 + 3 + 1


def test_reading_walks_back_past_snapshots_of_other_engines(catalog, make_table):
    table = make_table()
    assert read_committed_offsets(table) == {}
    ranges = {0: (0, 4)}
    commit_append(table, write_batch(table, "t", ranges, "run-1", tasks=1), "t", *start_end(ranges), "run-1")
    _plain_append(catalog, table)
    _plain_append(catalog, table)
    table.refresh()

    assert OFFSETS_PROPERTY_PREFIX + "t" not in table.current_snapshot().summary.additional_properties
    assert read_topic_offsets(table, "t") == {0: 4}
    # The next batch starts where the walk says; its snapshot carries the map forward again.
    ranges = {0: (4, 9), 3: (0, 2)}
    commit_append(table, write_batch(table, "t", ranges, "run-2", tasks=1), "t", *start_end(ranges), "run-2")
    assert table.current_snapshot().summary[OFFSETS_PROPERTY_PREFIX + "t"] == '{"0":9,"3":2}'


def test_offset_conflict_aborts_and_deletes_our_files(make_table):
    table = make_table()
    ranges_a = {0: (0, 10), 1: (0, 10)}
    ranges_b = {1: (0, 6)}  # written concurrently, starting where A starts
    files_a = write_batch(table, "t", ranges_a, "run-a")
    files_b = write_batch(table, "t", ranges_b, "run-b")
    commit_append(table, files_a, "t", *start_end(ranges_a), "run-a")

    with pytest.raises(OffsetConflictError) as raised:
        commit_append(table, files_b, "t", *start_end(ranges_b), "run-b")

    assert raised.value.partition == 1 and raised.value.committed == 10 and raised.value.expected_start == 0
    assert "topic t partition 1" in str(raised.value)
    assert _exists(table, files_b) == [False] * len(files_b)
    assert all(_exists(table, files_a))
    assert len(table.metadata.snapshots) == 1
    assert table.scan().to_arrow().num_rows == 20


def test_unrelated_concurrent_commit_is_retried_without_rewriting(catalog, make_table, monkeypatch):
    table = make_table()
    ranges = {0: (0, 10)}
    files = write_batch(table, "t", ranges, "run-r")
    _interleave_before_commit(monkeypatch, times=1, commit=lambda: _plain_append(catalog, table, rows=2))

    result = commit_append(table, files, "t", *start_end(ranges), "run-r")

    assert result.attempts == 2
    assert all(_exists(table, files))
    assert [s.summary.operation.value for s in table.metadata.snapshots] == ["append", "append"]
    current = table.current_snapshot()
    assert current.snapshot_id == result.snapshot_id and current.parent_snapshot_id is not None
    assert current.summary[OFFSETS_PROPERTY_PREFIX + "t"] == '{"0":10}'
    assert {f.file_path for f in files} <= {t.file.file_path for t in table.scan().plan_files()}
    assert table.scan().to_arrow().num_rows == 12


def test_concurrent_kafscale_commit_is_detected_on_retry(catalog, make_table, monkeypatch):
    """pyiceberg's own commit retry would re-apply our append on top of the other run's: we must re-check."""
    table = make_table()
    ranges = {0: (0, 10)}
    ours = write_batch(table, "t", ranges, "run-ours")
    theirs = write_batch(table, "t", ranges, "run-theirs")
    theirs_handle = catalog.load_table(table.name())
    _interleave_before_commit(
        monkeypatch, times=1,
        commit=lambda: commit_append(theirs_handle, theirs, "t", *start_end(ranges), "run-theirs"),
    )

    with pytest.raises(OffsetConflictError, match="partition 0"):
        commit_append(table, ours, "t", *start_end(ranges), "run-ours")

    assert _exists(table, ours) == [False] * len(ours)
    assert table.scan().to_arrow().num_rows == 10
    assert table.current_snapshot().summary[RUN_ID_PROPERTY] == "run-theirs"


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_retries_are_bounded_and_then_delete_our_files(catalog, make_table, monkeypatch):
    table = make_table()
    ranges = {0: (0, 5)}
    files = write_batch(table, "t", ranges, "run-x")
    _interleave_before_commit(monkeypatch, times=3, commit=lambda: _plain_append(catalog, table))

    with pytest.raises(CommitRetriesExhaustedError, match="3 times"):
        commit_append(table, files, "t", *start_end(ranges), "run-x", max_attempts=3, retry_wait_seconds=0)

    assert _exists(table, files) == [False] * len(files)
    assert read_committed_offsets(table) == {}


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_commit_whose_response_is_lost_is_found_in_the_table(catalog, make_table, monkeypatch):
    table = make_table()
    ranges = {0: (0, 5)}
    files = write_batch(table, "t", ranges, "run-lost")
    real_commit = catalog.commit_table

    def commit_then_lose_the_response(*args, **kwargs):
        real_commit(*args, **kwargs)
        raise CommitStateUnknownException("gateway timeout after the commit")

    monkeypatch.setattr(catalog, "commit_table", commit_then_lose_the_response)
    result = commit_append(table, files, "t", *start_end(ranges), "run-lost")

    assert result.snapshot_id == table.current_snapshot().snapshot_id
    assert all(_exists(table, files))
    assert read_topic_offsets(table, "t") == {0: 5}


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_unknown_outcome_keeps_files_until_cleanup_proves_them_unreferenced(catalog, make_table, monkeypatch):
    table = make_table()
    ranges = {0: (0, 5)}
    recorded = run_table(table, "run-unknown")  # what its run record names
    files = write_batch(table, "t", ranges, "run-unknown", data_dir=recorded.data_dir)

    def fail_without_committing(*args, **kwargs):
        raise CommitStateUnknownException("connection reset")

    monkeypatch.setattr(catalog, "commit_table", fail_without_committing)
    with pytest.raises(CommitOutcomeUnknownError, match="run run-unknown failed with an unknown outcome"):
        commit_append(table, files, "t", *start_end(ranges), "run-unknown")
    monkeypatch.undo()

    assert all(_exists(table, files))  # they might have been referenced
    assert table.current_snapshot() is None
    # What a later run does for the ended run (run_files.clean_ended_runs): the table shows no commit of it, so
    # its own directory, and nothing else, is deleted.
    assert run_committed(table, "run-unknown", started_ms=0) is False
    assert sorted(remove_run_files(table, recorded.data_dir)) == sorted(
        f.file_path for f in files
    )
    assert _exists(table, files) == [False] * len(files)


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_an_ended_runs_commit_applied_late_by_the_catalog_keeps_its_files(catalog, make_table, monkeypatch, tmp_path):
    """A commit whose outcome was unknown is applied by the catalog after its run ended; the
    clean-up of ended runs must not delete its files before main has moved past the snapshot it was built on."""
    table = make_table()
    commit_append(table, write_batch(table, "t", {0: (0, 3)}, "run-first"), "t", {0: 0}, {0: 3}, "run-first")
    with LocalOffsetStore(tmp_path / "offsets.db", lease_ttl_seconds=30) as store:
        lease = store.acquire_lease("t", 0, "owner-a")
        record = register_run(store, [lease], "run-a", [table])
        files = write_batch(table, "t", {0: (3, 8)}, "run-a", data_dir=record.tables[0].data_dir)
        real_commit, in_flight = catalog.commit_table, []

        def held_in_flight(*args, **kwargs):
            in_flight.append((args, kwargs))
            raise CommitStateUnknownException("gateway timeout; the catalog applies it later")

        monkeypatch.setattr(catalog, "commit_table", held_in_flight)
        with pytest.raises(CommitOutcomeUnknownError, match="run-a"):
            commit_append(table, files, "t", {0: 3}, {0: 8}, "run-a", max_attempts=1,
                          before_attempt=lambda current: record_commit_attempt(store, [lease], record, current))
        monkeypatch.undo()
        lease.release()  # run A has ended (its lease expired)

        stale = catalog.load_table(table.name())
        assert clean_ended_runs(store, "t", [stale]) == [], "the commit may still land"
        assert all(_exists(table, files)) and [r for r, _ in store.recorded_runs("t")] == ["run-a"]

        real_commit(*in_flight[0][0], **in_flight[0][1])  # the catalog applies it now
        table.refresh()
        assert read_topic_offsets(table, "t") == {0: 8}
        assert clean_ended_runs(store, "t", [stale]) == [] and store.recorded_runs("t") == []
        assert all(_exists(table, files)) and table.scan().to_arrow().num_rows == 8


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_an_ended_runs_commit_that_can_no_longer_land_has_its_files_removed(catalog, make_table, tmp_path):
    """The other side of the rule: once main has moved past the snapshot the ended run's commit was built on,
    without it, the catalog refuses that commit whenever it arrives: its files are deleted."""
    table = make_table()
    commit_append(table, write_batch(table, "t", {0: (0, 3)}, "run-first"), "t", {0: 0}, {0: 3}, "run-first")
    with LocalOffsetStore(tmp_path / "offsets.db", lease_ttl_seconds=30) as store:
        lease = store.acquire_lease("t", 0, "owner-a")
        record = register_run(store, [lease], "run-a", [table])
        files = write_batch(table, "t", {0: (3, 8)}, "run-a", data_dir=record.tables[0].data_dir)
        record_commit_attempt(store, [lease], record, table)  # then it died without sending
        lease.release()
        commit_append(table, write_batch(table, "t", {0: (3, 5)}, "run-b"), "t", {0: 3}, {0: 5}, "run-b")
        stale = catalog.load_table(table.name())
        assert sorted(clean_ended_runs(store, "t", [stale])) == sorted(f.file_path for f in files)
        assert store.recorded_runs("t") == [] and table.scan().to_arrow().num_rows == 5


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_an_ended_runs_commit_to_an_audit_branch_is_judged_by_that_branch(catalog, make_table, monkeypatch, tmp_path):
    """An audited commit goes to the audit branch, built on that branch's head: when main moves meanwhile (a
    manifest merge, another writer), the clean-up judges it by the branch, which is still at its base: the files
    stay. Once the branch has moved on (the next audited run starts it at main's head), they go."""
    table = make_table(properties={"format-version": "1"})  # no sequence-number check saves a v1 table
    commit_append(table, write_batch(table, "t", {0: (0, 3)}, "run-first"), "t", {0: 0}, {0: 3}, "run-first")
    with LocalOffsetStore(tmp_path / "offsets.db", lease_ttl_seconds=30) as store:
        lease = store.acquire_lease("t", 0, "owner-a")
        record = register_run(store, [lease], "run-a", [table])
        files = write_batch(table, "t", {0: (3, 8)}, "run-a", data_dir=record.tables[0].data_dir)
        real_commit, in_flight = catalog.commit_table, []

        def held_in_flight(*args, **kwargs):
            in_flight.append((args, kwargs))
            raise CommitStateUnknownException("gateway timeout; the catalog applies it later")

        def before_attempt(current):
            record_commit_attempt(store, [lease], record, current, ref="audit")

        start_audit_branch(table, "audit")  # the audit starts at main's head
        monkeypatch.setattr(catalog, "commit_table", held_in_flight)
        with pytest.raises(CommitOutcomeUnknownError, match="run-a"):
            commit_append(table, files, "t", {0: 3}, {0: 8}, "run-a", max_attempts=1, branch="audit",
                          before_attempt=before_attempt)
        monkeypatch.undo()
        lease.release()
        commit_append(table, write_batch(table, "t", {0: (20, 21)}, "run-main"), "u", {0: 0}, {0: 1}, "run-main")

        stale = catalog.load_table(table.name())
        assert clean_ended_runs(store, "t", [stale]) == [], "the branch is still at its base"
        assert all(_exists(table, files))
        with pytest.raises(CommitFailedException, match="main has changed"):
            real_commit(*in_flight[0][0], **in_flight[0][1])  # it required main unmoved too: never lands now
        start_audit_branch(table, "audit")  # the next audited run starts the branch at main's head
        assert sorted(clean_ended_runs(store, "t", [stale])) == sorted(f.file_path for f in files)
        assert store.recorded_runs("t") == []


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_clean_up_never_deletes_a_file_a_snapshot_of_any_ref_references(catalog, make_table, tmp_path):
    """Whatever an ended run's record says, a file of its directory that a snapshot of a branch references stays."""
    table = make_table()
    with LocalOffsetStore(tmp_path / "offsets.db", lease_ttl_seconds=30) as store:
        lease = store.acquire_lease("t", 0, "owner-a")
        record = register_run(store, [lease], "run-a", [table])  # no commit attempt recorded
        files = write_batch(table, "t", {0: (0, 5)}, "run-a", data_dir=record.tables[0].data_dir)
        commit_append(table, files, "t", {0: 0}, {0: 5}, "another-writer", branch="side")
        lease.release()
        assert clean_ended_runs(store, "t", [catalog.load_table(table.name())]) == []
        assert all(_exists(table, files)) and store.recorded_runs("t") == []


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_a_run_whose_commit_was_expired_behind_an_older_tag_is_not_proven_uncommitted(make_table, monkeypatch):
    """The walk stopped at the first retained snapshot older than the run's start (here a tag) and
    answered "not committed" although the snapshot after it, the run's commit, had been expired."""
    monkeypatch.setattr(run_files, "CLOCK_SKEW_MS", 0)
    table = make_table()
    commit_append(table, write_batch(table, "t", {0: (0, 5)}, "run-old"), "t", {0: 0}, {0: 5}, "run-old")
    tagged = table.current_snapshot()
    table.manage_snapshots().create_tag(tagged.snapshot_id, "audit").commit()
    started_ms = tagged.timestamp_ms + 1
    time.sleep(0.01)
    ours = commit_append(table, write_batch(table, "t", {0: (5, 9)}, "run-ours"), "t", {0: 5}, {0: 9}, "run-ours")
    commit_append(table, write_batch(table, "t", {0: (9, 12)}, "run-new"), "t", {0: 9}, {0: 12}, "run-new")
    table.maintenance.expire_snapshots().by_id(ours.snapshot_id).commit()
    table.refresh()
    assert table.metadata.snapshot_by_id(ours.snapshot_id) is None
    assert table.metadata.snapshot_by_id(tagged.snapshot_id) is not None

    assert run_committed(table, "run-ours", started_ms) is None, "a hole in the history proves nothing"
    assert run_committed(table, "run-new", started_ms) is True
    assert table.scan().to_arrow().num_rows == 12


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_a_rewrite_moving_a_position_back_refuses_when_the_refreshed_table_moved_it(make_table):
    """At the commit: a rewrite planned with partition 0 at 5 must not set it back to 3 once another
    run has landed 5..7 (those rows would stay behind position 3 and land again)."""
    table = make_table()
    commit_append(table, write_batch(table, "t", {0: (0, 5)}, "run-1"), "t", {0: 0}, {0: 5}, "run-1")
    planned = read_topic_offsets(table, "t")
    commit_append(table, write_batch(table, "t", {0: (5, 8)}, "run-2"), "t", {0: 5}, {0: 8}, "run-2")
    before = table.metadata.current_snapshot_id
    with pytest.raises(PositionsMovedError, match="partition 0 at next offset 5, but the table is now at 8"):
        commit_rewrite(table, [], [], marker=("kafscale.test", "move-1"), what="the removal of 3..4",
                       positions=("t", {0: 3}), expected=("t", planned))
    assert table.metadata.current_snapshot_id == before and read_topic_offsets(table, "t") == {0: 8}
    assert table.scan().to_arrow().num_rows == 8


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_empty_batch_still_advances_offsets(make_table):
    table = make_table()
    commit_append(table, [], "t", {0: 0}, {0: 7}, "run-empty")
    assert read_topic_offsets(table, "t") == {0: 7}
    assert table.scan().to_arrow().num_rows == 0


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_corrupt_offsets_property_names_the_snapshot(catalog, make_table):
    table = make_table()
    _plain_append(catalog, table, **{OFFSETS_PROPERTY_PREFIX + "t": "[1, 2]"})
    table.refresh()
    snapshot_id = table.current_snapshot().snapshot_id
    with pytest.raises(CorruptOffsetsPropertyError, match=f"snapshot {snapshot_id} property kafscale.offsets.t"):
        read_committed_offsets(table)


@pytest.mark.parametrize("catalog", ["sql"], indirect=True)
def test_invalid_ranges_and_reserved_properties_are_refused(make_table):
    table = make_table()
    with pytest.raises(ValueError, match=r"partitions \[0\] but end offsets cover \[1\]"):
        commit_append(table, [], "t", {0: 0}, {1: 5}, "r")
    with pytest.raises(ValueError, match=r"partition 0: offset range 5\.\.4"):
        commit_append(table, [], "t", {0: 5}, {0: 4}, "r")
    with pytest.raises(ValueError, match=r"kafscale\.run-id"):
        commit_append(table, [], "t", {0: 0}, {0: 1}, "r", snapshot_properties={RUN_ID_PROPERTY: "x"})
    assert table.metadata.snapshots == []


def test_offsets_property_format_round_trip():
    assert format_offsets_property({10: 5, 2: 980, 0: 1200}) == '{"0":1200,"2":980,"10":5}'
    assert parse_offsets_property('{"0":1200,"10":5}', where="w") == {0: 1200, 10: 5}
    for bad in ('{"0": -1}', '{"x": 1}', '{"0": 1.5}', "{", '{"0": true}'):
        with pytest.raises(CorruptOffsetsPropertyError, match=r"^w: "):
            parse_offsets_property(bad, where="w")
    assert offsets_summary_properties({"a": {0: 1}, "b": {0: 2}}, "a", {1: 4}) == {
        "kafscale.offsets.a": '{"0":1,"1":4}', "kafscale.offsets.b": '{"0":2}',
    }


def _interleave_before_commit(monkeypatch, times: int, commit) -> None:
    """Run a real concurrent `commit` right after commit_append has read the table's offsets, `times` times."""
    real_read = table_offsets.read_committed_offsets
    remaining = [times]

    def read_then_let_another_writer_commit(table):
        offsets = real_read(table)
        if remaining[0] > 0:
            remaining[0] -= 1
            commit()
        return offsets

    monkeypatch.setattr(table_offsets, "read_committed_offsets", read_then_let_another_writer_commit)
