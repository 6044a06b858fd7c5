"""Admin calls a broker sends on to a topic's owner (a partitioned topic's partitions, a namespace's topics) on a
cluster of two brokers with ``--auth-required``: real ZooKeeper, 3 bookies, two broker processes, pulsar-client."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bookie.auth import create_token, new_secret
from tests.broker_testing import Brokers, in_process_broker, produce_consume, topic_opening_commands
from tests.integration.test_broker_admin11 import _https_broker
from tests.integration.test_broker_auth import SUPERUSER, SecureCluster
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_tls import _client
from tests.tls_testing import needs_openssl, self_signed
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.server import BrokerServer

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand


@pytest.fixture
def two_secured(bookies: Any, tmp_path: Path) -> Iterator[tuple[SecureCluster, SecureCluster]]:
    """Two brokers requiring tokens (superuser: admin) on 3 bookies, each as a :class:`SecureCluster`."""
    secret = new_secret()
    secret_file = tmp_path / "token-secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    bookies.start_many(3)
    brokers = Brokers(bookies, tmp_path)
    try:
        args = ("--auth-secret-file", str(secret_file), "--auth-required", "--superuser-roles", SUPERUSER)
        tokens = {SUPERUSER: create_token(secret, SUPERUSER, expires_in_s=3600)}
        a, b = brokers.start(*args), brokers.start(*args)
        yield SecureCluster(a, secret, tokens), SecureCluster(b, secret, tokens)
    finally:
        brokers.stop_all()


def test_calls_sent_on_to_another_owner_keep_their_token(
    two_secured: tuple[SecureCluster, SecureCluster],
) -> None:
    """A namespace's clearBacklog and unload, and a partitioned topic's skip_all, asked of broker A for topics
    broker B serves: each call A sends on is redirected to B and must reach it with the request's token (aiohttp
    drops the Authorization header on a redirect to another origin: they were 401 there)."""
    a, b = two_secured
    token = a.tokens[SUPERUSER]
    topic = f"persistent://public/default/owned-by-b-{uuid.uuid4().hex[:6]}"
    parted = f"persistent://public/default/parted-{uuid.uuid4().hex[:6]}"
    status, body = a.http(
        "PUT", f"/admin/v2/persistent/public/default/{parted.rsplit('/', 1)[1]}/partitions", 2, token
    )
    assert status == 204, body
    c = b.client(token)  # B looks the topics up, so B serves them
    try:
        for t in (topic, parted):
            consumer = c.subscribe(t, "s")
            producer = c.create_producer(t)
            for _ in range(3):
                producer.send(b"m")
            consumer.close()
            producer.close()
    finally:
        c.close()

    def backlog(t: str) -> int:
        status, stats = a.http(
            "GET", f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[1]}/stats", None, token
        )
        assert status == 200, stats
        return int(stats["subscriptions"]["s"]["msgBacklog"])

    assert backlog(topic) == 3
    status, body = a.http("POST", "/admin/v2/namespaces/public/default/clearBacklog/s", None, token)
    assert status == 204, body
    assert backlog(topic) == 0
    skip = f"/admin/v2/persistent/public/default/{parted.rsplit('/', 1)[1]}/subscription/s/skip_all"
    assert a.http("POST", skip, None, token)[0] == 204
    status, body = a.http("PUT", "/admin/v2/namespaces/public/default/unload", None, token)
    assert status == 204, body


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kw: Any) -> None:
        return None  # the 307 is raised as an HTTPError, its Location read by the test


@needs_openssl
def test_an_https_request_is_redirected_to_the_owners_https_url(cluster: Brokers, tmp_path: Path) -> None:
    """A call over https on a topic another broker serves is redirected to that broker's https URL, as Pulsar's
    validateTopicOwnership does (before: to its http one, where the request's token went in clear and a client
    certificate, the request's credential, is not asked for: 401 under --auth-required)."""
    cert, key = self_signed(tmp_path, "broker")
    owner, _owner_tls, owner_https = _https_broker(cluster, cert, key)
    _other, _other_tls, other_https = _https_broker(cluster, cert, key)
    topic = f"persistent://public/default/https-{uuid.uuid4().hex[:6]}"
    c = _client(owner_https, cert)  # its lookup on `owner` makes it the owner
    try:
        assert produce_consume(c, topic, 2) == [b"m-0", b"m-1"]
    finally:
        c.close()
    path = f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/stats"
    opener = urllib.request.build_opener(
        _NoRedirect, urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(cert)))
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        opener.open(other_https + path, timeout=15)
    assert e.value.code == 307
    assert e.value.headers["Location"] == owner_https + path
    # over http the owner's http URL, as before
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.build_opener(_NoRedirect).open(
            f"http://127.0.0.1:{_other.http_port}{path}", timeout=15
        )
    assert e.value.headers["Location"] == f"http://127.0.0.1:{owner.http_port}{path}"


def test_a_closed_connections_queued_topic_opens_are_not_run(cluster: Brokers) -> None:
    """A connection that opens 40 new topics (PRODUCERs) and goes: the 16 opens under way finish, the 24 waiting
    their turn (TOPIC_OPENS_PER_CONNECTION) are dropped, not run one batch after another for nobody (before:
    all 40 opened, each topic's managed ledger and a ledger made; a flood of 100,000 then gone kept the broker
    opening topics for hours)."""
    import asyncio

    from topic_broker.service import TOPIC_OPENS_PER_CONNECTION

    n, began = 40, []

    async def on_loop() -> tuple[asyncio.Event, asyncio.AbstractEventLoop, BrokerServer]:
        return asyncio.Event(), asyncio.get_running_loop(), BrokerServer(service)

    with in_process_broker(cluster) as (service, run):
        opened, loop, server = run(on_loop())
        run(server.start())
        open_topic = service._open_topic

        async def held_open(name: Any, known: Any = None) -> Any:
            began.append(str(name))
            await opened.wait()
            return await open_topic(name, known)

        service._open_topic = held_open
        try:
            s = socket.create_connection(("127.0.0.1", service.config.port), timeout=60)
            cmds = [T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))]
            for i in range(n):  # a PRODUCER of each (its open goes through the same turns as a SUBSCRIBE's)
                producer = topic_opening_commands(f"persistent://public/default/gone-{uuid.uuid4().hex}")[2]
                producer.producer.producer_id = producer.producer.request_id = i + 1
                cmds.append(producer)
            s.sendall(b"".join(wire.encode_command(c) for c in cmds))
            wait_for(lambda: len(began) >= TOPIC_OPENS_PER_CONNECTION, "the first opens to begin")
            s.close()
            wait_for(lambda: not service.sessions, "the broker to see the connection closed")
            loop.call_soon_threadsafe(opened.set)
            wait_for(lambda: not service._tasks, "the connection's PRODUCERs to end")
            assert len(began) == TOPIC_OPENS_PER_CONNECTION
        finally:
            run(server.stop())
