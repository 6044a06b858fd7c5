"""Tests for the bugs planted in the audit of 2026-11-29 against 1d61931 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of dedup's skipped ids, held SENDs, backpressure and the
changes since"): each fails with its bug planted and passes without it. Real ZooKeeper and bookie processes, an
in-process broker where a write is made to fail."""

from __future__ import annotations

import asyncio
import threading
import time
import types
import uuid
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, in_process_broker
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_broker_pulsar_client import _closed, _raw_producer, _raw_send
from tests.integration.test_broker_skipped_ids_failures import fail_next_write, first_stored, stored
from topic_broker import pulsar_api_pb2 as pb

T = pb.BaseCommand


def test_a_fill_below_the_last_id_leaves_the_last_id_stored_and_persisted(cluster: Brokers) -> None:
    """A send that fills an id the producer's delayed messages jumped over (1 after 0, 2, 4) lowers neither its
    last id nor the one persisted with its receipt: a resend of 4 is a duplicate, before and after a failed
    write resets the producer's last id to the persisted one."""
    with _serving(cluster) as (service, run):
        port = types.SimpleNamespace(port=service.config.port)
        t = f"persistent://public/default/planted6-fill-{uuid.uuid4().hex[:8]}"
        s, dec = _raw_producer(port, t, "p")
        for seq in (0, 2, 4, 1):  # the delayed 0, 2, 4, then 1 behind them: each stored
            _raw_send(s, seq, b"m%d" % seq)
            assert stored(s, dec), seq
        _raw_send(s, 4, b"m4")  # a resend of 4: a duplicate (was stored again, the last id lowered to 1)
        assert not stored(s, dec)
        (fut,) = service.topics.values()
        fail_next_write(run, fut.result().ml)
        _raw_send(s, 5, b"m5")  # its write fails: the broker closes the connection, the last id back to 4
        assert _closed(s)
        s.close()
        s, dec = _raw_producer(port, t, "p")
        _raw_send(s, 4, b"m4")  # still a duplicate (was stored again, the persisted id lowered to 1)
        assert not stored(s, dec)
        _raw_send(s, 5, b"m5")  # the failed one sent again: stored
        assert stored(s, dec)
        s.close()


def test_the_stats_read_an_idle_cursor_another_writer_moved(cluster: Brokers) -> None:
    """A subscription with no consumer (its dispatcher idle) and a cursor opened without one (a producer's
    initial subscription), each moved in ZooKeeper by another writer (a Spark query's commit): the topic's stats
    report the backlog from the stored cursor, not from what the broker read when it opened them."""
    import json
    import urllib.request
    from dataclasses import replace

    from tests.integration.test_broker_sub_ops_idle import idle_and_moved
    from topic_broker.admin import AdminServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        http = AdminServer(service)
        run(http.start())
        try:
            topic, _rt, positions = idle_and_moved(service, run)  # s: 3 of 6 consumed by the other writer
            run(topic.initial_subscription("i"))
            meta, ml_name = service.meta, topic.name.ml_name
            stored = run(meta.get_cursor(ml_name, "i"))
            run(
                meta.save_cursor(
                    ml_name, "i", replace(stored.value, mark_delete=tuple(positions[4])), stored.version
                )
            )
            url = f"http://127.0.0.1:{service.config.http_port}/admin/v2/persistent/public/default/{topic.name.local}"
            with urllib.request.urlopen(f"{url}/stats", timeout=30) as r:
                subs = json.loads(r.read())["subscriptions"]
            assert (subs["s"]["msgBacklog"], subs["i"]["msgBacklog"]) == (3, 1)
        finally:
            run(http.stop())


def hold_writes(ml: Any, writes: threading.Event) -> None:
    """The managed ledger's writes wait for ``writes`` (60 s at most)."""
    real = ml.append_from

    async def held(*args: object) -> None:
        await asyncio.to_thread(writes.wait, 60)
        await real(*args)

    ml.append_from = held


