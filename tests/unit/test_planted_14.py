"""Tests for the bugs planted in the audit of 0260c38..89e0dc0 (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. No cluster: a broker's connection (its
real BrokerService, BrokerProtocol and Session, the service's topic-list handler replaced by one that records
and waits) over a transport that records what is written, the port check on real sockets."""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

from bookie.server_gate import port_problems
from tests.unit.test_broker_connection import connected
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import service as service_mod
from topic_broker import wire
from topic_broker.server import BrokerProtocol, BrokerServer
from topic_broker.service import REQUESTS_IN_FLIGHT_MAX, BrokerConfig, BrokerService, Session

T = pb.BaseCommand


class _Transport(asyncio.Transport):
    """What the protocol and its session call on a transport, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def writelines(self, data: Any) -> None:
        self.written.extend(data)

    def write(self, data: Any) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _requests(ids: range) -> bytes:
    return b"".join(
        wire.encode_command(
            T(
                type=T.GET_TOPICS_OF_NAMESPACE,
                getTopicsOfNamespace=pb.CommandGetTopicsOfNamespace(namespace="public/default", request_id=i),
            )
        )
        for i in ids
    )


def test_requests_read_while_the_connection_takes_nothing_wait_and_begin_once_it_drains(
    monkeypatch: Any,
) -> None:
    """Requests read while the connection's unsent bytes are over the transport's high-water mark are held (not
    begun: each would queue one more answer for a peer that reads none), the connection is not read while any is
    held (nor while REQUESTS_IN_FLIGHT_MAX are being answered and more came), and once it drains they are begun in order and it is read again. Planted: begun at once whatever the
    connection takes; never begun when it drained with none in flight (stuck for good); read while held; never
    read again once they were begun. (GET_TOPICS_OF_NAMESPACE's own smaller bound, LARGE_ANSWERS_IN_FLIGHT_MAX, is
    lifted here: test_large_answers_in_flight tests it.)"""
    monkeypatch.setattr(service_mod, "LARGE_ANSWER_HANDLERS", frozenset())

    async def main() -> None:
        service = BrokerService(BrokerConfig())
        began: list[int] = []
        answer = asyncio.Event()

        async def held(s: Session, r: Any) -> None:
            began.append(r.body.request_id)
            await answer.wait()

        service.on_get_topics_of_namespace = held  # type: ignore[method-assign]
        transport = _Transport()
        protocol = BrokerProtocol(service, BrokerServer(service).gate, BrokerServer(service))
        protocol.connection_made(transport)
        s = protocol.session
        assert s is not None
        connect = T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
        s.data_received(wire.encode_command(connect))
        # over REQUESTS_IN_FLIGHT_MAX: the rest held, the connection not read until they are begun
        s.data_received(_requests(range(REQUESTS_IN_FLIGHT_MAX + 3)))
        await asyncio.sleep(0.01)
        assert began == list(range(REQUESTS_IN_FLIGHT_MAX)) and len(s.held) == 3
        assert not transport.reading
        answer.set()
        await asyncio.sleep(0.05)
        assert began == list(range(REQUESTS_IN_FLIGHT_MAX + 3)) and not s.held and s.in_flight == 0
        assert transport.reading
        # its unsent bytes over the mark: held, begun once it drained
        answer.clear()
        began.clear()
        protocol.pause_writing()
        s.data_received(_requests(range(5)))
        await asyncio.sleep(0.01)
        assert began == [] and len(s.held) == 5 and s.in_flight == 0
        assert not transport.reading
        protocol.resume_writing()  # drained
        await asyncio.sleep(0.01)
        assert began == [0, 1, 2, 3, 4] and not s.held and s.in_flight == 5
        assert transport.reading
        answer.set()
        await asyncio.sleep(0.01)
        assert s.in_flight == 0
        protocol.connection_lost(None)

    asyncio.run(main())


def _held_session(writable: bool) -> Session:
    s = Session.__new__(Session)  # only what tick and answers_ping read and write
    s.peer, s.conn, s.writable, s.closed = (
        "test",
        connected(now=0.0, keepalive_interval_s=30.0),
        writable,
        False,
    )
    s.producers, s.publish_paused, s.publish_bytes = {}, False, 0
    s.held = deque([object()])  # type: ignore[list-item]  # one request held
    s.flush = lambda: None  # type: ignore[method-assign]
    s._liveness = None
    return s


def test_a_connection_not_read_for_its_held_requests_is_spared_the_keep_alive_while_it_takes_answers() -> (
    None
):
    """Not read while requests are held, a connection's PONGs are not seen: while it takes what it is sent the
    keep-alive spares it (as for its producers' SENDs) and a producer-name liveness check takes it for alive;
    one that takes nothing either is closed after two intervals. Planted: a healthy client's connection closed
    by the keep-alive, and its producer's name taken by another (the check's PING never answered in time)."""
    for writable in (True, False):
        s = _held_session(writable)
        s.tick(30.0)
        s.tick(60.0)
        assert s.conn.closed is not writable, writable
    s = _held_session(True)
    assert asyncio.run(s.answers_ping(0.05)) is True


def test_a_port_left_in_time_wait_is_not_taken_for_in_use() -> None:
    """A port whose last connection is in TIME_WAIT (a broker or bookie just stopped with clients connected) is
    free for a listener that binds with SO_REUSEADDR, as the servers' do: the start's check of its ports binds
    so too. Planted without SO_REUSEADDR: a broker restarted at once refused to start, 'port N in use by
    another process'."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server's side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    assert port_problems("127.0.0.1", {"--port": port}).in_use == []
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        assert port_problems("127.0.0.1", {"--port": busy.getsockname()[1]}).in_use == [
            f"port {busy.getsockname()[1]} (--port)"
        ]
    finally:
        busy.close()


def test_a_broker_checks_each_of_its_ports_before_it_registers() -> None:
    """`broker serve` checks every port it will listen on before it registers: --port, --http-port, and the
    TLS ones when given. Planted with --tls-port left out: a broker whose TLS port was taken registered (a
    running broker of its id unregistered) and then failed to bind."""
    from topic_broker.main import _ports

    taken = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]
    try:
        p = [t.getsockname()[1] for t in taken]
        config = BrokerConfig(
            listen_address="127.0.0.1", port=p[0], http_port=p[1], tls_port=p[2], admin_tls_port=p[3]
        )
        assert port_problems(config.listen_address, _ports(config)).in_use == [
            f"port {p[0]} (--port)",
            f"port {p[1]} (--http-port)",
            f"port {p[2]} (--tls-port)",
            f"port {p[3]} (--admin-tls-port)",
        ]
    finally:
        for t in taken:
            t.close()
