"""Strangers that look up or open many topics: the ownership a LOOKUP takes of a topic not opened here is let go
after a while, not held for each name until the broker stops; one connection's opens of new topics go a few at a
time."""

from __future__ import annotations

import socket
import urllib.request
import uuid

import pytest

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from tests.integration.test_broker_client_features4 import wait_for
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.admin import AdminServer
from topic_broker.server import BrokerServer
from zk.client import MetadataStore

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand
OWNED = "ownership/public/default/persistent"
NAMES = 200


def _lookups(port: int, names: list[str]) -> list[pb.CommandLookupTopicResponse]:
    """One connection's CONNECT and a LOOKUP of each name, in one write; the answers, in order."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        cmds = [T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))]
        cmds += [
            T(
                type=T.LOOKUP,
                lookupTopic=pb.CommandLookupTopic(topic=f"persistent://public/default/{n}", request_id=i),
            )
            for i, n in enumerate(names)
        ]
        s.sendall(b"".join(wire.encode_command(c) for c in cmds))
        dec, answers = wire.FrameDecoder(), []
        while len(answers) < len(names):
            data = s.recv(1 << 16)
            assert data, "connection closed"
            answers += [
                f.command.lookupTopicResponse for f in dec.feed(data) if f.command.type == T.LOOKUP_RESPONSE
            ]
        return answers
    finally:
        s.close()


def test_the_ownership_a_lookup_took_of_a_topic_nobody_opens_is_let_go(cluster: Brokers) -> None:  # noqa: F811
    """200 random names looked up (binary) and one over HTTP, then a producer's topic: each lookup made the
    broker the owner (an ephemeral znode per name); past the hold those nobody opened are let go, the producer's
    stays (its topic is served) and it goes on sending. Before, every name kept its znode while the broker ran."""
    with (
        in_process_broker(cluster, tick_interval_s=1.0, lookup_ownership_hold_s=1.0) as (service, _run),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):
        server, admin = BrokerServer(service), AdminServer(service)
        _run(server.start())
        _run(admin.start())
        try:
            names = [f"flood-{uuid.uuid4().hex}" for _ in range(NAMES)]
            answers = _lookups(service.config.port, names)
            assert all(not a.HasField("error") for a in answers), answers[:1]
            http = f"flood-http-{uuid.uuid4().hex}"
            url = f"http://127.0.0.1:{service.config.http_port}/lookup/v2/topic/persistent/public/default/{http}"
            with urllib.request.urlopen(url, timeout=30) as r:
                assert r.status == 200
            client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}")
            try:
                producer = client.create_producer("persistent://public/default/flood-kept")
                producer.send(b"before")
                assert set(store.children(OWNED)) >= {*names, http, "flood-kept"}
                wait_for(
                    lambda: store.children(OWNED) == ["flood-kept"], "the unopened topics' ownership let go"
                )
                producer.send(b"after")
                assert store.children(OWNED) == ["flood-kept"]
            finally:
                client.close()
        finally:
            _run(admin.stop())
            _run(server.stop())


def test_one_connections_opens_of_new_topics_go_a_few_at_a_time(cluster: Brokers) -> None:  # noqa: F811
    """A connection that SUBSCRIBEs to 60 new topics at once has at most TOPIC_OPENS_PER_CONNECTION of them
    opening at a time (the others wait their turn), and another connection's open of a new topic is not queued
    behind them. Before, all 60 opened at once; with a thousand, their ZooKeeper and bookie requests, queued
    together, held another client's new producer 92 s (1.5 s now) on a throwaway cluster."""
    import asyncio

    from topic_broker.service import TOPIC_OPENS_PER_CONNECTION

    n = 60
    with in_process_broker(cluster) as (service, run):
        server = BrokerServer(service)
        run(server.start())

        async def gate() -> tuple[asyncio.Event, asyncio.AbstractEventLoop]:
            return asyncio.Event(), asyncio.get_running_loop()

        opened, loop = run(gate())
        opening, most = set(), [0]
        open_topic = service._open_topic

        async def held_open(name, known=None):  # type: ignore[no-untyped-def]
            if "flood-" not in str(name):
                return await open_topic(name, known)
            opening.add(str(name))
            most[0] = max(most[0], len(opening))
            try:
                await opened.wait()
                return await open_topic(name, known)
            finally:
                opening.discard(str(name))

        service._open_topic = held_open
        s = socket.create_connection(("127.0.0.1", service.config.port), timeout=60)
        try:
            cmds = [T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))]
            for i in range(n):
                sub = pb.CommandSubscribe(
                    topic=f"persistent://public/default/flood-{uuid.uuid4().hex}",
                    subscription="s",
                    subType=pb.CommandSubscribe.Shared,
                )
                sub.consumer_id = sub.request_id = i + 1
                cmds.append(T(type=T.SUBSCRIBE, subscribe=sub))
            s.sendall(b"".join(wire.encode_command(c) for c in cmds))
            wait_for(lambda: len(opening) >= TOPIC_OPENS_PER_CONNECTION, "the flood's opens to begin")
            client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}")
            try:  # another connection's new topic opens while the flood's wait
                client.create_producer(f"persistent://public/default/other-{uuid.uuid4().hex}").send(b"x")
            finally:
                client.close()
            assert most[0] == TOPIC_OPENS_PER_CONNECTION
            loop.call_soon_threadsafe(opened.set)
            dec, answers = wire.FrameDecoder(), []
            while len(answers) < n:
                data = s.recv(1 << 16)
                assert data, "connection closed"
                answers += [f.command for f in dec.feed(data) if f.command.type in (T.SUCCESS, T.ERROR)]
            assert [a.type for a in answers] == [T.SUCCESS] * n
            assert most[0] == TOPIC_OPENS_PER_CONNECTION
        finally:
            s.close()
            run(server.stop())
