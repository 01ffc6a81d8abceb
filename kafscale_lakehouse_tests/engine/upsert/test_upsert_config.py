"""`mappings[].mode: upsert` and `id_columns`: accepted when they key the table, refused naming the key otherwise."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.engine.ingestion.replay import ReplayError, replay_range
from kafscale_lakehouse.offsets.ranges import OffsetRange
from kafscale_lakehouse.orchestration.checks import build_table_checks


def _config(**mapping: object):
    document = {
        "segments": {"local_root": "segments"},
        "offsets": {"backend": "local", "local_path": "offsets.db"},
        "iceberg": {"catalog": {"type": "sql", "uri": "sqlite:///catalog.db"}, "warehouse": "warehouse"},
        "mappings": [{"topic": "stores", "table": "cdc.stores",
                      "schema": {"columns": [{"name": "store_id", "type": "long", "required": True},
                                             {"name": "status", "type": "string"}]},
                      **mapping}],
    }
    return parse_config(document, source="<test>", base_dir="/nonexistent")  # relative paths are only resolved


def test_upsert_mapping_keyed_by_a_required_column_or_the_record_key():
    assert _config(mode="upsert", id_columns=["store_id"], order_column="status").mappings[0].order_column == "status"
    assert _config(mode="upsert", id_columns=["store_id"]).mappings[0].id_columns == ["store_id"]
    assert _config(mode="upsert", id_columns=["key"]).mappings[0].mode == "upsert"
    assert _config().mappings[0].mode == "append"


@pytest.mark.parametrize(("mapping", "key", "words"), [
    ({"mode": "upsert"}, "mappings[0].id_columns", "required for mode upsert"),
    ({"mode": "upsert", "id_columns": ["status"]}, "mappings[0].id_columns[0]", "must be a required column"),
    ({"mode": "upsert", "id_columns": ["nope"]}, "mappings[0].id_columns[0]", "neither a mapped column"),
    ({"mode": "upsert", "id_columns": ["store_id", "store_id"]}, "mappings[0].id_columns[1]", "listed twice"),
    ({"mode": "upsert", "id_columns": ["store_id", "key"]}, "mappings[0].id_columns[1]", "[key] alone"),
    ({"id_columns": ["store_id"]}, "mappings[0].id_columns", "only used with mode upsert"),
    ({"mode": "merge"}, "mappings[0].mode", "upsert"),
    ({"order_column": "status"}, "mappings[0].order_column", "only used with mode upsert"),
    ({"mode": "upsert", "id_columns": ["store_id"], "order_column": "nope"}, "mappings[0].order_column",
     "not a mapped column"),
    ({"mode": "upsert", "id_columns": ["store_id"], "order_column": "store_id"}, "mappings[0].order_column",
     "is an id column"),
])
def test_upsert_config_errors_name_the_key(mapping, key, words):
    with pytest.raises(ConfigError) as caught:
        _config(**mapping)
    assert any(key in problem and words in problem for problem in caught.value.problems), caught.value.problems


def test_cdc_block():
    mapping = _config(mode="upsert", id_columns=["store_id"], cdc={}).mappings[0]
    assert mapping.cdc is not None and mapping.cdc.format == "debezium"
    mapping = _config(mode="upsert", id_columns=["store_id"],
                      cdc={"format": "op_field", "op_field": "action", "delete_ops": ["delete", "purge"]}).mappings[0]
    assert mapping.cdc is not None and mapping.cdc.delete_ops == ["delete", "purge"]
    for mapping, key, words in [
        ({"cdc": {}}, "mappings[0].cdc", "only used with mode upsert"),
        ({"mode": "upsert", "id_columns": ["store_id"], "cdc": {"format": "op_field", "delete_ops": []}},
         "mappings[0].cdc.delete_ops", "at least one"),
        ({"mode": "upsert", "id_columns": ["store_id"], "cdc": {"format": "maxwell"}}, "mappings[0].cdc.format",
         "debezium"),
    ]:
        with pytest.raises(ConfigError) as caught:
            _config(**mapping)
        assert any(key in problem and words in problem for problem in caught.value.problems), caught.value.problems


def test_an_offset_range_is_not_replayed_into_an_upsert_table():
    mapping = _config(mode="upsert", id_columns=["store_id"]).mappings[0]
    # Refused before any connection is used: the rows of an upsert table are not the records of a range.
    with pytest.raises(ReplayError, match=r"cdc.stores is an upsert table .* --to-offset N"):
        replay_range(None, mapping, OffsetRange(0, 0, 10))  # type: ignore[arg-type]


def test_an_upsert_table_checks_id_unique_in_place_of_record_id_unique():
    upsert = _config(mode="upsert", id_columns=["store_id"])
    append = _config()
    names = {c.check_key.name for c in build_table_checks(upsert, upsert.mappings[0])}
    assert names == {"schema_valid", "id_unique", "offsets_contiguous", "freshness", "retention_headroom"}
    assert "record_id_unique" in {c.check_key.name for c in build_table_checks(append, append.mappings[0])}
    [id_unique] = [c for c in build_table_checks(upsert, upsert.mappings[0]) if c.check_key.name == "id_unique"]
    assert id_unique.check_specs_by_output_name and all(s.blocking for s in id_unique.check_specs)
