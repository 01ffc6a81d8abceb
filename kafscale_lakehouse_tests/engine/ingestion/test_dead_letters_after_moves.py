"""Dead letters stay exactly once when offsets are read again: after a position moved back
(`offsets reset --to-offset`, engine/ingestion/replay.py), after an operator rolled the table back (also past a move
back), and when the records read again are valid now. A publication replaces the dead letters of the offsets it covers
(engine/tables/dead_letters.py); until then those of offsets beyond the table's position stay."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.apps.workload import pizza_orders
from kafscale_lakehouse.engine.ingestion.replay import move_position
from kafscale_lakehouse.engine.ingestion.run import IngestContext
from kafscale_lakehouse.engine.tables.summary import read_topic_offsets
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld
from kafscale_lakehouse_tests.validation_modes.conftest import registry  # noqa: F401 (the fixture)
from kafscale_lakehouse_tests.validation_modes.faults import (
    FAULTS,
    SEGMENT_RECORDS,
    records_with_faults,
    serve_schema,
)
from kafscale_lakehouse_tests.validation_modes.test_ingest_modes import (
    dead_letter_offsets,
    dead_letter_table,
    run,
    validated_config,
)

pytestmark = pytest.mark.integration

# Mode off with a configured dead-letter table: the harness' required order_id makes positions 5 and 8 invalid.
INVALID_POSITIONS = sorted(p for p, f in FAULTS.items() if f.coercion_reason)
SEGMENTS = 3
INVALID = [base + p for base in range(0, SEGMENTS * SEGMENT_RECORDS, SEGMENT_RECORDS) for p in INVALID_POSITIONS]
VALID = sorted(set(range(SEGMENTS * SEGMENT_RECORDS)) - set(INVALID))


def faulty_world(world: IngestWorld, segments: int = SEGMENTS):
    for base in range(0, segments * SEGMENT_RECORDS, SEGMENT_RECORDS):
        world.write_records(0, base, records_with_faults(base))
    name = f"{world.table_name}_rejects"
    return validated_config(world, None, "off", dead_letter_table=name), name


def move(world: IngestWorld, config, spark, next_offset: int):
    with IngestContext.from_config(config, spark) as context:
        return move_position(context, config.mappings[0], 0, next_offset)


@pytest.mark.parametrize("world_kind", ["embedded", "production"])
def test_a_position_moved_back_lands_its_dead_letters_again_once(request, world_kind, spark):
    world: IngestWorld = request.getfixturevalue(f"{world_kind}_world")
    config, name = faulty_world(world)
    run(world, config, spark)
    assert dead_letter_offsets(dead_letter_table(world, name)) == INVALID

    moved = move(world, config, spark, 22)

    assert (moved.before, moved.after) == (60, 22)
    assert dead_letter_offsets(dead_letter_table(world, name)) == INVALID, "kept until their offsets land again"
    again = run(world, config, spark)
    assert not again.failed and again.invalid_count == len([o for o in INVALID if o >= 22])
    world.assert_exactly_once(runs=3, expected={0: VALID})
    assert dead_letter_offsets(dead_letter_table(world, name)) == INVALID, "each dead letter once"


def test_a_table_rolled_back_by_an_operator_lands_its_dead_letters_again_once(embedded_world, spark):
    world = embedded_world
    config, name = faulty_world(world, segments=1)
    run(world, config, spark)
    first = world.table().current_snapshot().snapshot_id
    for base in range(SEGMENT_RECORDS, SEGMENTS * SEGMENT_RECORDS, SEGMENT_RECORDS):
        world.write_records(0, base, records_with_faults(base))
    run(world, config, spark)
    assert dead_letter_offsets(dead_letter_table(world, name)) == INVALID

    table = world.table()
    table.manage_snapshots().rollback_to_snapshot(first).commit()  # the operator's, not ours
    assert read_topic_offsets(world.table(), world.topic) == {0: SEGMENT_RECORDS}
    again = run(world, config, spark)

    assert not again.failed and again.records == len([o for o in VALID if o >= SEGMENT_RECORDS])
    assert dead_letter_offsets(dead_letter_table(world, name)) == INVALID, (
        "the dead letters beyond the table's offsets are replaced when those offsets land again, never doubled")


def test_a_table_rolled_back_past_a_move_back_keeps_every_dead_letter_once(embedded_world, spark):
    """Why a move back leaves the dead letters of the offsets it moved back over in place: the operator may roll the
    table back past the move, bringing those rows back, and the dead-letter table must still hold their dead
    letters."""
    world = embedded_world
    config, name = faulty_world(world)
    run(world, config, spark)
    moved = move(world, config, spark, 22)

    table = world.table()
    table.manage_snapshots().rollback_to_snapshot(table.snapshot_by_id(moved.snapshot_id).parent_snapshot_id).commit()
    again = run(world, config, spark)

    assert not again.failed and again.records == 0
    world.assert_exactly_once(runs=2, expected={0: VALID})  # the first run, and the move (rolled back)
    assert dead_letter_offsets(dead_letter_table(world, name)) == INVALID, "every dead letter still there, once"


def test_dead_letters_of_offsets_valid_when_landed_again_leave_the_dead_letter_table(embedded_world, registry,  # noqa: F811
                                                                                     spark):
    """Rolled back, then the topic's schema fixed: the records landed again are valid and land in the table, so
    their dead letters go (a publication of no file replaces them), else each would be in both tables."""
    world = embedded_world
    serve_schema(registry, world.topic)
    world.write_records(0, 0, records_with_faults(0))
    config = validated_config(world, registry.base_url, "lenient")
    run(world, config, spark)
    first = world.table().current_snapshot().snapshot_id
    plain = pizza_orders(SEGMENT_RECORDS, SEGMENT_RECORDS, partition=0)
    schema_faults_only = [plain[i] if FAULTS.get(i) and FAULTS[i].coercion_reason else r
                          for i, r in enumerate(records_with_faults(SEGMENT_RECORDS))]
    world.write_records(0, SEGMENT_RECORDS, schema_faults_only)
    run(world, config, spark)
    schema_invalid = [SEGMENT_RECORDS + p for p, f in sorted(FAULTS.items()) if not f.coercion_reason]
    assert dead_letter_offsets(dead_letter_table(world)) == sorted(FAULTS) + schema_invalid

    world.table().manage_snapshots().rollback_to_snapshot(first).commit()
    serve_schema(registry, world.topic, {"type": "object"})  # the schema fixed
    again = run(world, config, spark)

    assert not again.failed and again.invalid_count == 0 and again.records == SEGMENT_RECORDS
    assert dead_letter_offsets(dead_letter_table(world)) == sorted(FAULTS)
    assert {o for _, _, o in world.table_rows()} >= set(schema_invalid)
