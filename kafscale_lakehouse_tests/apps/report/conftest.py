"""A small table with history, as ingest runs leave it, built directly: two commits, dead letters, watermarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from pyiceberg.io.pyarrow import _dataframe_to_data_files

from kafscale_lakehouse.config import LakehouseConfig, load_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.ingestion.rows import DeadLetterFileWriter
from kafscale_lakehouse.engine.ingestion.segment_reader import INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN
from kafscale_lakehouse.engine.tables.appends import commit_append
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table
from kafscale_lakehouse.engine.tables.dead_letters import (
    dead_letter_target,
    open_dead_letter_table,
    publish_dead_letters,
    stage_dead_letters,
)
from kafscale_lakehouse.offsets.local_store import LocalOffsetStore
from kafscale_lakehouse.schema import record_arrow_schema, table_schema
from kafscale_lakehouse.schema.columns import Column

TABLE = "rpt.pizzas"
TOPIC = "report-pizzas"
COLUMNS = (Column(name="order_id", type="string", required=True),)
REGISTRY_PASSWORD = "registry-pass-8d1f"
CATALOG_PASSWORD = "catalog-pass-51ac"
# (schema path, error) of the dead letters of the second commit, at offsets 30, 31, 32 of partition 0.
DEAD_LETTERS = (("#/properties/store_id/type", "$.store_id: 'seven' is not of type 'integer'"),
                ("#/required", "$: 'order_id' is a required property"),
                ("#/properties/store_id/type", "$.store_id: 'nine' is not of type 'integer'"))


@dataclass
class ReportWorld:
    root: Path
    config_path: Path
    config: LakehouseConfig


@pytest.fixture
def report_world(tmp_path) -> ReportWorld:
    (tmp_path / "segments").mkdir()
    document = {
        "segments": {"local_root": "segments"},
        "iceberg": {"catalog": {"type": "sql", "uri": "sqlite:///catalog.db", "username": "owner",
                                "password": CATALOG_PASSWORD},
                    "warehouse": "warehouse"},
        "offsets": {"backend": "local", "local_path": "offsets.db"},
        "schema": {"mode": "lenient",
                   "registry": {"base_url": f"https://reader:{REGISTRY_PASSWORD}@registry.invalid/schemas"}},
        "mappings": [{"topic": TOPIC, "table": TABLE, "create_table_if_missing": True,
                      "schema": {"columns": [asdict(c) for c in COLUMNS]}}],
    }
    config_path = tmp_path / "lakehouse.yaml"
    config_path.write_text(yaml.safe_dump(document))
    config = load_config(config_path)
    catalog = load_catalog(catalog_settings(config))
    table = open_table(catalog, TABLE, schema=table_schema(COLUMNS), create_if_missing=True)
    _commit_rows(table, {0: (0, 30), 1: (0, 20)}, "run-one")
    dead_letters = open_dead_letter_table(catalog, f"{TABLE}_dead_letters")
    staged = _stage_dead_letters(dead_letters, "run-two")
    snapshot_id = _commit_rows(table, {0: (33, 50)}, "run-two", start={0: 30},
                               properties=staged.summary_properties())
    publish_dead_letters(dead_letters, staged, source_snapshot_id=snapshot_id)
    store = LocalOffsetStore(config.offsets.local_path, key_prefix=config.offsets.key_prefix)
    store.record_broker_watermark(TOPIC, 0, 80)
    store.record_broker_watermark(TOPIC, 1, 20)
    store.close()
    return ReportWorld(tmp_path, config_path, config)


def _commit_rows(table, ranges: dict[int, tuple[int, int]], run_id: str, *, start: dict[int, int] | None = None,
                 properties: dict[str, str] | None = None) -> int:
    """Rows for offsets [first, end) per partition, committed with the offsets the way a run commits them."""
    rows = [{"record_id": f"{TOPIC}:{p}:{o}", "topic": TOPIC, "partition": p, "offset": o, "timestamp_ms": o,
             "key": None, "value": b"{}", "headers": "", "order_id": f"o-{p}-{o}"}
            for p, (first, end) in ranges.items() for o in range(first, end)]
    arrow = pa.Table.from_pylist(rows, schema=record_arrow_schema(COLUMNS))
    files = list(_dataframe_to_data_files(table.metadata, arrow, table.io))
    starts = start or {p: first for p, (first, _) in ranges.items()}
    return commit_append(table, files, TOPIC, starts, {p: end for p, (_, end) in ranges.items()}, run_id,
                         snapshot_properties=properties).snapshot_id


def _stage_dead_letters(dead_letters, run_id: str):
    target = dead_letter_target(dead_letters, run_id, target_file_size_bytes=1 << 20)
    writer = DeadLetterFileWriter(target, task_id=0)
    invalid = pa.RecordBatch.from_pylist(
        [{"record_id": f"{TOPIC}:0:{30 + i}", "topic": TOPIC, "partition": 0, "offset": 30 + i, "timestamp_ms": 30 + i,
          "value": f'{{"n": {i}}}'.encode(), INVALID_REASON_COLUMN: error, INVALID_SCHEMA_PATH_COLUMN: path}
         for i, (path, error) in enumerate(DEAD_LETTERS)])
    writer.add(invalid)
    return stage_dead_letters(dead_letters, writer.close(), run_id=run_id, source_table=TABLE, topic=TOPIC,
                              offset_ranges={0: (30, 50)})
