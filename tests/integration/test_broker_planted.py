"""Broker behaviour that planted single-line bugs got past the other tests: each test here fails with such a
bug (docs/architecture.md §11, the topic broker's planted-bug audit). Real ZooKeeper, 3 bookie processes, a
broker process and the official ``pulsar-client``."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest

from ledger_client import BookKeeper, ClientConfig
from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers
from tests.integration.test_broker_admin import T as ADMIN_TOPICS
from tests.integration.test_broker_admin import call, ok
from tests.integration.test_broker_pulsar_client import (
    _connect,
    _meta,
    _owner,
    _raw,
    _wait,
    client,
    drain,
    topic_name,
)
from tests.integration.test_managed_ledger import ML, SMALL, payload, run
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.cursor import InitialPosition, ManagedCursor
from topic_broker.managed_ledger import (
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerFencedError,
    Position,
)
from topic_broker.names import TopicName
from zk.managed_ledgers import BrokerMetadataStore

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand


def _unload(broker: Any, t: str) -> None:
    """Close the topic on its broker (its clients reconnect, and the next one opens it again)."""
    url = f"http://127.0.0.1:{broker.http_port}/admin/v2/persistent/public/default/{t}/unload"
    with urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=15) as r:
        assert r.status in (200, 204)


def _ledgers(cluster: Brokers, t: str) -> list[int]:
    async def get(meta: BrokerMetadataStore) -> list[int]:
        info = await meta.get_ml_info(TopicName.parse(t).ml_name)
        assert info is not None
        return [li.ledger_id for li in info.value.ledgers]

    return _meta(cluster, get)


def test_retention_keeps_the_ledgers_of_a_subscription_nobody_attached_since_the_topic_reopened(
    cluster: Brokers,
) -> None:
    """After a reopen (an unload, a restart, a new owner) a durable subscription without consumers is known only
    by its stored cursor: retention must hold every ledger after that cursor's mark-delete, or the subscription
    loses its backlog."""
    broker = cluster.start(
        "--max-entries-per-ledger", "5", "--min-rollover-time-s", "0", "--tick-interval-s", "1"
    )
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t, batching_enabled=False)
        ids = [p.send(f"{i}".encode()) for i in range(20)]
        consumer.close()  # nothing acked
        _unload(broker, t)
        p.send(b"20")  # the producer reconnects: the topic is open again, its subscription not attached
        _wait(lambda: len(_ledgers(cluster, t)) >= 4, what="rollovers")
        time.sleep(3)  # ticks run retention (0 / 0: consumed ledgers go at once)
        assert _ledgers(cluster, t)[0] == ids[0].ledger_id()
        again = c.subscribe(t, "s")
        assert [m.data() for m in drain(again, 21)] == [f"{i}".encode() for i in range(21)]
    finally:
        c.close()


def test_dedup_remembers_a_producer_whose_last_message_is_in_an_older_ledger(cluster: Brokers) -> None:
    """A new owner takes the last sequence ids from the managed ledger's properties, and reads only the tail
    ledger's entries on top: a producer that last wrote to an older ledger is known by its property alone."""
    broker = cluster.start("--max-entries-per-ledger", "3", "--min-rollover-time-s", "0")
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        a = c.create_producer(t, producer_name="a", batching_enabled=False)
        for i in range(3):  # fills the first ledger
            a.send(f"a{i}".encode(), sequence_id=i)
        a.close()
        b = c.create_producer(t, producer_name="b", batching_enabled=False)
        for i in range(3):  # the next ledger: the tail one after the reopen
            b.send(f"b{i}".encode(), sequence_id=i)
        _unload(broker, t)
        b.close()
        a = c.create_producer(t, producer_name="a", batching_enabled=False)
        assert a.last_sequence_id() == 2
        a.send(b"a2", sequence_id=2)  # a resend of what is stored: dropped
        a.send(b"a3", sequence_id=3)
        # the subscription (holding the ledgers) had its unacknowledged messages redelivered at the unload: a
        # reader shows what is stored
        reader = c.create_reader(t, pulsar.MessageId.earliest)
        got = [reader.read_next(10_000).data() for _ in range(7)]
        assert got == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2", b"a3"]
        with pytest.raises(pulsar.Timeout):
            reader.read_next(500)
        consumer.close()
    finally:
        c.close()


