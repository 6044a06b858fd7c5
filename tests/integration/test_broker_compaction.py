"""Topic compaction as users of the official ``pulsar-client`` meet it: TableView, readers and consumers with
``is_read_compacted=True``, the admin's compaction trigger and status. One broker on 3 bookies is shared by
the module (broker tests are slow); every test uses its own topics and every wait is bounded."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_pulsar_client import client, topic_name

pulsar = pytest.importorskip("pulsar")


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("compaction")) as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


@pytest.fixture
def c(bp: BrokerProcess) -> Iterator[Any]:
    cl = client(bp)
    yield cl
    cl.close()


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def table(view: Any) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    view.for_each(lambda k, v: out.__setitem__(k, v))
    return out


def send_all(producer: Any, items: list[tuple[str | None, bytes]]) -> None:
    for key, value in items:
        if key is None:
            producer.send(value)
        else:
            producer.send(value, partition_key=key)


def test_table_view_reads_the_latest_value_per_key_and_follows_updates(c: Any) -> None:
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("c", b"")])
    view = c.create_table_view(t)
    try:
        assert table(view) == {"a": b"2", "b": b"1"}  # the tombstone removed c
        send_all(p, [("b", b"2"), ("d", b"1")])
        wait_for("the later updates", lambda: table(view) == {"a": b"2", "b": b"2", "d": b"1"})
        assert view.get("b") == b"2"
    finally:
        view.close()
