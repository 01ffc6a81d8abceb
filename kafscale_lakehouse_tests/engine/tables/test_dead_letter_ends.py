"""The dead-letter table's ends (`kafscale.dead-letter.ends.<topic>`, engine/tables/dead_letters.py) on both
catalogs: a table written before the key is scanned once, and a publication replaces the dead letters it already
holds of the offsets it covers (read again after a move back or a rollback), in one commit, other partitions kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from kafscale_lakehouse.engine.tables.dead_letters import (
    DEAD_LETTER_ARROW_SCHEMA,
    dead_letter_ends,
    dead_letter_target,
    open_dead_letter_table,
    publish_dead_letters,
    stage_dead_letters,
)
from kafscale_lakehouse.engine.tables.summary import DEAD_LETTER_ENDS_PROPERTY_PREFIX
from kafscale_lakehouse_tests.validation_modes.faults import FAULTS, SEGMENT_RECORDS
from kafscale_lakehouse_tests.validation_modes.test_dead_letter_table import TOPIC, read_source_batches, split


def published_before_the_key(partition: int, offsets: list[int]) -> pa.Table:
    now = datetime.now(UTC)
    return pa.Table.from_pylist([
        {"record_id": f"{TOPIC}:{partition}:{o}", "topic": TOPIC, "partition": partition, "offset": o,
         "timestamp_ms": 0, "value": b"x", "error": "invalid", "schema_path": None, "run_id": "earlier",
         "ingested_at": now} for o in offsets], schema=DEAD_LETTER_ARROW_SCHEMA)


def test_a_publication_replaces_the_dead_letters_of_its_offsets_in_a_table_written_before_the_ends_key(
        catalog, namespace, tmp_path):
    dead_letters = open_dead_letter_table(catalog, f"{namespace}.pizzas_dead_letters")
    dead_letters.append(published_before_the_key(0, sorted(FAULTS)))
    dead_letters.append(published_before_the_key(1, [0, 1, 2]))
    assert dead_letter_ends(dead_letters, TOPIC) == {0: max(FAULTS) + 1, 1: 3}, "no key: scanned"
    splitter, _ = split(read_source_batches(tmp_path),
                        dead_letter_target(dead_letters, "run-again", target_file_size_bytes=1 << 20))
    staged = stage_dead_letters(dead_letters, splitter.stats.dead_letter_files, run_id="run-again",
                                source_table=f"{namespace}.pizzas", topic=TOPIC,
                                offset_ranges={0: (0, SEGMENT_RECORDS)})

    published = publish_dead_letters(dead_letters, staged, source_snapshot_id=1)

    dead_letters.refresh()
    rows = dead_letters.scan().to_arrow().to_pylist()
    assert sorted((r["partition"], r["offset"], r["run_id"]) for r in rows) == [
        *((0, o, "run-again") for o in sorted(FAULTS)), *((1, o, "earlier") for o in (0, 1, 2))]
    assert dead_letters.current_snapshot().snapshot_id == published
    assert dead_letters.current_snapshot().summary[DEAD_LETTER_ENDS_PROPERTY_PREFIX + TOPIC] == (
        f'{{"0":{SEGMENT_RECORDS},"1":3}}')
    assert publish_dead_letters(dead_letters, staged, source_snapshot_id=1) == published, "published once"
    assert len(dead_letters.scan().to_arrow()) == len(rows)
