"""A SUBSCRIBE or PRODUCER whose connection goes while the broker waits on ZooKeeper for it (the topic opening,
the cursor read), on an in-process broker (real ZooKeeper and bookies), the wait held in place by a gate on
that ZooKeeper read. Attached once the read came back, the consumer or producer of a connection already gone
stayed for good: a Failover subscription's active consumer nobody reads (its backlog never delivered), a
producer name taken (the client's reconnection refused ProducerBusy). Seen with ZooKeeper killed and restarted
under pulsar-client load: the broker closed a connection for a failed ledger creation while its consumers'
resubscriptions waited on ZooKeeper."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.broker_testing import Brokers, CursorReadGate, in_process_broker
from tests.zk_testing import wait_for
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.names import TopicName

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand


def _send_and_close(port: int, command: Any, held: threading.Event, service: Any) -> None:
    """CONNECT, then ``command`` on a raw connection, closed once the broker is held on its ZooKeeper read;
    returns once the broker has seen the connection go."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    connect = T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
    s.sendall(wire.encode_command(connect))
    assert wire.FrameDecoder().feed(s.recv(65536))[0].command.type == T.CONNECTED
    s.sendall(wire.encode_command(command))
    assert held.wait(30)
    s.close()
    assert wait_for(lambda: not service.sessions, 30)


def _sent_and_closed_while_opening(service: Any, run: Callable[[Any], Any], command: Any) -> None:
    """``command`` sent on a raw connection closed while the topic it names opens (held at the opening's read of
    its namespace policies); returns once the open has been let go on."""
    assert service.meta is not None
    held, opened = threading.Event(), asyncio.Event()
    read: Callable[..., Any] = service.meta.get_policies

    async def gated(*args: Any) -> Any:  # the topic opening's read of its namespace policies
        held.set()
        await opened.wait()
        return await read(*args)

    service.meta.get_policies = gated
    try:
        _send_and_close(service.config.port, command, held, service)
    finally:
        service.meta.get_policies = read

    async def release() -> None:
        opened.set()

    run(release())


@contextlib.contextmanager
def _serving(cluster: Brokers, **config: Any) -> Iterator[tuple[Any, Callable[[Any], Any]]]:
    """An in-process broker serving its Pulsar port, ``config`` its ``BrokerConfig`` fields (its housekeeping
    tick once an hour unless given)."""
    from topic_broker.server import BrokerServer

    with in_process_broker(cluster, **{"tick_interval_s": 3600.0, **config}) as (service, run):
        server = BrokerServer(service)
        run(server.start())
        try:
            yield service, run
        finally:
            run(server.stop())


def test_a_subscribe_whose_connection_went_meanwhile_attaches_no_consumer(cluster: Brokers) -> None:
    with _serving(cluster) as (service, run):
        name = f"persistent://public/default/gone-{uuid.uuid4().hex[:8]}"
        topic = run(service.get_topic(TopicName.parse(name)))
        gate = CursorReadGate(topic.ml.store, run, 1)  # the SUBSCRIBE's read of the stored cursor
        sub = pb.CommandSubscribe(topic=name, subscription="s", subType=pb.CommandSubscribe.Failover)
        sub.consumer_id, sub.request_id = 1, 1
        _send_and_close(service.config.port, T(type=T.SUBSCRIBE, subscribe=sub), gate.reached, service)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        gate.release_after(done)
        assert wait_for(lambda: "s" in topic.subscriptions, 30)

        async def consumers() -> int:  # after the step that opened the subscription, on the broker's loop
            return len(topic.subscriptions["s"].consumers)

        assert run(consumers()) == 0


def test_a_producer_whose_connection_went_meanwhile_leaves_its_name_free(cluster: Brokers) -> None:
    with _serving(cluster) as (service, run):
        name = f"persistent://public/default/gone-{uuid.uuid4().hex[:8]}"
        cmd = pb.CommandProducer(topic=name, producer_id=1, request_id=1, producer_name="p1")
        _sent_and_closed_while_opening(service, run, T(type=T.PRODUCER, producer=cmd))
        c = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            p = c.create_producer(name, producer_name="p1")  # ProducerBusy with the gone one attached
            p.send(b"m")
        finally:
            c.close()


def test_a_subscribe_whose_topic_was_unloaded_meanwhile_is_refused(cluster: Brokers) -> None:
    """The topic unloaded while the SUBSCRIBE waited for its cursor: answered ServiceNotReady (the client looks
    the topic up again), not SUCCESS with the consumer on the instance unloaded, which nobody serves any more."""
    with _serving(cluster) as (service, run):
        name = f"persistent://public/default/unloaded-{uuid.uuid4().hex[:8]}"
        topic = run(service.get_topic(TopicName.parse(name)))
        gate = CursorReadGate(topic.ml.store, run, 1)  # the SUBSCRIBE's read of the stored cursor
        s = socket.create_connection(("127.0.0.1", service.config.port), timeout=30)
        try:
            connect = T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
            s.sendall(wire.encode_command(connect))
            dec = wire.FrameDecoder()
            assert dec.feed(s.recv(65536))[0].command.type == T.CONNECTED
            sub = pb.CommandSubscribe(topic=name, subscription="s", subType=pb.CommandSubscribe.Exclusive)
            sub.consumer_id, sub.request_id = 1, 1
            s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub)))
            assert gate.reached.wait(30)
            assert run(service.unload(TopicName.parse(name)))
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            gate.release_after(done)
            answer = None
            while answer is None:
                for f in dec.feed(s.recv(65536)):
                    if f.command.type in (T.SUCCESS, T.ERROR):
                        answer = f.command
            assert answer.type == T.ERROR and answer.error.error == pb.ServiceNotReady, answer
        finally:
            s.close()


def test_a_reader_whose_connection_went_while_its_topic_opened_leaves_no_subscription(
    cluster: Brokers,
) -> None:
    """A reader's SUBSCRIBE (non-durable) whose connection went while its topic was opening: its subscription,
    made once the open came back and then given no consumer, stayed on the topic until the topic was unloaded
    (a reader subscription with no reader, listed by the stats; one more for each such reader). It goes, as
    the subscription of a reader that leaves does."""
    with _serving(cluster) as (service, run):
        name = f"persistent://public/default/gone-{uuid.uuid4().hex[:8]}"
        sub = pb.CommandSubscribe(
            topic=name, subscription="reader-1", subType=pb.CommandSubscribe.Exclusive, durable=False
        )
        sub.consumer_id, sub.request_id = 1, 1
        _sent_and_closed_while_opening(service, run, T(type=T.SUBSCRIBE, subscribe=sub))
        topic = run(service.get_topic(TopicName.parse(name)))

        async def subscriptions() -> list[str]:  # once the SUBSCRIBE's step after the open has run
            await asyncio.sleep(0.2)
            return list(topic.subscriptions)

        assert run(subscriptions()) == []  # before: ['reader-1']
