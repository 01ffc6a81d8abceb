"""The engine: everything Spark and Iceberg, no Dagster. Rooms by concept (docs/architecture.md):

- `tables/`: pyiceberg only (catalogs, snapshot summaries, the commit machinery, appends and rewrites that carry
  offsets forward, the executor-side Parquet writer, run directories, dead letters, filters, the checks' logic);
- `spark/`: sessions, the long-lived engine, table reads and writes for downstream assets, the rewrite job;
- `ingestion/`: a run (positions, planning, the Spark job and its executor-side reading, the commit), topic scans,
  replay and position moves;
- `maintenance.py`: expiry, compaction, manifest rewrite, orphan removal.

Every error the engine raises derives from `EngineError`.
"""

from kafscale_lakehouse.engine.errors import EngineError

__all__ = ["EngineError"]
