"""helm-values/: the chart accepts them, the instance they render loads in Dagster, and the run pods they describe
have the image, credentials, config file and Spark settings the project needs."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import pytest
import yaml
from dagster._config import validate_config
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.storage.config import pg_config
from dagster._serdes import ConfigurableClassData
from dagster_k8s import K8sRunLauncher

from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.config.spark_remote import parse_remote_url
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.spark.engine import (
    ENGINE_ADDRESS_VARIABLE,
    SPARK_REMOTE_VARIABLE,
    parse_engine_address,
)
from kafscale_lakehouse.engine.spark.session import spark_settings_from_env
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.deploy.conftest import RELEASE, VALUES_DIR, size_values
from kafscale_lakehouse_tests.deploy.helm_chart import SUBCHART_KEY, load_values, render_instance_config
from kafscale_lakehouse_tests.deploy.run_pod import (
    DEPENDENT_VARIABLE,
    build_run_job,
    plain_env,
    run_container,
)

CONFIG_MAP = "kafscale-lakehouse-config"
CREDENTIALS_SECRET = "kafscale-lakehouse-credentials"
# Config keys that hold credentials (access_key_id too: it names an account).
CREDENTIAL_KEYS = frozenset({"access_key_id", "secret_access_key", "username", "password", "token", "credential"})


def code_location(values: dict) -> dict:
    deployments = values[SUBCHART_KEY]["deployments"]
    assert len(deployments) == 1, "one code location: kafscale_lakehouse.definitions"
    return deployments[0]


def image_of(deployment: dict) -> str:
    return f"{deployment['image']['repository']}:{deployment['image']['tag']}"


def load_instance(instance_config: dict, directory: Path) -> dict:
    """Load a dagster.yaml the way Dagster does when an instance starts (schema and cross-key rules)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "dagster.yaml").write_text(yaml.safe_dump(instance_config), encoding="utf-8")
    config, _custom_instance_class = dagster_instance_config(str(directory))
    return dict(config)


# ------------------------------------------------------------------------------------------ chart schema


def test_values_use_only_keys_the_chart_defines(size, chart_schema):
    assert chart_schema.problems(size_values(size)) == []


MISSPELLINGS = [
    # (path of the key to rename, misspelled name, the problem's location)
    (("runLauncher",), "runLaucher", "(top level)"),
    (("runLauncher", "config", "k8sRunLauncher", "envSecrets"), "envSecret", "runLauncher.config.k8sRunLauncher"),
    ((SUBCHART_KEY, "deployments", 0, "dagsterApiGrpcArgs"), "dagsterApiGrpcArg", f"{SUBCHART_KEY}.deployments[0]"),
    (("dagsterDaemon", "runCoordinator", "config", "queuedRunCoordinator", "maxConcurrentRuns"), "maxConcurentRuns",
     "dagsterDaemon.runCoordinator.config.queuedRunCoordinator"),
]


@pytest.mark.parametrize(("path", "misspelled", "location"), MISSPELLINGS, ids=[m[1] for m in MISSPELLINGS])
def test_a_misspelled_key_fails_validation(path, misspelled, location, chart_schema, tmp_path):
    values = load_values(VALUES_DIR / "common.yaml")
    parent = values
    for part in path[:-1]:
        parent = parent[part]
    parent[misspelled] = parent.pop(path[-1])
    misspelled_file = tmp_path / "misspelled.yaml"
    misspelled_file.write_text(yaml.safe_dump(values), encoding="utf-8")

    problems = chart_schema.problems(load_values(misspelled_file))

    assert problems == [f"{location}: Additional properties are not allowed ('{misspelled}' was unexpected)"]


def test_list_items_must_be_complete(chart_schema):
    # A list replaces the chart's default list whole, so nothing fills in a missing required key of an item.
    values = size_values("small")
    del code_location(values)["port"]

    assert chart_schema.problems(values) == [f"{SUBCHART_KEY}.deployments[0]: 'port' is a required property"]


# --------------------------------------------------------------------------------------- instance config


