"""The topic broker against the official ``pulsar-client``: real ZooKeeper, 3 bookie processes, broker processes."""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess, free_port
from tests.broker_testing import Brokers
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.names import TopicName
from topic_broker.subscription import failover_ring_pick, failover_topic_hash
from zk import MetadataStore
from zk.managed_ledgers import BrokerMetadataStore, CursorInfo

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand


def quiet_logger() -> pulsar.ConsoleLogger:
    """The client logs at INFO to stdout; warnings and errors are enough to read a failure."""
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)


def client(bp: BrokerProcess, **kw) -> pulsar.Client:
    kw.setdefault("operation_timeout_seconds", 15)
    return pulsar.Client(bp.service_url, logger=quiet_logger(), **kw)


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def failover_topic(active: str, others: tuple[str, ...] = ("b",)) -> str:
    """A new non-partitioned topic's short name on whose Failover subscriptions, of consumers named ``active`` and
    ``others`` at one priority level, ``active`` is the active consumer (Pulsar's consistent-hash ring of the
    names, :func:`topic_broker.subscription.failover_ring_pick`)."""
    names = sorted((active, *others))
    while True:
        t = topic_name()
        full = failover_topic_hash(f"persistent://public/default/{t}")
        if names[failover_ring_pick(full, names)] == active:
            return t


def drain(consumer, n: int, timeout_ms: int = 10_000) -> list:
    return [consumer.receive(timeout_millis=timeout_ms) for _ in range(n)]


def receive_or_none(consumer, timeout_ms: int) -> Any:
    """The next message, or None when none came within ``timeout_ms``."""
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


# -- round trips --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batching", [False, True])
def test_produce_consume_round_trip_in_order(broker: BrokerProcess, batching: bool) -> None:
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(t, batching_enabled=batching, batching_max_publish_delay_ms=5)
        n = 500
        for i in range(n):
            producer.send_async(f"m-{i}".encode(), None)
        producer.flush()
        got = drain(consumer, n)
        assert [m.data() for m in got] == [f"m-{i}".encode() for i in range(n)]
        for m in got:
            consumer.acknowledge(m)
        producer.close()
        consumer.close()
    finally:
        c.close()


