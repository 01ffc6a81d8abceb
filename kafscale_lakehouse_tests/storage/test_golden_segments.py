"""The golden fixture segments, uploaded to SeaweedFS under their `s3_key`, are discovered, listed and decoded."""

from __future__ import annotations

import json

from kafscale_lakehouse.format import decode_segment
from kafscale_lakehouse.storage import Discovery, DiscoveryMode, discover_partitions
from kafscale_lakehouse_tests.storage.conftest import make_s3_store


def test_golden_segments_are_discovered_and_decode_to_their_expected_rows(seaweedfs, unique_prefix,
                                                                         fixture_segments_dir):
    fixtures = sorted(path for path in fixture_segments_dir.iterdir() if (path / "fixture.json").is_file())
    assert len(fixtures) >= 7
    for fixture in fixtures:
        meta = json.loads((fixture / "fixture.json").read_text())
        expected = [json.loads(line) for line in (fixture / "expected.jsonl").read_text().splitlines() if line]
        # The pizza fixtures share one key (one per codec): each fixture gets its own namespace.
        namespace = f"{unique_prefix}-{fixture.name}"
        assert meta["s3_key"].startswith("default/"), fixture
        kfs_key = namespace + meta["s3_key"].removeprefix("default")
        index_key = kfs_key.removesuffix(".kfs") + ".index"
        kfs_file = fixture / meta["s3_key"].rsplit("/", 1)[1]
        store = make_s3_store(seaweedfs, namespace)
        store.put(kfs_key, kfs_file.read_bytes())
        store.put(index_key, kfs_file.with_suffix(".index").read_bytes())

        topic, partition = meta["topic"], meta["partition"]
        assert discover_partitions(DiscoveryMode.S3, store) == Discovery(DiscoveryMode.S3, {topic: [partition]})
        listing = store.list_segments(topic, partition)
        assert listing.incomplete == [], fixture.name
        [segment] = listing.segments
        assert (segment.base_offset, segment.last_offset, segment.kfs_key, segment.index_key) == (
            meta["base_offset"], meta["last_offset"], kfs_key, index_key), fixture.name

        decoded = decode_segment(store.read(segment.kfs_key), key=segment.kfs_key, topic=segment.topic,
                                 partition=segment.partition)
        assert decoded.records.num_rows == meta["records"] == len(expected), fixture.name
        assert decoded.records.column("record_id").to_pylist() == [row["record_id"] for row in expected]
        assert decoded.records.column("offset").to_pylist() == [row["offset"] for row in expected]
