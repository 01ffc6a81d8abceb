"""local (sqlite) only: leases and commits shared by several processes, and errors naming the file."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from kafscale_lakehouse.offsets import LeaseHeldError, LocalOffsetStore, OffsetStoreUnavailableError


def _contend(path: str, owner: str, start, seconds: float, holders, overlaps, acquisitions) -> None:
    """Run in a separate process: grab the lease whenever free, bump the offset by one, hold it briefly."""
    store = LocalOffsetStore(path, key_prefix="processors")
    start.wait(120)  # both processes contend for the same window, however long their start-up took
    until = time.time() + seconds
    while time.time() < until:
        try:
            lease = store.acquire_lease("orders", 0, owner)
        except LeaseHeldError:
            time.sleep(0.005)
            continue
        with lease:
            with holders.get_lock():
                holders.value += 1
                if holders.value != 1:
                    overlaps.value += 1
            current = store.committed_offset("orders", 0).offset
            # `current` is the last committed offset; committing one more offset makes the next offset current + 2.
            store.commit_offsets([lease], {0: (current + 2, int(time.time() * 1000))})
            time.sleep(0.02)
            with holders.get_lock():
                holders.value -= 1
        acquisitions.value += 1
        time.sleep(0.005)  # give the other process a chance


def test_two_processes_contending_for_one_lease(tmp_path):
    path = str(tmp_path / "offsets.sqlite")
    LocalOffsetStore(path, key_prefix="processors")
    context = multiprocessing.get_context("spawn")
    holders, overlaps = context.Value("i", 0), context.Value("i", 0)
    acquisitions = [context.Value("i", 0), context.Value("i", 0)]
    start = context.Barrier(3)
    workers = [context.Process(target=_contend, args=(path, f"worker-{i}", start, 2.0, holders, overlaps,
                                                      acquisitions[i]))
               for i in range(2)]
    for worker in workers:
        worker.start()
    start.wait(120)
    for worker in workers:
        worker.join(30)
    assert [worker.exitcode for worker in workers] == [0, 0]
    counts = [count.value for count in acquisitions]
    assert overlaps.value == 0
    assert min(counts) > 0, counts
    # every holder read-modify-wrote the offset under its lease: no update was lost
    assert LocalOffsetStore(path, key_prefix="processors").committed_offset("orders", 0).offset == sum(counts) - 1


def test_an_unopenable_file_raises_naming_it(tmp_path):
    with pytest.raises(OffsetStoreUnavailableError, match=f"sqlite {tmp_path}: cannot open"):
        LocalOffsetStore(tmp_path)  # a directory, not a database file


def test_a_database_locked_too_long_raises_naming_the_file(tmp_path):
    path = tmp_path / "offsets.sqlite"
    store = LocalOffsetStore(path, busy_timeout_seconds=0.2)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OffsetStoreUnavailableError, match=f"sqlite {path}: database is locked"):
            store.acquire_lease("orders", 0, "worker-a")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    store.acquire_lease("orders", 0, "worker-a").release()


def test_directory_of_the_file_is_created(tmp_path):
    path = tmp_path / "state" / "nested" / "offsets.sqlite"
    LocalOffsetStore(path).record_broker_watermark("orders", 0, 5)
    assert Path(path).is_file()
    assert LocalOffsetStore(path).broker_watermarks("orders") == {0: 5}
