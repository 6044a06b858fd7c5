"""The topic broker as users of the official ``pulsar-client`` meet it: the client features beyond the basics of
test_broker_pulsar_client.py (compression, chunking, size limits, topic names, batch-index acks, ...).
Real ZooKeeper, 3 bookie processes and a broker process; every wait is bounded."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_pulsar_client import client, drain, topic_name
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")


def test_every_compression_type_round_trips_with_and_without_batching(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
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
    finally:
        c.close()


def test_chunked_messages_larger_than_the_limit_round_trip_and_ack(broker: BrokerProcess) -> None:
    """A 12 MiB message in chunks of the announced maximum: every chunk must fit a ledger entry, and dedup (on by
    default) must not take the chunks after the first for resends (they share the message's sequence id)."""
    c = client(broker)
    try:
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
    finally:
        c.close()


def test_a_message_over_the_limit_without_chunking_fails_at_once(broker: BrokerProcess) -> None:
    c = client(broker)
    try:
        producer = c.create_producer(topic_name(), batching_enabled=False)
        started = time.monotonic()
        with pytest.raises(pulsar.MessageTooBig):
            producer.send(b"x" * (wire.DEFAULT_MAX_MESSAGE_SIZE + 1))
        assert time.monotonic() - started < 5
        producer.send(b"small")  # the producer goes on
    finally:
        c.close()


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


def test_batch_index_acks_survive_a_reconnect_and_a_negative_ack(broker: BrokerProcess) -> None:
    """With ``batch_index_ack_enabled`` the messages of a batch acked one by one are not delivered again, whether
    the batch comes back to a new consumer or after a negative ack of the others."""
    c = client(broker)
    try:
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
        producer = c.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=50)
        for i in range(10):
            producer.send_async(f"{i}".encode(), None)
        producer.flush()
        got = drain(consumer, 10)
        assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1  # one batch
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
    finally:
        c.close()
