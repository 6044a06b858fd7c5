"""A topic over its backlog quota takes producers again once the backlog is acknowledged, and their sends too,
without waiting for the broker's housekeeping tick: the tick here comes every 60 s, so only a PRODUCER finds the
quota exceeded or not. Real ZooKeeper, 3 bookie processes, one broker, the official ``pulsar-client``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import module_cluster
from tests.integration.test_backlog_age_quota import _namespace
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_pulsar_client import client

pulsar = pytest.importorskip("pulsar")


@pytest.fixture(scope="module")
def bp(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("quotaresume"), "--tick-interval-s", "60") as b:
        yield b.procs[0]


def test_producer_request_hold_sends_resume_once_the_old_message_is_acknowledged(bp: BrokerProcess) -> None:
    """A 1 s message_age quota, producer_request_hold: a message left unacknowledged 1.5 s has a new producer
    refused (ProducerBlockedQuotaExceededError at the client's 3 s operation timeout); once a consumer
    acknowledges it, a new producer is taken and its send stored at once. (The refusal marked the topic over
    its quota, and only the next tick, a minute later, cleared that mark: every SEND closed its producer, the
    client reconnected and sent again, and the send timed out.)"""
    ns = _namespace(bp)
    quota = {"limitTime": 1, "policy": "producer_request_hold"}
    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/t"
    c = client(bp, operation_timeout_seconds=3)
    try:
        consumer = c.subscribe(topic, "slow")
        first = c.create_producer(topic)
        first.send(b"old")
        first.close()
        time.sleep(1.5)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            c.create_producer(topic)
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        deadline = time.monotonic() + 10
        while True:  # (the acknowledgement reaches the broker on its own)
            try:
                producer = c.create_producer(topic, send_timeout_millis=3000)
                break
            except pulsar.ProducerBlockedQuotaExceededError:
                assert time.monotonic() < deadline, "producers still refused after the acknowledgement"
        stored = threading.Event()
        producer.send_async(b"after", lambda result, _id: result == pulsar.Result.Ok and stored.set())
        # (the client's send timeout does not end the resends: it waited for the tick, 58 s)
        assert stored.wait(15), "the send was not stored: its producer closed at each SEND"
        assert consumer.receive(timeout_millis=10_000).data() == b"after"
    finally:
        c.close()
