"""A commit that lands but is answered with an error (a proxy that retries the POST, a 502 after the commit) is
found in the table before anything is deleted: the run succeeds once, its files stay referenced."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.engine.tables import catalogs
from kafscale_lakehouse.engine.tables.appends import TableChangedDuringRunError, commit_append
from kafscale_lakehouse.engine.tables.catalogs import CatalogUnavailableError, load_catalog, open_table
from kafscale_lakehouse.engine.tables.summary import COMMIT_ID_PROPERTY, read_topic_offsets
from kafscale_lakehouse_tests.engine.tables.catalog_proxy import CommitProxy
from kafscale_lakehouse_tests.engine.tables.helpers import lakehouse_schema, rest_settings, start_end, write_batch

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["retry", "502"])
def test_commit_answered_with_an_error_after_it_landed_is_kept(spark, seaweedfs, namespace, mode):
    with CommitProxy(seaweedfs.rest_uri, mode) as proxy:
        catalog = load_catalog(rest_settings(seaweedfs, uri=proxy.uri))
        table = open_table(catalog, f"{namespace}.uncertain_{mode}", schema=lakehouse_schema(),
                           create_if_missing=True)
        ranges = {0: (0, 20), 1: (0, 10)}
        files = write_batch(table, "t", ranges, f"run-{mode}")

        result = commit_append(table, files, "t", *start_end(ranges), f"run-{mode}")

    assert proxy.commits_forwarded == (2 if mode == "retry" else 1)
    fresh = load_catalog(rest_settings(seaweedfs)).load_table(table.name())
    ours = [s for s in fresh.snapshots() if s.summary.get(COMMIT_ID_PROPERTY)]
    assert [s.snapshot_id for s in ours] == [result.snapshot_id], "exactly one snapshot of ours"
    assert read_topic_offsets(fresh, "t") == {0: 20, 1: 10}
    assert all(fresh.io.new_input(f.file_path).exists() for f in files), "the landed commit's files are kept"
    record_ids = fresh.scan(selected_fields=("record_id",)).to_arrow().column("record_id").to_pylist()
    assert sorted(record_ids) == sorted(f"t:{p}:{o}" for p, (s, e) in ranges.items() for o in range(s, e))


def test_a_partition_spec_changed_during_the_run_is_refused_before_the_commit(spark, rest_catalog, namespace):
    table = open_table(rest_catalog, f"{namespace}.spec_change", schema=lakehouse_schema(), create_if_missing=True)
    commit_append(table, [], "t", {0: 0}, {0: 5}, "run-before")
    files = write_batch(table, "t", {0: (5, 25)}, "run-spec")
    # An operator partitions the table while the run's Spark job writes.
    operator = rest_catalog.load_table(table.name())
    with operator.update_spec() as update:
        update.add_identity("partition")

    with pytest.raises(TableChangedDuringRunError, match="partition spec changed to spec 1"):
        commit_append(table, files, "t", {0: 5}, {0: 25}, "run-spec")

    table.refresh()
    assert read_topic_offsets(table, "t") == {0: 5}, "the offsets did not move: the next run reads them again"
    assert not any(table.io.new_input(f.file_path).exists() for f in files)


@pytest.mark.parametrize("mode", ["load-500", "create-500"])
def test_a_table_load_or_creation_answered_with_a_server_error_is_tried_again(seaweedfs, namespace, monkeypatch,
                                                                            mode):
    """A REST catalog under load answers a few requests with a 5xx (SeaweedFS's, while a land_tables batch created 50
    tables at once): loading and creating a table are safe to repeat, so they are tried again, and a creation the
    server made before failing its answer is found, not made twice."""
    monkeypatch.setattr(catalogs, "CATALOG_SERVER_ERROR_PAUSES_SECONDS", (0.0, 0.0), raising=False)
    with CommitProxy(seaweedfs.rest_uri, mode, misbehave_commits=2 if mode == "load-500" else 1) as proxy:
        catalog = load_catalog(rest_settings(seaweedfs, uri=proxy.uri))
        table = open_table(catalog, f"{namespace}.busy_{mode.replace('-', '_')}", schema=lakehouse_schema(),
                           create_if_missing=True)
        assert proxy.remaining == 0

    fresh = load_catalog(rest_settings(seaweedfs)).load_table(table.name())
    assert fresh.metadata.table_uuid == table.metadata.table_uuid


def test_a_catalog_that_keeps_failing_a_table_load_is_named(seaweedfs, namespace, monkeypatch):
    monkeypatch.setattr(catalogs, "CATALOG_SERVER_ERROR_PAUSES_SECONDS", (0.0, 0.0), raising=False)
    with CommitProxy(seaweedfs.rest_uri, "load-500", misbehave_commits=10) as proxy:
        catalog = load_catalog(rest_settings(seaweedfs, uri=proxy.uri))
        with pytest.raises(CatalogUnavailableError, match=f"Iceberg catalog at {proxy.uri} answered ServerError"):
            open_table(catalog, f"{namespace}.down", schema=lakehouse_schema(), create_if_missing=True)
        assert proxy.remaining == 10 - getattr(catalogs, "CATALOG_SERVER_ERROR_ATTEMPTS", 1)
