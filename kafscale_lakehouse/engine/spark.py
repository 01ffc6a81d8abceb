"""The one place that builds the SparkSession, with the settings of shared/infra.md."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# Deployment overrides (helm-values/README.md): the run pod's variables win over the config file's `spark` section.
SPARK_MASTER_VARIABLE = "KAFSCALE_SPARK_MASTER"
SPARK_CONF_PREFIX = "KAFSCALE_SPARK_CONF_"


def spark_settings_from_env(env: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    """`KAFSCALE_SPARK_MASTER` and every `KAFSCALE_SPARK_CONF_<LABEL>=<spark key>=<value>` (the label only keeps the
    variables apart: Spark keys contain dots, variable names cannot)."""
    settings: dict[str, str] = {}
    setter: dict[str, str] = {}
    for name, value in sorted(env.items()):
        if not name.startswith(SPARK_CONF_PREFIX):
            continue
        key, separator, setting = value.partition("=")
        if not separator or not key.strip():
            raise ValueError(f"{name}: {value!r} is not <spark key>=<value>")
        if key in settings:
            raise ValueError(f"{name}: {key} is already set by {setter[key]}")
        settings[key], setter[key] = setting, name
    return env.get(SPARK_MASTER_VARIABLE) or None, settings


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
    nothing listens on an external interface. `conf` entries win over these defaults, and the deployment's
    environment (`spark_settings_from_env`) wins over both.
    """
    env_master, env_conf = spark_settings_from_env(os.environ)
    master = env_master or master
    conf = {**(conf or {}), **env_conf}
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
