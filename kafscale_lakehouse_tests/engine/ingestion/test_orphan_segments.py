"""Orphaned segment objects (today's KafScale broker): the broker uploads `.kfs` and `.index` in parallel,
so a failed upload leaves one without the other and the records are gone from the broker. Within
`processor.orphan_segment_grace_seconds` the partition waits (the upload may still complete); after it, the run, the
sensor's scan and `offsets show` name the object and the offsets it should hold, the other partitions land, and
`offsets skip` records the skipped range in the table and moves the partition past it, in one snapshot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kafscale_lakehouse.engine.ingestion import WatchSources, scan_topic
from kafscale_lakehouse.engine.ingestion.run import IngestFailedError, ingest
from kafscale_lakehouse.engine.tables.summary import SKIPPED_PROPERTY_PREFIX, read_topic_offsets
from kafscale_lakehouse.format import build_index_entries, decode_segment, encode_index
from kafscale_lakehouse.storage import ObjectKind
from kafscale_lakehouse_tests.support.servers import S3_BUCKET


def lose_object(world, partition: int, base_offset: int, kind: ObjectKind) -> str:
    """The broker's upload of one object of a segment failed: the other object stays, its records are lost."""
    key = world.segment_object_key(partition, base_offset, kind)
    world.seaweedfs.s3_client().delete_object(Bucket=S3_BUCKET, Key=key)
    world.segments[partition].pop(base_offset)
    return world.segment_object_key(partition, base_offset,
                                    ObjectKind.SEGMENT if kind is ObjectKind.INDEX else ObjectKind.INDEX)


@contextmanager
def watch_sources(config) -> Iterator[WatchSources]:
    """What the sensor scans with, closed afterwards."""
    sources = WatchSources.from_config(config)
    try:
        yield sources
    finally:
        sources.offsets.close()
        if sources.etcd is not None:
            sources.etcd.close()


def skipped_in_table(world) -> list[dict]:
    key = SKIPPED_PROPERTY_PREFIX + world.topic
    return [json.loads(s.summary[key]) for s in world.table().metadata.snapshots
            if s.summary is not None and key in s.summary.additional_properties]


def test_an_orphan_kfs_stops_its_partition_after_the_grace_then_is_skipped_and_recorded(production_world, spark,
                                                                                          cli_main, capsys):
    world = production_world
    world.write_segments(0, 160, records_per_segment=40)  # segments 0, 40, 80, 120
    world.write_segments(1, 40, records_per_segment=40)
    orphan = lose_object(world, 0, 80, ObjectKind.INDEX)  # offsets 80..119: a .kfs without its .index

    # Within the grace period the upload may still complete: the partition lands up to it and waits, no error.
    [result] = ingest(world.config(), spark)
    assert result.partitions[0].end_offset == 80 and result.partitions[0].error is None
    world.assert_exactly_once(runs=1, expected={0: range(80), 1: range(40)})
    with watch_sources(world.config()) as sources:
        assert scan_topic(sources, world.topic).partitions[0].error is None

    # After it: the partition fails naming the object and its offsets; partition 1 lands its new segment.
    world.write_segments(1, 40, base_offset=40, records_per_segment=40)
    config = world.config(orphan_segment_grace_seconds=0)
    with pytest.raises(IngestFailedError) as failed:
        ingest(config, spark)
    outcomes = failed.value.result.partitions
    assert orphan in outcomes[0].error and "offsets 80..119" in outcomes[0].error
    assert f"offsets skip --topic {world.topic} --partition 0 --segment {orphan} --yes" in outcomes[0].error
    assert outcomes[1].error is None and outcomes[1].records == 40
    world.assert_exactly_once(runs=2, expected={0: range(80), 1: range(80)})

    # The sensor's scan says the same (with and without a listing cursor).
    with watch_sources(config) as sources:
        scan = scan_topic(sources, world.topic)
        assert orphan in scan.partitions[0].error and scan.partitions[1].error is None
        assert orphan in scan_topic(sources, world.topic, scan.cursors).partitions[0].error

    config_path = world.write_config_file(orphan_segment_grace_seconds=0)
    capsys.readouterr()
    assert cli_main("offsets", "show", "--config", str(config_path), "--topic", world.topic) == 0
    shown = capsys.readouterr().out
    assert f"STALLED partition 0: topic {world.topic} partition 0 stops at {orphan}" in shown
    assert "STALLED partition 1" not in shown

    skip = ("offsets", "skip", "--config", str(config_path), "--topic", world.topic, "--partition", "0",
            "--segment", orphan)
    assert cli_main(*skip) == 1, "without --yes nothing is skipped"
    assert "would skip: topic" in capsys.readouterr().out and skipped_in_table(world) == []
    assert cli_main(*skip, "--yes") == 0
    assert "offsets 80..119 are skipped" in capsys.readouterr().out
    assert skipped_in_table(world) == [{"0": [80, 120]}]
    assert read_topic_offsets(world.table(), world.topic) == {0: 120, 1: 80}

    [result] = ingest(config, spark)  # the partition goes on after the skipped range
    assert result.partitions[0].records == 40
    # Every record of the segments exactly once, offsets 80..119 recorded as skipped and nowhere else.
    world.assert_exactly_once(runs=4, expected={0: [*range(80), *range(120, 160)], 1: range(80)})


