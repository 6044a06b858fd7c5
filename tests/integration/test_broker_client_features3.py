"""The topic broker as users of the official ``pulsar-client`` meet it, third part: the consumer and producer
features beyond test_broker_pulsar_client.py and test_broker_client_features.py (zero-queue consumers, batch
receive, listeners, multi-topic lists, routing modes, KeyBased batches, Key_Shared modes, send queues, stats).
One broker on 3 bookies is shared by the module (broker tests are slow); every test uses its own topics and
every wait is bounded."""

from __future__ import annotations

import collections
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_pulsar_client import client, drain, topic_name

pulsar = pytest.importorskip("pulsar")


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features3")) as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


@pytest.fixture
def c(bp: BrokerProcess) -> Iterator[Any]:
    cl = client(bp)
    yield cl
    cl.close()


def admin(bp: BrokerProcess, method: str, path: str, body: Any = None) -> Any:
    """One admin call, following a broker's ``307`` to the topic's owner whatever the method (as Pulsar's admin
    client does; urllib follows it for GET only): after an unload either broker may own the topic."""
    data = None if body is None else json.dumps(body).encode()
    url = f"http://127.0.0.1:{bp.http_port}{path}"
    for _ in range(3):
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            if e.code != 307 or not e.headers.get("Location"):
                raise
            url = e.headers["Location"]
            continue
        return json.loads(text) if text else None
    raise AssertionError(f"{method} {path}: redirected three times")


def partitioned(bp: BrokerProcess, n: int) -> str:
    t = topic_name()
    admin(bp, "PUT", f"/admin/v2/persistent/public/default/{t}/partitions", n)
    return f"persistent://public/default/{t}"


def fails_within(seconds: float, error: type, attempt: Callable[[], Any]) -> None:
    """``attempt()`` raises ``error`` within ``seconds`` (not after a longer retry)."""
    started = time.monotonic()
    with pytest.raises(error):
        attempt()
    assert time.monotonic() - started < seconds


def nack_counts(consumer: Any, times: int) -> list[int]:
    """The redelivery counts of ``times`` receives, each negatively acknowledged."""
    out = []
    for _ in range(times):
        m = consumer.receive(timeout_millis=10_000)
        out.append(m.redelivery_count())
        consumer.negative_acknowledge(m)
    return out


def receive_all(consumer: Any, idle_ms: int = 1500) -> list[Any]:
    """Every message until none comes for ``idle_ms``."""
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_millis=idle_ms))
        except pulsar.Timeout:
            return out


def test_zero_queue_consumer_batch_receive_and_listeners(c: Any) -> None:
    t = topic_name()
    zero = c.subscribe(t, "zero", receiver_queue_size=0, consumer_type=pulsar.ConsumerType.Shared)
    batched = c.subscribe(t, "batched", batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(10, -1, 500))
    heard: list[bytes] = []
    all_heard = threading.Event()

    def listener(consumer: Any, msg: Any) -> None:
        heard.append(msg.data())
        consumer.acknowledge(msg)
        if len(heard) == 25:
            all_heard.set()

    listened = c.subscribe(t, "listened", message_listener=listener)
    producer = c.create_producer(t, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(25)]
    for data in sent:
        producer.send(data)
    # A zero-queue consumer asks for one message per receive (receive() with a timeout is refused by the client)
    for data in sent[:5]:
        m = zero.receive()
        assert m.data() == data
        zero.acknowledge(m)
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < 25 and time.monotonic() < deadline:
        msgs = batched.batch_receive()
        assert len(msgs) <= 10
        got += [m.data() for m in msgs]
        if len(msgs):
            batched.acknowledge_cumulative(msgs[-1])
    assert got == sent
    assert all_heard.wait(20) and heard == sent
    read: list[bytes] = []
    all_read = threading.Event()

    def reader_listener(reader: Any, msg: Any) -> None:
        read.append(msg.data())
        if len(read) == 25:
            all_read.set()

    reader = c.create_reader(t, pulsar.MessageId.earliest, reader_listener=reader_listener)
    assert all_read.wait(20) and read == sent
    reader.close()
    listened.close()


