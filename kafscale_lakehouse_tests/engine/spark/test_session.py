"""The shared SparkSession builder: loopback binding and executors on this venv's Python."""

from __future__ import annotations

import os
import sys

import pytest
from pyspark.sql import functions as F  # noqa: N812 - pyspark's conventional alias
from pyspark.sql.types import StringType

from kafscale_lakehouse.engine.spark.session import get_spark_session

pytestmark = pytest.mark.integration


def test_session_binds_loopback_and_workers_run_this_python():
    session = get_spark_session("local[2]", {"spark.sql.shuffle.partitions": "2"}, ui_enabled=False)

    assert get_spark_session("local[2]", ui_enabled=False) is session
    assert session.conf.get("spark.driver.host") == "127.0.0.1"
    assert session.conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert session.sparkContext.uiWebUrl is None
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    worker_python = F.udf(lambda _: sys.executable, StringType())
    assert session.range(1).select(worker_python("id")).first()[0] == sys.executable
