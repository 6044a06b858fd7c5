"""Broker leftovers: a namespace's clearBacklog over a topic whose owner died mid-write, on broker processes
(real ZooKeeper, 3 bookies, pulsar-client)."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.request
import uuid
from typing import Any

import pytest

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_gone_connection import _serving
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.admin import AdminServer
from topic_broker.names import TopicName
from zk.client import MetadataStore

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand


def test_namespace_clear_backlog_clears_a_topic_whose_owner_died_with_its_ledger_open(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A topic with 3 messages of backlog on subscription "a" whose broker was killed (its last ledger left
    open, its ownership gone with its session): the namespace's clearBacklog, on another broker, leaves a
    backlog of 0 (the whole namespace's, and the named subscription's)."""
    first = cluster.start()
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    base = f"/admin/v2/persistent/public/{ns}"
    admin(first, "PUT", f"/admin/v2/namespaces/public/{ns}")
    topics = ["t-0", "t-1"]
    c = pulsar.Client(first.service_url)
    try:
        for t in topics:
            admin(first, "PUT", f"{base}/{t}")
            admin(first, "PUT", f"{base}/{t}/subscription/a")
            producer = c.create_producer(f"persistent://public/{ns}/{t}")
            for _ in range(3):
                producer.send(b"m")
    finally:
        first.kill9()  # mid-write: the topics' ledgers stay open
        c.close()
    store = MetadataStore.connect(first.zk, first.zk_root)
    try:
        wait_for(
            lambda: not store.children_many([f"ownership/public/{ns}/persistent"]).popitem()[1],
            "the dead broker's ownership gone with its session",
        )
    finally:
        store.close()
    second = cluster.start()
    admin(second, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/a")
    t0 = admin(second, "GET", f"{base}/{topics[0]}/stats")["subscriptions"]["a"]["msgBacklog"]
    assert t0 == 0
    admin(second, "PUT", f"/admin/v2/namespaces/public/{ns}/unload")
    admin(second, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog")
    assert [
        admin(second, "GET", f"{base}/{t}/stats")["subscriptions"]["a"]["msgBacklog"] for t in topics
    ] == [0, 0]


def test_a_namespace_deleted_while_a_lookup_holds_an_ownership_leaves_no_ownership_directories(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A lookup's ownership of a topic nobody opens is held while its namespace is deleted (no topic exists, so
    the delete goes on, and the ownership directories, not empty, stay); once the hold ends and the znode is let
    go, ``ownership/public/<ns>`` goes too (before, its two empty directories stayed for good: 2 znodes per
    namespace so deleted)."""
    bp = cluster.start()
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    topic = TopicName.parse(f"persistent://public/{ns}/looked-up")
    with (
        in_process_broker(cluster, tick_interval_s=0.5, lookup_ownership_hold_s=1.5) as (service, run),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):
        run(service.lookup_owner(topic))
        assert store.children(f"ownership/public/{ns}/persistent") == ["looked-up"]
        admin(bp, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        assert store.get_optional(f"ownership/public/{ns}/persistent/looked-up") is not None  # still held
        wait_for(lambda: not store.exists(f"ownership/public/{ns}"), "its ownership directories gone", 10)
        assert ns not in store.children("ownership/public")


def _raw_consumer(port: int, topic: str, sub: str) -> socket.socket:
    """A connection with consumer 1 on ``sub`` of ``topic`` (Shared, from the earliest) that never comes back
    when the broker closes it (a client that does not reconnect: a dead process, another client library)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(
        wire.encode_command(
            T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
        )
    )
    cmd = pb.CommandSubscribe(
        topic=topic,
        subscription=sub,
        subType=pb.CommandSubscribe.Shared,
        consumer_id=1,
        request_id=1,
        initialPosition=pb.CommandSubscribe.Earliest,
    )
    s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=cmd)))
    dec = wire.FrameDecoder()
    while True:
        for f in dec.feed(s.recv(65536)):
            if f.command.type == T.SUCCESS:
                return s
            assert f.command.type == T.CONNECTED, f.command