def test_multi_topic_list_with_a_partitioned_topic_and_a_new_subscription_after_unsubscribe(
    bp: BrokerProcess, c: Any
) -> None:
    tp, plain = partitioned(bp, 3), f"persistent://public/default/{topic_name()}"
    assert c.get_topic_partitions(tp) == [f"{tp}-partition-{i}" for i in range(3)]
    assert c.get_topic_partitions(plain) == [plain]
    multi = c.subscribe([tp, plain], "multi", consumer_type=pulsar.ConsumerType.Shared)
    p1, p2 = c.create_producer(tp, batching_enabled=False), c.create_producer(plain, batching_enabled=False)
    for i in range(9):
        p1.send(f"p{i}".encode())
    for i in range(3):
        p2.send(f"q{i}".encode())
    got = receive_all(multi)
    assert sorted(m.data() for m in got) == sorted(
        [f"p{i}".encode() for i in range(9)] + [b"q0", b"q1", b"q2"]
    )
    assert {m.topic_name() for m in got} == {plain} | {f"{tp}-partition-{i}" for i in range(3)}
    multi.close()
    # unsubscribe deletes the subscription: the next one of the same name starts where initial_position says
    for topic, producer in ((plain, p2), (tp, p1)):
        s = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        s.receive(timeout_millis=10_000)
        s.unsubscribe()
        s = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert len(receive_all(s)) == (3 if topic == plain else 9)
        s.unsubscribe()
        s = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Latest)
        producer.send(b"new")
        assert [m.data() for m in receive_all(s)] == [b"new"]
        s.close()
    a = c.subscribe(plain, "busy", consumer_type=pulsar.ConsumerType.Shared)
    b = c.subscribe(plain, "busy", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        a.unsubscribe()  # another consumer is attached, as in Pulsar
    b.close()
    a.unsubscribe()


def test_seek_and_last_message_id_on_a_partitioned_topic(bp: BrokerProcess, c: Any) -> None:
    tp = partitioned(bp, 3)
    consumer = c.subscribe(tp, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = c.create_producer(
        tp, batching_enabled=False, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution
    )
    ids = [producer.send(f"m{i}".encode()) for i in range(6)]
    assert sorted(i.partition() for i in ids) == [0, 0, 1, 1, 2, 2]
    got = drain(consumer, 6)
    consumer.seek(pulsar.MessageId.earliest)
    assert sorted(m.data() for m in receive_all(consumer)) == sorted(m.data() for m in got)
    consumer.seek(int(time.time() * 1000) - 600_000)
    assert len(receive_all(consumer)) == 6
    # a received message's id names its partition: the seek resets that partition only (exclusive, as Pulsar)
    first = next(m for m in got if m.message_id().entry_id() == 0)
    consumer.seek(first.message_id())
    after = receive_all(consumer)
    assert [(m.topic_name(), m.message_id().entry_id()) for m in after] == [(first.topic_name(), 1)]
    one = c.subscribe(first.topic_name(), "one")
    last = one.get_last_message_id()
    assert (last.partition(), last.entry_id()) == (first.message_id().partition(), 1)


def test_cumulative_ack_on_shared_is_refused_by_the_client_and_the_subscription_goes_on(c: Any) -> None:
    t = topic_name()
    shared = c.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(5):
        producer.send(f"x{i}".encode())
    got = drain(shared, 5)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        shared.acknowledge_cumulative(got[-1])
    shared.acknowledge(got[0])
    shared.acknowledge(got[1])
    shared.close()  # the client sends the grouped acks before it closes
    again = c.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared)
    assert [m.data() for m in receive_all(again)] == [b"x2", b"x3", b"x4"]


@pytest.mark.parametrize("kind", ["Exclusive", "Failover"])
def test_exclusive_and_failover_count_no_redeliveries_so_a_dead_letter_policy_never_fires(
    c: Any, kind: str
) -> None:
    """Pulsar's Exclusive and Failover dispatchers have no redelivery tracker: a message comes back with count 0
    however often it is negatively acknowledged, and the client never sends it to the dead-letter topic."""
    t = topic_name()
    consumer = c.subscribe(
        t,
        "s",
        consumer_type=getattr(pulsar.ConsumerType, kind),
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1),
    )
    dead = c.subscribe(f"{t}-s-DLQ", "d", initial_position=pulsar.InitialPosition.Earliest)
    c.create_producer(t).send(b"poison")
    assert nack_counts(consumer, 3) == [0, 0, 0]
    with pytest.raises(pulsar.Timeout):
        dead.receive(timeout_millis=1000)
    consumer.close()  # the one unacknowledged message comes back to the next consumer, still with count 0
    again = c.subscribe(t, "s", consumer_type=getattr(pulsar.ConsumerType, kind))
    m = again.receive(timeout_millis=10_000)
    assert (m.data(), m.redelivery_count()) == (b"poison", 0)