def test_rendered_instance_config_loads_in_dagster(size, tmp_path):
    instance_config = render_instance_config(size_values(size), RELEASE)

    loaded = load_instance(instance_config, tmp_path)

    # Every table's pool admits one run at a time, decided in the queue (no pod waits for a slot).
    assert loaded["concurrency"]["pools"] == {"default_limit": 1, "granularity": "run"}
    assert loaded["concurrency"]["runs"]["max_concurrent_runs"] == {"small": 2, "large": 8}[size]
    assert "config" not in loaded["run_coordinator"]
    # Each pluggable class accepts its config: what the daemon, webserver and run pods construct.
    coordinator = loaded["run_coordinator"]
    ConfigurableClassData(coordinator["module"], coordinator["class"], yaml.safe_dump(coordinator.get("config", {}))) \
        .rehydrate(as_type=QueuedRunCoordinator)
    launcher = loaded["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    checked = validate_config(K8sRunLauncher.config_type(), launcher["config"])
    assert checked.success, checked.errors
    for storage in ("run_storage", "event_log_storage", "schedule_storage"):
        assert loaded[storage]["module"].startswith("dagster_postgres.")
        checked = validate_config(pg_config(), loaded[storage]["config"])
        assert checked.success, (storage, checked.errors)
        assert loaded[storage]["config"]["postgres_db"]["password"] == {"env": "DAGSTER_PG_PASSWORD"}


def test_every_run_coordinator_setting_is_cleared(size, chart_schema):
    # The chart's defaults set some of them (which, depends on the chart version): only null removes a default.
    settings = size_values(size)["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]

    assert settings == dict.fromkeys(chart_schema.defined_keys("QueuedRunCoordinatorConfig"))


def test_a_run_limit_in_the_run_coordinator_is_refused_next_to_pools(tmp_path):
    # Why common.yaml clears the queuedRunCoordinator settings: this chart then writes max_concurrent_runs under
    # run_coordinator.config, which Dagster refuses together with `concurrency`.
    values = size_values("small")
    values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["dequeueUseThreads"] = True
    instance_config = render_instance_config(values, RELEASE)
    assert instance_config["run_coordinator"]["config"]["max_concurrent_runs"] == -1

    with pytest.raises(DagsterInvalidConfigError, match="max_concurrent_runs"):
        load_instance(instance_config, tmp_path)


# ------------------------------------------------------------------------------------------- run pods


def launch_run(size: str, work_dir: Path) -> dict:
    """The Job the size's K8sRunLauncher creates for a run of the code location."""
    values = size_values(size)
    return build_run_job(render_instance_config(values, RELEASE), image=image_of(code_location(values)),
                         code_location_module="kafscale_lakehouse.definitions", work_dir=work_dir)


@pytest.fixture
def run_job(size, tmp_path):
    return launch_run(size, tmp_path)


def test_run_pod_has_credentials_config_and_per_run_resources(size, run_job, dockerfile):
    values = size_values(size)
    container = run_container(run_job)
    pod = run_job["spec"]["template"]["spec"]

    assert container["image"] == image_of(code_location(values))
    assert container["args"][:3] == ["dagster", "api", "execute_run"]
    assert container["resources"] == values["runLauncher"]["config"]["k8sRunLauncher"]["resources"]
    assert {"secretRef": {"name": CREDENTIALS_SECRET}} in container["envFrom"]
    # The config file lands where the image's KAFSCALE_LAKEHOUSE_CONFIG points.
    config_path = PurePosixPath(dockerfile.env()["KAFSCALE_LAKEHOUSE_CONFIG"])
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == CONFIG_MAP)
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert PurePosixPath(mount["mountPath"]) == config_path.parent
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert run_job["spec"]["ttlSecondsAfterFinished"] > 0


def test_run_pod_variables_refer_only_to_variables_defined_before_them(run_job):
    defined: set[str] = set()
    for entry in run_container(run_job)["env"]:
        for referenced in DEPENDENT_VARIABLE.findall(entry.get("value", "")):
            assert referenced in defined, f"{entry['name']} uses $({referenced}) before it is defined"
        defined.add(entry["name"])


def engine_manifest() -> dict[str, dict]:
    """manifests/spark-engine.yaml by kind."""
    documents = yaml.safe_load_all((VALUES_DIR / "manifests" / "spark-engine.yaml").read_text(encoding="utf-8"))
    return {document["kind"]: document for document in documents}


def test_small_run_pods_connect_to_the_spark_engine_and_start_no_spark(tmp_path):
    job = launch_run("small", tmp_path)
    container = run_container(job)
    env = plain_env(container)
    master, settings = spark_settings_from_env(env)
    manifest = engine_manifest()
    service = manifest["Service"]
    address = parse_remote_url(env[SPARK_REMOTE_VARIABLE], setting=SPARK_REMOTE_VARIABLE)

    # The run's session is a client of the engine's Service (same namespace), on the port the engine listens on.
    assert address.host == service["metadata"]["name"]
    [port] = service["spec"]["ports"]
    assert address.port == port["port"]
    engine_pod = manifest["Deployment"]["spec"]["template"]
    assert service["spec"]["selector"].items() <= engine_pod["metadata"]["labels"].items()
    [engine] = engine_pod["spec"]["containers"]
    engine_env = plain_env(engine)
    listen = parse_engine_address(engine_env[ENGINE_ADDRESS_VARIABLE])
    assert listen.host == "0.0.0.0" and listen.port == next(
        p["containerPort"] for p in engine["ports"] if p["name"] == port["targetPort"])
    # No Spark in the run pod: no master, no Spark settings, and far less than the engine's memory.
    assert master is None and settings == {}
    assert container["resources"]["limits"]["memory"] == "1Gi"
    engine_master, engine_settings = spark_settings_from_env(engine_env)
    requested_cores = int(engine["resources"]["requests"]["cpu"])
    assert engine_master == f"local[{requested_cores}]" and engine_settings["spark.driver.memory"] == "3g"
    # Only the run pods may reach it: the NetworkPolicy admits exactly the labels the launcher gives them.
    policy = manifest["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= engine_pod["metadata"]["labels"].items()
    [rule] = policy["ingress"]
    [source] = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert [p["port"] for p in rule["ports"]] == [listen.port]


def test_the_engine_runs_the_code_location_image_with_its_config_and_credentials(dockerfile):
    [engine] = engine_manifest()["Deployment"]["spec"]["template"]["spec"]["containers"]
    pod = engine_manifest()["Deployment"]["spec"]["template"]["spec"]

    # Its Python workers import the project: the same image as the code location and the runs.
    assert engine["image"] == image_of(code_location(size_values("small")))
    assert engine["args"] == ["kafscale-lakehouse", "spark-engine"]
    assert {"secretRef": {"name": CREDENTIALS_SECRET}} in engine["envFrom"]
    config_path = PurePosixPath(dockerfile.env()["KAFSCALE_LAKEHOUSE_CONFIG"])
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == CONFIG_MAP)
    mount = next(m for m in engine["volumeMounts"] if m["name"] == volume["name"])
    assert PurePosixPath(mount["mountPath"]) == config_path.parent
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_large_runs_spark_executors_on_kubernetes_from_the_same_image(tmp_path, install_guide):
    job = launch_run("large", tmp_path)
    pod = job["spec"]["template"]["spec"]
    master, settings = spark_settings_from_env(plain_env(run_container(job)))

    assert master.startswith("k8s://https://")
    assert settings["spark.kubernetes.container.image"] == image_of(code_location(size_values("large")))
    # The run pod is the driver: it runs as the service account allowed to manage executor pods.
    service_account = pod["serviceAccountName"]
    assert settings["spark.kubernetes.authenticate.driver.serviceAccountName"] == service_account
    install_guide.created("serviceaccount", service_account)
    binding = install_guide.created("rolebinding", service_account)
    assert f"--serviceaccount={RELEASE.namespace}:{service_account}" in binding
    assert settings["spark.driver.host"] == "<status.podIP>"
    assert settings["spark.kubernetes.driver.pod.name"] == "<metadata.name>"
    assert settings["spark.kubernetes.namespace"] == "<metadata.namespace>"
    for key in ("spark.executor.instances", "spark.executor.cores"):
        assert int(settings[key]) > 0
    assert re.fullmatch(r"[1-9][0-9]*[mg]", settings["spark.executor.memory"])
    # Executors read and write S3 themselves, with the keys of the Secret the run pod has.
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert settings[f"spark.kubernetes.executor.secretKeyRef.{variable}"] == f"{CREDENTIALS_SECRET}:{variable}"
        assert variable in install_guide.secret_keys(CREDENTIALS_SECRET)


# ----------------------------------------------------------------------------------- code server, guide


def test_code_server_serves_the_project_with_credentials_and_config(dockerfile, pyproject):
    deployment = code_location(size_values("small"))

    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == pyproject["tool"]["dagster"]["module_name"]
    image_cmd = dockerfile.exec_form("CMD")
    assert deployment["port"] == int(image_cmd[image_cmd.index("--port") + 1])
    # Sensors run in the code server, so it needs what the runs need; the runs do not inherit it (resources).
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": False}
    assert deployment["envSecrets"] == [{"name": CREDENTIALS_SECRET}]
    config_path = PurePosixPath(dockerfile.env()["KAFSCALE_LAKEHOUSE_CONFIG"])
    volume = next(v for v in deployment["volumes"] if v.get("configMap", {}).get("name") == CONFIG_MAP)
    mount = next(m for m in deployment["volumeMounts"] if m["name"] == volume["name"])
    assert PurePosixPath(mount["mountPath"]) == config_path.parent


def test_guide_creates_every_secret_and_config_map_the_values_use(size, install_guide, dockerfile):
    values = size_values(size)

    install_guide.created("secret", values["global"]["postgresqlSecretName"])
    assert "postgresql-password" in install_guide.secret_keys(values["global"]["postgresqlSecretName"])
    for source in values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"] + code_location(values)["envSecrets"]:
        install_guide.created("secret", source["name"])
    files = install_guide.configmap_files(CONFIG_MAP)
    config_name = PurePosixPath(dockerfile.env()["KAFSCALE_LAKEHOUSE_CONFIG"]).name
    assert (REPO_ROOT / files[config_name]).is_file()


def test_config_file_loads_with_only_the_secret_keys_as_environment(install_guide, monkeypatch):
    config_file = REPO_ROOT / install_guide.configmap_files(CONFIG_MAP)["lakehouse.yaml"]
    secret_keys = install_guide.secret_keys(CREDENTIALS_SECRET)
    document = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    referenced = {name for _key, value in _leaves(document) if isinstance(value, str)
                  for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value)}
    assert referenced and referenced <= set(secret_keys), f"not in the Secret: {sorted(referenced - set(secret_keys))}"
    for name, placeholder in secret_keys.items():
        monkeypatch.setenv(name, placeholder)

    config = load_config(config_file)

    assert config.etcd.password.get_secret_value() == secret_keys["KAFSCALE_ETCD_PASSWORD"]
    assert catalog_settings(config).catalog_properties()["credential"] == secret_keys["KAFSCALE_CATALOG_CREDENTIAL"]
    assert config.mappings


