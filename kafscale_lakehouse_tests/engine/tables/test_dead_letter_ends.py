"""The dead-letter table's ends (`kafscale.dead-letter.ends.<topic>`) and the removal of a move back's dead letters
(engine/tables/dead_letters.py), on both catalogs: a table written before the key is scanned once, the removal keeps
what lies before the move, records the new end, and commits nothing when its check refuses or nothing lies there."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from kafscale_lakehouse.engine.tables.dead_letters import (
    DEAD_LETTER_ARROW_SCHEMA,
    dead_letter_ends,
    open_dead_letter_table,
    remove_dead_letters_from,
)
from kafscale_lakehouse.engine.tables.summary import DEAD_LETTER_ENDS_PROPERTY_PREFIX

TOPIC = "orders"


class RefusedError(Exception):
    pass


def dead_letters(partition: int, offsets: range) -> pa.Table:
    now = datetime.now(UTC)
    return pa.Table.from_pylist([
        {"record_id": f"{TOPIC}:{partition}:{o}", "topic": TOPIC, "partition": partition, "offset": o,
         "timestamp_ms": 0, "value": b"x", "error": "invalid", "schema_path": None, "run_id": "legacy",
         "ingested_at": now} for o in offsets], schema=DEAD_LETTER_ARROW_SCHEMA)


def offsets_of(table, partition: int) -> list[int]:
    table.refresh()
    rows = table.scan(selected_fields=("partition", "offset")).to_arrow().to_pylist()
    return sorted(r["offset"] for r in rows if r["partition"] == partition)


def test_a_move_back_removes_the_dead_letters_from_its_offset_on_and_records_the_new_end(catalog, namespace):
    table = open_dead_letter_table(catalog, f"{namespace}.orders_dead_letters")
    table.append(dead_letters(0, range(10)))  # written before the ends key existed
    table.append(dead_letters(1, range(4)))
    assert dead_letter_ends(table, TOPIC) == {0: 10, 1: 4}, "no key: the topic's offsets are scanned"

    with pytest.raises(RefusedError):
        remove_dead_letters_from(table, TOPIC, 0, 2, run_id="move-1", check=_refuse)
    assert offsets_of(table, 0) == list(range(10)), "a refused check commits nothing"

    snapshot_id = remove_dead_letters_from(table, TOPIC, 0, 6, run_id="move-2", check=lambda: None)

    assert snapshot_id == table.current_snapshot().snapshot_id
    assert offsets_of(table, 0) == list(range(6)) and offsets_of(table, 1) == list(range(4))
    assert table.current_snapshot().summary[DEAD_LETTER_ENDS_PROPERTY_PREFIX + TOPIC] == '{"0":6,"1":4}'
    assert dead_letter_ends(table, TOPIC) == {0: 6, 1: 4}
    before = table.current_snapshot().snapshot_id
    assert remove_dead_letters_from(table, TOPIC, 0, 6, run_id="move-3", check=_refuse) is None, (
        "the recorded end says nothing lies there: no check, no commit")
    assert table.current_snapshot().snapshot_id == before


def _refuse() -> None:
    raise RefusedError("the position moved on")
