"""Spark: the session, the long-lived engine (Spark Connect) and the local one started on first use, table reads and
writes for downstream assets."""

from kafscale_lakehouse.engine.spark.engine import (
    DEFAULT_ENGINE_ADDRESS,
    ENGINE_ADDRESS_VARIABLE,
    SparkEngineError,
    parse_engine_address,
    serve,
)
from kafscale_lakehouse.engine.spark.local_engine import AUTO_ENGINE_VARIABLE, LocalEngine, local_engine_request
from kafscale_lakehouse.engine.spark.session import get_spark_session, spark_settings_from_env
from kafscale_lakehouse.engine.spark.table_source import read_table
from kafscale_lakehouse.engine.spark.writes import write_arrow, write_dataframe
from kafscale_lakehouse.local_processes import IDLE_SECONDS_VARIABLE

__all__ = [
    "AUTO_ENGINE_VARIABLE",
    "DEFAULT_ENGINE_ADDRESS",
    "ENGINE_ADDRESS_VARIABLE",
    "IDLE_SECONDS_VARIABLE",
    "LocalEngine",
    "SparkEngineError",
    "get_spark_session",
    "local_engine_request",
    "parse_engine_address",
    "read_table",
    "serve",
    "spark_settings_from_env",
    "write_arrow",
    "write_dataframe",
]