def test_guide_installs_the_chart_release_of_the_lowest_dagster(install_guide, pyproject):
    # The image's dagster-k8s of the range's lowest release pins that Dagster release; the chart is the same one.
    install = install_guide.helm_install()
    dagster_range = next(spec for spec in pyproject["project"]["dependencies"] if spec.startswith("dagster>="))

    assert install[2:4] == (RELEASE.name, "dagster/dagster")
    assert install_guide.option(install, "--version") == dagster_range.removeprefix("dagster>=").split(",")[0]
    assert install_guide.option(install, "--namespace") == RELEASE.namespace
    assert any(argv[:3] == ("helm", "repo", "add") and argv[3:] == ("dagster", "https://dagster-io.github.io/helm")
               for argv in install_guide.commands)
    # The values files the command passes exist, common first so a size file can override it.
    value_files = [install[i + 1] for i, word in enumerate(install) if word == "-f"]
    assert value_files[0] == "helm-values/common.yaml"
    assert all((REPO_ROOT / path).is_file() for path in value_files)


def test_no_credential_is_written_in_the_deployment_files(size):
    values = size_values(size)
    # The chart's only inline credential; the password comes from the Secret the guide creates instead.
    assert values["generatePostgresqlPasswordSecret"] is False
    assert "postgresqlPassword" not in values["postgresql"]
    config = yaml.safe_load((VALUES_DIR / "lakehouse.yaml").read_text(encoding="utf-8"))
    credentials = [(key, value) for key, value in _leaves(config) if key.rsplit(".", 1)[-1] in CREDENTIAL_KEYS]
    assert credentials
    for key, value in credentials:
        assert re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", value), f"lakehouse.yaml {key} is not a ${{VARIABLE}}"


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, f"{prefix}[{index}]")
    else:
        yield prefix, node
