"""The broker's TLS port as a Pulsar operator runs it: client certificates (``--tls-trust-certs``, Pulsar's
``AuthenticationTls``), a renewed certificate reloaded without a restart (``--tls-cert-refresh-check-s``) and https
on the admin port (``--admin-tls-port``), against the official ``pulsar-client``: real ZooKeeper, 3 bookies, broker
processes, certificates made with the ``openssl`` CLI."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bookie.auth import create_token, new_secret
from ledgerstore.cluster import BrokerProcess, free_port
from tests.broker_testing import Brokers, produce_consume
from tests.integration.test_broker_auth import SUPERUSER, SecureCluster
from tests.integration.test_broker_tls import (
    HANDSHAKE_FAILED,
    _client,
    _log,
    _log_once_said,
    _tls_broker,
    _topic,
)
from tests.tls_testing import needs_openssl, self_signed, signed_by

pulsar = pytest.importorskip("pulsar")
pytestmark = needs_openssl


def _secure_tls_broker(cluster: Brokers, tmp: Path, *extra: str) -> tuple[SecureCluster, str, Path]:
    """A broker with ``--auth-required`` (superuser: admin), a TLS port trusting ``ca.pem`` for client
    certificates; its pulsar+ssl:// URL and its certificate (the clients' trust file)."""
    cert, key = self_signed(tmp, "broker")
    secret = new_secret()
    secret_file = tmp / "secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    flags = ("--auth-secret-file", str(secret_file), "--auth-required", "--superuser-roles", SUPERUSER)
    bp, url = _tls_broker(cluster, cert, key, *flags, "--tls-trust-certs", str(tmp / "ca.pem"), *extra)
    tokens = {SUPERUSER: create_token(secret, SUPERUSER, expires_in_s=600)}
    return SecureCluster(bp, secret, tokens), url, cert


