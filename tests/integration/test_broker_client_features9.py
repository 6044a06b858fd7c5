"""Pulsar client features under faults, ninth part, on a broker of its own (the fixtures of the third part): what
a client sends for a consumer whose SUBSCRIBE is still being handled; batches whose count or sizes lie."""

from __future__ import annotations

import socket
import struct
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker_testing import Brokers, in_process_broker, module_cluster
from tests.integration.test_broker_client_features3 import bp, c
from tests.integration.test_broker_pulsar_client import _connect, _raw, _raw_answer, _raw_producer, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.names import TopicName
from topic_broker.server import BrokerServer

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "c"]  # the fixtures of the third part, on this module's broker

T = pb.BaseCommand


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features9")) as b:
        yield b


def test_requests_for_a_consumer_sent_behind_its_subscribe_wait_for_it(bp: Any) -> None:
    """The C++ client takes a new connection for its consumer's as it sends the SUBSCRIBE, so a reader's
    has_message_available() as it reconnects sends GET_LAST_MESSAGE_ID right behind it: answered once the
    consumer is there, not ConsumerNotFound (which the application got as an error)."""
    s = _raw(bp)
    _connect(s)
    t = f"persistent://public/default/{topic_name()}"
    sub = pb.CommandSubscribe(topic=t, subscription="s", subType=pb.CommandSubscribe.Exclusive)
    sub.consumer_id, sub.request_id = 1, 1
    s.sendall(  # in one write: the topic is not open yet when the others are read
        wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub))
        + wire.encode_command(
            T(
                type=T.GET_LAST_MESSAGE_ID,
                getLastMessageId=pb.CommandGetLastMessageId(consumer_id=1, request_id=2),
            )
        )
        + wire.encode_command(
            T(type=T.SEEK, seek=pb.CommandSeek(consumer_id=1, request_id=3, message_publish_time=1))
        )
    )
    dec = wire.FrameDecoder()
    answers: dict[int, Any] = {}
    s.settimeout(30)
    while len(answers) < 3:
        data = s.recv(65536)
        assert data, f"connection closed with answers {answers}"
        for f in dec.feed(data):
            cmd = f.command
            if cmd.type == T.SUCCESS:
                answers[cmd.success.request_id] = cmd
            elif cmd.type == T.ERROR:
                answers[cmd.error.request_id] = cmd
            elif cmd.type == T.GET_LAST_MESSAGE_ID_RESPONSE:
                answers[cmd.getLastMessageIdResponse.request_id] = cmd
    s.close()
    assert answers[1].type == T.SUCCESS
    assert answers[2].type == T.GET_LAST_MESSAGE_ID_RESPONSE, answers[2]
    assert answers[3].type == T.SUCCESS, answers[3]


def _single(i: int) -> bytes:
    """Message ``b<i>`` of a batch: its size, its SingleMessageMetadata, its payload."""
    meta = pb.SingleMessageMetadata(payload_size=len(b"b%d" % i)).SerializeToString()
    return struct.pack(">I", len(meta)) + meta + b"b%d" % i


def test_a_batch_whose_count_or_sizes_overrun_its_payload_is_refused(bp: Any, c: Any) -> None:
    """pulsar-client reads a batch by its count and sizes without checking them against the payload: stored, a
    batch claiming 5 messages of 2 crashed a Shared consumer's process (a segfault), one of garbage every
    consumer's, and a size past the payload had it hand out bytes of its own memory, at each delivery."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    s, dec = _raw_producer(bp, t, "liar")
    overrun = pb.SingleMessageMetadata(payload_size=9999).SerializeToString()
    batches = [
        (5, _single(0) + _single(1)),  # a lie, ...
        (3, b"\x00\x00\x00\x05garbage!"),
        (1, struct.pack(">I", len(overrun)) + overrun + b"zz"),
        (2, _single(0) + _single(1)),  # ... and the truth
    ]
    for seq, (count, payload) in enumerate(batches):
        md = pb.MessageMetadata(
            producer_name="liar", sequence_id=seq, publish_time=1, num_messages_in_batch=count
        )
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=count))
        s.sendall(wire.encode_send(send, md, payload))
        got = _raw_answer(s, dec)
        if seq < 3:
            assert got.type == T.SEND_ERROR and "invalid message" in got.send_error.message, (seq, got)
        else:
            assert got.type == T.SEND_RECEIPT, got
    s.close()
    c.create_producer(t).send(b"after")
    assert [consumer.receive(timeout_millis=20_000).data() for _ in range(3)] == [b"b0", b"b1", b"after"]


class _ProducersWalked(dict):  # type: ignore[type-arg]
    """A topic's producers that note the functions walking them."""

    walkers: list[str]

    def values(self) -> Any:
        self.walkers.append(sys._getframe(1).f_code.co_name)
        return super().values()


def test_a_producer_is_added_without_walking_the_topics_producers(brokers: Brokers) -> None:
    """Each PRODUCER walked the topic's producers three times (a name held, an exclusive one): 15,000 PRODUCERs
    pipelined on one connection took 17 s of the event loop, every client of the broker waiting meanwhile."""
    with in_process_broker(brokers) as (service, run):
        server = BrokerServer(service)
        run(server.start())
        s = socket.create_connection(("127.0.0.1", service.config.port), timeout=30)
        _connect(s)
        t = f"persistent://public/default/{topic_name()}"
        dec = wire.FrameDecoder()

        def producer(i: int, name: str) -> Any:
            cmd = pb.CommandProducer(topic=t, producer_id=i, request_id=i, producer_name=name)
            s.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
            frames: list[Any] = []
            while not frames:
                frames = dec.feed(s.recv(65536))
            return frames[0].command

        assert producer(1, "a").type == T.PRODUCER_SUCCESS
        topic = run(service.get_topic(TopicName.parse(t)))
        walked = _ProducersWalked(topic.producers)
        walked.walkers = []
        topic.producers = walked
        assert producer(2, "b").type == T.PRODUCER_SUCCESS
        answer = producer(3, "a")  # a name held: refused, still without a walk
        assert answer.type == T.ERROR and answer.error.error == pb.ProducerBusy, answer
        s.close()
        run(server.stop())
    assert not {"_create_producer", "_free_name_of_dead_connection"} & set(walked.walkers), walked.walkers


def test_a_partitions_messages_carry_the_ids_their_producer_was_given(bp: Any, c: Any) -> None:
    """A message received from a partitioned topic has the MessageId its producer was given, partition index
    included, as with Pulsar's broker (which names the partition in each MESSAGE and GET_LAST_MESSAGE_ID answer):
    an application comparing the two, or storing one to seek to, finds them equal. Before, the broker sent no
    partition, and every received id read partition -1: `(6,99,-1,-1)` against the producer's `(6,99,1,-1)`."""
    t = f"persistent://public/default/{topic_name()}"
    admin_put = f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    _http_put(admin_put + "/partitions", b"3")
    producer = c.create_producer(t, batching_enabled=False)
    sent = {str(producer.send(f"m{i}".encode(), partition_key=f"k{i}")): i for i in range(12)}
    consumer = c.subscribe(t, "ids", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(timeout_millis=30_000) for _ in range(12)]
    assert {str(m.message_id()): int(m.data()[1:]) for m in got} == sent
    assert {m.message_id().partition() for m in got} == {0, 1, 2}
    part = c.subscribe(f"{t}-partition-2", "last", initial_position=pulsar.InitialPosition.Earliest)
    assert part.get_last_message_id().partition() == 2


def _http_put(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204
