"""helm-values/manifests/serve-metrics.yaml runs the CLI command that exists, with the image, Secret and config of
the chart's values, and probes and scrapes the paths and port serve-metrics serves."""

from __future__ import annotations

import tomllib
from pathlib import PurePosixPath

import pytest
import yaml

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse.apps.metrics_server import (
    HEALTH_PATH,
    METRICS_ADDRESS_ENV,
    METRICS_PATH,
    READY_PATH,
    parse_metrics_address,
)
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.deploy.conftest import VALUES_DIR
from kafscale_lakehouse_tests.deploy.dockerfile import Dockerfile
from kafscale_lakehouse_tests.deploy.helm_chart import SUBCHART_KEY, load_values

MANIFEST = VALUES_DIR / "manifests" / "serve-metrics.yaml"


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict]:
    documents = [d for d in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if d]
    return {document["kind"]: document for document in documents}


@pytest.fixture(scope="module")
def code_server() -> dict:
    """The user-code deployment of common.yaml, whose image, Secret and ConfigMap serve-metrics shares."""
    [deployment] = load_values(VALUES_DIR / "common.yaml")[SUBCHART_KEY]["deployments"]
    return deployment


def container_of(manifest: dict[str, dict]) -> dict:
    [container] = manifest["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_the_container_runs_serve_metrics_as_the_cli_parses_it(manifest):
    container = container_of(manifest)
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    program, *arguments = container["args"]

    assert "command" not in container, "the image's entry point must run the args"
    assert program in scripts and scripts[program] == "kafscale_lakehouse.apps.cli:main"
    assert cli._build_parser().parse_args(arguments).command == "serve-metrics"
    assert [variable["name"] for variable in container["env"]] == [METRICS_ADDRESS_ENV]


def test_probes_and_scrapes_use_the_port_and_paths_served(manifest):
    container = container_of(manifest)
    [address] = [v["value"] for v in container["env"] if v["name"] == METRICS_ADDRESS_ENV]
    _host, port = parse_metrics_address(address, source=METRICS_ADDRESS_ENV)
    [container_port] = container["ports"]
    service = manifest["Service"]

    assert container_port["containerPort"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": HEALTH_PATH, "port": container_port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": container_port["name"]}
    # Both sources may take their whole time budget before /readyz answers.
    assert container["readinessProbe"]["timeoutSeconds"] >= 9
    assert service["spec"]["selector"].items() <= manifest["Deployment"]["spec"]["template"]["metadata"][
        "labels"].items()
    assert service["spec"]["selector"] == manifest["Deployment"]["spec"]["selector"]["matchLabels"]
    [service_port] = service["spec"]["ports"]
    assert service_port["targetPort"] == container_port["name"]
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert service["metadata"]["annotations"]["prometheus.io/path"] == METRICS_PATH
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_image_credentials_and_config_are_those_of_the_code_server(manifest, code_server):
    container = container_of(manifest)
    pod = manifest["Deployment"]["spec"]["template"]["spec"]
    image = code_server["image"]
    config_path = PurePosixPath(Dockerfile(REPO_ROOT / "Dockerfile").env()["KAFSCALE_LAKEHOUSE_CONFIG"])

    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert container["envFrom"] == [{"secretRef": {"name": s["name"]}} for s in code_server["envSecrets"]]
    assert pod["volumes"] == code_server["volumes"]
    assert container["volumeMounts"] == code_server["volumeMounts"]
    [mount] = container["volumeMounts"]
    assert PurePosixPath(mount["mountPath"]) == config_path.parent
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == code_server["securityContext"]
