"""Dagster's sqlite instance storage (the default of `dagster dev` and `make demo`) with its connections kept open.

Dagster's sqlite run, event-log and schedule storages create a SQLAlchemy engine and open a new sqlite connection for
every read and write (`NullPool`), and closing the last connection of a database file checkpoints its write-ahead log:
~11 ms of CPU per event written (benchmarks/README.md). A `land_tables` run writes ~6 events per table it lands and
the namespace watch an observation per topic, so at hundreds of topics that is a large part of the run's and the
daemon's CPU. `KeptConnectionsSqliteStorage` is `storage: sqlite` with one engine per database file and the
connections of the event log's index, the runs and the schedules kept open (4-5 ms per event): the same files,
schema, migrations and config (`base_dir`), so an instance directory moves between the two freely. Sqlite's
write-ahead log (Dagster creates every file in WAL mode) lets the daemon, the webserver, the code server and the runs
read and write the same files beside each other's open connections, as before. A deployment of hundreds of topics in
production uses Postgres (README).

An opt-in for one host landing hundreds of topics (docs/operations-one-host.md, with its measured gain):
`kafscale-lakehouse dagster-home DIR --kept-connections` adds it to the dagster.yaml of a DAGSTER_HOME. It needs
DAGSTER_HOME (or `base_dir`), which `dagster dev` and `dg` run in a folder without one do not have (they make a
temporary instance from the folder's dagster.yaml).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dagster import DagsterInvalidConfigError, Field, StringSource
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool, StaticPool

# Run shards' engines a process keeps (the event log has one file per run): a run writes its own and the index; the
# webserver and the daemon read a few at a time. The least recently used one is dropped beyond this.
MAX_OPEN_SHARDS = 16


def _engine(conn_string: str, *, single_connection: bool) -> Engine:
    # check_same_thread: the pool hands a connection to whichever thread checks it out (one at a time).
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False}
    if single_connection:
        return create_engine(conn_string, poolclass=StaticPool, connect_args=connect_args)
    # SQLAlchemy's QueuePool: a connection per thread at a time, 5 kept; no bound beyond (NullPool had none): a busy
    # webserver's threads never wait for one.
    return create_engine(conn_string, connect_args=connect_args, pool_size=5, max_overflow=-1)


class _ProcessEngine:
    """One engine for a database file, made again in a forked child (a sqlite connection must not cross a fork)."""

    def __init__(self, conn_string: str) -> None:
        self._conn_string = conn_string
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._pid = 0

    def get(self) -> Engine:
        with self._lock:
            if self._engine is None or self._pid != os.getpid():
                self._engine, self._pid = _engine(self._conn_string, single_connection=False), os.getpid()
            return self._engine

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None and self._pid == os.getpid():
                self._engine.dispose()
            self._engine = None

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.get().connect() as conn, conn.begin():
            yield conn


class _KeptConnections:
    """`connect` and `dispose` of a one-file sqlite storage (runs, schedules) through its kept engine."""

    _kept: _ProcessEngine

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._kept.transaction() as conn:
            yield conn

    def dispose(self) -> None:
        self._kept.dispose()
        super().dispose()  # type: ignore[misc]  # the Dagster storage after this class in the MRO


class KeptConnectionsRunStorage(_KeptConnections, SqliteRunStorage):
    """`SqliteRunStorage` whose `connect` reuses the file's engine and pooled connections."""

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None) -> None:
        super().__init__(conn_string, inst_data)
        self._kept = _ProcessEngine(conn_string)


class KeptConnectionsScheduleStorage(_KeptConnections, SqliteScheduleStorage):
    """`SqliteScheduleStorage` whose `connect` reuses the file's engine and pooled connections."""

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None) -> None:
        super().__init__(conn_string, inst_data)
        self._kept = _ProcessEngine(conn_string)


