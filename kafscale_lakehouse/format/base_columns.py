"""The eight base columns of every landed record (docs/kafscale-format.md §8) as an Arrow schema and table builder.

`BASE_SCHEMA` is the one definition of the base columns: their names, order (Iceberg field ids 1-8 in the tables we
create), types and nullability; the schema layer reads its `Column`s from it. `record_id` is
`<topic>:<partition>:<offset>`; `headers` is compact JSON text, `""` when the record has none.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

BASE_SCHEMA = pa.schema([
    pa.field("record_id", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp_ms", pa.int64(), nullable=False),
    pa.field("key", pa.binary(), nullable=True),
    pa.field("value", pa.binary(), nullable=True),
    pa.field("headers", pa.string(), nullable=True),
])


def record_id(topic: str, partition: int, offset: int | str) -> str:
    """The record_id column value: `<topic>:<partition>:<offset>`."""
    return f"{topic}:{partition}:{offset}"


def build_base_table(topic: str, partition: int, *, offsets: pa.Array, timestamps_ms: pa.Array, keys: pa.Array,
                     values: pa.Array, headers: pa.Array) -> pa.Table:
    """A BASE_SCHEMA table from per-record int64 offsets and timestamps, binary keys and values, string headers."""
    row_count = len(offsets)
    record_ids = pc.binary_join_element_wise(record_id(topic, partition, ""), pc.cast(offsets, pa.string()), "")
    return pa.Table.from_arrays([
        record_ids,
        pa.repeat(pa.scalar(topic, pa.string()), row_count),
        pa.repeat(pa.scalar(partition, pa.int32()), row_count),
        offsets,
        timestamps_ms,
        keys,
        values,
        headers,
    ], schema=BASE_SCHEMA)
