"""Fixtures for the LFS ingest runs: the schema registry and the ingest worlds of the validation-mode tests."""

from kafscale_lakehouse_tests.validation_modes.conftest import (  # noqa: F401 - fixtures
    embedded_world,
    production_world,
    registry,
)
