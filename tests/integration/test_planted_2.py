"""Tests for the bugs planted in the audit of 2026-11-28 against b6de126 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the code since the earlier audits"): each fails with its
bug planted and passes without it. Real ZooKeeper, bookie and broker processes, the official ``pulsar-client``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from typing import Any

import pytest

from tests.broker_testing import Brokers
from tests.integration import test_broker_auth as auth
from tests.integration.test_broker_auth import SUPERUSER, SecureCluster
from tests.integration.test_broker_pulsar_client import client, drain, topic_name
from topic_broker import pulsar_api_pb2 as pb
from zk import MetadataStore
from zk.managed_ledgers import BrokerMetadataStore, SchemaHistory, SchemaInfo

pulsar = pytest.importorskip("pulsar")

secure = auth.secure  # a secured broker and 3 bookies (fixture)


def test_a_new_owner_after_a_crash_takes_a_batchs_last_sequence_id_as_the_producers_last(
    cluster: Brokers,
) -> None:
    """The C++-based clients send a batch with its first sequence id only: a new owner rebuilding dedup state
    from the entries (the old one killed before recording it) counts the batch's messages, so the producer is
    told the batch's last id and its messages sent again are dropped, not stored twice."""
    broker = cluster.start()
    t = topic_name()
    with contextlib.closing(client(broker)) as first:
        first.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        a = first.create_producer(
            t,
            producer_name="a",
            batching_enabled=True,
            batching_max_messages=5,
            batching_max_publish_delay_ms=60_000,
        )
        for i in range(5):  # one batch: sequence ids 0-4, sent when the fifth message fills it
            a.send_async(f"a{i}".encode(), None, sequence_id=i)
        a.flush()
    broker.kill9()  # before the owner records the producer's last sequence id
    broker.start()
    with contextlib.closing(client(broker)) as second:
        again = second.create_producer(t, producer_name="a", batching_enabled=False)
        assert again.last_sequence_id() == 4
        for seq in (2, 4, 5):  # 2 and 4 are resends of what is stored: dropped
            again.send(f"a{seq}".encode(), sequence_id=seq)
        reader = second.subscribe(t, "s")
        got = [m.data() for m in drain(reader, 6)]
        assert got == [b"a0", b"a1", b"a2", b"a3", b"a4", b"a5"]
        with pytest.raises(pulsar.Timeout):  # and nothing after them
            reader.receive(timeout_millis=500)


def test_a_schema_delete_that_read_the_history_before_another_ones_marker_writes_no_second_marker(
    zk_store: MetadataStore,
) -> None:
    """Two admins delete a topic's schema at once: the second one read the history before the first one's
    marker was written. Its compare-and-set sees the marker and writes nothing, so the versions after the
    delete go on from the first marker's number + 1 (not + 2)."""
    ml = "public/default/persistent/planted-schema-delete"

    async def go() -> list[SchemaInfo]:
        meta = BrokerMetadataStore(zk_store)
        await meta.add_schema(ml, SchemaInfo(type=pb.Schema.String, timestamp_ms=1))
        stale = await meta.get_schemas(ml)
        assert await meta.mark_schemas_deleted(ml, 2) == 1

        async def stale_read(_ml: str) -> SchemaHistory:
            return stale

        meta.get_schemas = stale_read  # type: ignore[method-assign]
        await meta.mark_schemas_deleted(ml, 3)
        assert await meta.add_schema(ml, SchemaInfo(type=pb.Schema.Json, data=b"{}", timestamp_ms=4)) == 2
        return list((await BrokerMetadataStore(zk_store).get_schemas(ml)).versions)

    versions = asyncio.run(go())
    assert [(v.type, v.deleted) for v in versions] == [
        (pb.Schema.String, False),
        (0, True),
        (pb.Schema.Json, False),
    ]


def _topics_of_namespace(cluster: SecureCluster, token: str, namespace: str) -> tuple[int, str] | list[str]:
    """GET_TOPICS_OF_NAMESPACE on a connection authenticated with ``token``: the error code and text, or the
    topics."""
    from topic_broker import wire

    T = pb.BaseCommand
    s = socket.create_connection(("127.0.0.1", cluster.broker.port), timeout=10)
    try:
        connect = pb.CommandConnect(
            client_version="t", protocol_version=20, auth_method_name="token", auth_data=token.encode()
        )
        s.sendall(wire.encode_command(T(type=T.CONNECT, connect=connect)))
        dec = wire.FrameDecoder()
        assert dec.feed(s.recv(65536))[0].command.type == T.CONNECTED
        get = pb.CommandGetTopicsOfNamespace(request_id=1, namespace=namespace)
        s.sendall(wire.encode_command(T(type=T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace=get)))
        got: list[Any] = []
        while not got:
            data = s.recv(65536)
            assert data, "the broker closed the connection"
            got += [f.command for f in dec.feed(data)]
    finally:
        s.close()
    if got[0].type == T.ERROR:
        return got[0].error.error, got[0].error.message
    assert got[0].type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE, got[0]
    return list(got[0].getTopicsOfNamespaceResponse.topics)


def test_a_role_without_a_grant_cannot_list_a_namespaces_topics(secure: SecureCluster) -> None:
    """With --auth-required, GET_TOPICS_OF_NAMESPACE (what a client's pattern subscription asks first) is
    authorized as a lookup is: a role with neither produce nor consume on the namespace is refused and learns
    no topic name; once granted consume it gets the list."""
    topic = f"persistent://public/default/planted-{uuid.uuid4().hex[:8]}"
    admin = secure.client(secure.tokens[SUPERUSER])
    try:
        admin.create_producer(topic).send(b"x")
    finally:
        admin.close()
    alice = secure.tokens["alice"]
    refused = _topics_of_namespace(secure, alice, "public/default")
    assert isinstance(refused, tuple) and refused[0] == pb.AuthorizationError, refused
    assert refused[1].startswith("alice is not authorized to produce or consume"), refused
    secure.grant("alice", ["consume"])
    assert topic in _topics_of_namespace(secure, alice, "public/default")


def test_deleting_a_namespace_whose_topic_had_a_schema_leaves_nothing_of_it_in_zookeeper(
    cluster: Brokers,
) -> None:
    """A namespace's deletion removes the empty directories its topics left under every broker root, the
    schemas' too (a topic with a schema leaves schemas/<tenant>/<namespace>/persistent once deleted): nothing
    naming the tenant is left once it is deleted too."""
    from tests.integration.test_broker_namespaces import admin, unique

    broker = cluster.start()
    tenant, ns = unique("tn"), unique("ns")
    assert admin(broker, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
    assert admin(broker, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    with contextlib.closing(client(broker)) as c:
        c.create_producer(f"persistent://{tenant}/{ns}/typed", schema=pulsar.schema.StringSchema()).send("x")
    assert admin(broker, "GET", f"/admin/v2/schemas/{tenant}/{ns}/typed/schema")[0] == 200
    assert admin(broker, "DELETE", f"/admin/v2/persistent/{tenant}/{ns}/typed?force=true")[0] == 204
    assert admin(broker, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    assert admin(broker, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 204
    left: list[str] = []
    with MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store:

        def walk(path: str) -> None:
            for child in store.children(path):
                p = f"{path}/{child}" if path else child
                if tenant in child:
                    left.append(p)
                walk(p)

        walk("")
    assert left == []