def test_an_admin_reset_cursor_that_closes_the_consumers_leaves_the_subscription_idle(
    cluster: Brokers,  # noqa: F811
) -> None:
    """reset-cursor closes the subscription's consumers (as Pulsar does); one that does not come back leaves the
    subscription idle, as a consumer's own close does: its cursor no longer taken as in use, its consumer gone
    from the dispatcher's records, its idle time set. Before, the cursor stayed "active", so a move of it by
    another writer (the Spark source's commit) was not adopted: the next skip counted from the old position and
    its save conflicted, which fenced the topic."""
    with _serving(cluster) as (service, run):
        http = AdminServer(service)
        run(http.start())
        try:
            name = TopicName.parse(f"persistent://public/default/reset-{uuid.uuid4().hex[:8]}")
            topic = run(service.get_topic(name))
            md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
            positions = [run(topic.ml.append(wire.make_entry(md, b"v"))) for _ in range(6)]
            raw = _raw_consumer(service.config.port, str(name), "s")
            rt = topic.subscriptions["s"]
            assert len(rt.consumers) == 1 and rt.cursor.active
            url = (
                f"http://127.0.0.1:{service.config.http_port}/admin/v2/persistent/public/default/{name.local}"
            )

            def post(path: str, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                req = urllib.request.Request(f"{url}{path}", data=data, method="POST")
                req.add_header("Content-Type", "application/json")
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert r.status == 204

            post("/subscription/s/resetcursor", "earliest")
            assert not rt.consumers and not rt._by_key  # the raw consumer does not come back
            assert not rt.cursor.active and rt.idle_since_ms > 0
            meta = service.meta
            stored = run(meta.get_cursor(name.ml_name, "s"))
            moved = dataclasses.replace(stored.value, mark_delete=tuple(positions[2]))  # another writer's
            run(meta.save_cursor(name.ml_name, "s", moved, stored.version))
            post("/subscription/s/skip/1")
            assert not topic.ml.fenced and not topic.unloaded
            assert rt.cursor.mark_delete == positions[3]  # one after the other writer's
            raw.close()
        finally:
            run(http.stop())


@pytest.mark.parametrize("level", ["namespace", "topic"])
def test_a_message_age_quota_holds_and_resumes_a_partitioned_topics_producers(
    cluster: Brokers,  # noqa: F811
    level: str,
) -> None:
    """A 1 s message_age quota with producer_request_hold, set on the namespace or on the 2-partition topic
    itself: a message left unacknowledged 1.5 s on one partition has a new producer of the partitioned topic
    refused (ProducerBlockedQuotaExceededError); once the message is acknowledged, a new producer is taken and
    its sends to both partitions are stored."""
    bp = cluster.start("--tick-interval-s", "60")
    ns = f"public/age{uuid.uuid4().hex[:6]}"
    admin(bp, "PUT", f"/admin/v2/namespaces/{ns}")
    admin(bp, "PUT", f"/admin/v2/persistent/{ns}/pt/partitions", 2)
    quota = {"limitTime": 1, "policy": "producer_request_hold"}
    where = f"/admin/v2/namespaces/{ns}" if level == "namespace" else f"/admin/v2/persistent/{ns}/pt"
    admin(bp, "POST", f"{where}/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/pt"
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=3)
    try:
        consumer = c.subscribe(topic, "slow")
        first = c.create_producer(topic)
        first.send(b"old", partition_key="k")
        first.close()
        time.sleep(1.5)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            c.create_producer(topic)
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        deadline = time.monotonic() + 10
        while True:  # (the acknowledgement reaches the broker on its own)
            try:
                producer = c.create_producer(
                    topic,
                    send_timeout_millis=10_000,
                    message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                    batching_enabled=False,
                )
                break
            except pulsar.ProducerBlockedQuotaExceededError:
                assert time.monotonic() < deadline, "producers still refused after the acknowledgement"
        for i in range(4):
            producer.send(f"new-{i}".encode())
        got = sorted(consumer.receive(timeout_millis=10_000).data() for _ in range(4))
        assert got == [f"new-{i}".encode() for i in range(4)]
    finally:
        c.close()


def test_a_batch_holding_stored_and_new_sequence_ids_is_dropped_whole_as_pulsar_drops_it(
    cluster: Brokers,  # noqa: F811
) -> None:
    """Deduplication on (the broker's default): a batching producer's ids 0-2 stored, then one batch of ids 1-4
    (an application resending from an earlier id): judged by its first id, as Pulsar's
    MessageDeduplication.isDuplicate judges it, the batch is a resend, acknowledged and not stored, its new ids
    3 and 4 too; the next id, 5, is stored. (Before: judged by its last id, the batch was stored whole, 1 and 2
    a second time: 7 messages.)"""
    bp = cluster.start()
    topic = f"persistent://public/default/dd-{uuid.uuid4().hex[:8]}"
    c = pulsar.Client(bp.service_url)
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        producer = c.create_producer(
            topic,
            producer_name="pp",
            batching_enabled=True,
            batching_max_messages=4,
            batching_max_publish_delay_ms=60_000,
        )
        results: list[pulsar.Result] = []
        for i in range(3):
            producer.send_async(f"m{i}".encode(), lambda r, _m: results.append(r), sequence_id=i)
        producer.flush()
        for i in range(1, 5):
            producer.send_async(f"again{i}".encode(), lambda r, _m: results.append(r), sequence_id=i)
        producer.flush()
        producer.send_async(b"m5", lambda r, _m: results.append(r), sequence_id=5)
        producer.flush()
        wait_for(lambda: len(results) == 8, "the receipts", 10)
        assert results == [pulsar.Result.Ok] * 8
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(10_000).data())
        assert got == [b"m0", b"m1", b"m2", b"m5"]
        assert producer.last_sequence_id() == 5
    finally:
        c.close()