def test_key_based_batches_on_key_shared_keep_each_key_on_one_consumer_in_order(c: Any) -> None:
    t = topic_name()
    consumers = [
        c.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=f"c{i}")
        for i in range(2)
    ]
    producer = c.create_producer(
        t,
        batching_type=pulsar.BatchingType.KeyBased,
        batching_max_publish_delay_ms=20,
        batching_max_messages=100,
    )
    for j in range(30):
        for k in range(10):
            producer.send_async(f"k{k}:{j}".encode(), None, partition_key=f"k{k}")
    producer.flush()
    got: dict[int, list[tuple[str, int]]] = {0: [], 1: []}

    def run(i: int) -> None:
        for m in receive_all(consumers[i], 3000):
            got[i].append((m.partition_key(), int(m.data().decode().split(":")[1])))
            consumers[i].acknowledge(m)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(got[0]) + len(got[1]) == 300
    owners = collections.defaultdict(set)
    for i in (0, 1):
        per_key = collections.defaultdict(list)
        for key, j in got[i]:
            owners[key].add(i)
            per_key[key].append(j)
        assert all(v == list(range(30)) for v in per_key.values()), i
    assert len(owners) == 10 and all(len(v) == 1 for v in owners.values())


def test_key_shared_modes_do_not_mix_and_overlapping_sticky_ranges_fail_at_once(bp: BrokerProcess) -> None:
    """Pulsar refuses a consumer of another Key_Shared mode or out-of-order setting (ConsumerBusy) and sticky
    ranges it cannot assign (ConsumerAssignError), both without a retry."""
    c = client(bp, operation_timeout_seconds=20)
    policy = pulsar.ConsumerKeySharedPolicy

    def sub(t: str, **kw: Any) -> Any:
        return c.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared, **kw)

    def refused(error: type, t: str, **kw: Any) -> None:
        fails_within(5, error, lambda: sub(t, **kw))

    try:
        sticky_topic, auto_topic = topic_name(), topic_name()
        a = sub(
            sticky_topic, key_shared_policy=policy(pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 32767)])
        )
        refused(
            pulsar.ConsumerAssignError,
            sticky_topic,
            key_shared_policy=policy(pulsar.KeySharedMode.Sticky, sticky_ranges=[(100, 200)]),
        )
        refused(pulsar.ConsumerBusy, sticky_topic)  # auto split joining sticky consumers
        refused(
            pulsar.ConsumerBusy,
            sticky_topic,
            key_shared_policy=policy(
                pulsar.KeySharedMode.Sticky, sticky_ranges=[(40000, 50000)], allow_out_of_order_delivery=True
            ),
        )
        b = sub(
            sticky_topic,
            key_shared_policy=policy(pulsar.KeySharedMode.Sticky, sticky_ranges=[(32768, 65535)]),
        )
        producer = c.create_producer(sticky_topic, batching_enabled=False)
        for i in range(40):
            producer.send(f"{i}".encode(), partition_key=f"k{i % 8}")
        assert len(receive_all(a)) + len(receive_all(b)) == 40
        auto = sub(auto_topic)
        refused(
            pulsar.ConsumerBusy,
            auto_topic,
            key_shared_policy=policy(pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 10)]),
        )
        auto.close()
    finally:
        c.close()


