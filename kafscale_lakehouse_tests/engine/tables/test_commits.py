"""engine/tables/commits.py is the one module on pyiceberg's private API: this pins the pyiceberg version it was
written against and checks each private name it uses still is what the module assumes. A pyiceberg upgrade fails
here first, naming what to re-check, instead of deep inside a commit."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pyarrow as pa
from pyiceberg.expressions import EqualTo
from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _determine_partitions, _to_requested_schema
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction
from pyiceberg.table.update import _apply_table_update, _TableMetadataUpdateContext
from pyiceberg.table.update.snapshot import _SnapshotProducer
from pyiceberg.types import LongType, NestedField, StringType

from kafscale_lakehouse.engine.tables import commits

PYICEBERG_LINE = "0.12."


def test_pyiceberg_is_the_release_line_the_commit_machinery_was_written_for():
    assert version("pyiceberg").startswith(PYICEBERG_LINE), (
        "pyiceberg changed: re-check every private name in engine/tables/commits.py (and this test) against the "
        "new release line, then update PYICEBERG_LINE and the range in pyproject.toml")


def test_the_private_names_the_commit_machinery_relies_on_exist_with_their_shapes():
    # HistoryIndependentTransaction replays the staged updates as pyiceberg does.
    assert list(inspect.signature(_apply_table_update).parameters)[:3] == ["update", "base_metadata", "context"]
    assert callable(_TableMetadataUpdateContext().has_changes)
    assert hasattr(Transaction, "_updates") or "_updates" in inspect.getsource(Transaction.__init__)
    # commit_settled defers the clean-up of a refused commit's manifests until its outcome is known.
    assert callable(_SnapshotProducer._clean_all_uncommitted)
    assert "_snapshot_producers" in inspect.getsource(Transaction)
    assert "_snapshot_id" in inspect.getsource(_SnapshotProducer.__init__)
    # expire_planned_snapshots stages a requirement on main next to pyiceberg's own expiry.
    assert list(inspect.signature(Transaction._apply).parameters)[1:3] == ["updates", "requirements"]
    # The executor-side writer does what pyiceberg's append does to a batch.
    assert commits.check_pyarrow_schema_compatible is _check_pyarrow_schema_compatible
    assert commits.determine_partitions is _determine_partitions
    assert commits.to_requested_schema is _to_requested_schema


def test_the_wrapped_private_helpers_still_answer_as_the_callers_expect():
    schema = Schema(NestedField(1, "topic", StringType(), required=False),
                    NestedField(2, "offset", LongType(), required=False))
    converted = commits.arrow_schema_as_iceberg(pa.schema([("topic", pa.string()), ("offset", pa.int64())]))
    assert [f.name for f in converted.fields] == ["topic", "offset"]
    must_match = commits.rows_must_match(schema, EqualTo("topic", "pizzas"))
    assert callable(must_match)
