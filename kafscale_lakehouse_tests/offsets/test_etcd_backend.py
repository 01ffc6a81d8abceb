"""etcd-only behaviour: endpoints, unreachable etcd, a crash and restart of etcd, authentication."""

from __future__ import annotations

import logging
import ssl
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config
from kafscale_lakehouse.connections import etcd_client_from_config
from kafscale_lakehouse.etcd import EtcdAuthError, EtcdClient, EtcdUnavailableError
from kafscale_lakehouse.offsets import EtcdOffsetStore
from kafscale_lakehouse_tests.support.leases import held_leases
from kafscale_lakehouse_tests.support.servers import Etcd, free_ports

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("endpoint", ["{host}:{port}", "http://{host}:{port}", "http://{host}:{port}/"])
def test_endpoint_forms_are_accepted(etcd_server, endpoint, unique_prefix):
    host, port = etcd_server.endpoint.split(":")
    with EtcdClient([endpoint.format(host=host, port=port)]) as client:
        client.put(f"{unique_prefix}/k", b"v")
        assert client.get(f"{unique_prefix}/k") == b"v"
        assert client.endpoints == [f"http://{etcd_server.endpoint}"]


@pytest.mark.parametrize(("endpoints", "message"), [
    ([], "non-empty list"),
    (["ftp://h:1"], "scheme 'ftp'"),
    (["h"], "not host:port"),
    (["http://a:1", "https://b:2"], "mixes http and https"),
])
def test_bad_endpoints_are_config_errors_naming_the_key(endpoints, message):
    with pytest.raises(ValueError, match=f"^endpoints: .*{message}"):
        EtcdClient(endpoints)
    if endpoints:  # (without endpoints the config layer says they are required)
        config = parse_config({"iceberg": {"catalog": {"type": "rest", "uri": "http://127.0.0.1:1"}},
                               "offsets": {"backend": "local", "local_path": "offsets.db"}, "s3": {"bucket": "b"},
                               "etcd": {"endpoints": endpoints}})
        with pytest.raises(ConfigError, match=f"etcd.endpoints: .*{message}"):  # the config layer names the key
            etcd_client_from_config(config)


def test_unreachable_etcd_raises_naming_the_endpoint_after_bounded_retries():
    (port,) = free_ports(1)
    store = EtcdOffsetStore(EtcdClient([f"127.0.0.1:{port}"], timeout_seconds=1, retry_seconds=1.5), key_prefix="p")
    started = time.monotonic()
    with pytest.raises(EtcdUnavailableError, match=rf"etcd unreachable at http://127\.0\.0\.1:{port}") as raised:
        store.committed_offsets("orders")
    assert 1.0 <= time.monotonic() - started < 5
    assert raised.value.endpoints == [f"http://127.0.0.1:{port}"]
    with pytest.raises(EtcdUnavailableError):
        store.acquire_lease("orders", 0, "worker-a")


def test_second_endpoint_is_used_when_the_first_is_down(etcd_server, unique_prefix):
    (dead_port,) = free_ports(1)
    with EtcdClient([f"127.0.0.1:{dead_port}", etcd_server.endpoint], retry_seconds=10) as client:
        for i in range(3):
            client.put(f"{unique_prefix}/k{i}", b"v")
        assert [entry.key for entry in client.get_prefix(f"{unique_prefix}/")] == [
            f"{unique_prefix}/k0", f"{unique_prefix}/k1", f"{unique_prefix}/k2"]