def test_a_broker_that_does_not_own_a_topic_refuses_its_producers_and_consumers(cluster: Brokers) -> None:
    """A client that reaches a broker other than the owner (a stale lookup, or no lookup) is refused with
    ServiceNotReady: that broker must not open the topic, which would fence the owner's ledger and serve a
    topic that ZooKeeper says another broker owns."""
    a, b = cluster.start(), cluster.start()
    c = client(a)
    try:
        t = topic_name()
        p = c.create_producer(t, batching_enabled=False)
        p.send(b"x")
        owner = _owner(cluster, t)
        other = b if owner == a.service_url else a
        full = f"persistent://public/default/{t}"
        s = _raw(other)
        try:
            _connect(s)
            s.sendall(
                wire.encode_command(
                    T(
                        type=T.PRODUCER,
                        producer=pb.CommandProducer(topic=full, producer_id=1, request_id=1),
                    )
                )
                + wire.encode_command(
                    T(
                        type=T.SUBSCRIBE,
                        subscribe=pb.CommandSubscribe(
                            topic=full, subscription="s", subType=0, consumer_id=2, request_id=2
                        ),
                    )
                )
            )
            dec = wire.FrameDecoder()
            frames: list[Any] = []
            while len(frames) < 2:
                frames += dec.feed(s.recv(65536))
        finally:
            s.close()
        assert [(f.command.type, f.command.error.error) for f in frames] == [
            (T.ERROR, pb.ServiceNotReady)
        ] * 2
        p.send(b"y")  # the owner was not fenced
        assert _owner(cluster, t) == owner
        reader = c.create_reader(t, pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(2)] == [b"x", b"y"]
    finally:
        c.close()


def test_a_topic_with_only_consumers_attached_is_not_deleted_without_force(broker: BrokerProcess) -> None:
    """DELETE of a topic is refused (412) while any client is attached, a consumer as much as a producer."""
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t)
        p.send(b"kept")
        p.close()
        status, body, _ = call(broker, "DELETE", f"{ADMIN_TOPICS}/{t}")
        assert status == 412, (status, body)
        assert consumer.receive(timeout_millis=10_000).data() == b"kept"
        assert f"persistent://public/default/{t}" in ok(broker, "GET", ADMIN_TOPICS)
    finally:
        c.close()


def test_a_fenced_owner_writes_no_cursor_and_the_new_owner_keeps_serving(bookies: Any) -> None:
    """Once fenced, the old owner's cursor flush (a delayed one still pending, say) raises and writes nothing:
    had it written the znode the new owner had just read, the new owner's next flush would conflict and fence
    the new owner too."""

    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(**SMALL)
        old = await ManagedLedger.open(bk, store, ML, cfg)
        positions = [await old.append(payload(i)) for i in range(4)]
        old_cursor = await ManagedCursor.open(old, "sub", InitialPosition.EARLIEST, flush_interval_s=60)
        bk2 = await BookKeeper.connect(
            bk.store.connect_string, config=ClientConfig(zk_root=bk.config.zk_root)
        )
        try:
            new = await ManagedLedger.open(bk2, BrokerMetadataStore(bk2.store), ML, cfg)
            new_cursor = await ManagedCursor.open(new, "sub")
            with pytest.raises(ManagedLedgerFencedError):
                await old.append(payload(99))
            assert old.fenced
            old_cursor.ack_individual(positions[1])
            with pytest.raises(ManagedLedgerFencedError):
                await old_cursor.flush()
            new_cursor.ack_cumulative(positions[3])
            await new_cursor.flush()
            assert not new.fenced
            stored = await store.get_cursor(ML, "sub")
            assert stored is not None and tuple(stored.value.mark_delete) == tuple(positions[3])
            await old.close()
            await new.close()
        finally:
            await bk2.close()

    run(bookies, body)


def test_unsubscribe_is_refused_while_another_consumer_uses_the_subscription(broker: BrokerProcess) -> None:
    """UNSUBSCRIBE by one of two Shared consumers is refused (ConsumerBusy): the subscription, its cursor and
    its backlog stay for the other one."""
    c = client(broker)
    try:
        t = topic_name()
        first = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
        second = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
        with pytest.raises(pulsar.ConsumerBusy):
            first.unsubscribe()
        first.close()
        c.create_producer(t).send(b"still subscribed")
        assert second.receive(timeout_millis=10_000).data() == b"still subscribed"
        assert "s" in ok(broker, "GET", f"{ADMIN_TOPICS}/{t}/subscriptions")
    finally:
        c.close()


