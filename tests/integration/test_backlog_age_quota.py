"""The ``message_age`` backlog quota (``pulsar-admin namespaces|topics set-backlog-quota --type message_age
--limitTime S --policy P``): set and read beside the ``destination_storage`` quota over the admin REST, and
enforced on the official ``pulsar-client``. Real ZooKeeper, 3 bookie processes, one broker whose housekeeping
tick (where the quotas are checked) comes every second; every wait is bounded."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import module_cluster
from tests.integration.test_broker_admin8 import _http_status
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_pulsar_client import client
from tests.metrics_testing import scrape, starting

pulsar = pytest.importorskip("pulsar")


@pytest.fixture(scope="module")
def bp(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("agequota"), "--tick-interval-s", "1") as b:
        yield b.procs[0]


def _namespace(bp: BrokerProcess) -> str:
    ns = f"public/age{uuid.uuid4().hex[:6]}"
    admin(bp, "PUT", f"/admin/v2/namespaces/{ns}")
    return ns


SIZE = {"limitSize": 1 << 30, "limitTime": -1, "policy": "producer_exception"}
AGE = {"limitSize": -1, "limitTime": 3600, "policy": "consumer_backlog_eviction"}


def test_both_quota_types_set_read_and_removed_on_namespace_and_topic(bp: BrokerProcess) -> None:
    """Each type is set without losing the other, both are in the map (and the namespace's policies), and
    removing one keeps the other; a message_age quota without ``limitTime`` and an unknown type are 412."""
    ns = _namespace(bp)
    base = f"/admin/v2/namespaces/{ns}"
    admin(bp, "POST", f"{base}/backlogQuota?backlogQuotaType=destination_storage", SIZE)
    admin(bp, "POST", f"{base}/backlogQuota?backlogQuotaType=message_age", AGE)
    assert admin(bp, "GET", f"{base}/backlogQuotaMap") == {"destination_storage": SIZE, "message_age": AGE}
    assert admin(bp, "GET", base)["backlog_quota_map"] == {"destination_storage": SIZE, "message_age": AGE}
    admin(bp, "DELETE", f"{base}/backlogQuota?backlogQuotaType=message_age")
    assert admin(bp, "GET", f"{base}/backlogQuotaMap") == {"destination_storage": SIZE}
    admin(bp, "POST", f"{base}/backlogQuota?backlogQuotaType=message_age", AGE)
    admin(bp, "DELETE", f"{base}/backlogQuota")  # the default type: destination_storage
    none = {"limitSize": -1, "limitTime": -1, "policy": "producer_request_hold"}
    assert admin(bp, "GET", f"{base}/backlogQuotaMap") == {"destination_storage": none, "message_age": AGE}
    no_time = {"policy": "producer_exception"}
    assert _http_status(bp, "POST", f"{base}/backlogQuota?backlogQuotaType=message_age", no_time) == 412
    assert _http_status(bp, "POST", f"{base}/backlogQuota?backlogQuotaType=big", SIZE) == 412
    assert admin(bp, "GET", f"{base}/backlogQuotaMap")["message_age"] == AGE

    topic = f"/admin/v2/persistent/{ns}/t"
    admin(bp, "PUT", topic)
    assert admin(bp, "GET", f"{topic}/backlogQuotaMap") == {}
    assert admin(bp, "GET", f"{topic}/backlogQuotaMap?applied=true") == {
        "destination_storage": none,
        "message_age": AGE,
    }
    own_age = {"limitSize": -1, "limitTime": 60, "policy": "producer_request_hold"}
    admin(bp, "POST", f"{topic}/backlogQuota?backlogQuotaType=message_age", own_age)
    admin(bp, "POST", f"{topic}/backlogQuota?backlogQuotaType=destination_storage", SIZE)
    assert admin(bp, "GET", f"{topic}/backlogQuotaMap") == {
        "destination_storage": SIZE,
        "message_age": own_age,
    }
    admin(bp, "DELETE", f"{topic}/backlogQuota?backlogQuotaType=message_age")
    assert admin(bp, "GET", f"{topic}/backlogQuotaMap") == {"destination_storage": SIZE}
    assert admin(bp, "GET", f"{topic}/backlogQuotaMap?applied=true") == {
        "destination_storage": SIZE,
        "message_age": AGE,
    }


def test_message_age_producer_exception_refuses_producers_until_acknowledged(bp: BrokerProcess) -> None:
    """A 1 s message_age quota, producer_exception: a message left unacknowledged by a subscription past 1 s
    refuses a new producer with ProducerBlockedQuotaExceededException and the connected one's sends fail;
    acknowledged, producers are taken."""
    ns = _namespace(bp)
    quota = {"limitTime": 1, "policy": "producer_exception"}
    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/t"
    c = client(bp)
    try:
        consumer = c.subscribe(topic, "slow")
        producer = c.create_producer(topic)
        producer.send(b"old")
        c.create_producer(topic).close()  # not a second old yet: taken
        time.sleep(1.5)
        # the producer connected before is closed at a tick, and its reconnection refused: its sends fail
        deadline = time.monotonic() + 20
        while True:
            try:
                producer.send(b"more")
            except pulsar.PulsarException:
                break
            assert time.monotonic() < deadline, "the connected producer still sends"
            time.sleep(0.2)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            c.create_producer(topic)
        old = consumer.receive(timeout_millis=10_000)
        assert old.data() == b"old"
        consumer.acknowledge_cumulative(
            _last_received(consumer) or old
        )  # and any "more" stored before the close
        deadline = time.monotonic() + 20
        while True:
            try:
                c.create_producer(topic).send(b"after")
                break
            except pulsar.ProducerBlockedQuotaExceededException:
                assert time.monotonic() < deadline, "producers still refused after the acknowledgement"
                time.sleep(0.2)
    finally:
        c.close()


def _last_received(consumer: Any) -> Any:
    """The last message the consumer receives before 1 s passes with none (None when it receives none)."""
    last = None
    while True:
        try:
            last = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            return last


def test_message_age_eviction_moves_the_cursor_past_old_messages(bp: BrokerProcess) -> None:
    """A 2 s message_age quota, consumer_backlog_eviction: a subscription that does not acknowledge has its
    messages older than 2 s acknowledged for it at a tick; a message newer than that stays; producers are taken
    all along."""
    ns = _namespace(bp)
    quota = {"limitTime": 2, "policy": "consumer_backlog_eviction"}
    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/t"
    stats = f"/admin/v2/persistent/{ns}/t/stats"
    metrics_url = f"http://127.0.0.1:{bp.http_port}/metrics"
    evictions_before = sum(starting(scrape(metrics_url), "pulsar_broker_backlog_quota_evictions_total"))
    c = client(bp)
    try:
        c.subscribe(topic, "slow").close()  # durable, nobody reading
        producer = c.create_producer(topic)
        for i in range(5):
            producer.send(f"old-{i}".encode())
        assert admin(bp, "GET", stats)["subscriptions"]["slow"]["msgBacklog"] == 5

        def backlog() -> int:
            return int(admin(bp, "GET", stats)["subscriptions"]["slow"]["msgBacklog"])

        wait_for(lambda: backlog() == 0, "the old messages evicted", 20)
        producer.send(b"new")
        time.sleep(1.0)  # a tick or more, the new message not 2 s old
        assert backlog() == 1
        consumer = c.subscribe(topic, "slow")
        assert consumer.receive(timeout_millis=10_000).data() == b"new"
        evictions = sum(starting(scrape(metrics_url), "pulsar_broker_backlog_quota_evictions_total"))
        assert evictions > evictions_before
    finally:
        c.close()


def test_a_topics_own_message_age_quota_holds_producers(bp: BrokerProcess) -> None:
    """A topic's own 1 s message_age quota (its namespace has none), producer_request_hold: a new producer is
    answered ProducerBlockedQuotaExceededError, which the client retries until its operation timeout."""
    ns = _namespace(bp)
    admin(bp, "PUT", f"/admin/v2/persistent/{ns}/t")
    quota = {"limitTime": 1, "policy": "producer_request_hold"}
    admin(bp, "POST", f"/admin/v2/persistent/{ns}/t/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/t"
    c = client(bp, operation_timeout_seconds=3)
    try:
        c.subscribe(topic, "slow")
        c.create_producer(topic).send(b"old")
        time.sleep(1.5)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            c.create_producer(topic)
    finally:
        c.close()
