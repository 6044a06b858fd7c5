"""Backlogs in messages with batching, and the namespace backlog quota, against the official ``pulsar-client``:
real ZooKeeper, 3 bookie processes, one broker process."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import start_broker
from tests.metrics_testing import scrape, starting

pulsar = pytest.importorskip("pulsar")


@pytest.fixture
def broker(bookies, tmp_path: Path) -> Iterator[BrokerProcess]:
    bookies.start_many(3)
    bp = start_broker(bookies, tmp_path, 10.0, "--tick-interval-s", "1")  # the default session timeout
    bp.wait_ready(60)
    try:
        yield bp
    finally:
        try:
            bp.stop()
        except Exception:
            bp.kill9()


def http(bp: BrokerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{bp.http_port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def client(bp: BrokerProcess) -> Any:
    return pulsar.Client(
        bp.service_url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def wait_for(what: Callable[[], Any], ok: Callable[[Any], bool], timeout_s: float = 15) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def sub_stats(bp: BrokerProcess, topic: str, sub: str) -> dict[str, Any]:
    status, stats = http(bp, "GET", f"/admin/v2/persistent/public/default/{topic}/stats")
    assert status == 200, stats
    return stats["subscriptions"][sub]  # type: ignore[no-any-return]


def send_batched(c: Any, topic: str, n: int, size: int = 10) -> None:
    producer = c.create_producer(
        f"persistent://public/default/{topic}",
        batching_enabled=True,
        batching_max_messages=size,
        batching_max_publish_delay_ms=50,
    )
    for i in range(n):
        producer.send_async(f"m-{i}".encode(), None)
    producer.flush()
    producer.close()


def test_backlog_counts_messages_of_batches(broker: BrokerProcess) -> None:
    topic = f"b-{uuid.uuid4().hex[:8]}"
    c = client(broker)
    try:
        consumer = c.subscribe(
            f"persistent://public/default/{topic}", "s", consumer_type=pulsar.ConsumerType.Shared
        )
        send_batched(c, topic, 100)
        s = sub_stats(broker, topic, "s")
        assert s["msgBacklog"] == 100
        assert 0 < s["msgBacklogEntries"] < 100  # batches: fewer entries than messages
        assert s["backlogSize"] > 0
        msgs = [consumer.receive(timeout_millis=10_000) for _ in range(100)]
        # every message of the first entries acked: those entries leave the backlog with all their messages
        first_entries = {(m.message_id().ledger_id(), m.message_id().entry_id()) for m in msgs[:50]}
        acked = [m for m in msgs if (m.message_id().ledger_id(), m.message_id().entry_id()) in first_entries]
        for m in acked:
            consumer.acknowledge(m)
        s = wait_for(lambda: sub_stats(broker, topic, "s"), lambda s: s["msgBacklog"] == 100 - len(acked))
        assert s["msgBacklog"] == 100 - len(acked)
        assert s["msgBacklogEntries"] == sub_stats(broker, topic, "s")["msgBacklogEntries"]
        for m in msgs:
            consumer.acknowledge(m)
        s = wait_for(lambda: sub_stats(broker, topic, "s"), lambda s: s["msgBacklog"] == 0)
        assert s["msgBacklog"] == 0 and s["msgBacklogEntries"] == 0
    finally:
        c.close()
    # a new owner counts the recovered ledger's messages by reading it
    http(broker, "PUT", f"/admin/v2/persistent/public/default/{topic}/unload")
    c = client(broker)
    try:
        send_batched(c, topic, 30)
        s = wait_for(lambda: sub_stats(broker, topic, "s"), lambda s: s["msgBacklog"] == 30)
        assert s["msgBacklog"] == 30
    finally:
        c.close()


def _topic_with_quota(broker: BrokerProcess, prefix: str, limit: int, policy: str) -> str:
    """A topic in a new namespace whose backlog quota is ``limit`` bytes with ``policy``."""
    ns = f"{prefix}{uuid.uuid4().hex[:6]}"
    assert http(broker, "PUT", f"/admin/v2/namespaces/public/{ns}")[0] == 204
    status, body = http(
        broker,
        "POST",
        f"/admin/v2/namespaces/public/{ns}/backlogQuota",
        {"limitSize": limit, "policy": policy},
    )
    assert status == 204, body
    return f"persistent://public/{ns}/t"


def test_quota_producer_exception_refuses_producers(broker: BrokerProcess) -> None:
    topic = _topic_with_quota(broker, "q", 2048, "producer_exception")
    c = client(broker)
    try:
        consumer = c.subscribe(topic, "slow")
        producer = c.create_producer(topic, batching_enabled=False)
        for _ in range(8):
            producer.send(b"x" * 1024)  # 8 KiB behind the slow subscription
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            c.create_producer(topic)

        def refused() -> bool:
            try:
                producer.send(b"y")
            except pulsar.PulsarException:
                return True
            return False

        assert wait_for(refused, bool, 20)
        # the subscription catches up: producers are accepted again
        while True:
            try:
                m = consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                break
            consumer.acknowledge(m)
        p2 = wait_for(lambda: _try_producer(c, topic), lambda p: p is not None, 20)
        assert p2 is not None
        p2.send(b"after")
    finally:
        c.close()


def _try_producer(c: Any, topic: str) -> Any:
    try:
        return c.create_producer(topic)
    except pulsar.PulsarException:
        return None


def test_quota_consumer_backlog_eviction_moves_the_slowest_cursor(broker: BrokerProcess) -> None:
    topic = _topic_with_quota(broker, "e", 4096, "consumer_backlog_eviction")
    c = client(broker)
    try:
        c.subscribe(topic, "slow").close()  # durable, nobody reading
        fast = c.subscribe(topic, "fast")
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"{i:04d}".encode() * 256)  # 1 KiB each: 20 KiB behind "slow"
        for _ in range(20):
            fast.acknowledge(fast.receive(timeout_millis=10_000))
        path = "/admin/v2/" + topic.replace("://", "/", 1) + "/stats"
        stats = wait_for(
            lambda: http(broker, "GET", path)[1],
            lambda st: st["subscriptions"]["slow"]["backlogSize"] <= 4096,
        )
        slow = stats["subscriptions"]["slow"]
        assert slow["backlogSize"] <= 4096 and 0 < slow["msgBacklog"] < 20
        # what is left for "slow" is the newest messages
        consumer = c.subscribe(topic, "slow")
        first = consumer.receive(timeout_millis=10_000).data()
        assert int(first[:4]) >= 20 - slow["msgBacklog"]
        metrics = scrape(f"http://127.0.0.1:{broker.http_port}/metrics")
        evictions = starting(metrics, "pulsar_broker_backlog_quota_evictions_total")
        assert len(evictions) == 1 and evictions[0] >= 1, evictions
    finally:
        c.close()
