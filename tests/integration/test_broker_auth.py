"""Token authentication and namespace permissions on the topic broker, against the official ``pulsar-client``:
real ZooKeeper, 3 bookies that require tokens, a broker that requires them too and writes its ledgers with one."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bookie.auth import create_token, new_secret
from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import produce_consume, start_broker, topic_opening_commands

pulsar = pytest.importorskip("pulsar")

SUPERUSER = "admin"


@dataclass
class SecureCluster:
    broker: BrokerProcess
    secret: bytes
    tokens: dict[str, str]

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.broker.http_port}"

    def client(self, token: str | None, url: str | None = None, **kw: Any) -> Any:
        kw.setdefault("operation_timeout_seconds", 10)
        if token is not None:
            kw["authentication"] = pulsar.AuthenticationToken(token)
        return pulsar.Client(
            url or self.broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **kw
        )

    def http(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.http_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                text = r.read().decode()
                return r.status, (json.loads(text) if text.strip().startswith(("{", "[")) else text)
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            return e.code, (json.loads(text) if text.startswith("{") else text)

    def grant(self, role: str, actions: list[str], ns: str = "public/default") -> None:
        status, body = self.http(
            "POST", f"/admin/v2/namespaces/{ns}/permissions/{role}", actions, self.tokens[SUPERUSER]
        )
        assert status == 204, body


def _write_secret(path: Path, secret: bytes) -> Path:
    path.write_bytes(secret)
    path.chmod(0o600)
    return path


def secure_cluster(
    bookies: Any, tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[SecureCluster]:
    """3 bookies and a broker with ``--auth-required`` (superusers: admin and ops), ``env`` added to the broker's
    environment; tokens for the superuser, alice and bob. Stopped at the end."""
    secret = new_secret()
    secret_file = _write_secret(tmp_path / "token-secret", secret)
    tokens = {name: create_token(secret, name, expires_in_s=3600) for name in (SUPERUSER, "alice", "bob")}
    broker_token = tmp_path / "broker.token"
    broker_token.write_text(create_token(secret, "broker"))
    bookies.start_many(3, "--auth-secret-file", str(secret_file), "--auth-required")
    bp = start_broker(
        bookies,
        tmp_path,
        4,
        "--auth-secret-file",
        str(secret_file),
        "--auth-required",
        "--superuser-roles",
        f"{SUPERUSER},ops",
        "--bookie-auth-token-file",
        str(broker_token),
        env=env,
    )
    bp.wait_ready(60)
    try:
        yield SecureCluster(bp, secret, tokens)
    finally:
        try:
            bp.stop()
        except Exception:
            bp.kill9()


@pytest.fixture
def secure(bookies, tmp_path: Path) -> Iterator[SecureCluster]:
    yield from secure_cluster(bookies, tmp_path)


def _topic() -> str:
    return f"persistent://public/default/auth-{uuid.uuid4().hex[:8]}"


def test_tokens_authenticate_and_permissions_authorize(secure: SecureCluster) -> None:
    topic = _topic()
    # the superuser needs no grant; its ledgers reach bookies that require a token (the broker's own)
    c = secure.client(secure.tokens[SUPERUSER])
    try:
        assert produce_consume(c, topic) == [f"m-{i}".encode() for i in range(5)]
    finally:
        c.close()

    # alice and bob: nothing granted yet
    alice = secure.client(secure.tokens["alice"])
    bob = secure.client(secure.tokens["bob"])
    try:
        with pytest.raises(pulsar.AuthorizationError):
            alice.create_producer(topic)
        with pytest.raises(pulsar.AuthorizationError):
            bob.subscribe(topic, "s")

        secure.grant("alice", ["produce", "consume"])
        secure.grant("bob", ["consume"])
        status, perms = secure.http("GET", "/admin/v2/namespaces/public/default/permissions")
        assert status == 200 and perms == {"alice": ["consume", "produce"], "bob": ["consume"]}

        assert len(produce_consume(alice, topic, 3)) == 3
        consumer = bob.subscribe(topic, "bob-sub", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=10_000).data() == b"m-0"
        consumer.close()
        with pytest.raises(pulsar.AuthorizationError):
            bob.create_producer(topic)

        # revoked: bob may consume no more
        status, body = secure.http(
            "DELETE", "/admin/v2/namespaces/public/default/permissions/bob", token=secure.tokens[SUPERUSER]
        )
        assert status == 204, body
        with pytest.raises(pulsar.AuthorizationError):
            bob.subscribe(topic, "bob-sub-2")
        # another namespace: alice's grant does not reach it
        status, body = secure.http("PUT", "/admin/v2/namespaces/public/other", token=secure.tokens[SUPERUSER])
        assert status == 204, body
        with pytest.raises(pulsar.AuthorizationError):
            alice.create_producer(f"persistent://public/other/t-{uuid.uuid4().hex[:6]}")
    finally:
        alice.close()
        bob.close()

    # the HTTP lookup (pulsar.Client("http://…")) carries the token too
    h = secure.client(secure.tokens["alice"], url=secure.http_url)
    try:
        assert len(produce_consume(h, _topic(), 2)) == 2
    finally:
        h.close()
    status, _ = secure.http("GET", f"/lookup/v2/topic/persistent/public/default/{uuid.uuid4().hex[:6]}")
    assert status == 401
    status, _ = secure.http(
        "GET",
        f"/lookup/v2/topic/persistent/public/default/x{uuid.uuid4().hex[:6]}",
        token=secure.tokens["bob"],
    )
    assert status == 403


def test_bad_tokens_are_refused(secure: SecureCluster) -> None:
    topic = _topic()
    expired = create_token(secure.secret, "alice", expires_in_s=10, now=time.time() - 60)
    foreign = create_token(new_secret(), SUPERUSER)
    for token in (expired, foreign, None):
        c = secure.client(token, operation_timeout_seconds=5)
        try:
            started = time.monotonic()
            with pytest.raises(pulsar.AuthenticationError):
                c.create_producer(topic)
            assert time.monotonic() - started < 4  # at once, not after the operation timeout
            with pytest.raises(pulsar.AuthenticationError):
                c.subscribe(topic, "s")
        finally:
            c.close()
    log = (secure.broker.log_path or Path()).read_text()
    assert "expired" in log and "signature does not verify" in log


def test_admin_http_needs_a_token_to_change_anything(secure: SecureCluster) -> None:
    path = "/admin/v2/namespaces/public/default/permissions/carol"
    assert secure.http("POST", path, ["consume"])[0] == 401
    bad = create_token(new_secret(), SUPERUSER)
    assert secure.http("POST", path, ["consume"], token=bad)[0] == 401
    assert secure.http("POST", path, ["consume"], token=secure.tokens["alice"])[0] == 403
    assert secure.http("POST", path, ["teleport"], token=secure.tokens[SUPERUSER])[0] == 400
    assert secure.http("POST", path, ["consume"], token=secure.tokens[SUPERUSER])[0] == 204
    assert secure.http("PUT", "/admin/v2/tenants/t1")[0] == 401
    # reads stay open (no --admin-read-auth), as do /health and /metrics
    assert secure.http("GET", "/admin/v2/namespaces/public/default/permissions")[1] == {"carol": ["consume"]}
    assert secure.http("GET", "/health")[0] == 200
    assert secure.http("GET", "/admin/v2/brokers/ready")[0] == 200
    status, text = secure.http("GET", "/metrics")
    assert status == 200 and "pulsar_broker_auth_failures_total" in text


def test_an_expiring_token_is_refreshed_through_auth_challenge_and_a_stale_one_ends_the_connection(
    secure: SecureCluster,
) -> None:
    """Pulsar's token refresh with the official client: once a connection's token expires the broker sends
    AUTH_CHALLENGE; a client whose token supplier hands out fresh tokens keeps its connection and its producer
    (no close for expiry in the broker's log); one that can only repeat its expired token is disconnected and
    cannot reconnect with it."""
    log_path = secure.broker.log_path or Path()
    topic = _topic()
    issued: list[str] = []

    def fresh() -> str:
        issued.append(create_token(secure.secret, SUPERUSER, expires_in_s=2))
        return issued[-1]

    c = pulsar.Client(
        secure.broker.service_url,
        authentication=pulsar.AuthenticationToken(fresh),
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic)
        sent = []
        deadline = time.monotonic() + 7  # a few expiries at the broker's 1 s check
        while time.monotonic() < deadline:
            sent.append(f"m-{len(sent)}".encode())
            producer.send(sent[-1])
            time.sleep(0.1)
        got = []
        for _ in sent:
            m = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(m)
            got.append(m.data())
        assert got == sent
    finally:
        c.close()
    assert len(issued) >= 3, issued  # asked again at each challenge
    log = log_path.read_text()
    assert "no fresh one came in time" not in log and "authentication refresh failed" not in log

    stale = create_token(secure.secret, SUPERUSER, expires_in_s=2)
    c = secure.client(stale, operation_timeout_seconds=5)
    try:
        producer = c.create_producer(_topic(), send_timeout_millis=4000)
        producer.send(b"before expiry")
        time.sleep(4)  # expired, challenged, the same token sent back: disconnected
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after expiry")
    finally:
        c.close()
    assert "authentication refresh failed" in log_path.read_text()


def _commands_answered(secure: SecureCluster, token: str, topic: str) -> dict[str, tuple[int, str]]:
    """The broker's error code and text for each of PARTITIONED_METADATA, LOOKUP, PRODUCER and SUBSCRIBE of
    ``topic`` sent on one connection authenticated with ``token`` (no client in between, which would stop at the
    first refusal)."""
    import socket

    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire

    T = pb.BaseCommand
    commands = topic_opening_commands(topic)
    s = socket.create_connection(("127.0.0.1", secure.broker.port), timeout=10)
    got: list[Any] = []
    try:
        connect = pb.CommandConnect(
            client_version="t", protocol_version=20, auth_method_name="token", auth_data=token.encode()
        )
        s.sendall(wire.encode_command(T(type=T.CONNECT, connect=connect)))
        dec = wire.FrameDecoder()
        frames = dec.feed(s.recv(65536))
        assert frames[0].command.type == T.CONNECTED, frames[0].command
        s.sendall(b"".join(wire.encode_command(c) for c in commands))
        while len(got) < 4:
            data = s.recv(65536)
            assert data, "the broker closed the connection"
            got += [f.command for f in dec.feed(data)]
    finally:
        s.close()
    out: dict[str, tuple[int, str]] = {}
    for c in got:
        if c.type == T.PARTITIONED_METADATA_RESPONSE:
            out["partitioned metadata"] = (
                c.partitionMetadataResponse.error,
                c.partitionMetadataResponse.message,
            )
        elif c.type == T.LOOKUP_RESPONSE:
            out["lookup"] = (c.lookupTopicResponse.error, c.lookupTopicResponse.message)
        elif c.type == T.ERROR:
            out[{3: "producer", 4: "subscribe"}[c.error.request_id]] = (c.error.error, c.error.message)
    return out


def test_a_role_without_permission_learns_nothing_of_which_namespaces_exist(secure: SecureCluster) -> None:
    """As Pulsar, the role is authorized before the namespace is looked for: a role refused in an existing
    namespace is refused in the same words in one that does not exist (it was told TopicNotFound "Namespace not
    found" there, by the lookups since namespaces were enforced and by PRODUCER and SUBSCRIBE since 4248f36; the
    HTTP lookup 404), so it cannot probe for namespaces; a superuser is told the namespace is missing."""
    from topic_broker import pulsar_api_pb2 as pb

    ns = f"ns-{uuid.uuid4().hex[:8]}"
    missing, existing = f"persistent://public/{ns}/t", _topic()
    alice = secure.tokens["alice"]
    for topic in (missing, existing):
        status, why = secure.http("GET", "/lookup/v2/topic/" + topic.replace("://", "/"), None, alice)
        assert (status, why) == (403, {"reason": f"alice is not authorized to produce or consume on {topic}"})
        answers = _commands_answered(secure, alice, topic)
        assert answers == {
            what: (pb.AuthorizationError, f"alice is not authorized to {actions} on {topic}")
            for what, actions in (
                ("partitioned metadata", "produce or consume"),
                ("lookup", "produce or consume"),
                ("producer", "produce"),
                ("subscribe", "consume"),
            )
        }, topic
    client = secure.client(alice)
    try:  # the client raises what the first answer said
        for call in (client.create_producer, client.subscribe):
            with pytest.raises(pulsar.AuthorizationError):
                call(missing, *(("s",) if call == client.subscribe else ()))
    finally:
        client.close()
    lookup = "/lookup/v2/topic/" + missing.replace("://", "/")
    assert secure.http("GET", lookup, None, secure.tokens[SUPERUSER]) == (
        404,
        {"reason": "Namespace not found"},
    )
    answers = _commands_answered(secure, secure.tokens[SUPERUSER], missing)
    assert answers == dict.fromkeys(
        ("partitioned metadata", "lookup", "producer", "subscribe"), (pb.TopicNotFound, "Namespace not found")
    )


def test_messages_over_http_need_the_consume_permission(secure: SecureCluster) -> None:
    """examinemessage, a message by id and a subscription's peek answer payloads: they need a token and the
    ``consume`` permission even where other admin reads are open (no --admin-read-auth), or a stranger reaching
    the HTTP port would read what it may not subscribe to."""
    admin = secure.tokens[SUPERUSER]
    ns = f"public/pay-{uuid.uuid4().hex[:8]}"
    assert secure.http("PUT", f"/admin/v2/namespaces/{ns}", token=admin)[0] == 204
    secure.grant("alice", ["consume"], ns)
    topic = f"persistent://{ns}/t"
    c = secure.client(admin)
    try:
        c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest).close()
        mid = c.create_producer(topic).send(b"secret-0")
    finally:
        c.close()
    base = f"/admin/v2/persistent/{ns}/t"
    paths = (
        base + "/examinemessage?initialPosition=earliest&messagePosition=1",
        base + f"/ledger/{mid.ledger_id()}/entry/{mid.entry_id()}",
        base + "/subscription/s/position/1",
    )
    for path in paths:
        assert secure.http("GET", path)[0] == 401, path
        status, why = secure.http("GET", path, token=secure.tokens["bob"])
        assert (status, why) == (403, {"reason": f"bob is not authorized to consume from {topic}"}), path
        for token in (secure.tokens["alice"], admin):
            status, body = secure.http("GET", path, token=token)
            assert (status, body) == (200, "secret-0"), path
    # the other reads stay open
    assert secure.http("GET", base + "/stats")[0] == 200