def test_second_exclusive_consumer_is_refused_shared_splits(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        t = topic_name()
        first = c.subscribe(t, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
        with pytest.raises(pulsar.ConsumerBusy):
            c.subscribe(t, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
        first.close()
        s1 = c.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
        s2 = c.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
        p = c.create_producer(t)
        for i in range(40):
            p.send(f"{i}".encode())
        seen: list[bytes] = []
        counts = [0, 0]
        while len(seen) < 40:
            for idx, s in enumerate((s1, s2)):
                try:
                    m = s.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                seen.append(m.data())
                counts[idx] += 1
                s.acknowledge(m)
        assert sorted(seen, key=int) == [f"{i}".encode() for i in range(40)]
        assert counts[0] > 0 and counts[1] > 0
    finally:
        c.close()


def test_shared_consumer_that_stops_receiving_leaves_the_other_supplied_and_gets_more_when_it_resumes(
    broker: BrokerProcess,
) -> None:
    """Shared round robin with one consumer out of permits: its queue (10) fills and stays full while it does not
    receive, and every other message goes to the consumer that receives, at once; when the first one receives
    again, its FLOWs bring it new messages. A dispatcher that waited for the stalled consumer's permits, or
    never read again once one consumer had none, would stop the other one too (the bench's end-to-end stops
    were searched for this)."""
    c = client(broker)
    try:
        t = topic_name()
        slow = c.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
        fast = c.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
        p = c.create_producer(t, batching_enabled=False)
        lateness: list[float] = []
        fast_got: list[int] = []
        for i in range(200):
            p.send(f"{i}".encode())
            m = fast.receive(timeout_millis=5_000) if i >= 20 else None  # the slow one's queue fills first
            if m is not None:
                lateness.append(time.time() * 1000 - m.publish_timestamp())
                fast_got.append(int(m.data()))
                fast.acknowledge(m)
        while (m := receive_or_none(fast, 500)) is not None:
            fast_got.append(int(m.data()))
            fast.acknowledge(m)
        assert 180 <= len(fast_got) <= 190  # the slow one holds what its 10 permits took, no more
        assert max(lateness) < 2_000, f"a message waited {max(lateness):.0f} ms for the receiving consumer"
        held = drain(slow, 200 - len(fast_got))
        for m in held:
            slow.acknowledge(m)
        assert sorted(fast_got + [int(m.data()) for m in held]) == list(range(200))
        # resumed: it asked for more (FLOW at half its queue) and gets its share of new messages
        for i in range(200, 260):
            p.send(f"{i}".encode())
        got: dict[str, list[int]] = {"slow": [], "fast": []}
        deadline = time.monotonic() + 20
        while len(got["slow"]) + len(got["fast"]) < 60 and time.monotonic() < deadline:
            for name, s in (("slow", slow), ("fast", fast)):
                if (m := receive_or_none(s, 100)) is not None:
                    got[name].append(int(m.data()))
                    s.acknowledge(m)
        assert sorted(got["slow"] + got["fast"]) == list(range(200, 260))
        assert got["slow"], "the consumer that resumed got none of the new messages"
    finally:
        c.close()


def test_failover_and_key_shared(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        t = failover_topic("a")
        f1 = c.subscribe(t, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
        f2 = c.subscribe(t, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
        k1 = c.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
        k2 = c.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
        p = c.create_producer(t)
        for i in range(60):
            p.send(f"{i}".encode(), partition_key=f"k{i % 6}")
        got = drain(f1, 60)
        assert [m.data() for m in got] == [f"{i}".encode() for i in range(60)]
        with pytest.raises(pulsar.Timeout):
            f2.receive(timeout_millis=300)
        f1.close()  # the standby takes over and gets what was not acked
        again = drain(f2, 60)
        assert [m.data() for m in again] == [f"{i}".encode() for i in range(60)]
        owner: dict[str, int] = {}
        total = 0
        while total < 60:
            for idx, k in enumerate((k1, k2)):
                try:
                    m = k.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                total += 1
                assert owner.setdefault(m.partition_key(), idx) == idx
                k.acknowledge(m)
    finally:
        c.close()


def test_reader_earliest_latest_message_id_and_has_message_available(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        t = topic_name()
        p = c.create_producer(t)
        ids = [p.send(f"{i}".encode()) for i in range(10)]
        r = c.create_reader(t, pulsar.MessageId.earliest)
        assert [r.read_next(5000).data() for _ in range(10)] == [f"{i}".encode() for i in range(10)]
        assert not r.has_message_available()
        latest = c.create_reader(t, pulsar.MessageId.latest)
        assert not latest.has_message_available()
        p.send(b"10")
        assert latest.read_next(5000).data() == b"10"
        mid = c.create_reader(t, ids[4])
        assert mid.read_next(5000).data() == b"5"
        assert mid.has_message_available()
    finally:
        c.close()


def test_seek_by_message_id_and_time(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        t = topic_name()
        p = c.create_producer(t)
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        ids = []
        for i in range(10):
            ids.append(p.send(f"{i}".encode()))
            if i == 4:
                time.sleep(0.05)
                t_mid = int(time.time() * 1000)
                time.sleep(0.05)
        got = drain(consumer, 10)
        for m in got:
            consumer.acknowledge(m)
        # The broker resets the subscription so that the next entry delivered is the seek id itself (Pulsar's
        # resetCursor); the client then drops messages at or before its seek id unless it was configured with
        # start_message_id_inclusive, so a default consumer's next message is the one after it.
        consumer.seek(ids[2])
        assert consumer.receive(10_000).data() == b"3"
        consumer.seek(t_mid)
        assert consumer.receive(10_000).data() == b"5"
        inclusive = c.subscribe(
            t,
            "s-inclusive",
            initial_position=pulsar.InitialPosition.Earliest,
            start_message_id_inclusive=True,
        )
        assert inclusive.receive(10_000).data() == b"0"
        inclusive.seek(ids[2])
        assert inclusive.receive(10_000).data() == b"2"
    finally:
        c.close()


def test_exclusive_producers_busy_fencing_and_waiting(broker: BrokerProcess) -> None:
    import threading

    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        first = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises(pulsar.ProducerFenced):  # Pulsar's answer to a second Exclusive producer
            c.create_producer(t, access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises(pulsar.ProducerBusy):
            c.create_producer(t)
        first.send(b"first")
        waiter: list[Any] = []
        started = threading.Event()

        def wait_for_it() -> None:
            started.set()
            waiter.append(c.create_producer(t, access_mode=pulsar.ProducerAccessMode.WaitForExclusive))

        th = threading.Thread(target=wait_for_it, daemon=True)
        th.start()
        started.wait()
        th.join(1.0)
        assert th.is_alive() and not waiter, "a WaitForExclusive producer waits while another one produces"
        first.send(b"still first")
        first.close()
        th.join(30)
        assert waiter, "it gets the topic once the exclusive producer is gone"
        waiter[0].send(b"waited")
        fencer = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
        fencer.send(b"fenced the waiter")
        assert [m.data() for m in drain(consumer, 4)] == [
            b"first",
            b"still first",
            b"waited",
            b"fenced the waiter",
        ]
    finally:
        c.close()


def test_a_multi_topic_failover_subscription_spreads_its_topics_over_its_consumers(
    broker: BrokerProcess,
) -> None:
    """Two consumers of one Failover subscription over the same non-partitioned topics: each topic is delivered to
    the consumer Pulsar's consistent-hash ring of their names picks for it (Pulsar 3's broker), so both get
    some; the first by name took every topic."""
    c = client(broker)
    try:
        topics = [failover_topic("a"), failover_topic("b", ("a",)), topic_name(), topic_name()]
        fo = pulsar.ConsumerType.Failover
        consumers = {n: c.subscribe(topics, "fo", consumer_type=fo, consumer_name=n) for n in ("a", "b")}
        for t in topics:
            c.create_producer(t).send(t.encode())
        got = {n: sorted(m.data().decode() for m in drain_until_quiet(x)) for n, x in consumers.items()}
        expected: dict[str, list[str]] = {"a": [], "b": []}
        for t in topics:
            ring = failover_ring_pick(failover_topic_hash(f"persistent://public/default/{t}"), ["a", "b"])
            expected[["a", "b"][ring]].append(t)
        assert got == {n: sorted(ts) for n, ts in expected.items()}
    finally:
        c.close()


def test_a_failover_consumer_joining_just_after_another_takes_over_before_anything_is_sent(
    broker: BrokerProcess,
) -> None:
    """As after an owner change, when both consumers reconnect: b subscribes a moment before a, the ring's
    choice. As Pulsar's broker (activeConsumerFailoverDelayTimeMillis), nothing is sent for a second after the
    active consumer changes, so b is not sent the backlog that a then takes over: those stayed in b's receive
    queue and b's application received them again, all acknowledged by a, once a left."""
    c = client(broker)
    try:
        t = failover_topic("a")
        fo = pulsar.ConsumerType.Failover
        b = c.subscribe(t, "fo", consumer_type=fo, consumer_name="b")
        p = c.create_producer(t, batching_enabled=False)
        for i in range(20):
            p.send(f"m{i}".encode())
        a = c.subscribe(t, "fo", consumer_type=fo, consumer_name="a")
        acked = {m.data() for m in drain_until_quiet(a)}
        assert len(acked) == 20
        a.close()
        assert [m.data() for m in drain_until_quiet(b)] == []
    finally:
        c.close()


def drain_until_quiet(consumer, quiet_ms: int = 1500) -> list:
    """Every message received until none comes for ``quiet_ms``, each acknowledged."""
    out = []
    while (m := receive_or_none(consumer, quiet_ms)) is not None:
        consumer.acknowledge(m)
        out.append(m)
    return out


def test_an_exclusive_with_fencing_producer_fences_the_waiting_ones_out(broker: BrokerProcess) -> None:
    """As Pulsar's: an ExclusiveWithFencing producer fails the queued WaitForExclusive producers (ProducerFenced)
    before it closes the one that holds the topic, so the topic is its own; a waiter does not take it over."""
    import threading

    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        holder = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.Exclusive)
        holder.send(b"held")
        outcome: list[Any] = []

        def wait_for_it() -> None:
            try:
                outcome.append(c.create_producer(t, access_mode=pulsar.ProducerAccessMode.WaitForExclusive))
            except pulsar.PulsarException as e:
                outcome.append(e)

        th = threading.Thread(target=wait_for_it, daemon=True)
        th.start()
        th.join(1.0)
        assert th.is_alive() and not outcome, "the WaitForExclusive producer waits"
        fencer = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
        th.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], pulsar.ProducerFenced), outcome
        fencer.send(b"fenced")
        assert [m.data() for m in drain(consumer, 2)] == [b"held", b"fenced"]
    finally:
        c.close()


def test_negative_ack_redelivery_count_grows(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(
            t, "s", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=100
        )
        p = c.create_producer(t)
        p.send(b"x")
        counts = []
        for _ in range(3):
            m = consumer.receive(10_000)
            counts.append(m.redelivery_count())
            consumer.negative_acknowledge(m)
        assert counts == [0, 1, 2]
    finally:
        c.close()


def test_dedup_with_a_fixed_producer_name(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t, producer_name="fixed")
        for i in range(5):
            p.send(f"{i}".encode(), sequence_id=i)
        p.close()
        p2 = c.create_producer(t, producer_name="fixed")
        assert p2.last_sequence_id() == 4
        for i in range(3, 8):  # 3 and 4 are duplicates
            p2.send(f"{i}".encode(), sequence_id=i)
        got = [m.data() for m in drain(consumer, 8)]
        assert got == [f"{i}".encode() for i in range(8)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        c.close()


def test_a_name_the_broker_gave_a_producer_is_not_given_again_after_a_restart(broker: BrokerProcess) -> None:
    """Producers without a name get one from the broker, and the topic keeps its dedup state under that name:
    a producer created after the broker restarted must not get the name of one created before, else the older
    producer's resends (same name, sequence ids already used by the newer) are dropped as duplicates and
    acknowledged without being stored."""
    t = topic_name()
    c1 = client(broker)
    try:
        p1 = c1.create_producer(t, send_timeout_millis=30_000)
        p1.send(b"a0")
        broker.stop()
        broker.start()
        c2 = client(broker)
        try:
            p2 = c2.create_producer(t)
            assert p2.producer_name() != p1.producer_name()
            p2.send(b"b0")
            p2.close()
            p1.send(b"a1")  # after the reconnection
            reader = c2.create_reader(t, pulsar.MessageId.earliest)
            got = [reader.read_next(10_000).data() for _ in range(3)]
            assert sorted(got) == [b"a0", b"a1", b"b0"]
        finally:
            c2.close()
    finally:
        c1.close()


def test_partitioned_topic(broker: BrokerProcess, cluster: Brokers) -> None:
    t = topic_name()
    _meta(cluster, lambda meta: meta.create_partitioned_topic(TopicName.parse(t).ml_name, 3))
    c = client(broker)
    try:
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t)
        for i in range(30):
            p.send(f"{i}".encode(), partition_key=f"k{i % 5}")
        for i in range(30, 60):  # no key: round robin over the partitions
            p.send(f"{i}".encode())
        got = drain(consumer, 60)
        assert sorted(int(m.data()) for m in got) == list(range(60))
        # A keyed message goes to hash(key) % 3, so 5 keys need not cover every partition; the unkeyed ones do.
        assert {m.topic_name() for m in got} == {
            f"persistent://public/default/{t}-partition-{i}" for i in range(3)
        }
        per_key: dict[str, list[int]] = {}
        partition_of_key: dict[str, set[str]] = {}
        for m in got:
            if m.partition_key():
                per_key.setdefault(m.partition_key(), []).append(int(m.data()))
                partition_of_key.setdefault(m.partition_key(), set()).add(m.topic_name())
        assert sorted(per_key) == [f"k{i}" for i in range(5)]
        assert all(v == sorted(v) for v in per_key.values())
        assert all(len(v) == 1 for v in partition_of_key.values())
    finally:
        c.close()


def test_consumers_subscribing_a_new_shared_subscription_at_once(
    broker: BrokerProcess, cluster: Brokers
) -> None:
    """Both create the same new cursor on every partition at the same moment: one creates it, the other joins
    it (the topic is not fenced by the second creation)."""
    import threading

    t = topic_name()
    _meta(cluster, lambda meta: meta.create_partitioned_topic(TopicName.parse(t).ml_name, 4))
    clients = [client(broker), client(broker)]
    try:
        barrier = threading.Barrier(len(clients))
        consumers: list[Any] = [None] * len(clients)

        def subscribe(i: int) -> None:
            barrier.wait()
            consumers[i] = clients[i].subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared)

        threads = [threading.Thread(target=subscribe, args=(i,)) for i in range(len(clients))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert all(consumers)
        p = clients[0].create_producer(t, batching_enabled=False)
        for i in range(40):
            p.send(f"{i}".encode())
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < 40 and time.monotonic() < deadline:
            for s in consumers:
                try:
                    m = s.receive(timeout_millis=100)
                except pulsar.Timeout:
                    continue
                seen.append(int(m.data()))
                s.acknowledge(m)
        assert sorted(seen) == list(range(40))
    finally:
        for c in clients:
            c.close()


def _meta(cluster: Brokers, fn: Callable[[BrokerMetadataStore], Awaitable[Any]]) -> Any:
    """Run ``fn`` against the cluster's broker znodes (as another process, e.g. the Spark source, would)."""
    return _meta_store(cluster.bookies, fn)


def _meta_store(bookies: Any, fn: Callable[[BrokerMetadataStore], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        store = MetadataStore.connect(bookies.zk, root=bookies.root)
        try:
            return await fn(BrokerMetadataStore(store))
        finally:
            store.close()

    return asyncio.run(run())


def _owner(cluster: Brokers, t: str) -> str | None:
    async def get(meta: BrokerMetadataStore) -> str | None:
        owner = await meta.get_owner(TopicName.parse(t).ml_name)
        return None if owner is None else owner.service_url

    return _meta(cluster, get)


def test_broker_kill9_moves_clients_to_the_survivor(cluster: Brokers) -> None:
    b1 = cluster.start()
    b2 = cluster.start()
    # A Pulsar service URL may name several brokers: the client looks topics up on any of them, so it finds
    # the survivor when one dies.
    c = pulsar.Client(
        f"pulsar://127.0.0.1:{b1.port},127.0.0.1:{b2.port}",
        operation_timeout_seconds=30,
        logger=quiet_logger(),
    )
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t, send_timeout_millis=60_000)
        for i in range(20):
            p.send(f"{i}".encode())
        got = drain(consumer, 10)
        for m in got:
            consumer.acknowledge(m)
        time.sleep(1.5)  # the cursor is persisted (rate-limited to 1/s)
        owner_url = _owner(cluster, t)
        owner, survivor = (b1, b2) if owner_url == b1.service_url else (b2, b1)
        assert owner_url == owner.service_url
        owner.kill9()
        for i in range(20, 30):
            p.send(f"{i}".encode())
        rest = [int(m.data()) for m in drain(consumer, 20, timeout_ms=60_000)]
        # Nothing acked is redelivered unless its ack was still in flight; nothing is lost; order per partition.
        assert rest == list(range(10, 30))
        assert survivor.alive
        assert _owner(cluster, t) == survivor.service_url
    finally:
        c.close()


def test_a_subscription_moved_in_zookeeper_while_idle_resumes_where_it_was_moved(cluster: Brokers) -> None:
    """Even when retention keeps everything (so no trim reads the cursors), a consumer attaching to an idle
    durable subscription starts where another writer moved it, and its acks do not conflict with that write."""
    from zk.managed_ledgers import NamespacePolicies

    broker = cluster.start()
    _meta(
        cluster,
        lambda meta: meta.set_policies(
            "public", "default", NamespacePolicies(retention_time_minutes=-1, retention_size_mb=-1)
        ),
    )
    c = client(broker)
    try:
        t = topic_name()
        ml = TopicName.parse(t).ml_name
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t)
        ids = [p.send(f"{i}".encode()) for i in range(10)]
        consumer.close()

        async def move(meta: BrokerMetadataStore) -> None:
            stored = await meta.get_cursor(ml, "s")
            assert stored is not None
            mid = ids[6]
            await meta.save_cursor(
                ml, "s", CursorInfo(mark_delete=(mid.ledger_id(), mid.entry_id())), stored.version
            )

        _meta(cluster, move)
        again = c.subscribe(t, "s")
        got = drain(again, 3)
        assert [m.data() for m in got] == [b"7", b"8", b"9"]
        for m in got:
            again.acknowledge(m)
        p.send(b"10")  # the topic is still served: the acks' cursor writes did not conflict
        assert again.receive(10_000).data() == b"10"
    finally:
        c.close()


def test_broker_restarted_under_its_id_before_its_old_session_expires_owns_its_topics(
    cluster: Brokers,
) -> None:
    """The ownership znode an earlier session of the same broker id left behind is replaced, not reused: it
    would vanish when that session expires, while the restarted broker still serves the topic."""
    b = cluster.start()
    c = client(b, operation_timeout_seconds=30)
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t, send_timeout_millis=60_000)
        p.send(b"0")
        b.kill9()
        b.start()  # same port, so the same id, while the killed session still holds its ephemeral znodes
        p.send(b"1")
        time.sleep(6)  # the old session (timeout 4 s) has expired
        assert _owner(cluster, t) == b.service_url
        p.send(b"2")
        assert [m.data() for m in drain(consumer, 3)] == [b"0", b"1", b"2"]
    finally:
        c.close()


def _wait(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_trim_follows_a_cursor_moved_in_zookeeper_by_another_writer(cluster: Brokers) -> None:
    """Retention re-reads the cursors before trimming: a subscription moved in ZooKeeper (as the Spark topic
    source does with ``save_cursor``) lets the ledgers before it go, and its next consumer starts there."""
    broker = cluster.start(
        "--max-entries-per-ledger", "5", "--min-rollover-time-s", "0", "--tick-interval-s", "1"
    )
    c = client(broker)
    try:
        t = topic_name()
        ml = TopicName.parse(t).ml_name
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t)
        ids = [p.send(f"{i}".encode()) for i in range(20)]
        consumer.close()  # nothing acked: the subscription holds every ledger

        def ledgers() -> list[int]:
            async def get(meta: BrokerMetadataStore) -> list[int]:
                info = await meta.get_ml_info(ml)
                assert info is not None
                return [li.ledger_id for li in info.value.ledgers]

            return _meta(cluster, get)

        _wait(lambda: len(ledgers()) >= 4, what="rollovers")
        time.sleep(3)  # ticks run: nothing is trimmed below an unacknowledged subscription
        assert ledgers()[0] == ids[0].ledger_id()

        last = ids[-1]

        async def move(meta: BrokerMetadataStore) -> None:
            stored = await meta.get_cursor(ml, "s")
            assert stored is not None
            info = CursorInfo(mark_delete=(last.ledger_id(), last.entry_id()))
            await meta.save_cursor(ml, "s", info, stored.version)

        _meta(cluster, move)
        _wait(lambda: ledgers()[0] >= last.ledger_id(), what="the trim up to the moved cursor")
        again = c.subscribe(t, "s")
        p.send(b"after")
        assert again.receive(10_000).data() == b"after"
    finally:
        c.close()


# -- bad input ----------------------------------------------------------------------------------------------


def _raw(bp: BrokerProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", bp.port), timeout=5)
    return s


def _connect(s: socket.socket) -> None:
    s.sendall(
        wire.encode_command(
            T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
        )
    )
    frames = wire.FrameDecoder().feed(s.recv(65536))
    assert frames[0].command.type == T.CONNECTED
    assert frames[0].command.connected.server_version


def _closed(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, TimeoutError, OSError):
        return True


@pytest.mark.parametrize("bad", ["before_connect", "garbage", "too_large", "unknown_producer"])
def test_bad_input_closes_that_connection_only(broker: BrokerProcess, bad: str) -> None:
    c = client(broker)
    try:
        t = topic_name()
        p = c.create_producer(t)
        s = _raw(broker)
        if bad == "before_connect":
            s.sendall(wire.encode_command(T(type=T.PING, ping=pb.CommandPing())))
        elif bad == "garbage":
            _connect(s)
            s.sendall(b"\x00\x00\x00\x09garbage!!")
        elif bad == "too_large":
            _connect(s)
            s.sendall(struct.pack(">I", 64 * 1024 * 1024) + b"x" * 100)
        else:
            _connect(s)
            send = T(type=T.SEND, send=pb.CommandSend(producer_id=77, sequence_id=0))
            md = pb.MessageMetadata(producer_name="x", sequence_id=0, publish_time=1)
            s.sendall(wire.encode_send(send, md, b"hello"))
        assert _closed(s)
        s.close()
        p.send(b"still serving")
    finally:
        c.close()


def test_send_with_wrong_checksum_gets_checksum_error(broker: BrokerProcess) -> None:
    s = _raw(broker)
    _connect(s)
    t = f"persistent://public/default/{topic_name()}"
    s.sendall(
        wire.encode_command(
            T(type=T.PRODUCER, producer=pb.CommandProducer(topic=t, producer_id=1, request_id=1))
        )
    )
    dec = wire.FrameDecoder()
    frames: list = []
    while not frames:
        frames = dec.feed(s.recv(65536))
    assert frames[0].command.type == T.PRODUCER_SUCCESS
    send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=0))
    md = pb.MessageMetadata(producer_name="x", sequence_id=0, publish_time=1)
    frame = bytearray(wire.encode_send(send, md, b"hello"))
    frame[-1] ^= 0xFF  # the payload no longer matches its checksum
    s.sendall(bytes(frame))
    frames = []
    while not frames:
        frames = dec.feed(s.recv(65536))
    assert frames[0].command.type == T.SEND_ERROR
    assert frames[0].command.send_error.error == pb.ChecksumError
    s.close()


def _raw_producer(bp: BrokerProcess, topic: str, name: str) -> tuple[socket.socket, wire.FrameDecoder]:
    """A connection with producer 1 named ``name`` on ``topic`` (asked again while the name is busy: the broker
    lets a gone connection's producer go when it sees the connection closed)."""
    deadline = time.monotonic() + 30
    while True:
        s = _raw(bp)
        _connect(s)
        cmd = pb.CommandProducer(topic=topic, producer_id=1, request_id=1, producer_name=name)
        s.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
        dec = wire.FrameDecoder()
        frames: list = []
        while not frames:
            frames = dec.feed(s.recv(65536))
        if frames[0].command.type == T.PRODUCER_SUCCESS:
            return s, dec
        s.close()
        assert frames[0].command.error.error == pb.ProducerBusy and time.monotonic() < deadline
        time.sleep(0.1)


def _raw_send(s: socket.socket, seq: int, payload: bytes) -> None:
    send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq))
    s.sendall(
        wire.encode_send(
            send, pb.MessageMetadata(producer_name="x", sequence_id=seq, publish_time=1), payload
        )
    )


#: answers read with an earlier one and not asked for yet, by decoder (the decoder kept, so its id is not reused)
_UNREAD: dict[int, tuple[wire.FrameDecoder, collections.deque[Any]]] = {}


def _raw_answer(s: socket.socket, dec: wire.FrameDecoder) -> Any:
    """The next SEND_RECEIPT or SEND_ERROR (several may come in one read: the others wait for the next calls)."""
    unread = _UNREAD.setdefault(id(dec), (dec, collections.deque()))[1]
    s.settimeout(60)
    while not unread:
        unread.extend(
            f.command for f in dec.feed(s.recv(65536)) if f.command.type in (T.SEND_RECEIPT, T.SEND_ERROR)
        )
    return unread.popleft()


def _raw_send_chunks(
    s: socket.socket,
    dec: wire.FrameDecoder,
    name: str,
    seq: int,
    parts: list[bytes],
    chunk_ids: list[int] | None = None,
) -> list[Any]:
    """Chunks ``chunk_ids`` (all by default) of one message of ``parts`` (sequence id ``seq``, uuid
    ``<name>-<seq>``) by the raw producer 1 named ``name`` on ``s``; the answers, one per chunk."""
    answers = []
    for chunk_id in range(len(parts)) if chunk_ids is None else chunk_ids:
        md = pb.MessageMetadata(producer_name=name, sequence_id=seq, publish_time=int(time.time() * 1000))
        md.uuid, md.chunk_id, md.num_chunks_from_msg = f"{name}-{seq}", chunk_id, len(parts)
        md.total_chunk_msg_size = sum(map(len, parts))
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq, is_chunk=True))
        s.sendall(wire.encode_send(send, md, parts[chunk_id]))
        answers.append(_raw_answer(s, dec))
    return answers


def test_a_resend_of_a_message_still_being_stored_is_not_acknowledged_before_it_is(cluster: Brokers) -> None:
    """Dedup takes a resend for a duplicate only once its first send is stored. A producer's connection gone
    while its send was being written (the bookies slow), the producer sends it again on a new connection: the
    broker answered that resend at once as a duplicate, before the first write's outcome, and had that write
    failed the message was acknowledged and never stored. The answer is now an error (the client sends again),
    as Pulsar's MessageDupUnknown."""
    broker = cluster.start()
    t = f"persistent://public/default/{topic_name()}"
    s1, dec1 = _raw_producer(broker, t, "x")
    _raw_send(s1, 0, b"m0")
    assert _raw_answer(s1, dec1).type == T.SEND_RECEIPT
    paused = cluster.bookies.procs[:2]  # every entry of E3/Qw2/Qa2 waits for one of them
    for bk in paused:
        bk.pause()
    try:
        _raw_send(s1, 1, b"m1")
        time.sleep(
            0.5
        )  # the broker has the send (the write waiting on the bookies) before the connection goes
        s1.close()
        s2, dec2 = _raw_producer(broker, t, "x")
        _raw_send(s2, 1, b"m1")
        answer = _raw_answer(s2, dec2)
        assert answer.type == T.SEND_ERROR, answer
        s2.close()
    finally:
        for bk in paused:
            bk.resume()
    c = client(broker)
    try:
        p = c.create_producer(t, producer_name="x")  # sends on from what is stored
        p.send(b"m2")
        reader = c.create_reader(t, pulsar.MessageId.earliest)
        got = [reader.read_next(10_000).data() for _ in range(p.last_sequence_id() + 1)]
        assert got[0] == b"m0" and got[-1] == b"m2" and len(set(got)) == len(got)
    finally:
        c.close()


def _get_schema(bp: BrokerProcess, topic: str, version: int | None = None) -> pb.CommandGetSchemaResponse:
    s = _raw(bp)
    try:
        _connect(s)
        get = pb.CommandGetSchema(request_id=9, topic=topic)
        if version is not None:
            get.schema_version = version.to_bytes(8, "big")
        s.sendall(wire.encode_command(T(type=T.GET_SCHEMA, getSchema=get)))
        dec = wire.FrameDecoder()
        frames: list = []
        while not frames:
            frames = dec.feed(s.recv(65536))
        assert frames[0].command.type == T.GET_SCHEMA_RESPONSE
        return frames[0].command.getSchemaResponse
    finally:
        s.close()


def test_declared_schemas_are_stored_in_zookeeper_and_survive_a_restart(broker: BrokerProcess) -> None:
    from pulsar.schema import Float, JsonSchema, Record, String

    class Reading(Record):
        sensor = String()

    def evolved() -> type[Record]:
        class Reading(Record):  # the same record name, a new field with "default": null (FULL compatible)
            sensor = String()
            value = Float(required_default=True)

        return Reading

    ReadingWithValue = evolved()

    t = f"persistent://public/default/{topic_name()}"
    c = client(broker)
    try:
        assert _get_schema(broker, t).error_code == pb.TopicNotFound, "a bytes topic has no schema"
        c.create_producer(t, schema=JsonSchema(Reading)).send(Reading(sensor="a"))
        c.create_producer(t, schema=JsonSchema(ReadingWithValue)).send(
            ReadingWithValue(sensor="x", value=1.0)
        )
        c.create_producer(t, schema=JsonSchema(Reading)).send(
            Reading(sensor="b")
        )  # the same: version 0 again
    finally:
        c.close()
    broker.stop()
    broker.start()
    latest = _get_schema(broker, t)
    assert not latest.HasField("error_code")
    assert latest.schema.type == pb.Schema.Json and b"value" in latest.schema.schema_data
    assert int.from_bytes(latest.schema_version, "big") == 1
    first = _get_schema(broker, t, version=0)
    assert first.schema.type == pb.Schema.Json and b"value" not in first.schema.schema_data
    assert _get_schema(broker, t, version=2).error_code == pb.TopicNotFound


def test_zookeeper_session_loss_unloads_topics_and_clients_come_back(bookies, tmp_path: Path) -> None:
    """An in-process broker whose ZooKeeper session expires stops serving its topics (clients are told to
    reconnect), registers again in its new session, and serves them again after fencing its old ledgers."""
    import threading

    from tests.zk_testing import expire_session
    from topic_broker.server import BrokerServer
    from topic_broker.service import BrokerConfig, BrokerService

    bookies.start_many(3)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)  # type: ignore[arg-type]

    config = BrokerConfig(
        zk=bookies.zk,
        zk_root=bookies.root,
        port=free_port(),
        http_port=free_port(),
        zk_session_timeout_s=4.0,
        tick_interval_s=1.0,
    )
    service = BrokerService(config)
    server = BrokerServer(service)
    run(service.start())
    run(server.start())
    c = pulsar.Client(config.service_url, operation_timeout_seconds=30, logger=quiet_logger())
    try:
        t = topic_name()
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        p = c.create_producer(t, send_timeout_millis=60_000)
        for i in range(5):
            p.send(f"{i}".encode())
        (served,) = service.served_topics()
        old_ledger = served.ml.current_ledger_id
        expire_session(service.bk.store)  # type: ignore[union-attr]
        _wait(lambda: served.unloaded, what="the topic unloaded after the session loss")
        for i in range(5, 10):
            p.send(f"{i}".encode())
        assert [m.data() for m in drain(consumer, 10, timeout_ms=30_000)] == [
            f"{i}".encode() for i in range(10)
        ]
        (again,) = service.served_topics()
        assert again is not served and again.ml.current_ledger_id > old_ledger
        assert config.id in _meta_store(bookies, lambda meta: meta.list_brokers())
        assert (
            _meta_store(bookies, lambda meta: meta.get_owner(TopicName.parse(t).ml_name)).broker_id
            == config.id
        )
    finally:
        c.close()
        run(server.stop())
        run(service.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
