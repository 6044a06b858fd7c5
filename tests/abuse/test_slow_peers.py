"""Peers that never read what they asked for, against a real broker process: what a consumer's connection is sent
stays within its write buffer (``server.WRITE_BUFFER_HIGH``) and one dispatcher read (``service.READ_BYTES_MAX``),
whatever its permits and the backlog; what a producer that pipelines SENDs has read and not yet stored stays
within ``service.PUBLISH_BYTES_MAX``, whatever it sends; a real client is served meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import resource
import socket
import threading
import time

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.abuse.helpers import http, rss_bytes
from tests.broker_testing import Brokers, broker, cluster, in_process_broker  # noqa: F401
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand
CONNECT = wire.encode_command(
    T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
)
MSG = 1_000_000
BACKLOG = 100  # 100 MB: each stranger is sent all of it without back-pressure
STRANGERS = 3
#: messages a stranger may be sent: the kernel's buffers, the 4 MiB write buffer and one read of 5 MiB, in MB
SENT_MAX = 30


def _await(s: socket.socket, dec: wire.FrameDecoder, wanted: int) -> None:
    while True:
        data = s.recv(65536)
        assert data, "the broker closed the connection"
        if any(f.command.type == wanted for f in dec.feed(data)):
            return


def _stranger(port: int, topic: str, sub: str) -> socket.socket:
    """A consumer that subscribes from the earliest message, grants every permit there is, and reads nothing."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    dec = wire.FrameDecoder()
    s.sendall(CONNECT)
    _await(s, dec, T.CONNECTED)
    cmd = pb.CommandSubscribe(
        topic=topic,
        subscription=sub,
        subType=pb.CommandSubscribe.Exclusive,
        initialPosition=pb.CommandSubscribe.Earliest,
    )
    cmd.consumer_id, cmd.request_id = 1, 1
    s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=cmd)))
    _await(s, dec, T.SUCCESS)
    flow = pb.CommandFlow(consumer_id=1, messagePermits=2**32 - 1)
    s.sendall(wire.encode_command(T(type=T.FLOW, flow=flow)))
    return s


def test_consumers_that_never_read_are_sent_a_bounded_part_of_a_large_backlog(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    assert broker.proc is not None
    topic = "persistent://public/default/slow-peers"
    client = pulsar.Client(
        broker.service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )
    try:
        client.subscribe(topic, "honest", initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(BACKLOG):
            producer.send_async(i.to_bytes(4, "big") + bytes(MSG - 4), None)
        producer.flush()
        base = rss_bytes(broker.proc.pid)
        strangers = [_stranger(broker.port, topic, f"stranger-{i}") for i in range(STRANGERS)]
        consumer = client.subscribe(topic, "honest")  # served meanwhile, all of it
        got = [consumer.receive(timeout_millis=60_000).data()[:4] for _ in range(BACKLOG)]
        assert [int.from_bytes(m, "big") for m in got] == list(range(BACKLOG))
        before, sent = None, _sent(broker, topic)
        deadline = time.monotonic() + 10  # until what the strangers' reads in flight bring is counted
        while sent != before and time.monotonic() < deadline:
            time.sleep(1)
            before, sent = sent, _sent(broker, topic)
        growth = rss_bytes(broker.proc.pid) - base
        for s in strangers:
            s.close()
    finally:
        client.close()
    assert len(sent) == STRANGERS and all(n <= SENT_MAX for n in sent.values()), sent
    assert growth <= STRANGERS * SENT_MAX * MSG + 100 * 2**20, f"RSS grew {growth / 2**20:.0f} MiB"


def _sent(bp: BrokerProcess, topic: str) -> dict[str, int]:
    """Messages dispatched to each stranger's subscription."""
    status, stats = http(bp, "GET", f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/stats")
    assert status == 200, stats
    subs = stats["subscriptions"]
    return {name: sub["msgOutCounter"] for name, sub in subs.items() if name.startswith("stranger-")}


def test_a_producer_that_pipelines_large_sends_and_reads_no_receipt_holds_a_bounded_part_of_them(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    """200 SENDs of 5 MB (1 GB) written as fast as the broker reads them: before, it read them all ahead of the
    bookies and its RSS grew by about what was sent (2.9 GB for 2 GB); now it reads on as they are stored."""
    assert broker.proc is not None
    topic = "persistent://public/default/slow-peers-producer"
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=30)
    dec = wire.FrameDecoder()
    s.sendall(CONNECT)
    _await(s, dec, T.CONNECTED)
    cmd = pb.CommandProducer(topic=topic, producer_id=1, request_id=1, producer_name="pipeliner")
    s.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
    _await(s, dec, T.PRODUCER_SUCCESS)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and no receipt read from here on
    payload = bytes(5_000_000)
    sends = 200
    base = rss_bytes(broker.proc.pid)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(broker.proc.pid) - base)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for i in range(sends):
            md = pb.MessageMetadata(producer_name="pipeliner", sequence_id=i, publish_time=1)
            send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=i, num_messages=1))
            s.sendall(wire.encode_send(send, md, payload))
        client = pulsar.Client(
            broker.service_url,
            operation_timeout_seconds=30,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        )
        try:  # served meanwhile
            client.create_producer(topic + "-by").send(b"served")
        finally:
            client.close()
        status, stats = 0, {}
        deadline = time.monotonic() + 120
        while stats.get("msgInCounter") != sends and time.monotonic() < deadline:
            time.sleep(0.5)
            status, stats = http(
                broker, "GET", "/admin/v2/persistent/public/default/slow-peers-producer/stats"
            )
    finally:
        done.set()
        sampler.join()
        s.close()
    assert stats.get("msgInCounter") == sends, (status, stats)  # all of it stored
    assert peak[0] <= 500 * 2**20, f"RSS grew {peak[0] / 2**20:.0f} MiB for 1 GB sent"
    assert broker.log_path is not None
    assert "SENDs not yet answered hold" in broker.log_path.read_text()


