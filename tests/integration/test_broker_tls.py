"""The broker's TLS port (``broker serve --tls-port --tls-cert --tls-key``) against the official ``pulsar-client``
over ``pulsar+ssl://``: real ZooKeeper, 3 bookies, broker processes, certificates made with the ``openssl`` CLI."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from bookie.auth import create_token, new_secret
from ledgerstore.cluster import BrokerProcess, free_port
from tests.broker_testing import Brokers, produce_consume
from tests.tls_testing import needs_openssl, self_signed
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")
pytestmark = needs_openssl


def _tls_broker(cluster: Brokers, cert: Path, key: Path, *extra: str) -> tuple[BrokerProcess, str]:
    """A broker serving its plaintext port and a TLS port; its pulsar+ssl:// URL."""
    port = free_port()
    bp = cluster.start("--tls-port", str(port), "--tls-cert", str(cert), "--tls-key", str(key), *extra)
    return bp, f"pulsar+ssl://127.0.0.1:{port}"


def _client(url: str, ca: Path | None, **kw: Any) -> Any:
    kw.setdefault("operation_timeout_seconds", 15)
    if ca is not None:
        kw["tls_trust_certs_file_path"] = str(ca)
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **kw)


def _topic() -> str:
    return f"persistent://public/default/tls-{uuid.uuid4().hex[:8]}"


HANDSHAKE_FAILED = "closed before its TLS handshake completed"


def _log(bp: BrokerProcess) -> str:
    assert bp.log_path is not None
    return bp.log_path.read_text(errors="replace")


