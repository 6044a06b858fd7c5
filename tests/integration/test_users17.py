"""A connection that pipelines requests and reads no answer: at most REQUESTS_IN_FLIGHT_MAX are answered at once,
the others held in order and the connection not read meanwhile. Real ZooKeeper, 3 bookies, a broker in-process."""

from __future__ import annotations

import socket
import time
from typing import Any

from tests.broker_testing import Brokers, in_process_broker
from tests.integration.test_broker_client_features4 import wait_for
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.server import BrokerServer

T = pb.BaseCommand


def _answers(s: socket.socket, n: int) -> list[int]:
    """The request ids of the next ``n`` GET_TOPICS_OF_NAMESPACE answers read from ``s`` (after CONNECTED)."""
    decoder, ids = wire.FrameDecoder(), []
    while len(ids) < n:
        data = s.recv(1 << 16)
        assert data, f"closed after {len(ids)} answers"
        for frame in decoder.feed(data):
            if frame.command.type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE:
                ids.append(frame.command.getTopicsOfNamespaceResponse.request_id)
    return ids


def pipelined_get_topics_held(cluster: Brokers, n: int, at_once: int) -> None:
    """``n`` GET_TOPICS_OF_NAMESPACE pipelined in one write to an in-process broker whose answers are held and
    no answer read: ``at_once`` begun, the rest held; once let go, every one answered, begun in the order sent."""
    import asyncio

    began: list[int] = []

    async def on_loop() -> tuple[asyncio.Event, asyncio.AbstractEventLoop, BrokerServer]:
        return asyncio.Event(), asyncio.get_running_loop(), BrokerServer(service)

    with in_process_broker(cluster) as (service, run):
        answer, loop, server = run(on_loop())
        run(server.start())
        handler = service.on_get_topics_of_namespace

        async def held(s: Any, r: Any) -> None:
            began.append(r.body.request_id)
            await answer.wait()
            await handler(s, r)

        service.on_get_topics_of_namespace = held
        try:
            s = socket.create_connection(("127.0.0.1", service.config.port), timeout=60)
            cmds = [T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))]
            cmds += [
                T(
                    type=T.GET_TOPICS_OF_NAMESPACE,
                    getTopicsOfNamespace=pb.CommandGetTopicsOfNamespace(
                        namespace="public/default", request_id=i
                    ),
                )
                for i in range(n)
            ]
            s.sendall(b"".join(wire.encode_command(c) for c in cmds))
            wait_for(lambda: len(began) >= at_once, "the first requests to begin")
            time.sleep(0.5)  # (the rest of the write read meanwhile)
            assert len(began) == at_once
            assert [len(x.held) for x in service.sessions] == [n - at_once]
            assert began == list(range(at_once))
            loop.call_soon_threadsafe(answer.set)
            assert sorted(_answers(s, n)) == list(range(n))
            assert began == list(range(n))  # begun in the order sent
            s.close()
        finally:
            run(server.stop())


def test_pipelined_requests_are_answered_at_most_so_many_at_once_and_all_in_the_end(
    cluster: Brokers, monkeypatch: Any
) -> None:
    """3,000 GET_TOPICS_OF_NAMESPACE pipelined in one write and no answer read: 1,000 begun (each was spawned
    at once, 3,000, their answers all queued for a peer that read none: 200,000 of them grew a broker from 63 MB
    to 1.3 GB, its event loop 7.6 s late and an admin call 87 s); once let go, every one is answered. (Their own
    smaller bound, LARGE_ANSWERS_IN_FLIGHT_MAX, is lifted here: test_large_answers_in_flight tests it.)"""
    from topic_broker import service as service_mod
    from topic_broker.service import REQUESTS_IN_FLIGHT_MAX

    monkeypatch.setattr(service_mod, "LARGE_ANSWER_HANDLERS", frozenset())
    pipelined_get_topics_held(cluster, 3 * REQUESTS_IN_FLIGHT_MAX, REQUESTS_IN_FLIGHT_MAX)
