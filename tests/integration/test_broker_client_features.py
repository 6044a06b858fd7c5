"""The topic broker as users of the official ``pulsar-client`` meet it: the client features beyond the basics of
test_broker_pulsar_client.py (compression, chunking, size limits, topic names, batch-index acks, ...).
Real ZooKeeper, 3 bookie processes and a broker process; every wait is bounded."""

from __future__ import annotations

import datetime
import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_pulsar_client import client, drain, topic_name
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")


@pytest.fixture
def c(broker: BrokerProcess) -> Iterator[Any]:
    """A ``pulsar.Client`` on the broker, closed after the test."""
    cl = client(broker)
    yield cl
    cl.close()


def test_every_compression_type_round_trips_with_and_without_batching(c: Any) -> None:
    for kind in ("LZ4", "ZLib", "ZSTD", "SNAPPY"):
        for batching in (False, True):
            t = topic_name()
            consumer = c.subscribe(t, "s")
            producer = c.create_producer(
                t,
                compression_type=getattr(pulsar.CompressionType, kind),
                batching_enabled=batching,
                batching_max_publish_delay_ms=5,
                block_if_queue_full=True,
            )
            sent = [(f"{kind}-{i}-" * 30).encode() for i in range(300)]
            for data in sent:
                producer.send_async(data, None)
            producer.flush()
            assert [m.data() for m in drain(consumer, len(sent), 5000)] == sent, (kind, batching)
            producer.close()
            consumer.close()


def test_chunked_messages_larger_than_the_limit_round_trip_and_ack(c: Any) -> None:
    """A 12 MiB message in chunks of the announced maximum: every chunk must fit a ledger entry, and dedup (on by
    default) must not take the chunks after the first for resends (they share the message's sequence id)."""
    t = topic_name()
    consumer = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(t, batching_enabled=False, chunking_enabled=True)
    big = os.urandom(12 * 1024 * 1024)
    producer.send(b"before")
    msg_id = producer.send(big)
    producer.send(b"after")
    assert str(msg_id).count(";") == 1  # a chunked message's id: its first and last chunk
    got = drain(consumer, 3, 15_000)
    assert [len(m.data()) for m in got] == [6, len(big), 5]
    assert got[1].data() == big
    for m in got:
        consumer.acknowledge(m)
    time.sleep(0.5)  # acks are grouped by the client
    consumer.close()
    again = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.Timeout):
        again.receive(timeout_millis=1500)  # every chunk was acknowledged


def test_a_message_over_the_limit_without_chunking_fails_at_once(c: Any) -> None:
    producer = c.create_producer(topic_name(), batching_enabled=False)
    started = time.monotonic()
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"x" * (wire.DEFAULT_MAX_MESSAGE_SIZE + 1))
    assert time.monotonic() - started < 5
    producer.send(b"small")  # the producer goes on


@pytest.mark.parametrize(
    "name",
    ["non-persistent://public/default/np", "persistent://public/default/a/b", "persistent://p/ns/a b\x01"],
)
def test_a_refused_topic_name_fails_at_once_not_after_the_operation_timeout(
    broker: BrokerProcess, name: str
) -> None:
    """The C++-based client retries InvalidTopicName until its operation timeout: the broker answers NotAllowed."""
    c = client(broker, operation_timeout_seconds=20)
    try:
        for attempt in (lambda: c.create_producer(name), lambda: c.subscribe(name, "s")):
            started = time.monotonic()
            with pytest.raises(pulsar.NotAllowedError):
                attempt()
            assert time.monotonic() - started < 5
    finally:
        c.close()


def _send_one_batch_of_ten(c: Any, t: str, consumer: Any) -> list[Any]:
    """Messages b"0" .. b"9" sent to ``t`` in one batch; what ``consumer`` receives of them."""
    producer = c.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(10):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    got = drain(consumer, 10)
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1  # one batch
    return got


def test_batch_index_acks_survive_a_reconnect_and_a_negative_ack(c: Any) -> None:
    """With ``batch_index_ack_enabled`` the messages of a batch acked one by one are not delivered again, whether
    the batch comes back to a new consumer or after a negative ack of the others."""
    t = topic_name()

    def subscribe() -> Any:
        return c.subscribe(
            t,
            "s",
            consumer_type=pulsar.ConsumerType.Shared,
            batch_index_ack_enabled=True,
            negative_ack_redelivery_delay_ms=1000,  # after the grouped acks of 6 and 8 went out
        )

    consumer = subscribe()
    got = _send_one_batch_of_ten(c, t, consumer)
    for m in got[:5]:
        consumer.acknowledge(m)
    time.sleep(0.5)  # acks are grouped by the client
    consumer.close()
    consumer = subscribe()
    again = drain(consumer, 5)
    assert [m.data() for m in again] == [f"{i}".encode() for i in range(5, 10)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)
    for m in again:
        if int(m.data()) % 2:
            consumer.negative_acknowledge(m)
        else:
            consumer.acknowledge(m)
    assert sorted(m.data() for m in drain(consumer, 3)) == [b"5", b"7", b"9"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)