def test_a_negative_ack_redelivers_that_message_only(broker: BrokerProcess) -> None:
    """On Shared, the client names the messages to redeliver: the others it holds unacknowledged stay with it
    and are not delivered a second time."""
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(
            t, "s", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=100
        )
        p = c.create_producer(t, batching_enabled=False)
        for i in range(2):
            p.send(f"{i}".encode())
        first, second = drain(consumer, 2)
        consumer.negative_acknowledge(first)
        again = consumer.receive(10_000)
        assert (again.data(), again.redelivery_count()) == (b"0", 1)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1_000)
        consumer.acknowledge(again)
        consumer.acknowledge(second)
    finally:
        c.close()


def test_a_new_owner_after_a_crash_takes_dedup_state_from_the_tail_ledger(cluster: Brokers) -> None:
    """The owner dies (kill -9) before it records its producers' last sequence ids: the next owner reads them
    from the entries of the last ledger, which the crash left open (recovered on open), not an older one."""
    broker = cluster.start("--max-entries-per-ledger", "3", "--min-rollover-time-s", "0")
    c = client(broker)
    t = topic_name()
    try:
        # the subscription holds the ledgers (retention lets a topic without one go)
        c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        a = c.create_producer(t, producer_name="a", batching_enabled=False)
        for i in range(5):  # 0, 1, 2 in the first ledger (recorded at the rollover), 3 and 4 in the next
            a.send(f"a{i}".encode(), sequence_id=i)
    finally:
        c.close()
    broker.kill9()
    broker.start()
    c = client(broker)
    try:
        consumer = c.subscribe(t, "s")
        a = c.create_producer(t, producer_name="a", batching_enabled=False)
        assert a.last_sequence_id() == 4
        a.send(b"a4", sequence_id=4)  # a resend of what is stored: dropped
        a.send(b"a5", sequence_id=5)
        assert [m.data() for m in drain(consumer, 6)] == [f"a{i}".encode() for i in range(6)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        c.close()


def test_reopening_keeps_the_data_of_ledgers_that_hold_a_single_entry(bookies: Any) -> None:
    """Opening drops (and deletes) only the empty ledgers of the list: a ledger holding one entry, as a topic
    that got one message before each unload has, keeps its data."""

    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(**SMALL)
        for i in range(3):
            ml = await ManagedLedger.open(bk, store, ML, cfg)
            await ml.append(payload(i))
            await ml.close()
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        assert [d for _, d in await ml.read_entries(Position(0, 0), 10)] == [payload(i) for i in range(3)]
        await ml.close()

    run(bookies, body)


def _frames_until(s: Any, dec: Any, wanted: int) -> list[Any]:
    """Frames read from the raw connection ``s`` until one of command type ``wanted`` arrives (included)."""
    frames: list[Any] = []
    while not any(f.command.type == wanted for f in frames):
        data = s.recv(65536)
        assert data, "connection closed"
        frames += dec.feed(data)
    return frames


def test_a_cumulative_ack_whose_ack_set_leaves_a_batch_unacked_stops_before_that_batch(
    broker: BrokerProcess,
) -> None:
    """A cumulative ack names a batch entry with an ack set (its unacknowledged messages) in which every
    message is still unacknowledged: it acknowledges up to the entry before, and the whole batch is delivered
    to the subscription's next consumer."""
    c = client(broker)
    try:
        t = topic_name()
        full = f"persistent://public/default/{t}"
        s = _raw(broker)
        try:
            _connect(s)
            dec = wire.FrameDecoder()
            sub = pb.CommandSubscribe(
                topic=full,
                subscription="s",
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=1,
                request_id=1,
                initialPosition=pb.CommandSubscribe.Earliest,
            )
            s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub)))
            _frames_until(s, dec, T.SUCCESS)
            p = c.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=60_000)
            for i in range(4):
                p.send_async(f"{i}".encode(), None)
            p.flush()  # one batch entry of 4 messages
            flow = pb.CommandFlow(consumer_id=1, messagePermits=100)
            s.sendall(wire.encode_command(T(type=T.FLOW, flow=flow)))
            mid = next(
                f.command.message.message_id
                for f in _frames_until(s, dec, T.MESSAGE)
                if f.command.type == T.MESSAGE
            )
            ack = pb.CommandAck(
                consumer_id=1,
                ack_type=pb.CommandAck.Cumulative,
                message_id=[pb.MessageIdData(ledgerId=mid.ledgerId, entryId=mid.entryId, ack_set=[0b1111])],
                request_id=2,
            )
            s.sendall(wire.encode_command(T(type=T.ACK, ack=ack)))
            _frames_until(s, dec, T.ACK_RESPONSE)
        finally:
            s.close()
        consumer = c.subscribe(t, "s")
        assert [m.data() for m in drain(consumer, 4)] == [f"{i}".encode() for i in range(4)]
    finally:
        c.close()