def test_routing_modes_of_a_partitioned_producer(bp: BrokerProcess, c: Any) -> None:
    def partitions(keyed: bool = False, **kw: Any) -> collections.Counter[int]:
        """How a producer with ``kw`` spreads 20 messages on 4 partitions (``keyed``: each its own key)."""
        t = partitioned(bp, 4)
        producer = c.create_producer(t, batching_enabled=False, **kw)
        counts: collections.Counter[int] = collections.Counter()
        for i in range(20):
            msg_id = (
                producer.send(f"{i}".encode(), partition_key=str(i))
                if keyed
                else producer.send(f"{i}".encode())
            )
            counts[msg_id.partition()] += 1
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(int(m.data()) for m in receive_all(consumer)) == list(range(20))
        consumer.close()
        producer.close()
        return counts

    modes = pulsar.PartitionsRoutingMode
    custom = partitions(
        keyed=True,
        message_routing_mode=modes.CustomPartition,
        message_router=lambda msg, n: int(msg.partition_key()) % n,
    )
    assert custom == {0: 5, 1: 5, 2: 5, 3: 5}
    assert partitions(message_routing_mode=modes.RoundRobinDistribution) == {0: 5, 1: 5, 2: 5, 3: 5}
    single = partitions(message_routing_mode=modes.UseSinglePartition, lazy_start_partitioned_producers=True)
    assert len(single) == 1 and sum(single.values()) == 20


def test_send_async_bursts_on_a_small_queue_and_a_close_with_sends_pending(bp: BrokerProcess, c: Any) -> None:
    t = topic_name()
    results: list[Any] = []
    for batching in (False, True):
        producer = c.create_producer(
            t,
            block_if_queue_full=True,
            max_pending_messages=5,
            batching_enabled=batching,
            batching_max_messages=3,
        )
        for i in range(1000):
            producer.send_async(f"{i}".encode(), lambda r, _id: results.append(r))
        producer.flush()
        producer.close()
    assert len(results) == 2000 and set(results) == {pulsar.Result.Ok}
    stats = admin(bp, "GET", f"/admin/v2/persistent/public/default/{t}/stats")
    assert stats["msgInCounter"] == 2000
    other = client(bp)
    producer = other.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=60_000)
    pending: list[Any] = []
    for _ in range(100):
        producer.send_async(b"y", lambda r, _id: pending.append(r))
    started = time.monotonic()
    other.close()
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 10
    while len(pending) < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pending) == 100 and pulsar.Result.Ok not in pending


def test_subscription_stats_show_pulsars_type_names_and_consumer_properties(
    bp: BrokerProcess, c: Any
) -> None:
    t = topic_name()
    kinds = {
        "ex": pulsar.ConsumerType.Exclusive,
        "sh": pulsar.ConsumerType.Shared,
        "fo": pulsar.ConsumerType.Failover,
        "ks": pulsar.ConsumerType.KeyShared,
    }
    consumers = [
        c.subscribe(t, sub, consumer_type=kind, consumer_name=f"n-{sub}", properties={"app": sub})
        for sub, kind in kinds.items()
    ]
    subs = admin(bp, "GET", f"/admin/v2/persistent/public/default/{t}/stats")["subscriptions"]
    assert {s: subs[s]["type"] for s in kinds} == {
        "ex": "Exclusive",
        "sh": "Shared",
        "fo": "Failover",
        "ks": "Key_Shared",
    }
    assert {s: [(x["consumerName"], x["metadata"]) for x in subs[s]["consumers"]] for s in kinds} == {
        s: [(f"n-{s}", {"app": s})] for s in kinds
    }
    for consumer in consumers:
        consumer.close()


def test_topic_names_unusual_long_and_too_long(c: Any) -> None:
    for name in ("a.b-c_d=e:f", "sp ace%20", "ünï-çødé", "L" * 1000):
        t = f"persistent://public/default/{name}"
        producer = c.create_producer(t, batching_enabled=False)
        producer.send(b"hi")
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        m = consumer.receive(timeout_millis=10_000)
        assert (m.data(), m.topic_name()) == (b"hi", t)
        consumer.close()
        producer.close()
    fails_within(
        5, pulsar.NotAllowedError, lambda: c.create_producer("persistent://public/default/" + "L" * 1025)
    )


def test_a_stopped_broker_fails_within_the_operation_timeout(brokers: Brokers) -> None:
    gone = brokers.start()
    gone.stop()
    c = pulsar.Client(gone.service_url, operation_timeout_seconds=3, connection_timeout_ms=1000)
    try:
        fails_within(8, pulsar.Timeout, lambda: c.get_topic_partitions("t"))
        fails_within(8, pulsar.Timeout, lambda: c.create_producer("t"))
        fails_within(8, pulsar.Timeout, lambda: c.subscribe("t", "s"))
    finally:
        c.close()