class KeptConnectionsEventLogStorage(SqliteEventLogStorage):
    """`SqliteEventLogStorage` that keeps an engine per shard and the index shard's connection open.

    Dagster's `_db_lock` already lets one thread at a time use a connection of this storage, so the index's engine
    holds a single connection (`StaticPool`). A run's own shard is still connected per use: closing its connection
    checkpoints the write-ahead log into `<run_id>.db`, the file whose changes the webserver watches to show a run's
    events live (`SqliteEventLogStorageWatchdog`); a kept connection would hold them in the `-wal` file until the run
    ends. The index takes two thirds of the connections (an asset event's mirror and tags, a check's execution row)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        # Set before Dagster's constructor, which already connects (a new index's migrations).
        self._engines: OrderedDict[str, Engine] = OrderedDict()  # shard → engine, least recently used first
        self._engines_pid = os.getpid()
        self._tables: set[str] = set()  # tables has_table found: Dagster asks before every check evaluation
        super().__init__(base_dir, inst_data=inst_data)

    def _shard_engine(self, shard: str) -> Engine:
        """The shard's engine, created (and the shard's file initialized) on first use; under `_db_lock`."""
        if self._engines_pid != os.getpid():
            self._engines, self._engines_pid = OrderedDict(), os.getpid()  # the parent's connections stay its own
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        conn_string = self.conn_string_for_shard(shard)
        engine = (_engine(conn_string, single_connection=True) if shard == INDEX_SHARD_NAME
                  else create_engine(conn_string, poolclass=NullPool,
                                     connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}))
        if shard not in self._initialized_dbs:
            self._initdb(engine)
            self._initialized_dbs.add(shard)
        self._engines[shard] = engine
        while len(self._engines) > MAX_OPEN_SHARDS:
            _, evicted = self._engines.popitem(last=False)
            evicted.dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._shard_engine(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def has_table(self, table_name: str) -> bool:
        if table_name in self._tables:
            return True
        found = super().has_table(table_name)
        if found:
            self._tables.add(table_name)
        return found

    def _dispose_engines(self) -> None:
        with self._db_lock:
            engines = list(self._engines.values()) if self._engines_pid == os.getpid() else []
            self._engines = OrderedDict()
        for engine in engines:
            engine.dispose()

    def wipe(self) -> None:
        self._dispose_engines()  # wipe deletes the run shards' files: no connection may stay on them
        super().wipe()

    def upgrade(self) -> None:
        self._dispose_engines()
        super().upgrade()
        self._dispose_engines()  # upgrade forgets which shards it initialized: each is checked again on next use

    def dispose(self) -> None:
        self._dispose_engines()
        super().dispose()


class KeptConnectionsSqliteStorage(DagsterSqliteStorage):
    """`storage: sqlite` (the same layout under `base_dir`) with the kept-connection storages above. In dagster.yaml:

        storage:
          custom:
            module: kafscale_lakehouse.orchestration.sqlite_storage
            class: KeptConnectionsSqliteStorage

    `base_dir` defaults to `$DAGSTER_HOME`, where `storage: sqlite` keeps its files."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        self.base_dir = base_dir
        self._run_storage = KeptConnectionsRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = KeptConnectionsEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = KeptConnectionsScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        super(DagsterSqliteStorage, self).__init__()  # DagsterStorage's: DagsterSqliteStorage's makes stock storages

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        return {"base_dir": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None,
                          config_value: Mapping[str, Any]) -> KeptConnectionsSqliteStorage:
        base_dir = config_value.get("base_dir") or os.environ.get("DAGSTER_HOME")
        if not base_dir:
            raise DagsterInvalidConfigError(
                "dagster.yaml: storage.custom (kafscale_lakehouse.orchestration.sqlite_storage."
                "KeptConnectionsSqliteStorage) keeps its files under config.base_dir or $DAGSTER_HOME, and neither is "
                "set: set DAGSTER_HOME to the instance's directory (`make demo` does), or remove the `storage` section "
                "to let `dagster dev` use a temporary instance", [], None)
        return cls.from_local(inst_data=inst_data, base_dir=base_dir)
