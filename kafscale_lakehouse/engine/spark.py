"""The one place that builds the SparkSession, with the settings of shared/infra.md."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def get_spark_session(
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    *,
    app_name: str = "kafscale-lakehouse",
    ui_enabled: bool = True,
) -> SparkSession:
    """Return the active SparkSession or build one.

    Python workers run `sys.executable` (unless `PYSPARK_PYTHON` is already set), or executors would start the
    system Python without this venv's packages. A `local` master binds driver and block manager to loopback so
    nothing listens on an external interface. `conf` entries win over these defaults.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings: dict[str, str] = {"spark.ui.enabled": "true" if ui_enabled else "false"}
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        settings["spark.driver.bindAddress"] = LOOPBACK
        settings["spark.driver.host"] = LOOPBACK
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    log.info("Spark session ready: master=%s app=%s version=%s", master, app_name, session.version)
    return session
