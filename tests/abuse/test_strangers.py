"""Strangers holding connections open. On the broker's Pulsar port, connections beyond the per-address cap are
closed on arrival, and connections that never finish the handshake, or hold a frame open by trickling it, are
closed within the keep-alive bound (as Pulsar's broker does) while a real client is served. On the admin HTTP of
a bookie or a broker, connections beyond the per-address cap are closed on arrival and idle or half-sent ones after
``HTTP_IDLE_TIMEOUT_S``, while another address is served."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
import urllib.request
from typing import Any

import pytest

from bookie import server_gate as srv
from ledgerstore.cluster import BrokerProcess
from tests.abuse.helpers import http, metric
from tests.broker_testing import broker, cluster  # noqa: F401
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import server as broker_server
from topic_broker import wire
from topic_broker.connection import ConnectionConfig, ProtocolConnection

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand
EARLIEST = pulsar.InitialPosition.Earliest
KEEPALIVE_S = 30.0  # the broker's keep-alive interval (topic_broker.connection.DEFAULT_KEEPALIVE_INTERVAL_S)


def _connect_frame() -> bytes:
    return wire.encode_command(
        T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
    )


def test_pure_core_a_trickled_partial_frame_is_no_sign_of_life() -> None:
    conn = ProtocolConnection(ConnectionConfig(keepalive_interval_s=30.0), 0.0)
    conn.receive_data(_connect_frame(), 0.0)
    conn.data_to_send()
    conn.receive_data(struct.pack(">I", 1000), 1.0)  # a frame of 1000 bytes, begun
    t = 1.0
    while t < 200 and not conn.closed:
        t += 5.0
        conn.receive_data(b"x", t)  # one more byte of it now and then
        conn.tick(t)
    assert conn.closed and "keep-alive" in (conn.close_reason or ""), "a trickle kept the connection open"
    assert t <= 2 * 30.0 + 5.0


def _closed_after(
    socks: dict[str, socket.socket], start: float, deadline: float, trickle: str | None = None
) -> dict[str, float]:
    """Seconds from ``start`` until the server closed each socket (inf: still open at ``deadline``); the one
    named ``trickle`` is sent a byte every 5 s meanwhile."""
    closed = dict.fromkeys(socks, float("inf"))
    next_byte = time.monotonic() + 5.0
    for s in socks.values():
        s.setblocking(False)
    while time.monotonic() < deadline and any(v == float("inf") for v in closed.values()):
        time.sleep(0.2)
        for name, s in socks.items():
            if closed[name] != float("inf"):
                continue
            try:
                if not s.recv(65536):
                    closed[name] = time.monotonic() - start
            except BlockingIOError:
                pass
            except OSError:
                closed[name] = time.monotonic() - start
        if trickle is not None and time.monotonic() >= next_byte and closed[trickle] == float("inf"):
            next_byte += 5.0
            try:
                socks[trickle].send(b"x")
            except OSError:
                closed[trickle] = time.monotonic() - start
    return closed


def test_half_open_handshakes_and_trickled_frames_are_closed_and_a_client_is_served_meanwhile(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    crowd = [_from("127.0.0.2", broker.port) for _ in range(broker_server.CONNECTIONS_PER_PEER_MAX)]
    one_more = _from("127.0.0.2", broker.port)
    assert _refused_at_once(one_more), "one connection over the per-address cap was kept"
    for s in (one_more, *crowd):
        s.close()
    crowd = [_from("127.0.0.4", broker.http_port) for _ in range(srv.HTTP_CONNECTIONS_PER_PEER_MAX)]
    one_more = _from("127.0.0.4", broker.http_port)
    assert _refused_at_once(one_more), "one admin HTTP connection over the per-address cap was kept"
    for s in (one_more, *crowd):
        s.close()
    admin_half = socket.create_connection(("127.0.0.1", broker.http_port), timeout=5)
    admin_half.sendall(b"GET /admin/v2/clusters HTTP/1.1\r\n")  # a request head never finished
    silent = socket.create_connection(("127.0.0.1", broker.port), timeout=5)  # connects, sends nothing
    half = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    half.sendall(struct.pack(">I", 100) + b"0123456789")  # a frame header and a tenth of its body
    trickler = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    trickler.sendall(_connect_frame())
    assert wire.FrameDecoder().feed(trickler.recv(65536))[0].command.type == T.CONNECTED
    trickler.sendall(struct.pack(">I", 100_000) + b"y")  # then a large frame, a byte every 5 s
    start = time.monotonic()
    client = pulsar.Client(
        broker.service_url, operation_timeout_seconds=15, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )
    try:
        producer = client.create_producer("persistent://public/default/strangers-by")
        producer.send(b"served while strangers hold connections")
        socks = {"silent": silent, "half": half, "trickle": trickler, "admin_half": admin_half}
        closed = _closed_after(socks, start, start + 2 * KEEPALIVE_S + 15, "trickle")
        producer.send(b"still served")
    finally:
        client.close()
        for s in (silent, half, trickler, admin_half):
            s.close()
    assert closed["silent"] <= KEEPALIVE_S + 10, closed
    assert closed["half"] <= KEEPALIVE_S + 10, closed
    assert closed["trickle"] <= 2 * KEEPALIVE_S + 15, closed
    assert closed["admin_half"] <= srv.HTTP_IDLE_TIMEOUT_S + 15, closed
    log = broker.log_path.read_text() if broker.log_path else ""
    assert "no CONNECT within" in log and "keep-alive timeout" in log
    assert "refusing connection from 127.0.0.2" in log
    assert "admin HTTP: refusing connection from 127.0.0.4" in log


def _refused_at_once(s: socket.socket) -> bool:
    """Whether the server closed ``s`` within 3 s without answering anything."""
    s.settimeout(3)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _from(host: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((host, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def test_admin_http_strangers_are_capped_per_address_and_idle_or_half_sent_ones_closed(bookies) -> None:
    bp = bookies.start()
    silent = _from("127.0.0.3", bp.http_port)
    half = _from("127.0.0.3", bp.http_port)
    half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # a request head never finished
    start = time.monotonic()
    held = [_from("127.0.0.2", bp.http_port) for _ in range(srv.HTTP_CONNECTIONS_PER_PEER_MAX)]
    one_more = _from("127.0.0.2", bp.http_port)
    try:
        assert _refused_at_once(one_more), "one connection over the per-address cap was kept"
        status, body = http(bp, "GET", "/health", timeout_s=10)  # another address is served meanwhile
        assert status == 200 and body["status"] == "ok"
        assert metric(bp, "bookie_http_connections_refused_total") >= 1
        closed = _closed_after({"silent": silent, "half": half}, start, start + srv.HTTP_IDLE_TIMEOUT_S + 15)
        assert max(closed.values()) <= srv.HTTP_IDLE_TIMEOUT_S + 15, closed
    finally:
        for s in (silent, half, one_more, *held):
            s.close()
    assert bp.log_path is not None
    assert "admin HTTP: refusing connection from 127.0.0.2" in bp.log_path.read_text()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_partial_frames_of_many_connections_stay_within_the_brokers_budget(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    assert broker.proc is not None
    pid = broker.proc.pid
    before = _rss_mb(pid)
    size = 5_000_000  # just under the 5 MiB message limit
    n = 120  # 600 MB of partial frames offered, over twice PARTIAL_BYTES_MAX
    socks = []
    try:
        for _ in range(n):
            s = _from("127.0.0.5", broker.port)
            s.sendall(_connect_frame())
            s.recv(65536)
            s.settimeout(0.3)
            with contextlib.suppress(TimeoutError):  # a paused connection takes no more
                s.sendall(struct.pack(">I", size) + bytes(size - 1))
            socks.append(s)
        time.sleep(2)
        grown = _rss_mb(pid) - before
        client = pulsar.Client(
            broker.service_url,
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        )
        try:  # a client holding no partial frame is served meanwhile
            client.create_producer("persistent://public/default/budget-by").send(b"served")
        finally:
            client.close()
    finally:
        for s in socks:
            s.close()
    assert grown < broker_server.PARTIAL_BYTES_MAX / 2**20 + 150, f"RSS grew {grown:.0f} MB"
    assert broker.log_path is not None
    assert "partial frames hold" in broker.log_path.read_text()


def test_a_subscribe_with_an_empty_subscription_name_gets_an_error_and_the_connection_stays(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    s.sendall(_connect_frame())
    dec = wire.FrameDecoder()
    assert dec.feed(s.recv(65536))[0].command.type == T.CONNECTED
    sub = pb.CommandSubscribe(
        topic="persistent://public/default/empty-sub", subscription="", subType=pb.CommandSubscribe.Exclusive
    )
    sub.consumer_id, sub.request_id = 1, 7
    s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub)))
    s.sendall(wire.encode_command(T(type=T.PING, ping=pb.CommandPing())))
    frames: list = []
    while len(frames) < 2:
        data = s.recv(65536)
        assert data, "the broker closed the connection"
        frames += dec.feed(data)
    s.close()
    types = {f.command.type: f.command for f in frames}
    assert types[T.ERROR].error.request_id == 7
    assert types[T.ERROR].error.error == pb.InvalidTopicName
    assert "subscription" in types[T.ERROR].error.message
    assert T.PONG in types, "the connection stays open and served"
    assert broker.log_path is not None
    assert "on_subscribe failed" not in broker.log_path.read_text()


def _stranger_acks(port: int, topic: str, sub: str, ack_type: int, ledger: int, entry: int) -> None:
    """A raw consumer of ``sub`` (Shared) that acknowledges ``(ledger, entry)``, then PINGs for the broker's PONG."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(_connect_frame())
    dec = wire.FrameDecoder()
    frames = dec.feed(s.recv(65536))
    cmd = pb.CommandSubscribe(topic=topic, subscription=sub, subType=pb.CommandSubscribe.Shared)
    cmd.consumer_id, cmd.request_id = 1, 1
    s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=cmd)))
    ack = pb.CommandAck(consumer_id=1, ack_type=ack_type)
    ack.message_id.add(ledgerId=ledger, entryId=entry)
    s.sendall(
        wire.encode_command(T(type=T.ACK, ack=ack))
        + wire.encode_command(T(type=T.PING, ping=pb.CommandPing()))
    )
    while not any(f.command.type == T.PONG for f in frames):
        data = s.recv(65536)
        assert data, "the broker closed the connection"
        frames += dec.feed(data)
    s.close()
    assert [f.command.type for f in frames][:2] == [T.CONNECTED, T.SUCCESS]