def test_a_broker_started_under_a_low_open_files_limit_raises_it_and_serves_past_it(
    cluster: Brokers,  # noqa: F811
) -> None:
    """Started with a soft limit of 700 open files (as the usual 1024, below its connection caps), the broker
    raises it to the hard limit, as the JVM does for Pulsar's: 720 CONNECTed connections from 3 addresses (within
    the per-address cap) and a real client is still served. Before, the client's producer timed out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (700, hard))  # the broker inherits it
    try:
        bp = cluster.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert bp.proc is not None
    socks: list[socket.socket] = []
    try:
        for i in range(720):
            s = socket.socket()
            socks.append(s)
            s.bind((f"127.0.0.{2 + i % 3}", 0))
            s.settimeout(30)
            s.connect(("127.0.0.1", bp.port))
            s.sendall(CONNECT)
        client = pulsar.Client(
            bp.service_url,
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            client.create_producer("persistent://public/default/many-connections").send(b"served")
        finally:
            client.close()
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
    with open(f"/proc/{bp.proc.pid}/limits") as f:
        line = next(row for row in f if row.startswith("Max open files"))
    assert line.split()[3] == (str(hard) if hard != resource.RLIM_INFINITY else "unlimited"), line


def test_a_consumer_that_reads_nothing_is_disconnected_by_the_keep_alive_and_its_messages_go_back(
    cluster: Brokers,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keep-alive closes a connection that answers no PING, but a close waited for its unsent bytes to be
    written first: a peer that reads nothing kept the socket and its consumer, with its messages unacked, for
    good (still attached minutes after "closed by the broker"). It is cut after ``CLOSE_GRACE_S`` (10 s; 1 s
    here, the keep-alive 1 s), and another consumer of the subscription gets every message."""
    from topic_broker import service as service_module
    from topic_broker.server import BrokerServer

    monkeypatch.setattr(service_module, "CLOSE_GRACE_S", 1.0)
    with in_process_broker(cluster) as (service, run):
        service.conn_config = dataclasses.replace(service.conn_config, keepalive_interval_s=1.0)
        server = BrokerServer(service)
        run(server.start())
        try:
            port = service.config.port
            topic = "persistent://public/default/slow-peers-keepalive"
            client = pulsar.Client(
                f"pulsar://127.0.0.1:{port}", logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
            )
            try:
                client.subscribe(topic, "stranger", initial_position=pulsar.InitialPosition.Earliest).close()
                producer = client.create_producer(topic, batching_enabled=False)
                for i in range(20):
                    producer.send(i.to_bytes(4, "big") + bytes(MSG - 4))
            finally:
                client.close()
            stranger = _stranger(port, topic, "stranger")
            try:
                deadline = time.monotonic() + 30
                while service.sessions and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert not service.sessions, "the stranger's connection is still served"
            finally:
                stranger.close()
            client = pulsar.Client(
                f"pulsar://127.0.0.1:{port}", logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
            )
            try:
                consumer = client.subscribe(topic, "stranger")
                got = [consumer.receive(timeout_millis=30_000).data()[:4] for _ in range(20)]
                assert [int.from_bytes(m, "big") for m in got] == list(range(20))
            finally:
                client.close()
        finally:
            run(server.stop())


def test_a_connection_not_read_for_its_producers_sends_is_not_closed_by_the_keep_alive(
    cluster: Brokers,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection the broker stops reading because its producers' SENDs wait for the bookies cannot show it the
    client's PONGs: the keep-alive closed it after two intervals (its receipts lost, its sends made again). As
    Pulsar's keep-alive with auto-read off, it is not closed for that; the keep-alive 1 s here, the bound 256 KiB,
    the writes held 4 s."""
    from topic_broker import service as service_module
    from topic_broker.server import BrokerServer

    monkeypatch.setattr(service_module, "PUBLISH_BYTES_MAX", 256 * 1024)
    writes = threading.Event()
    with in_process_broker(cluster) as (service, run):
        service.conn_config = dataclasses.replace(service.conn_config, keepalive_interval_s=1.0)
        server = BrokerServer(service)
        run(server.start())
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            producer = client.create_producer(
                "persistent://public/default/slow-peers-paused", batching_enabled=False
            )
            (session,) = service.sessions
            (fut,) = service.topics.values()
            ml = fut.result().ml
            real = ml.append_from

            async def held(*args: object) -> None:
                await asyncio.to_thread(writes.wait, 60)
                await real(*args)

            ml.append_from = held
            answers: list[object] = []
            for _ in range(10):
                producer.send_async(bytes(100_000), lambda res, _mid: answers.append(res))
            deadline = time.monotonic() + 30
            while not session.publish_paused:
                assert time.monotonic() < deadline, "the connection was not paused"
                time.sleep(0.05)
            time.sleep(4)  # four keep-alive intervals without a PONG read
            writes.set()
            producer.flush()
            assert answers == [pulsar.Result.Ok] * 10
            assert not session.closed, "the paused connection was closed (keep-alive timeout)"
        finally:
            writes.set()
            client.close()
            run(server.stop())
