"""How a batch's Spark job packs its segment runs (one per Kafka partition's segments) into Spark tasks: a Spark task
costs more than reading a small segment run, so hundreds of tables' small partitions share a task per engine slot;
large ones spread by bytes. Pure logic: `pack_tasks`."""

from __future__ import annotations

from kafscale_lakehouse.engine.ingestion.spark_job import pack_tasks

MB = 1 << 20


def loads(groups: tuple[tuple[int, ...], ...], sizes: list[int]) -> list[int]:
    return [sum(sizes[t] for t in group) for group in groups]


def test_many_small_runs_share_one_task_per_slot_and_each_runs_once():
    sizes = [40_000 + 1_000 * (t % 7) for t in range(400)]  # 200 tables x 2 partitions, a segment each
    groups = pack_tasks(sizes, slots=2, max_bytes=128 * MB)
    assert len(groups) == 2
    assert sorted(t for group in groups for t in group) == list(range(400))
    assert all(list(group) == sorted(group) for group in groups)
    assert max(loads(groups, sizes)) - min(loads(groups, sizes)) <= max(sizes)


def test_bytes_beyond_the_slots_make_more_tasks_balanced_by_bytes():
    sizes = [100 * MB, 90 * MB, *([10 * MB] * 30)]  # 490 MB: four tasks of at most ~128 MB, not two
    groups = pack_tasks(sizes, slots=2, max_bytes=128 * MB)
    assert len(groups) == 4
    assert sorted(t for group in groups for t in group) == list(range(len(sizes)))
    assert max(loads(groups, sizes)) <= 130 * MB
    assert [group for group in groups if 0 in group] != [group for group in groups if 1 in group]  # big ones apart


def test_fewer_runs_than_slots_each_get_a_task_and_none_is_empty():
    assert pack_tasks([5, 7, 3], slots=8, max_bytes=100) == ((0,), (1,), (2,))
    assert pack_tasks([], slots=2, max_bytes=100) == ()
    assert pack_tasks([500], slots=2, max_bytes=100) == ((0,),)  # a run over the budget is a task of its own