def test_a_connection_is_not_read_once_its_sends_outstanding_pass_the_bound(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SENDs read and not yet answered past ``PUBLISH_BYTES_MAX`` (256 KiB here) pause the connection's reading
    at once, not at twice the bound; once the held writes are done, each is stored and the connection read
    again."""
    from topic_broker import service as service_module

    monkeypatch.setattr(service_module, "PUBLISH_BYTES_MAX", 256 * 1024)
    writes = threading.Event()
    with _serving(cluster) as (service, run):
        _port, _t, s, dec = first_stored(service, "planted6-pause", "p", b"m0")
        (session,) = service.sessions
        hold_writes(next(iter(service.topics.values())).result().ml, writes)
        for seq in (1, 2, 3):  # 300 KB: over the bound, under twice it
            _raw_send(s, seq, bytes(100_000))
        deadline = time.monotonic() + 30
        while not session.publish_paused:
            assert time.monotonic() < deadline, f"not paused with {session.publish_bytes} bytes outstanding"
            time.sleep(0.05)
        writes.set()
        s.settimeout(60)
        answers: list[Any] = []
        while len(answers) < 3:  # (one read may bring all three: a frame decoder read to its end each time)
            data = s.recv(65536)
            assert data, "the connection closed"
            answers += [f.command for f in dec.feed(data) if f.command.type in (T.SEND_RECEIPT, T.SEND_ERROR)]
        assert [a.send_receipt.sequence_id for a in answers if a.type == T.SEND_RECEIPT] == [1, 2, 3]
        while session.publish_paused:
            assert time.monotonic() < deadline, "not read again"
            time.sleep(0.05)
        s.close()


def test_a_partitions_policy_and_new_partitions_get_each_partitions_subscriptions_not_the_compactors(
    broker: BrokerProcess,
) -> None:
    """A topic policy set through a partition is the partitioned topic's (its write guarded by the partitioned
    topic's znode, not a partition's, which has none). Growing a partitioned topic copies the subscriptions of
    every existing partition (one made on partition 1 alone too), never the ``__compaction`` cursor, which on a
    new partition would be a subscription holding its whole backlog that nobody consumes."""
    import pulsar

    from tests.integration.test_broker_client_features3 import admin, partitioned
    from tests.integration.test_broker_compaction import compact

    t = partitioned(broker, 2)
    local = t.rsplit("/", 1)[-1]
    path = f"/admin/v2/persistent/public/default/{local}"
    admin(broker, "PUT", f"{path}-partition-1/subscription/only-1", "earliest")
    admin(broker, "POST", f"{path}-partition-1/messageTTL?messageTTL=60")  # a policy through a partition
    assert admin(broker, "GET", f"{path}/messageTTL") == 60
    pc = pulsar.Client(f"pulsar://127.0.0.1:{broker.port}", operation_timeout_seconds=30)
    try:
        pc.create_producer(f"{t}-partition-0").send(b"v", partition_key="k")
    finally:
        pc.close()
    compact(broker, f"{local}-partition-0")
    assert "__compaction" in admin(broker, "GET", f"{path}-partition-0/subscriptions")
    admin(broker, "POST", f"{path}/partitions", 3)
    assert admin(broker, "GET", f"{path}-partition-2/subscriptions") == ["only-1"]


def test_a_reader_from_the_last_message_inclusive_gets_it_and_an_initial_subscription_starts_at_the_earliest(
    cluster: Brokers,
) -> None:
    """The last stored message is not past the end: a reader starting there, inclusive, gets it. A producer's
    initial subscription made on a topic that holds messages already starts at the earliest one, as Pulsar's."""
    import pulsar

    from tests.integration.test_broker_pulsar_client import _connect, _raw
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.names import TopicName

    with _serving(cluster) as (service, run):
        t = f"persistent://public/default/planted6-seek-{uuid.uuid4().hex[:8]}"
        pc = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            producer = pc.create_producer(t, batching_enabled=False)
            ids = [producer.send(b"m%d" % i) for i in range(3)]
            reader = pc.create_reader(t, ids[-1], start_message_id_inclusive=True)
            assert reader.read_next(10_000).data() == b"m2"
        finally:
            pc.close()
        s = _raw(types.SimpleNamespace(port=service.config.port))
        _connect(s)
        cmd = pb.CommandProducer(topic=t, producer_id=1, request_id=1, initial_subscription_name="i")
        s.sendall(wire.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=cmd)))
        dec = wire.FrameDecoder()
        frames: list[Any] = []
        while not frames:
            frames = dec.feed(s.recv(65536))
        assert frames[0].command.type == pb.BaseCommand.PRODUCER_SUCCESS, frames[0].command
        s.close()
        ml = run(service.get_topic(TopicName.parse(t))).ml
        stored = run(service.meta.get_cursor(ml.name, "i"))
        assert tuple(stored.value.mark_delete) == tuple(ml.first_position().previous())