def test_etcd_killed_and_restarted_mid_use_recovers_with_data_intact(tmp_path, caplog):
    server = Etcd(tmp_path).start()
    try:
        store = EtcdOffsetStore(EtcdClient([server.endpoint], timeout_seconds=2, retry_seconds=20),
                                key_prefix="processors", lease_ttl_seconds=10)
        with held_leases(store, "orders", [0, 1], "worker-a") as leases:
            store.commit_offsets(leases.values(), {0: (101, 1000), 1: (201, 2000)})
            committed = store.committed_offsets("orders")

            server.kill()  # SIGKILL: no clean shutdown
            outcome: list[object] = []

            def commit_while_down() -> None:
                try:
                    store.commit_offsets(leases.values(), {0: (151, 1500)})
                    outcome.append("ok")
                except BaseException as exc:
                    outcome.append(exc)

            with caplog.at_level(logging.WARNING, logger="kafscale_lakehouse.etcd.client"):
                writer = threading.Thread(target=commit_while_down)
                writer.start()
                time.sleep(1.5)
                assert writer.is_alive(), f"commit did not wait for etcd: {outcome}"
                server.start()  # same data dir and port
                writer.join(30)
            assert outcome == ["ok"]
            assert any("unavailable" in record.message for record in caplog.records)

            after = store.committed_offsets("orders")
            assert after[1] == committed[1]
            assert (after[0].offset, after[0].last_timestamp_ms) == (150, 1500)
            assert not any(lease.lost for lease in leases.values())
        assert EtcdClient([server.endpoint]).get("processors/leases/orders/0") is None  # released after restart
    finally:
        server.stop()


def test_authentication(tmp_path):
    server = Etcd(tmp_path).start()
    try:
        server.enable_auth("lakehouse", "s3cret-pass")
        client = EtcdClient([server.endpoint], username="lakehouse", password="s3cret-pass")
        assert "s3cret-pass" not in repr(client)
        store = EtcdOffsetStore(client, key_prefix="processors")
        with store.acquire_lease("orders", 0, "worker-a") as lease:
            store.commit_offsets([lease], {0: (6, 50)})
        assert store.committed_offset("orders", 0).offset == 5

        with pytest.raises(EtcdAuthError, match="authentication failed for user 'lakehouse'") as raised:
            EtcdClient([server.endpoint], username="lakehouse", password="wrong-pass").get("processors/x")
        assert "wrong-pass" not in str(raised.value) and server.endpoint in str(raised.value)

        with pytest.raises(EtcdAuthError, match="requires authentication but no username/password are set"):
            EtcdClient([server.endpoint]).get("processors/x")

        # etcd's auth tokens do not survive a restart: the client logs in again by itself.
        server.kill()
        server.start()
        assert store.committed_offset("orders", 0).offset == 5
    finally:
        server.stop()


def _make_certificates(directory: Path) -> dict[str, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    files = {name: directory / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem",
                                                  "san.ext")}
    files["san.ext"].write_text("subjectAltName=IP:127.0.0.1\n")
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=lakehouse-test-ca",
         "-keyout", files["ca.key"], "-out", files["ca.pem"]],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", files["server.key"], "-out", files["server.csr"]],
        ["x509", "-req", "-days", "1", "-in", files["server.csr"], "-CA", files["ca.pem"], "-CAkey", files["ca.key"],
         "-CAcreateserial", "-extfile", files["san.ext"], "-out", files["server.pem"]],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return files


@dataclass
class TlsEtcd(Etcd):
    """etcd serving clients over https only (later flags override the helper's http URLs)."""

    ca_file: Path | None = None

    def _healthy(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(f"https://{self.endpoint}/health", timeout=1, context=context) as response:
            return b"true" in response.read()


def test_tls_with_a_private_ca(tmp_path):
    certs = _make_certificates(tmp_path)
    client_port, peer_port = free_ports(2)
    url = f"https://127.0.0.1:{client_port}"
    server = TlsEtcd(tmp_path / "etcd", client_port=client_port, peer_port=peer_port, ca_file=certs["ca.pem"],
                     extra_args=["--listen-client-urls", url, "--advertise-client-urls", url,
                                 "--cert-file", str(certs["server.pem"]), "--key-file", str(certs["server.key"])])
    server.start()
    try:
        store = EtcdOffsetStore(EtcdClient([url], ca_file=str(certs["ca.pem"])), key_prefix="processors")
        with store.acquire_lease("orders", 0, "worker-a") as lease:
            store.commit_offsets([lease], {0: (10, 90)})
        assert store.committed_offset("orders", 0).offset == 9

        with pytest.raises(EtcdUnavailableError, match=f"etcd unreachable at {url}"):
            # Without our CA the server certificate is not trusted: the handshake never succeeds.
            EtcdClient([url], retry_seconds=1).get("processors/x")
    finally:
        server.stop()


def test_missing_tls_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=f"ca_file: {tmp_path}/absent.pem cannot be read"):
        EtcdClient(["https://127.0.0.1:2379"], ca_file=str(tmp_path / "absent.pem"))