def _until(attempt: Any, timeout_s: float = 60.0) -> Any:
    """``attempt()``'s result once it raises no PulsarException (the broker's housekeeping runs every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attempt()
        except pulsar.PulsarException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_client_certificate_authenticates_by_its_cn(cluster: Brokers, tmp_path: Path) -> None:
    ca = self_signed(tmp_path, "ca")
    alice = pulsar.AuthenticationTLS(*(str(p) for p in signed_by(ca, tmp_path, "alice", "alice")))
    other_ca = self_signed(tmp_path, "other-ca")
    mallory = pulsar.AuthenticationTLS(*(str(p) for p in signed_by(other_ca, tmp_path, "mallory", "alice")))
    secure, url, broker_cert = _secure_tls_broker(cluster, tmp_path)
    topic = _topic()

    def client(auth: Any, at: str = url, trust: Path | None = broker_cert) -> Any:
        return _client(at, trust, authentication=auth, operation_timeout_seconds=8)

    c = client(alice)
    try:
        with pytest.raises(
            pulsar.AuthorizationError
        ):  # alice, authenticated by her certificate: no grant yet
            c.create_producer(topic)
        secure.grant("alice", ["produce", "consume"])
        assert produce_consume(c, topic) == [f"m-{i}".encode() for i in range(5)]
        status, _ = secure.http(
            "DELETE", "/admin/v2/namespaces/public/default/permissions/alice", token=secure.tokens[SUPERUSER]
        )
        assert status == 204
        with pytest.raises(pulsar.AuthorizationError):  # the grant revoked: no new producer
            c.create_producer(topic)
    finally:
        c.close()
    # a token on the same TLS port, with no client certificate (one is asked for, not required)
    c = client(pulsar.AuthenticationToken(secure.tokens[SUPERUSER]))
    try:
        assert produce_consume(c, _topic(), 2) == [b"m-0", b"m-1"]
    finally:
        c.close()
    # auth method tls where no certificate was verified: the plaintext port
    c = client(alice, secure.broker.service_url, None)
    try:
        with pytest.raises(pulsar.AuthenticationError):
            c.create_producer(topic)
    finally:
        c.close()
    # a certificate the trusted CA did not sign (its CN alice nonetheless): the handshake fails
    c = client(mallory)
    try:
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
            c.create_producer(topic)
    finally:
        c.close()
    log = _log_once_said(secure.broker, HANDSHAKE_FAILED)
    assert "client certificate" in log and "Traceback" not in log


def test_a_required_client_certificate_is_required(cluster: Brokers, tmp_path: Path) -> None:
    ca = self_signed(tmp_path, "ca")
    bob = pulsar.AuthenticationTLS(*(str(p) for p in signed_by(ca, tmp_path, "bob", SUPERUSER)))
    secure, url, broker_cert = _secure_tls_broker(cluster, tmp_path, "--tls-require-trusted-client-cert")
    c = _client(url, broker_cert, authentication=bob)
    try:  # the CN is a superuser's
        assert produce_consume(c, _topic(), 2) == [b"m-0", b"m-1"]
    finally:
        c.close()
    token = pulsar.AuthenticationToken(secure.tokens[SUPERUSER])
    c = _client(url, broker_cert, authentication=token, operation_timeout_seconds=5)
    try:  # a good token, no certificate: no handshake
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
            c.create_producer(_topic())
    finally:
        c.close()


def test_a_renewed_certificate_serves_new_connections_without_a_restart(
    cluster: Brokers, tmp_path: Path
) -> None:
    old_cert, old_key = self_signed(tmp_path, "old")
    served_cert, served_key = tmp_path / "broker.pem", tmp_path / "broker.key"
    shutil.copy(old_cert, served_cert)
    shutil.copy(old_key, served_key)
    bp, url = _tls_broker(cluster, served_cert, served_key, "--tls-cert-refresh-check-s", "0")
    first = _client(url, old_cert)
    try:
        topic = _topic()
        producer = first.create_producer(topic)
        producer.send(b"before")
        new_cert, new_key = self_signed(tmp_path, "new")
        # the key first: a check between the two sees a key of another certificate, logged and not taken
        shutil.copy(new_key, served_key)
        shutil.copy(new_cert, served_cert)
        second = _client(url, new_cert)
        try:  # a new connection gets the new certificate once the housekeeping has read it
            consumer = _until(
                lambda: second.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            )
            producer.send(b"after")  # the connection served before goes on
            assert [consumer.receive(timeout_millis=15_000).data() for _ in range(2)] == [b"before", b"after"]
        finally:
            second.close()
    finally:
        first.close()
    stale = _client(url, old_cert, operation_timeout_seconds=5)
    try:  # trusting only the old certificate, a new connection fails
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
            stale.create_producer(_topic())
    finally:
        stale.close()
    assert "TLS certificate reloaded" in _log(bp)
    # a broken file: logged, the certificate in use kept
    served_cert.write_text("not a certificate\n")
    log = _log_once_said(bp, "the certificate in use is kept")
    assert "the certificate in use is kept" in log and "Traceback" not in log
    c = _client(url, new_cert)
    try:
        assert produce_consume(c, _topic(), 2) == [b"m-0", b"m-1"]
    finally:
        c.close()


def test_the_admin_api_over_https_beside_plain_http(cluster: Brokers, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "broker")
    admin_tls_port = free_port()
    bp, _ = _tls_broker(cluster, cert, key, "--admin-tls-port", str(admin_tls_port))
    ctx = ssl.create_default_context(cafile=str(cert))
    tenants = f"https://127.0.0.1:{admin_tls_port}/admin/v2/tenants"
    with urllib.request.urlopen(tenants, timeout=15, context=ctx) as r:
        assert "public" in json.loads(r.read())
    req = urllib.request.Request(f"{tenants}/acme", data=b"{}", method="PUT")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=15, context=ctx) as r:
        assert r.status == 204
    with urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/admin/v2/tenants", timeout=15) as r:
        assert "acme" in json.loads(r.read())  # the plain port stays
    cluster_url = f"https://127.0.0.1:{admin_tls_port}/admin/v2/clusters/ledgerstore"
    with urllib.request.urlopen(cluster_url, timeout=15, context=ctx) as r:
        assert json.loads(r.read())["serviceUrlTls"] == f"https://127.0.0.1:{admin_tls_port}"
    with pytest.raises(urllib.error.URLError):  # a client that does not trust the certificate
        urllib.request.urlopen(tenants, timeout=15, context=ssl.create_default_context())


def test_serve_refuses_client_certificate_and_admin_tls_flags_that_do_not_fit(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "broker")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    tls = ("--tls-port", "28491", "--tls-cert", str(cert), "--tls-key", str(key))

    def serve(*flags: str) -> list[str]:  # ZooKeeper is never reached: the flags are checked first
        return BrokerProcess(zk="127.0.0.1:1", port=28490, http_port=28492, extra_args=list(flags)).command()

    cases = {
        ("--tls-trust-certs", str(cert)): "--tls-trust-certs needs --tls-port",
        ("--admin-tls-port", "28493"): "--admin-tls-port needs --tls-port",
        (*tls, "--tls-require-trusted-client-cert"): "needs --tls-trust-certs",
        (*tls, "--tls-trust-certs", str(not_pem)): "--tls-trust-certs",
        (*tls, "--tls-trust-certs", str(tmp_path / "gone.pem")): "does not load",
        (*tls, "--tls-cert-refresh-check-s", "-1"): "--tls-cert-refresh-check-s -1",
        (*tls, "--admin-tls-port", "28492"): "--admin-tls-port 28492",
    }
    for flags, said in cases.items():
        r = subprocess.run(serve(*flags), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (flags, r.stderr)
        assert said in r.stderr and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, (
            flags,
            r.stderr,
        )
