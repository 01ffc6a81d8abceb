"""The one place that builds the SparkSession, with the settings of shared/infra.md: a Spark Connect client of the
long-lived engine (`engine/spark/engine.py`) when one is configured, else the embedded session of `spark.master`."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from kafscale_lakehouse.config.spark_remote import parse_remote_url
from kafscale_lakehouse.engine.spark.engine import (
    SPARK_REMOTE_VARIABLE,
    SparkEngineError,
    open_connect_session,
    port_open,
    shared_session_url,
    with_engine_token,
)
from kafscale_lakehouse.engine.spark.local_engine import AUTO_ENGINE_VARIABLE, LocalEngine, local_engine_url

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# Deployment overrides (helm-values/README.md): the run pod's variables win over the config file's `spark` section.
SPARK_MASTER_VARIABLE = "KAFSCALE_SPARK_MASTER"
SPARK_CONF_PREFIX = "KAFSCALE_SPARK_CONF_"
# How long a run waits for the engine to accept connections (it may still be starting next to `dagster dev`).
ENGINE_WAIT_SECONDS = 180


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
    remote: str | None = None,
    app_name: str = "kafscale-lakehouse",
    ui_enabled: bool = True,
    local_engine: LocalEngine | None = None,
) -> SparkSession:
    """Return the active SparkSession or build one.

    With `$SPARK_REMOTE` or `remote` (`spark.remote` in the config; the variable wins) set, the session is a Spark
    Connect client of that engine: no JVM starts here, `conf` is applied as the session's (runtime) settings and
    `master` is the engine's business. Else, with `local_engine` (`local_engine_request`), a `local` master and no
    embedded session active in this process, a client of the local engine of these settings, started now if there
    is none (`engine/spark/local_engine.py`). Otherwise, the embedded session:
    Python workers run `sys.executable` (unless `PYSPARK_PYTHON` is already set), or executors would start the
    system Python without this venv's packages. A `local` master binds driver and block manager to loopback so
    nothing listens on an external interface. `conf` entries win over these defaults, and the deployment's
    environment (`spark_settings_from_env`) wins over both.
    """
    env_master, env_conf = spark_settings_from_env(os.environ)
    conf = {**(conf or {}), **env_conf}
    if os.environ.get(SPARK_REMOTE_VARIABLE):
        return _connect_session(os.environ[SPARK_REMOTE_VARIABLE], SPARK_REMOTE_VARIABLE, conf, app_name)
    if remote:
        return _connect_session(remote, "spark.remote", conf, app_name)
    # Set but empty means "no engine"; pyspark's builder would still refuse a master next to it.
    os.environ.pop(SPARK_REMOTE_VARIABLE, None)
    master = env_master or master
    if local_engine is not None and master.startswith("local") and SparkContext._active_spark_context is None:
        # The engine was started with `conf`: its sessions have those settings (the static ones included, which a
        # client session could not set).
        return _connect_session(local_engine_url(master, conf, local_engine),
                                f"{AUTO_ENGINE_VARIABLE} (the local Spark engine)", {}, app_name)
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


def _connect_session(url: str, setting: str, conf: Mapping[str, str], app_name: str) -> SparkSession:
    """A Spark Connect session on the engine at `url` (named by `setting` in errors), once it accepts connections.

    Runs join one shared session of the engine (`shared_session_url`), whose Python workers stay warm; stopping a
    run's session does not end it for the others. Should the engine have dropped that session, the run gets a new
    one of its own. Built with the Connect builder itself, so an embedded session in this process is left alone.
    A loopback engine's token is read from its token file (`with_engine_token`).
    """
    try:
        address = parse_remote_url(url, setting=setting)
    except ValueError as exc:
        raise SparkEngineError(str(exc)) from None
    deadline = time.monotonic() + ENGINE_WAIT_SECONDS
    while not port_open(address):
        if time.monotonic() > deadline:
            raise SparkEngineError(f"{setting}: no Spark engine accepts connections at {address.url} after "
                                   f"{ENGINE_WAIT_SECONDS} s; start one (`kafscale-lakehouse spark-engine`) or unset "
                                   f"{setting} to run Spark embedded")
        time.sleep(0.5)
    url = with_engine_token(url)
    try:
        try:
            session, version = open_connect_session(shared_session_url(url), conf, app_name)
        except Exception as exc:
            if "SESSION_CLOSED" not in str(exc):
                raise
            log.warning("the Spark engine at %s dropped the runs' shared session; this run uses a new one (its Python "
                        "workers start cold)", address.url)
            session, version = open_connect_session(url, conf, app_name)
    except Exception as exc:
        raise SparkEngineError(f"{setting}: the Spark engine at {address.url} does not answer: {exc}") from exc
    log.info("Spark session ready: engine %s (Spark Connect, from %s) app=%s version=%s", address.url, setting,
             app_name, version)
    return session
