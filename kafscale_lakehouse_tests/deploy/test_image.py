"""The Dockerfile: its entry point and commands run against this venv (no container engine here), its
environment matches the venv's layout, and its build context holds what it installs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pyspark
import pytest
from dagster._grpc.client import DagsterGrpcClient
from dagster._utils.error import SerializableErrorInfo

from kafscale_lakehouse.apps.workload import write_partition_segments
from kafscale_lakehouse_tests.conftest import REPO_ROOT
from kafscale_lakehouse_tests.deploy.conftest import size_values
from kafscale_lakehouse_tests.deploy.dockerfile import DockerIgnore
from kafscale_lakehouse_tests.deploy.helm_chart import SUBCHART_KEY
from kafscale_lakehouse_tests.support.servers import free_ports

pytestmark = pytest.mark.integration  # starts the image's code servers

# What the chart's user deployment runs (dagster-user-deployments/templates/deployment-user.yaml, `args`), before
# the deployment's dagsterApiGrpcArgs; the container's ENTRYPOINT stays in front of it.
CHART_GRPC_ARGS = ("dagster", "api", "grpc", "-h", "0.0.0.0", "-p")
SERVER_START_TIMEOUT_SECONDS = 90


@pytest.fixture(scope="module")
def entrypoint(dockerfile, tmp_path_factory) -> list[str]:
    """The image's ENTRYPOINT, with the script the Dockerfile writes there saved locally."""
    argv = dockerfile.exec_form("ENTRYPOINT")
    script = tmp_path_factory.mktemp("entrypoint") / PurePosixPath(argv[0]).name
    script.write_text(dockerfile.heredoc_file(argv[0]), encoding="utf-8")
    script.chmod(0o755)
    return [str(script), *argv[1:]]


@pytest.fixture
def image_env(dockerfile, venv_bin, tmp_path) -> dict[str, str]:
    """The image's environment mapped onto this machine: the venv for /opt/venv, a copy of the embedded example
    config for the ConfigMap, a fresh DAGSTER_HOME."""
    image = dockerfile.env()
    config = tmp_path / "lakehouse.yaml"
    shutil.copy(REPO_ROOT / "kafscale_lakehouse" / "examples" / "embedded.yaml", config)
    # The definitions check at load that the mapped topic exists: give it one segment, as the demo producer would.
    write_partition_segments(tmp_path / "var" / "segments", record_count=10, topic="completed-pizzas", partition=0)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SPARK_", "DAGSTER_"))}
    env.update(
        PATH=f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
        PYSPARK_PYTHON=sys.executable,
        SPARK_HOME=str(Path(pyspark.__file__).parent),
        KAFSCALE_LAKEHOUSE_CONFIG=str(config),
        DAGSTER_HOME=str(dagster_home),
        PYTHONUNBUFFERED=image["PYTHONUNBUFFERED"],
    )
    return env


def on_loopback(argv: list[str], port: int) -> list[str]:
    """The command with its host and port options changed to 127.0.0.1 and `port` (tests bind loopback only)."""
    rebound = list(argv)
    for names, value in ((("-h", "--host"), "127.0.0.1"), (("-p", "--port"), str(port))):
        positions = [index for index, word in enumerate(rebound) if word in names]
        if len(positions) != 1 or positions[0] + 1 >= len(rebound):
            raise AssertionError(f"expected one {'/'.join(names)} option with a value in {argv}")
        rebound[positions[0] + 1] = value
    return rebound


