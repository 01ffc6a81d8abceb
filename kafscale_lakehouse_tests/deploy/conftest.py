"""Fixtures for the deployment files: the values of each size, the chart's schemas, the Dockerfile, the guide."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kafscale_lakehouse_tests.conftest import FIXTURES, REPO_ROOT
from kafscale_lakehouse_tests.deploy.dockerfile import Dockerfile
from kafscale_lakehouse_tests.deploy.helm_chart import ChartSchema, Release, load_values, merge_values
from kafscale_lakehouse_tests.deploy.install_guide import InstallGuide

VALUES_DIR = REPO_ROOT / "helm-values"
CHART_SCHEMA_DIR = FIXTURES / "dagster-helm"
SIZES = ("small", "large")
# The release of the install guide: `helm install kafscale-lakehouse … --namespace kafscale-lakehouse`.
RELEASE = Release(name="kafscale-lakehouse", namespace="kafscale-lakehouse")


def size_values(size: str) -> dict[str, Any]:
    """What `helm install -f common.yaml -f <size>.yaml` passes to the chart."""
    return merge_values(load_values(VALUES_DIR / "common.yaml"), load_values(VALUES_DIR / f"{size}.yaml"))


@pytest.fixture(params=SIZES)
def size(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def chart_schema() -> ChartSchema:
    if not CHART_SCHEMA_DIR.is_dir():
        pytest.fail(f"the Dagster chart's schemas are not at {CHART_SCHEMA_DIR}: the checkout is incomplete")
    return ChartSchema(CHART_SCHEMA_DIR)


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return Dockerfile(REPO_ROOT / "Dockerfile")


@pytest.fixture(scope="session")
def install_guide() -> InstallGuide:
    return InstallGuide.read(VALUES_DIR / "README.md")


@pytest.fixture(scope="session")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    """The directory of this venv's console scripts (`dagster`, `kafscale-lakehouse`), as /opt/venv/bin in the image."""
    return Path(sys.executable).parent
