"""The Kubernetes Job that Dagster's K8sRunLauncher creates for a run, built by the real launcher from a rendered
instance config. Only the Kubernetes API is replaced (there is no cluster here): a recorder keeps the Job the
launcher submits instead of sending it."""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
from dagster import DagsterInstance
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.test_utils import create_run_for_test
from dagster_k8s import K8sRunLauncher

# Kubernetes replaces $(NAME) in an env value by the variable NAME defined earlier in the same container.
DEPENDENT_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

# A kubeconfig that is parsed but never contacted: the launcher loads one when it is created.
_UNUSED_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: unused, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: unused, user: {token: unused}}]
contexts: [{name: unused, context: {cluster: unused, user: unused}}]
current-context: unused
"""


class _JobRecorder:
    """Stands in for kubernetes.client.BatchV1Api: keeps the Jobs instead of creating them."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, Any]] = []

    def create_namespaced_job(self, body: Any, namespace: str, **_: Any) -> None:
        self.jobs.append((namespace, body))


def build_run_job(instance_config: Mapping[str, Any], *, image: str, code_location_module: str,
                  work_dir: Path) -> dict[str, Any]:
    """Launch one run with the instance's K8sRunLauncher and return the Job manifest it submits (camelCase keys).

    The run comes from a code server of `image` serving `code_location_module`, as the chart's user deployment
    reports it. Outside a cluster the launcher reads a local kubeconfig instead of the in-cluster one.
    """
    launcher_config = copy.deepcopy(dict(instance_config["run_launcher"]["config"]))
    kubeconfig = work_dir / "kubeconfig"
    kubeconfig.write_text(_UNUSED_KUBECONFIG, encoding="utf-8")
    launcher_config.update(load_incluster_config=False, kubeconfig_file=str(kubeconfig))
    recorder = _JobRecorder()
    launcher = K8sRunLauncher(**launcher_config, k8s_client_batch_api=recorder)

    origin = JobPythonOrigin(
        "__ASSET_JOB",
        RepositoryPythonOrigin(
            executable_path=sys.executable,
            code_pointer=ModuleCodePointer(code_location_module, "defs"),
            container_image=image,
            entry_point=["dagster"],
        ),
    )
    dagster_home = work_dir / "dagster_home"
    dagster_home.mkdir(exist_ok=True)
    with DagsterInstance.local_temp(str(dagster_home)) as instance:
        launcher.register_instance(instance)
        run = create_run_for_test(instance, job_name=origin.job_name, job_code_origin=origin)
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    if len(recorder.jobs) != 1:
        raise AssertionError(f"the launcher submitted {len(recorder.jobs)} Jobs for one run")
    namespace, job = recorder.jobs[0]
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    manifest.setdefault("metadata", {})["namespace"] = namespace
    return manifest


def run_container(job: Mapping[str, Any]) -> dict[str, Any]:
    containers = job["spec"]["template"]["spec"]["containers"]
    if len(containers) != 1:
        raise AssertionError(f"expected one run container, got {[c.get('name') for c in containers]}")
    return containers[0]


def plain_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's env entries with a literal value, with $(NAME) references resolved as Kubernetes does
    (entries from valueFrom resolve to `<fieldPath>` / `<secret:key>` placeholders)."""
    resolved: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "valueFrom" in entry:
            source = entry["valueFrom"]
            if "fieldRef" in source:
                resolved[entry["name"]] = f"<{source['fieldRef']['fieldPath']}>"
            elif "secretKeyRef" in source:
                resolved[entry["name"]] = f"<{source['secretKeyRef']['name']}:{source['secretKeyRef']['key']}>"
            continue
        value = entry.get("value", "")
        resolved[entry["name"]] = DEPENDENT_VARIABLE.sub(lambda m: resolved.get(m.group(1), m.group(0)), value)
    return resolved


