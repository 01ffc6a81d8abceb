"""What the official Dagster Helm chart does with the values in helm-values/, reproduced for the tests.

There is no `helm` here, so three steps of `helm install` are redone in Python:
- merging several `-f` files (maps merge key by key, anything else is replaced whole; a null stays null and
  later deletes the chart's default),
- validating against the chart's `values.schema.json` and, for the `dagster-user-deployments` section, the
  subchart's schema (Helm validates a subchart's values against the subchart's own schema, with the parent's
  `global` handed down),
- rendering the instance config (`dagster.yaml`) the chart puts in its `-instance` ConfigMap, for the sections
  these values control (storage, run launcher, run coordinator, telemetry, additionalInstanceConfig), following
  the chart's templates `configmap-instance.yaml` and `helpers/instance/_*.tpl`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

SUBCHART_KEY = "dagster-user-deployments"
CHART_NAME = "dagster"
# The chart's default for `global.dagsterHome` (values.yaml); our values keep it.
DEFAULT_DAGSTER_HOME = "/opt/dagster/dagster_home"

_LOCAL_REF = re.compile(r"^#/(?:definitions|\$defs)/(?P<name>.+)$")
# Keywords whose value is data, not a subschema.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "title", "description", "type"})


def load_values(path: Path) -> dict[str, Any]:
    """One values file as Helm reads it (YAML with anchors); a file that is not a mapping is an error."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path}: a values file must be a mapping, got {type(document).__name__}")
    return document


def merge_values(*documents: Mapping[str, Any]) -> dict[str, Any]:
    """`helm install -f a.yaml -f b.yaml`: later files win; maps merge recursively, lists are replaced whole."""
    merged: dict[str, Any] = {}
    for document in documents:
        merged = _merge_maps(merged, document)
    return merged


