"""Null lists of structs survive pyiceberg's projection to a table schema, on write (commits.to_requested_schema) and
on read (scans, compaction): pyiceberg 0.12 turns them into empty lists, so a tombstone's null line-item list would
land, or read back, as [] (commits._NullListPreservingProjection)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, ListType, MapType, NestedField, StringType, StructType

from kafscale_lakehouse.engine.tables.commits import to_requested_schema
from kafscale_lakehouse.engine.tables.data_files import _PARQUET

SCHEMA = Schema(
    NestedField(1, "lines", ListType(2, StructType(NestedField(3, "qty", IntegerType())), element_required=True)),
    NestedField(4, "attributes", MapType(5, StringType(), 6, StringType())),
    NestedField(7, "order", StructType(NestedField(8, "lines", ListType(9, StructType(NestedField(10, "sku",
                                                                                                 StringType())))))),
)
ROWS = [
    {"lines": [{"qty": 1}], "attributes": {}, "order": None},
    {"lines": None, "attributes": None, "order": {"lines": None}},
    {"lines": [], "attributes": {"a": "b"}, "order": {"lines": [{"sku": "x"}]}},
]


def test_null_lists_of_structs_stay_null_at_any_depth_and_in_slices() -> None:
    batch = pa.RecordBatch.from_pylist(ROWS, schema=schema_to_pyarrow(SCHEMA))
    for start, rows in ((0, ROWS), (1, ROWS[1:])):
        part = batch.slice(start)
        file_schema = pyarrow_to_schema(part.schema, name_mapping=SCHEMA.name_mapping, format_version=2)
        projected = to_requested_schema(requested_schema=SCHEMA, file_schema=file_schema, batch=part,
                                        include_field_ids=True, format_model=_PARQUET)
        got = projected.to_pylist()
        assert [r["lines"] for r in got] == [r["lines"] for r in rows]
        assert [r["order"] for r in got] == [r["order"] for r in rows]
        assert [r["attributes"] is None for r in got] == [r["attributes"] is None for r in rows]


def test_null_lists_of_structs_read_back_null(tmp_path) -> None:
    """pyiceberg's reader projects with the same visitor: a file holding a null list of structs scans as null."""
    catalog = SqlCatalog("nested", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("n")
    table = catalog.create_table("n.orders", SCHEMA)
    path = tmp_path / "orders.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS, schema=schema_to_pyarrow(table.schema())), path)
    table.add_files([f"file://{path}"])
    got = table.scan().to_arrow().to_pylist()
    assert [r["lines"] for r in got] == [r["lines"] for r in ROWS]
    assert [r["order"] for r in got] == [r["order"] for r in ROWS]
