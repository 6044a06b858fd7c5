"""The topic broker as users of the official ``pulsar-client`` meet it, seventh part: what a pulsar-admin user
reads in a topic's stats while clients produce and consume.

One broker on 3 bookies (its housekeeping tick every second) is shared by the module; every test uses its own
topics; every wait is bounded."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_pulsar_client import topic_name

pulsar = pytest.importorskip("pulsar")
__all__ = ["c"]  # the third part's client fixture, on this module's broker


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features7"), "--tick-interval-s", "1") as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


def _stats(bp: BrokerProcess, t: str) -> dict[str, Any]:
    return admin(bp, "GET", f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}/stats")


def test_the_first_stats_read_shows_the_rates_of_messages_flowing(bp: BrokerProcess, c: Any) -> None:
    """A topic's stats read once, while messages flow in and out, show rates above 0 (the broker's tick samples
    the counters; before, a rate was sampled only when read, so the first read answered 0.0)."""
    t = f"persistent://public/default/{topic_name()}"
    c.subscribe(t, "s", message_listener=lambda consumer, m: consumer.acknowledge(m))
    producer = c.create_producer(t, batching_enabled=False)
    started = time.monotonic()
    while time.monotonic() - started < 3.5:  # several ticks of the broker, with messages after each
        producer.send(b"x" * 100)
        time.sleep(0.05)
    stats = _stats(bp, t)
    assert stats["msgInCounter"] > 0
    assert stats["msgRateIn"] > 0 and stats["msgThroughputIn"] > 0, stats
    assert stats["msgRateOut"] > 0 and stats["msgThroughputOut"] > 0, stats


def test_stats_name_the_producers_and_consumers_as_pulsar_does(bp: BrokerProcess, c: Any) -> None:
    """Pulsar's publisher and consumer fields: the producer's access mode and properties, each client's address,
    connection time and version, what each consumer was sent, and a Failover subscription's active consumer."""
    t = f"persistent://public/default/{topic_name()}"
    a = c.subscribe(
        t, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a", properties={"team": "x"}
    )
    c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    producer = c.create_producer(t, producer_name="billing", properties={"app": "billing"})
    for i in range(5):  # one batch of 5
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    assert [a.receive(10_000).data() for _ in range(5)] == [f"m{i}".encode() for i in range(5)]
    stats = _stats(bp, t)
    (pub,) = stats["publishers"]
    assert (pub["producerName"], pub["accessMode"], pub["metadata"]) == (
        "billing",
        "Shared",
        {"app": "billing"},
    )
    sub = stats["subscriptions"]["s"]
    assert sub["activeConsumerName"] == "a"
    consumers = {x["consumerName"]: x for x in sub["consumers"]}
    assert {n: x["msgOutCounter"] for n, x in consumers.items()} == {"a": 5, "b": 0}
    assert consumers["a"]["metadata"] == {"team": "x"} and consumers["a"]["bytesOutCounter"] > 0
    for client in (pub, *consumers.values()):
        assert client["address"].startswith("/127.0.0.1:"), client
        assert client["clientVersion"].startswith("Pulsar-"), client
        connected = datetime.datetime.fromisoformat(client["connectedSince"])
        assert abs(datetime.datetime.now(datetime.UTC) - connected) < datetime.timedelta(hours=1), client