def _merge_maps(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge_maps(merged[key], value)
        else:
            merged[key] = value
    return merged


class ChartSchema:
    """The chart's and the subchart's value schemas, tightened to say which keys the chart defines.

    Two changes to the vendored schemas, both about what a values file alone can be checked for:
    - every object schema that lists its properties rejects other keys (the chart's schema leaves most objects
      open, so a misspelled key would be silently ignored by the templates); objects that extend a Kubernetes
      schema (`$ref` to kubernetesjsonschema.dev, not vendored) stay open, and only their listed keys are checked;
    - `required` is kept only inside list items: Helm merges our maps over the chart's default values, which
      supply the required map keys, but a list replaces the default list whole, so its items must be complete.
    """

    def __init__(self, schema_dir: Path):
        parent = json.loads((schema_dir / "values.schema.json").read_text(encoding="utf-8"))
        subchart = json.loads((schema_dir / f"{SUBCHART_KEY}.values.schema.json").read_text(encoding="utf-8"))
        parent_definitions = parent.get("definitions", {})
        subchart_definitions = subchart.get("$defs", {})
        self._parent = Draft202012Validator(_tighten(parent, parent_definitions, in_list_item=False))
        self._subchart = Draft202012Validator(_tighten(subchart, subchart_definitions, in_list_item=False))
        # The parent's own switches for the subchart (`enabled`, `enableSubchart`), which the subchart ignores.
        parent_section = parent_definitions["UserDeployments"]["properties"]
        self._parent_only_keys = frozenset(parent_section) - frozenset(subchart["properties"])
        self._parent_definitions = parent_definitions

    def defined_keys(self, definition: str) -> frozenset[str]:
        """The keys the chart's schema defines for one of its objects, e.g. `QueuedRunCoordinatorConfig`."""
        return frozenset(self._parent_definitions[definition]["properties"])

    def problems(self, values: Mapping[str, Any]) -> list[str]:
        """One `key.path: what is wrong` line per problem; empty when the chart accepts every key and value."""
        found = list(_problems(self._parent, values, ""))
        if SUBCHART_KEY in values:
            section = {key: value for key, value in values[SUBCHART_KEY].items() if key not in self._parent_only_keys}
            if "global" in values:
                section["global"] = values["global"]
            found.extend(_problems(self._subchart, section, SUBCHART_KEY))
        # Both schemas describe the deployments, so the same problem can be found twice.
        return list(dict.fromkeys(found))


def _tighten(node: Any, definitions: Mapping[str, Any], *, in_list_item: bool, resolving: tuple[str, ...] = ()) -> Any:
    """Inline local `$ref`s and apply the two changes described on `ChartSchema`."""
    if isinstance(node, list):
        return [_tighten(item, definitions, in_list_item=in_list_item, resolving=resolving) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: value for key, value in node.items() if key not in ("definitions", "$defs")}
    reference = node.pop("$ref", None)
    extends_kubernetes_schema = reference is not None and _LOCAL_REF.match(reference) is None
    tightened: dict[str, Any] = {}
    for key, value in node.items():
        if key == "required":
            if in_list_item:
                tightened[key] = value
        elif key in _DATA_KEYWORDS:
            tightened[key] = value
        elif key in ("properties", "patternProperties"):
            tightened[key] = {
                name: _tighten(schema, definitions, in_list_item=in_list_item, resolving=resolving)
                for name, schema in value.items()
            }
        elif key in ("items", "prefixItems"):
            tightened[key] = _tighten(value, definitions, in_list_item=True, resolving=resolving)
        else:
            tightened[key] = _tighten(value, definitions, in_list_item=in_list_item, resolving=resolving)
    if reference is not None and not extends_kubernetes_schema:
        name = _LOCAL_REF.match(reference).group("name")
        if name in resolving:
            raise ValueError(f"recursive schema reference {reference} (through {' -> '.join(resolving)})")
        target = _tighten(definitions[name], definitions, in_list_item=in_list_item, resolving=(*resolving, name))
        clashing = (set(target) & set(tightened)) - {"title", "description"}
        if clashing:
            raise ValueError(f"{reference}: keywords {sorted(clashing)} are both in the definition and beside the $ref")
        tightened = {**target, **tightened}
    # Decided where an object is defined; a local $ref takes the decision of its definition.
    if (
        reference is None
        and tightened.get("type") == "object"
        and tightened.get("properties")
        and "additionalProperties" not in tightened
    ):
        tightened["additionalProperties"] = False
    return tightened


def _problems(validator: Draft202012Validator, instance: Any, prefix: str) -> Iterator[str]:
    for error in validator.iter_errors(instance):
        for leaf in _leaf_errors(error):
            yield f"{_format_path(prefix, leaf.absolute_path)}: {leaf.message}"


def _leaf_errors(error: ValidationError) -> list[ValidationError]:
    """For anyOf/oneOf, every error of the branch for the value's own type, not "is not of type 'null'"."""
    if not error.context:
        return [error]
    branches: dict[Any, list[ValidationError]] = {}
    for branch_error in error.context:
        branches.setdefault(branch_error.relative_schema_path[0], []).append(branch_error)
    same_type = [errors for errors in branches.values()
                 if not any(e.validator == "type" and not e.relative_path for e in errors)]
    chosen = min(same_type or list(branches.values()), key=len)
    return [leaf for branch_error in chosen for leaf in _leaf_errors(branch_error)]


def _format_path(prefix: str, parts) -> str:
    text = prefix
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


# ----------------------------------------------------------------------------------------- instance config


@dataclass(frozen=True)
class Release:
    """`helm install <name> dagster/dagster --namespace <namespace>`."""

    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        """The chart's `dagster.fullname`: the release name if it contains the chart name, else `<release>-dagster`."""
        return self.name if CHART_NAME in self.name else f"{self.name}-{CHART_NAME}"


def render_instance_config(values: Mapping[str, Any], release: Release) -> dict[str, Any]:
    """The `dagster.yaml` the chart renders into its instance ConfigMap, as a dict."""
    storage = _postgres_storage_config(values, release)
    instance: dict[str, Any] = {
        "scheduler": {"module": "dagster.core.scheduler", "class": "DagsterDaemonScheduler"},
        "schedule_storage": {"module": "dagster_postgres.schedule_storage", "class": "PostgresScheduleStorage",
                             "config": copy.deepcopy(storage)},
        "run_launcher": _run_launcher(values, release),
        "run_storage": {"module": "dagster_postgres.run_storage", "class": "PostgresRunStorage",
                        "config": copy.deepcopy(storage)},
        "event_log_storage": {"module": "dagster_postgres.event_log", "class": "PostgresEventLogStorage",
                              "config": copy.deepcopy(storage)},
    }
    daemon = values.get("dagsterDaemon") or {}
    coordinator = daemon.get("runCoordinator") or {}
    if daemon.get("enabled", True) and coordinator.get("enabled"):
        instance["run_coordinator"] = _queued_run_coordinator(coordinator)
    instance["telemetry"] = {"enabled": _value(values, "telemetry.enabled")}
    for key, section in (values.get("additionalInstanceConfig") or {}).items():
        if key in instance:
            # The template appends additionalInstanceConfig as YAML: dagster.yaml would hold the key twice.
            raise ValueError(f"additionalInstanceConfig.{key}: the chart already renders a `{key}` section")
        instance[key] = section
    return instance


def _postgres_storage_config(values: Mapping[str, Any], release: Release) -> dict[str, Any]:
    postgresql = _value(values, "postgresql")
    hostname = f"{release.fullname}-postgresql" if postgresql.get("enabled", True) else postgresql["postgresqlHost"]
    database = {
        "username": _value(values, "postgresql.postgresqlUsername"),
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": hostname,
        "db_name": _value(values, "postgresql.postgresqlDatabase"),
        "port": _value(values, "postgresql.service.port"),
        "params": postgresql.get("postgresqlParams") or {},
    }
    if postgresql.get("postgresqlScheme"):
        database["scheme"] = postgresql["postgresqlScheme"]
    return {"postgres_db": database}


def _run_launcher(values: Mapping[str, Any], release: Release) -> dict[str, Any]:
    launcher_type = _value(values, "runLauncher.type")
    if launcher_type != "K8sRunLauncher":
        raise ValueError(f"runLauncher.type: only K8sRunLauncher is rendered here, got {launcher_type!r}")
    settings = _value(values, "runLauncher.config.k8sRunLauncher")
    global_values = values.get("global") or {}
    service_account = values.get("serviceAccount") or {}
    config: dict[str, Any] = {
        "load_incluster_config": settings["loadInclusterConfig"],
        "job_namespace": settings.get("jobNamespace") or release.namespace,
        "image_pull_policy": settings["imagePullPolicy"],
        "service_account_name": (global_values.get("serviceAccountName") or service_account.get("name")
                                 or release.fullname),
        "dagster_home": global_values.get("dagsterHome") or DEFAULT_DAGSTER_HOME,
        "instance_config_map": f"{release.fullname}-instance",
        "postgres_password_secret": _value(values, "global.postgresqlSecretName"),
    }
    if settings.get("kubeconfigFile"):
        config["kubeconfig_file"] = settings["kubeconfigFile"]
    if values.get("imagePullSecrets"):
        config["image_pull_secrets"] = values["imagePullSecrets"]
    if "image" in settings:
        image = settings["image"]
        config["job_image"] = f"{image['repository']}:{image['tag']}"
    for key, rendered in (("envConfigMaps", "env_config_maps"), ("envSecrets", "env_secrets")):
        names = [source["name"] for source in settings.get(key) or [] if "name" in source]
        if names:
            config[rendered] = names
    for key, rendered in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes"),
                          ("labels", "labels"), ("resources", "resources"), ("schedulerName", "scheduler_name"),
                          ("securityContext", "security_context")):
        if settings.get(key):
            config[rendered] = settings[key]
    if settings.get("failPodOnRunFailure"):
        config["fail_pod_on_run_failure"] = True
    run_k8s_config = settings.get("runK8sConfig") or {}
    rendered_k8s_config = {
        rendered: run_k8s_config[key]
        for key, rendered in (("containerConfig", "container_config"), ("podSpecConfig", "pod_spec_config"),
                              ("podTemplateSpecMetadata", "pod_template_spec_metadata"),
                              ("jobSpecConfig", "job_spec_config"), ("jobMetadata", "job_metadata"))
        if run_k8s_config.get(key)
    }
    if rendered_k8s_config:
        config["run_k8s_config"] = rendered_k8s_config
    return {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": config}


def _queued_run_coordinator(coordinator: Mapping[str, Any]) -> dict[str, Any]:
    if coordinator.get("type") != "QueuedRunCoordinator":
        raise ValueError("dagsterDaemon.runCoordinator.type: only QueuedRunCoordinator is rendered here, "
                         f"got {coordinator.get('type')!r}")
    settings = (coordinator.get("config") or {}).get("queuedRunCoordinator") or {}
    rendered: dict[str, Any] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}
    # The template's `if not (empty (compact (values …)))`: sprig's compact drops null, false, 0, "" and empties.
    if not any(value not in (None, False, 0, "", [], {}) for value in settings.values()):
        return rendered
    max_runs = settings.get("maxConcurrentRuns")
    config: dict[str, Any] = {"max_concurrent_runs": -1 if max_runs is None else max_runs}
    for key, config_key in (("tagConcurrencyLimits", "tag_concurrency_limits"),
                            ("dequeueIntervalSeconds", "dequeue_interval_seconds"),
                            ("dequeueUseThreads", "dequeue_use_threads"), ("dequeueNumWorkers", "dequeue_num_workers")):
        if settings.get(key):
            config[config_key] = settings[key]
    blocking = settings.get("blockOpConcurrencyLimitedRuns")
    if blocking:
        config["block_op_concurrency_limited_runs"] = {
            "enabled": blocking["enabled"], "op_concurrency_slot_buffer": blocking["opConcurrencySlotBuffer"]}
    rendered["config"] = config
    return rendered


def _value(values: Mapping[str, Any], dotted_key: str) -> Any:
    """The value at `a.b.c`; a missing key is an error naming it (our values must set what the render reads)."""
    current: Any = values
    walked: list[str] = []
    for part in dotted_key.split("."):
        walked.append(part)
        if not isinstance(current, Mapping) or part not in current:
            raise KeyError(f"values: {'.'.join(walked)} is not set")
        current = current[part]
    return current