def test_a_schema_of_another_type_is_refused_and_the_same_type_round_trips(c: Any) -> None:
    from pulsar.schema import Integer, JsonSchema, Record, String, StringSchema

    class Order(Record):
        qty = Integer()
        item = String()

    t = topic_name()
    producer = c.create_producer(t, schema=StringSchema())
    producer.send("héllo")
    for attempt in (
        lambda: c.create_producer(t, schema=JsonSchema(Order)),
        lambda: c.subscribe(t, "json", schema=JsonSchema(Order)),
    ):
        started = time.monotonic()
        with pytest.raises(pulsar.IncompatibleSchema):
            attempt()
        assert time.monotonic() - started < 5
    strings = c.subscribe(t, "str", schema=StringSchema(), initial_position=pulsar.InitialPosition.Earliest)
    assert strings.receive(timeout_millis=5000).value() == "héllo"
    c.subscribe(t, "bytes")  # no schema goes with any
    j = topic_name()
    orders = c.subscribe(j, "s", schema=JsonSchema(Order))
    c.create_producer(j, schema=JsonSchema(Order)).send(Order(qty=3, item="tea"))
    got = orders.receive(timeout_millis=5000).value()
    assert (got.qty, got.item) == (3, "tea")


def test_dead_letter_topic_gets_the_message_after_its_redeliveries(c: Any) -> None:
    t = topic_name()
    consumer = c.subscribe(
        t,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2),
    )
    dead = c.subscribe(f"{t}-s-DLQ", "d", initial_position=pulsar.InitialPosition.Earliest)
    c.create_producer(t).send(b"poison", properties={"k": "v"})
    counts = []
    for _ in range(3):
        m = consumer.receive(timeout_millis=5000)
        counts.append(m.redelivery_count())
        consumer.negative_acknowledge(m)
    assert counts == [0, 1, 2]
    m = dead.receive(timeout_millis=10_000)
    assert m.data() == b"poison"
    assert m.properties()["k"] == "v" and m.properties()["REAL_TOPIC"].endswith(t)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)


def test_what_a_producer_sets_round_trips_and_its_sequence_survives_a_reopen(c: Any) -> None:
    """10k ``send_async`` with callbacks, properties, keys, event time; ``last_sequence_id`` after a reopen;
    ``get_last_message_id``; multi-topic consumers and initial positions."""
    t = topic_name()
    consumer = c.subscribe(t, "s")
    producer = c.create_producer(t, producer_name="p1", batching_enabled=True, block_if_queue_full=True)
    assert producer.last_sequence_id() == -1
    results: list[Any] = []
    n = 10_000
    for i in range(n):
        producer.send_async(
            f"{i}".encode(),
            lambda res, _mid: results.append(res),
            properties={"i": str(i)},
            partition_key=f"k{i % 7}",
            event_timestamp=1_000 + i,
        )
    producer.flush()
    assert len(results) == n and all(r == pulsar.Result.Ok for r in results)
    assert producer.last_sequence_id() == n - 1
    got = drain(consumer, n)
    assert all(
        m.data() == f"{i}".encode()
        and m.properties() == {"i": str(i)}
        and m.partition_key() == f"k{i % 7}"
        and m.event_timestamp() == 1_000 + i
        for i, m in enumerate(got)
    )
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (
        got[-1].message_id().ledger_id(),
        got[-1].message_id().entry_id(),
    )
    producer.close()
    assert c.create_producer(t, producer_name="p1").last_sequence_id() == n - 1

    other = topic_name()
    c.create_producer(other).send(b"old")
    both = c.subscribe([t, other], "multi", initial_position=pulsar.InitialPosition.Earliest)
    latest = c.subscribe(other, "latest", initial_position=pulsar.InitialPosition.Latest)
    c.create_producer(other).send(b"new")
    assert sum(1 for _ in drain(both, n + 2)) == n + 2
    assert latest.receive(timeout_millis=5000).data() == b"new"
    both.unsubscribe()


def test_a_regex_consumer_gets_the_matching_topics_and_only_those(c: Any) -> None:
    """``topics_pattern``: the topics of the namespace that match when it subscribes (GET_TOPICS_OF_NAMESPACE);
    topics created later are found by the client's polling (every 60 s in the Python client)."""
    prefix = topic_name()
    for suffix in ("a", "b", "other"):
        name = f"{prefix}-{suffix}" if suffix != "other" else f"x{prefix}"
        c.create_producer(name).send(name.encode())
    consumer = c.subscribe(
        re.compile(f"persistent://public/default/{prefix}-.*"),
        "s",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    assert sorted(m.data() for m in drain(consumer, 2)) == [
        f"{prefix}-a".encode(),
        f"{prefix}-b".encode(),
    ]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)