def test_an_orphan_index_with_nothing_committed_names_its_offsets_and_its_skip_is_recorded(production_world, spark,
                                                                                           cli_main, capsys):
    world = production_world
    world.write_segments(0, 80, records_per_segment=40)  # segments 0, 40
    world.write_segments(1, 40, records_per_segment=40)
    orphan = lose_object(world, 0, 0, ObjectKind.SEGMENT)  # offsets 0..39: an .index without its .kfs
    config_path = world.write_config_file(orphan_segment_grace_seconds=0)

    with pytest.raises(IngestFailedError) as failed:
        ingest(world.config(orphan_segment_grace_seconds=0), spark)
    error = failed.value.result.partitions[0].error
    assert orphan in error and "orphan .index" in error and "offsets 0..39" in error
    world.assert_exactly_once(runs=1, expected={1: range(40)})

    capsys.readouterr()
    assert cli_main("offsets", "show", "--config", str(config_path), "--topic", world.topic) == 0
    assert f"STALLED partition 0: topic {world.topic} partition 0 stops at {orphan}" in capsys.readouterr().out, (
        "listed although nothing of it is committed")
    wrong = world.segment_object_key(0, 40)
    assert cli_main("offsets", "skip", "--config", str(config_path), "--topic", world.topic, "--partition", "0",
                    "--segment", wrong, "--yes") == 2, "only the segment the partition waits behind is skipped"
    assert f"does not wait behind {wrong}" in capsys.readouterr().err
    assert cli_main("offsets", "skip", "--config", str(config_path), "--topic", world.topic, "--partition", "0",
                    "--segment", orphan, "--yes") == 0
    assert skipped_in_table(world) == [{"0": [0, 40]}], "recorded although nothing was committed before"

    [result] = ingest(world.config(orphan_segment_grace_seconds=0), spark)
    assert result.partitions[0].records == 40
    world.assert_exactly_once(runs=3, expected={0: range(40, 80), 1: range(40)})


def test_an_orphan_kfs_is_finished_so_an_index_rebuilt_from_it_lands_its_records(production_world, spark):
    """What the error suggests for an orphan `.kfs` with a valid footer: nothing needs to be skipped."""
    world = production_world
    world.write_segments(0, 120, records_per_segment=40)  # segments 0, 40, 80
    orphan = lose_object(world, 0, 40, ObjectKind.INDEX)
    with pytest.raises(IngestFailedError, match=r"its \.kfs is finished, so an \.index rebuilt from it lands them"):
        ingest(world.config(orphan_segment_grace_seconds=0), spark)

    s3 = world.seaweedfs.s3_client()
    kfs = s3.get_object(Bucket=S3_BUCKET, Key=orphan)["Body"].read()
    batches = decode_segment(kfs, key=orphan, topic=world.topic, partition=0).batches
    index = encode_index(build_index_entries([(b.base_offset, b.position, b.record_count) for b in batches]))
    s3.put_object(Bucket=S3_BUCKET, Key=world.segment_object_key(0, 40, ObjectKind.INDEX), Body=index)
    [result] = ingest(world.config(orphan_segment_grace_seconds=0), spark)
    assert result.partitions[0].records == 80 and skipped_in_table(world) == []
    world.assert_exactly_once(runs=2, expected={0: range(120)})
