"""Strangers that look up topics nobody opens: the ownership a LOOKUP takes of a topic not opened here is let go
after a while, not held for each name until the broker stops."""

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
