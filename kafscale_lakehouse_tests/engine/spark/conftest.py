"""The engine tests: `spark_engine` (kafscale_lakehouse_tests/conftest.py) is shared with the fault matrix."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from kafscale_lakehouse_tests.engine.spark.other_user import OtherUser, make_other_user


@pytest.fixture(autouse=True)
def embedded_functions_after_each_test():
    """A client of the engine switches `pyspark.sql.functions` to Spark Connect for its process
    (engine/spark/session.py); the tests after each of these use the embedded session again."""
    yield
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUser]:
    """Uid 65534, for what the engine and the warm process refuse to another user (skipped unless root)."""
    user, modules = make_other_user()
    yield user
    shutil.rmtree(modules, ignore_errors=True)
