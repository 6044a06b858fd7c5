"""Pulsar's subscription expiration (a namespace's ``subscriptionExpirationTime``) on a broker in this process:
checked every ``--subscription-expiry-check-interval-s`` (Pulsar's ``subscriptionExpiryCheckIntervalInMinutes``),
not at each housekeeping tick; a consumer that came and went between two checks counts as activity; and a
SUBSCRIBE racing the expiry of its subscription leaves the consumer on a subscription that is kept.

The module's cluster (the ninth part's) only lends its bookies and ZooKeeper; one in-process broker (its
housekeeping tick every second, its expiry check once an hour: the tests run the check themselves) serves the
topics."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker_testing import Brokers, CursorReadGate
from tests.integration.test_broker_admin11 import store
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_client_features9 import brokers
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_broker_pulsar_client import T, _connect, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.names import TopicName
from zk.client import MetadataStore
from zk.managed_ledgers import NamespacePolicies

__all__ = ["brokers", "store"]  # the ninth part's bookies and broker (one per module), the eleventh's store

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def broker(brokers: Brokers) -> Iterator[tuple[Any, Any]]:
    with _serving(brokers, tick_interval_s=1.0, subscription_expiry_check_interval_s=3600.0) as served:
        yield served


class _Client:
    """A raw connection to the in-process broker: SUBSCRIBE and CLOSE_CONSUMER, answers read one at a time."""

    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        _connect(self.s)
        self.dec = wire.FrameDecoder()
        self.request_id = 0

    def send_subscribe(self, topic: str, consumer_id: int) -> None:
        self.request_id += 1
        cmd = pb.CommandSubscribe(
            topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared,
            consumer_id=consumer_id, request_id=self.request_id,
        )  # fmt: skip
        self.s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=cmd)))

    def close_consumer(self, consumer_id: int) -> None:
        self.request_id += 1
        cmd = pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=self.request_id)
        self.s.sendall(wire.encode_command(T(type=T.CLOSE_CONSUMER, close_consumer=cmd)))
        assert self.answer().type == T.SUCCESS

    def answer(self) -> Any:
        got: list[Any] = []
        while not got:
            got = [
                f.command for f in self.dec.feed(self.s.recv(65536)) if f.command.type in (T.SUCCESS, T.ERROR)
            ]
        return got[0]


def _idle_topic(service: Any, run: Any, store: MetadataStore) -> tuple[str, Any, _Client]:
    """A topic of a new namespace whose subscriptions expire after a minute, with the subscription ``s`` made
    by consumer 1 (closed since) and last active an hour ago (its stored ``last_active_ms``)."""
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    run(service.meta.set_policies("public", ns, NamespacePolicies(subscription_expiration_time_minutes=1)))
    t = f"persistent://public/{ns}/{topic_name()}"
    client = _Client(service.config.port)
    client.send_subscribe(t, 1)
    assert client.answer().type == T.SUCCESS
    client.close_consumer(1)
    topic = run(service.get_topic(TopicName.parse(t)))
    cursor = f"managed-ledgers/{topic.ml.name}/cursors/s"
    stored = store.get(cursor)
    store.set(cursor, {**stored.value, "last_active_ms": int(time.time() * 1000) - HOUR_MS}, stored.version)
    return t, topic, client


def _stored_subscriptions(run: Any, topic: Any) -> list[str]:
    return list(run(topic.ml.store.list_cursors(topic.ml.name)))


def test_the_expiry_check_is_not_run_by_the_housekeeping_tick(broker: tuple[Any, Any]) -> None:
    """The check lists every served topic's cursors and reads each idle one from ZooKeeper: it ran at every
    housekeeping tick (5 s), where Pulsar checks every 5 minutes. Three ticks of the broker (every second) pass
    without one; the monitor runs it every --subscription-expiry-check-interval-s."""
    service, run = broker
    checks, ticks = [], []
    expire, refresh = service.expire_inactive_subscriptions, service.refresh_policies

    async def counted_expire() -> None:
        checks.append(time.monotonic())
        await expire()

    async def counted_refresh() -> None:
        ticks.append(time.monotonic())
        await refresh()

    service.expire_inactive_subscriptions, service.refresh_policies = counted_expire, counted_refresh
    try:
        wait_for(lambda: len(ticks) >= 3, "three housekeeping ticks")
    finally:
        del service.expire_inactive_subscriptions, service.refresh_policies
    assert checks == []


def test_a_consumer_that_came_and_went_between_two_checks_keeps_its_subscription(
    broker: tuple[Any, Any], store: MetadataStore
) -> None:
    """A consumer attached and closed between two checks (nothing acknowledged: its cursor's stored activity
    an hour old) is activity, as Pulsar's removeConsumer updates the cursor's last active time: the check keeps
    the subscription. Checked at each tick, a consumer was seen by the check; every 5 minutes, one that stayed
    less went unseen and its subscription was deleted at the next check. Idle for longer, it is deleted."""
    service, run = broker
    t, topic, client = _idle_topic(service, run, store)
    client.send_subscribe(t, 2)
    assert client.answer().type == T.SUCCESS
    client.close_consumer(2)
    run(service.expire_inactive_subscriptions())
    assert _stored_subscriptions(run, topic) == ["s"]

    topic.subscriptions["s"].idle_since_ms -= HOUR_MS  # as if it left an hour ago
    run(service.expire_inactive_subscriptions())
    assert _stored_subscriptions(run, topic) == []
    assert "s" not in topic.subscriptions
    client.s.close()


def test_a_subscribe_racing_the_expiry_of_its_subscription_keeps_it(
    broker: tuple[Any, Any], store: MetadataStore
) -> None:
    """A SUBSCRIBE to an expired idle subscription refreshes its cursor first; the expiry check meanwhile saw no
    consumer, deleted the subscription (its cursor's znode, the topic's dispatcher) and the consumer was then
    attached to the dispatcher of a subscription gone from the topic and from ZooKeeper: its acknowledgements
    saved nowhere, the next consumer given a new subscription. The refresh is held (its cursor read gated) while
    the check runs: the check waits for the consumer, sees it and keeps the subscription."""
    service, run = broker
    t, topic, client = _idle_topic(service, run, store)
    topic.subscriptions["s"].idle_since_ms -= HOUR_MS
    gate = CursorReadGate(topic.ml.store, run, nth=1)
    try:
        client.send_subscribe(t, 2)
        assert gate.reached.wait(30), "the SUBSCRIBE's cursor refresh"
        check = asyncio.run_coroutine_threadsafe(service.expire_inactive_subscriptions(), gate.loop)
        gate.release_after(check, wait_s=2.0)
        check.result(30)
    finally:
        topic.ml.store.get_cursor = gate.read
    assert client.answer().type == T.SUCCESS
    assert _stored_subscriptions(run, topic) == ["s"]
    rt = topic.subscriptions.get("s")
    assert rt is not None and [c.consumer_id for c in rt.consumers.values()] == [2]
    client.s.close()


def test_an_attached_consumers_activity_is_saved_between_two_checks(
    broker: tuple[Any, Any], store: MetadataStore
) -> None:
    """A subscription with a consumer attached has its stored activity (``last_active_ms``, which the next
    broker to serve the topic goes by) saved once it is older than half the expiration time, at the housekeeping
    tick: at the expiry check only (every 300 s by default), an expiration of a few minutes had it older than
    that when the topic moved, and the new owner's first check deleted the subscription before its consumer was
    back (the consumer then came back to a new one at the latest message, its backlog skipped)."""
    service, run = broker  # its tick every second, its expiry check once an hour
    t, topic, client = _idle_topic(service, run, store)  # stored last active an hour ago, 1 minute expiration
    client.send_subscribe(t, 2)
    assert client.answer().type == T.SUCCESS
    cursor = f"managed-ledgers/{topic.ml.name}/cursors/s"
    wait_for(  # before: an hour old until the next check
        lambda: store.get(cursor).value["last_active_ms"] > int(time.time() * 1000) - 30_000,
        "the attached consumer's activity saved",
        timeout_s=15.0,
    )
    client.s.close()