def test_entry_point_runs_the_cli(entrypoint, image_env, tmp_path):
    result = subprocess.run([*entrypoint, "kafscale-lakehouse", "--help"], env=image_env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert "segment" in result.stdout


def test_entry_point_runs_the_go_processors_chart_args_as_the_ingest_loop(entrypoint, image_env, tmp_path):
    # KafScale's iceberg-processor chart starts its image with `args: ["-config={{ .Values.config.path }}"]` only.
    config = tmp_path / "config" / "config.yaml"
    result = subprocess.run([*entrypoint, f"-config={config}"], env=image_env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)

    assert result.returncode == 2, result.stderr  # the CLI's one-line error: the ingest loop loaded that file
    assert str(config) in result.stderr


def test_code_server_starts_from_the_image_command_and_from_the_chart(entrypoint, dockerfile, image_env, tmp_path):
    deployment = size_values("small")[SUBCHART_KEY]["deployments"][0]
    image_port, chart_port = free_ports(2)
    commands = {
        "image CMD": on_loopback([*entrypoint, *dockerfile.exec_form("CMD")], image_port),
        "chart args": on_loopback([*entrypoint, *CHART_GRPC_ARGS, str(deployment["port"]),
                                   *deployment["dagsterApiGrpcArgs"]], chart_port),
    }
    ports = {"image CMD": image_port, "chart args": chart_port}
    servers = {}
    try:
        for name, argv in commands.items():
            label = name.replace(" ", "-")
            # Each server its own instance directory: two creating one sqlite instance at once collide.
            dagster_home = tmp_path / f"dagster_home-{label}"
            dagster_home.mkdir()
            log = (tmp_path / f"{label}.log").open("w")
            servers[name] = (subprocess.Popen(argv, env=dict(image_env, DAGSTER_HOME=str(dagster_home)), cwd=tmp_path,
                                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log)
        for name, (server, log) in servers.items():
            client = DagsterGrpcClient(port=ports[name], host="127.0.0.1")
            _wait_until_serving(client, server, Path(log.name))
            # What the chart's readiness and liveness probes run in the container.
            probe = subprocess.run(["dagster", "api", "grpc-health-check", "-p", str(ports[name]), "-h", "127.0.0.1"],
                                   env=image_env, capture_output=True, text=True, timeout=60)
            assert probe.returncode == 0, f"{name}: {probe.stdout}{probe.stderr}"
            repositories = client.list_repositories()
            assert not isinstance(repositories, SerializableErrorInfo), f"{name}: {repositories.to_string()}"
    finally:
        for server, log in servers.values():
            _stop(server)
            log.close()
    for name, (server, _log) in servers.items():
        # Kubernetes stops pods with SIGTERM; the server must end on it rather than wait for SIGKILL.
        assert server.returncode is not None and server.returncode != -signal.SIGKILL, name


def _wait_until_serving(client: DagsterGrpcClient, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the code server exited with {server.returncode}:\n{log.read_text()}")
        try:
            client.ping("ready?")
            return
        except Exception:
            time.sleep(0.3)
    raise AssertionError(f"the code server did not answer within {SERVER_START_TIMEOUT_SECONDS}s:\n{log.read_text()}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_executor_argument_starts_a_spark_executor_for_the_driver(entrypoint, image_env, tmp_path):
    # What Spark on Kubernetes passes to an executor pod. The driver address is a closed port, so the executor
    # must get as far as connecting to it, with its JVM options applied in Spark's (numeric) order.
    (closed_port,) = free_ports(1)
    driver_url = f"spark://CoarseGrainedScheduler@127.0.0.1:{closed_port}"
    env = dict(image_env, SPARK_DRIVER_URL=driver_url, SPARK_EXECUTOR_ID="1", SPARK_EXECUTOR_CORES="1",
               SPARK_EXECUTOR_MEMORY="512m", SPARK_APPLICATION_ID="spark-application-test",
               SPARK_EXECUTOR_POD_IP="127.0.0.1", SPARK_RESOURCE_PROFILE_ID="0", SPARK_EXECUTOR_POD_NAME="executor-1",
               SPARK_JAVA_OPT_0="-XshowSettings:properties", SPARK_JAVA_OPT_2="-Dkafscale.order=second",
               SPARK_JAVA_OPT_10="-Dkafscale.order=tenth")

    result = subprocess.run([*entrypoint, "executor"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)

    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "kafscale.order = tenth" in output  # SPARK_JAVA_OPT_10 comes after SPARK_JAVA_OPT_2
    assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in output
    assert f"Failed to connect to /127.0.0.1:{closed_port}" in output
    assert "ClassNotFoundException" not in output


def test_image_environment_matches_the_venv_layout(dockerfile, pyproject):
    env = dockerfile.env()
    venv = PurePosixPath(env["VIRTUAL_ENV"])

    assert env["PATH"].startswith(f"{venv}/bin:")
    assert PurePosixPath(env["PYSPARK_PYTHON"]) == venv / "bin" / "python"
    local_spark_home = Path(pyspark.__file__).parent.relative_to(sys.prefix)
    assert PurePosixPath(env["SPARK_HOME"]).relative_to(venv) == PurePosixPath(local_spark_home.as_posix())
    python_version = re.fullmatch(r"python:(\d+\.\d+)-slim-bookworm", dockerfile.base_image())
    assert python_version, f"base image {dockerfile.base_image()} is not Debian 12's Python"
    assert python_version.group(1) == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert pyproject["project"]["requires-python"] == f">={python_version.group(1)}"
    assert "openjdk-17-jre-headless" in " ".join(i.arguments for i in dockerfile.instructions if i.keyword == "RUN")


def test_image_runs_as_a_numeric_non_root_user(dockerfile):
    # Kubernetes can only enforce runAsNonRoot (common.yaml) for a numeric user.
    uid, _, gid = dockerfile.user().partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert not gid or gid.isdigit()


def test_image_installs_dagster_postgres_of_the_dagster_k8s_release_line(dockerfile, pyproject):
    # Run pods load the chart's instance, which keeps runs and events in PostgreSQL: the `k8s` extra brings it.
    installs = " ".join(instruction.arguments for instruction in dockerfile.instructions
                        if instruction.keyword == "RUN" and "pip install" in instruction.arguments)
    k8s_extra = pyproject["project"]["optional-dependencies"]["k8s"]
    postgres_range = next((spec for spec in k8s_extra if spec.startswith("dagster-postgres>=")), None)
    k8s_range = next(spec for spec in k8s_extra if spec.startswith("dagster-k8s>="))

    assert re.search(r"""pip install [^&]*["']?\.\[k8s[,a-z]*\]["']?""", installs), installs
    assert "dagster-postgres" not in installs, "declared once, in pyproject.toml's k8s extra"
    assert postgres_range and postgres_range.removeprefix("dagster-postgres") == k8s_range.removeprefix("dagster-k8s")


def test_build_context_holds_what_the_image_installs(dockerfile, pyproject, tmp_path):
    files = DockerIgnore(REPO_ROOT / ".dockerignore").context_files(REPO_ROOT)

    for source in dockerfile.copied_sources():
        assert source in files or any(f.startswith(source.rstrip("/") + "/") for f in files), source
    assert pyproject["project"]["readme"] in files
    assert not [f for f in files
                if f.startswith((".venv/", ".git/", "kafscale_lakehouse_tests/")) or "__pycache__" in f]
    # The context alone is enough for the code location and the console scripts.
    context = tmp_path / "context"
    for relative in files:
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / relative, context / relative)
    targets = [pyproject["tool"]["dagster"]["module_name"]] + [
        entry.split(":")[0] for entry in pyproject["project"]["scripts"].values()]
    probe = "import importlib, sys\n" + "".join(
        f"assert importlib.import_module({target!r}).__file__.startswith(sys.argv[1]), {target!r}\n"
        for target in targets)
    result = subprocess.run([sys.executable, "-c", probe, str(context)], cwd=context, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(context)}, timeout=120)
    assert result.returncode == 0, result.stderr
