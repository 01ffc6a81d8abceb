"""The root of the engine's errors: callers above the engine (the CLI, the Dagster definitions) catch `EngineError`.

Each concept keeps its own error classes beside its code (with messages that name the object at fault and the
remedy); they all derive from `EngineError`. Some also derive from the lower layer's error they refine (a lease
not released is an `OffsetStoreError` too) or from `ValueError` where they mean a bad argument, so existing
`except` clauses keep matching.
"""

from __future__ import annotations


class EngineError(RuntimeError):
    """A failure of the engine (catalog, commit, ingestion, maintenance, Spark) that names what is at fault."""
