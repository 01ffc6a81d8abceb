"""The engine tests: `spark_engine` (kafscale_lakehouse_tests/conftest.py) is shared with the fault matrix."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def embedded_functions_after_each_test():
    """A client of the engine switches `pyspark.sql.functions` to Spark Connect for its process
    (engine/spark/session.py); the tests after each of these use the embedded session again."""
    yield
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
