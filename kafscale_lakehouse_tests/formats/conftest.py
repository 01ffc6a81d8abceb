"""The Confluent-compatible schema registry the format tests (and their ingest worlds) register schemas in."""

from __future__ import annotations

import pytest

from kafscale_lakehouse_tests.support.schema_registry import ConfluentCompatibleRegistry


@pytest.fixture(scope="session")
def confluent_registry() -> ConfluentCompatibleRegistry:
    """kafscale_lakehouse_tests/support/schema_registry.py on a free port; tests use subjects of their own topics."""
    server = ConfluentCompatibleRegistry().start()
    yield server
    server.stop()


# The ingest worlds of the engine tests (SeaweedFS, etcd), for the Avro topics landed end to end.
from kafscale_lakehouse_tests.engine.conftest import cli_main, production_world  # noqa: E402, F401