def _log_once_said(bp: BrokerProcess, text: str, timeout_s: float = 30.0) -> str:
    """The broker's log once it says ``text`` (the broker sees a failed handshake after the client does)."""
    deadline = time.monotonic() + timeout_s
    while text not in (log := _log(bp)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return log


def test_round_trip_over_tls_with_a_token(cluster: Brokers, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "broker")
    secret = new_secret()
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    flags = ("--auth-secret-file", str(secret_file), "--auth-required", "--superuser-roles", "admin")
    bp, tls_url = _tls_broker(cluster, cert, key, *flags)
    token = pulsar.AuthenticationToken(create_token(secret, "admin", expires_in_s=600))
    c = _client(tls_url, cert, authentication=token)
    try:
        assert produce_consume(c, _topic()) == [f"m-{i}".encode() for i in range(5)]
    finally:
        c.close()
    # the same authentication over TLS: no token, no connection
    c = _client(tls_url, cert, operation_timeout_seconds=5)
    try:
        with pytest.raises(pulsar.AuthenticationError):
            c.create_producer(_topic())
    finally:
        c.close()
    # the plaintext port stays, as in Pulsar
    c = _client(bp.service_url, None, authentication=token)
    try:
        assert produce_consume(c, _topic(), 2) == [b"m-0", b"m-1"]
    finally:
        c.close()


def test_a_lookup_on_another_broker_sends_a_tls_client_to_the_owners_tls_port(
    cluster: Brokers, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "broker")
    owner, owner_tls = _tls_broker(cluster, cert, key)
    other, other_tls = _tls_broker(cluster, cert, key)
    topic = _topic()
    first = _client(owner_tls, cert)  # the first lookup, on `owner`, makes it the owner
    try:
        producer = first.create_producer(topic)
        producer.send(b"before")
        url = f"http://127.0.0.1:{other.http_port}/lookup/v2/topic/persistent/public/default/{topic.rsplit('/')[-1]}"
        with urllib.request.urlopen(url, timeout=15) as r:
            looked_up = json.loads(r.read())
        assert (looked_up["brokerUrl"], looked_up["brokerUrlTls"]) == (owner.service_url, owner_tls)
        # a client that knows only `other` over TLS is sent to the owner's TLS port, and works there
        second = _client(other_tls, cert)
        try:
            consumer = second.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer.send(b"after")
            got = [consumer.receive(timeout_millis=15_000).data() for _ in range(2)]
            assert got == [b"before", b"after"]
        finally:
            second.close()
    finally:
        first.close()
    # the owner of a topic without a TLS port: a TLS client is refused, never sent to its plaintext port
    plain = cluster.start()
    kept = _topic()
    c = _client(plain.service_url, None)
    try:
        c.create_producer(kept)
        tls = _client(other_tls, cert, operation_timeout_seconds=5)
        try:
            with pytest.raises(pulsar.PulsarException):
                tls.create_producer(kept)
        finally:
            tls.close()
    finally:
        c.close()


def test_a_client_trusting_another_ca_fails_without_hanging(cluster: Brokers, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "broker")
    other_ca, _ = self_signed(tmp_path, "other")
    bp, tls_url = _tls_broker(cluster, cert, key)
    c = _client(tls_url, other_ca, operation_timeout_seconds=5)
    try:
        started = time.monotonic()
        with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
            c.create_producer(_topic())
        assert time.monotonic() - started < 60  # its operation timeout is 5 s; a hang would be cut by pytest
    finally:
        c.close()
    log = _log_once_said(bp, HANDSHAKE_FAILED)
    assert HANDSHAKE_FAILED in log and "Traceback" not in log


def test_a_plaintext_client_on_the_tls_port_is_closed_and_disturbs_no_tls_client(
    cluster: Brokers, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "broker")
    bp, tls_url = _tls_broker(cluster, cert, key)
    port = int(tls_url.rsplit(":", 1)[1])
    c = _client(tls_url, cert)
    try:
        topic = _topic()
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic)
        producer.send(b"m-0")
        connect = wire.encode_command(
            pb.BaseCommand(
                type=pb.BaseCommand.CONNECT,
                connect=pb.CommandConnect(client_version="t", protocol_version=20),
            )
        )
        for _ in range(5):  # a Pulsar CONNECT in clear: no CONNECTED comes back, the connection is closed
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(connect)
                answer = b""
                try:
                    while chunk := s.recv(4096):  # until the broker closes it (a timeout fails the test)
                        answer += chunk
                except ConnectionResetError:
                    pass
                assert answer[:1] in (b"", b"\x15")  # nothing, or a TLS alert record: never a CONNECTED
        # the official client over plaintext on the TLS port fails
        plain = _client(f"pulsar://127.0.0.1:{port}", None, operation_timeout_seconds=5)
        try:
            with pytest.raises(pulsar.PulsarException):
                plain.create_producer(_topic())
        finally:
            plain.close()
        producer.send(b"m-1")
        got = [consumer.receive(timeout_millis=15_000).data() for _ in range(2)]
        assert got == [b"m-0", b"m-1"]
    finally:
        c.close()
    log = _log_once_said(bp, HANDSHAKE_FAILED)
    assert "Traceback" not in log
    # six failed handshakes in a few seconds: said once (at most once per 10 s), not six times
    assert 1 <= log.count(HANDSHAKE_FAILED) < 6


def test_serve_refuses_a_tls_port_without_a_certificate_that_loads(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "broker")
    other_cert, _ = self_signed(tmp_path, "other")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")

    def serve(*flags: str) -> list[str]:  # ZooKeeper is never reached: the flags are checked first
        return BrokerProcess(zk="127.0.0.1:1", port=28490, http_port=28492, extra_args=list(flags)).command()

    cases = {
        ("--tls-port", "28491"): "--tls-port 28491 needs --tls-cert and --tls-key",
        ("--tls-port", "28491", "--tls-cert", str(cert)): "needs --tls-cert and --tls-key",
        ("--tls-cert", str(cert), "--tls-key", str(key)): "--tls-cert and --tls-key need --tls-port",
        ("--tls-port", "28491", "--tls-cert", str(not_pem), "--tls-key", str(key)): "do not load",
        ("--tls-port", "28491", "--tls-cert", str(other_cert), "--tls-key", str(key)): "do not load",
        (
            "--tls-port",
            "28491",
            "--tls-cert",
            str(tmp_path / "gone.pem"),
            "--tls-key",
            str(key),
        ): "do not load",
    }
    for flags, said in cases.items():
        r = subprocess.run(serve(*flags), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (flags, r.stderr)
        assert said in r.stderr and "Traceback" not in r.stderr, (flags, r.stderr)