def _received(consumer: Any, at_most: int) -> list[bytes]:
    """What ``consumer`` receives (each acknowledged) until 2 s pass without a message, or ``at_most``."""
    got: list[bytes] = []
    with contextlib.suppress(pulsar.Timeout):
        while len(got) < at_most:
            m = consumer.receive(2000)
            got.append(m.data())
            consumer.acknowledge(m)
    return got


def test_acks_of_entries_not_written_yet_acknowledge_nothing(broker: BrokerProcess) -> None:  # noqa: F811
    """A consumer's ack of a message id after the topic's last entry (an individual one two entries ahead, a
    cumulative one three ahead) is dropped: the messages later stored there are delivered to the subscription."""
    topic = "persistent://public/default/future-acks"
    c = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        p = c.create_producer(topic, batching_enabled=False)
        first = p.send(b"m0")
        for sub, kind, ahead in (("ind", pb.CommandAck.Individual, 2), ("cum", pb.CommandAck.Cumulative, 3)):
            c.subscribe(
                topic, sub, consumer_type=pulsar.ConsumerType.Shared, initial_position=EARLIEST
            ).close()
            _stranger_acks(broker.port, topic, sub, kind, first.ledger_id(), first.entry_id() + ahead)
        for i in range(1, 6):
            p.send(f"m{i}".encode())
        for sub in ("ind", "cum"):
            got = _received(c.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared), 7)
            assert sorted(got) == [f"m{i}".encode() for i in range(6)], sub
    finally:
        c.close()