@pytest.mark.parametrize("sub_type", ["Shared", "KeyShared", "Exclusive"])
def test_delayed_delivery_on_shared_and_key_shared_only(broker: BrokerProcess, c: Any, sub_type: str) -> None:
    """``deliver_after``: held back on Shared and Key_Shared (others go past it), delivered at once on the other
    types, as in Pulsar; a consumer that reconnects meanwhile still waits for it."""
    t = topic_name()
    kind = getattr(pulsar.ConsumerType, sub_type)
    consumer = c.subscribe(t, "s", consumer_type=kind)
    producer = c.create_producer(t, batching_enabled=False)
    started = time.monotonic()
    producer.send(b"later", deliver_after=datetime.timedelta(seconds=2))
    producer.send(b"now", partition_key="k")
    first = consumer.receive(timeout_millis=5000)
    consumer.acknowledge(first)
    if sub_type == "Exclusive":
        assert first.data() == b"later" and time.monotonic() - started < 1.5
        return
    assert first.data() == b"now" and time.monotonic() - started < 1.5
    stats_url = f"http://127.0.0.1:{broker.http_port}/admin/v2/persistent/public/default/{t}/stats"
    with urllib.request.urlopen(stats_url, timeout=5) as r:
        assert json.load(r)["subscriptions"]["s"]["msgDelayed"] == 1
    consumer.close()
    consumer = c.subscribe(t, "s", consumer_type=kind)
    later = consumer.receive(timeout_millis=5000)
    assert later.data() == b"later" and time.monotonic() - started >= 1.9
    consumer.acknowledge(later)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=500)


def test_ack_timeout_redelivers_what_was_not_acknowledged(c: Any) -> None:
    """``unacked_messages_timeout_ms`` (10 s at the least in the client): the unacked messages come back with their
    redelivery count raised; the acked one does not."""
    t = topic_name()
    consumer = c.subscribe(
        t, "s", consumer_type=pulsar.ConsumerType.Shared, unacked_messages_timeout_ms=10_000
    )
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(4):
        producer.send(f"{i}".encode())
    got = drain(consumer, 4)
    consumer.acknowledge(got[0])
    again = drain(consumer, 3, 25_000)
    assert sorted(m.data() for m in again) == [b"1", b"2", b"3"]
    assert all(m.redelivery_count() == 1 for m in again)


@pytest.mark.parametrize("batching", [False, True])
def test_a_reader_at_latest_inclusive_reads_the_last_message(broker: BrokerProcess, batching: bool) -> None:
    """``MessageId.latest`` with ``start_message_id_inclusive``: the client asks for the last message id and seeks
    there; the reader must get the topic's last message (the last of its batch), also when the current ledger is
    empty after the broker restarted, and ``has_message_available`` must say so before the read."""
    c = client(broker)
    t = topic_name()
    try:
        p = c.create_producer(t, batching_enabled=batching, batching_max_publish_delay_ms=20)
        for i in range(5):
            p.send_async(f"{i}".encode(), None)
        p.flush()
        r = c.create_reader(t, pulsar.MessageId.latest, start_message_id_inclusive=True)
        assert r.has_message_available()
        assert r.read_next(5000).data() == b"4"
        assert not r.has_message_available()
        p.send(b"5")
        assert r.read_next(5000).data() == b"5"
    finally:
        c.close()
    broker.stop()
    broker.start()  # the topic opens on a new, empty ledger
    c = client(broker)
    try:
        r = c.create_reader(t, pulsar.MessageId.latest, start_message_id_inclusive=True)
        assert r.has_message_available()
        assert r.read_next(5000).data() == b"5"
        with pytest.raises(pulsar.Timeout):
            r.read_next(500)
        exclusive = c.create_reader(t, pulsar.MessageId.latest)
        assert not exclusive.has_message_available()
    finally:
        c.close()


def test_batch_index_acks_survive_a_broker_restart(broker: BrokerProcess) -> None:
    """The acked messages of a partly acked batch are stored with the cursor: after the broker restarts, the
    batch comes back with only its unacked messages (a cumulative ack inside a batch too)."""
    t = topic_name()

    def subscribe(cl: Any, sub: str) -> Any:
        kind = pulsar.ConsumerType.Shared if sub == "shared" else pulsar.ConsumerType.Exclusive
        return cl.subscribe(t, sub, consumer_type=kind, batch_index_ack_enabled=True)

    c = client(broker)
    try:
        shared, exclusive = subscribe(c, "shared"), subscribe(c, "exclusive")
        for m in _send_one_batch_of_ten(c, t, shared):
            if int(m.data()) % 3 == 0:
                shared.acknowledge(m)  # 0, 3, 6, 9
        exclusive.acknowledge_cumulative(drain(exclusive, 10)[3])  # 0..3
        time.sleep(2.5)  # the client groups acks; the broker stores its cursors at most once a second
    finally:
        c.close()
    broker.stop()
    broker.start()
    c = client(broker)
    try:
        shared = subscribe(c, "shared")
        assert sorted(int(m.data()) for m in drain(shared, 6)) == [1, 2, 4, 5, 7, 8]
        with pytest.raises(pulsar.Timeout):
            shared.receive(timeout_millis=1000)
        exclusive = subscribe(c, "exclusive")
        assert [int(m.data()) for m in drain(exclusive, 6)] == [4, 5, 6, 7, 8, 9]
        with pytest.raises(pulsar.Timeout):
            exclusive.receive(timeout_millis=1000)
    finally:
        c.close()
