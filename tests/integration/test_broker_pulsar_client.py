"""The topic broker against the official ``pulsar-client``: real ZooKeeper, 3 bookie processes, broker processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.cluster import BrokerProcess, free_port
from topic_broker import pulsar_api_pb2 as pb  # noqa: F401

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand


class Brokers:
    def __init__(self, bookies, tmp: Path) -> None:
        self.bookies = bookies
        self.tmp = tmp
        self.procs: list[BrokerProcess] = []

    def start(self, *extra: str) -> BrokerProcess:
        port = free_port()
        bp = BrokerProcess(
            zk=self.bookies.zk,
            zk_root=self.bookies.root,
            port=port,
            http_port=free_port(),
            extra_args=["--zk-session-timeout-s", "4", *extra],
            log_path=self.tmp / f"broker-{port}.log",
        )
        self.procs.append(bp)
        return bp.start()

    def stop_all(self) -> None:
        for bp in self.procs:
            try:
                bp.stop()
            except Exception:
                bp.kill9()


@pytest.fixture
def cluster(bookies, tmp_path: Path) -> Iterator[Brokers]:
    bookies.start_many(3)
    b = Brokers(bookies, tmp_path)
    yield b
    b.stop_all()


@pytest.fixture
def broker(cluster: Brokers) -> BrokerProcess:
    return cluster.start()


def client(bp: BrokerProcess, **kw) -> pulsar.Client:
    return pulsar.Client(bp.service_url, operation_timeout_seconds=15, **kw)


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def drain(consumer, n: int, timeout_ms: int = 10_000) -> list:
    return [consumer.receive(timeout_millis=timeout_ms) for _ in range(n)]


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