def test_admin_moves_to_message_ids_not_written_yet_start_at_the_next_entry(broker: BrokerProcess) -> None:  # noqa: F811
    """A subscription reset (``resetcursor``) or created at a message id three entries after the last stored one
    starts at the next entry written, as a SEEK there: every message sent after is delivered."""
    name = "future-admin-ids"
    topic = f"persistent://public/default/{name}"
    c = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        p = c.create_producer(topic, batching_enabled=False)
        first = p.send(b"m0")
        ahead = json.dumps({"ledgerId": first.ledger_id(), "entryId": first.entry_id() + 3}).encode()
        c.subscribe(topic, "r", initial_position=EARLIEST).close()
        base = f"http://127.0.0.1:{broker.http_port}/admin/v2/persistent/public/default/{name}/subscription"
        for method, url in (("POST", f"{base}/r/resetcursor"), ("PUT", f"{base}/c")):
            req = urllib.request.Request(url, ahead, {"Content-Type": "application/json"}, method=method)
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 204, (method, url)
        for i in range(1, 6):
            p.send(f"m{i}".encode())
        for sub in ("r", "c"):
            assert _received(c.subscribe(topic, sub), 6) == [f"m{i}".encode() for i in range(1, 6)], sub
    finally:
        c.close()


def test_a_reset_to_a_message_id_on_a_partitioned_topic_is_refused_as_pulsars(broker: BrokerProcess) -> None:  # noqa: F811
    """``resetcursor`` with a MessageId body on a partitioned topic is 405, as Pulsar's ("Reset-cursor at position is
    not allowed for partitioned-topic"): a message id is one partition's, and sent to every partition it moved the
    others to a place that is not theirs (the next entry written when its ledger is newer than theirs: their
    backlog skipped). Each partition keeps its backlog; a reset of the partition itself is taken."""
    name = "partitioned-reset"
    topic = f"persistent://public/default/{name}"
    admin = f"/admin/v2/persistent/public/default/{name}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}{admin}/partitions",
        b"2",
        {"Content-Type": "application/json"},
        method="PUT",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204
    c = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        c.subscribe(topic, "s", initial_position=EARLIEST).close()
        ids = {}
        for part in (0, 1):
            p = c.create_producer(f"{topic}-partition-{part}", batching_enabled=False)
            ids[part] = [p.send(f"p{part}-m{i}".encode()) for i in range(3)]
            p.close()
        newest = max(ids.values(), key=lambda got: got[0].ledger_id())[0]  # the partition of the newer ledger
        body = json.dumps({"ledgerId": newest.ledger_id(), "entryId": newest.entry_id()}).encode()
        url = f"http://127.0.0.1:{broker.http_port}{admin}/subscription/s/resetcursor"
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 405
        assert "not allowed for partitioned-topic" in refused.value.read().decode()
        for part in (0, 1):
            _, stats = http(broker, "GET", f"{admin}-partition-{part}/stats")
            assert stats["subscriptions"]["s"]["msgBacklog"] == 3, (part, stats["subscriptions"]["s"])
        url = f"http://127.0.0.1:{broker.http_port}{admin}-partition-0/subscription/s/resetcursor"
        first = ids[0][1]
        body = json.dumps({"ledgerId": first.ledger_id(), "entryId": first.entry_id()}).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 204
        _, stats = http(broker, "GET", f"{admin}-partition-0/stats")
        assert stats["subscriptions"]["s"]["msgBacklog"] == 2
    finally:
        c.close()
