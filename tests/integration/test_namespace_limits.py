"""A namespace's limits of subscriptions and topics (Pulsar's ``maxConsumersPerSubscription``,
``maxSubscriptionsPerTopic``, ``maxTopicsPerNamespace``): set, read and removed through the admin REST, shown in
the namespace's policies, and enforced on the official ``pulsar-client``. One broker on 3 bookies
(``test_broker_admin8``'s fixture, its own for this module)."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.error
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import before_first_call
from tests.integration.test_broker_admin8 import bp, brokers
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_pulsar_client import _connect, _raw, topic_name
from tests.integration.test_planted_10 import _namespace
from tests.zk_testing import wait_for
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from zk.managed_ledgers import BrokerMetadataStore, ManagedLedgerInfo, NamespacePolicies, TopicsLimitError

pulsar = pytest.importorskip("pulsar")
#: the eighth admin part's broker (one per module) and the third part's client
__all__ = ["bp", "brokers", "c"]


def test_max_consumers_per_subscription(bp: BrokerProcess, c: Any) -> None:
    """``maxConsumersPerSubscription`` 2: a third Shared consumer of a subscription is refused ConsumerBusy, one
    of another subscription is taken; removed, the third is taken."""
    ns = _namespace(bp)
    path = f"/admin/v2/namespaces/public/{ns}/maxConsumersPerSubscription"
    assert admin(bp, "GET", path) is None
    admin(bp, "POST", path, 2)
    assert admin(bp, "GET", path) == 2
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}")["max_consumers_per_subscription"] == 2
    topic = f"persistent://public/{ns}/{topic_name()}"
    shared = pulsar.ConsumerType.Shared
    consumers = [c.subscribe(topic, "s", consumer_type=shared) for _ in range(2)]
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "s", consumer_type=shared)
    consumers.append(c.subscribe(topic, "other", consumer_type=shared))
    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path) is None
    consumers.append(c.subscribe(topic, "s", consumer_type=shared))
    for x in consumers:
        x.close()


def test_a_topics_own_max_consumers_per_subscription_is_over_its_namespaces(
    bp: BrokerProcess, c: Any
) -> None:
    """A topic's own ``maxConsumersPerSubscription`` (``pulsar-admin topics set-max-consumers-per-subscription``)
    takes the place of its namespace's: 1 over the namespace's 3 refuses a second Shared consumer, 0 over the
    namespace's 1 takes any number, removed the namespace's applies again."""
    ns = _namespace(bp)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxConsumersPerSubscription", 3)
    name = topic_name()
    topic = f"persistent://public/{ns}/{name}"
    path = f"/admin/v2/persistent/public/{ns}/{name}/maxConsumersPerSubscription"
    shared = pulsar.ConsumerType.Shared
    consumers = [c.subscribe(topic, "s", consumer_type=shared)]
    assert admin(bp, "GET", path) is None
    assert admin(bp, "GET", path + "?applied=true") == 3
    admin(bp, "POST", path, 1)
    assert admin(bp, "GET", path) == 1
    assert admin(bp, "GET", path + "?applied=true") == 1
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "s", consumer_type=shared)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxConsumersPerSubscription", 1)
    admin(bp, "POST", path, 0)
    consumers += [c.subscribe(topic, "s", consumer_type=shared) for _ in range(2)]
    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path) is None
    assert admin(bp, "GET", path + "?applied=true") == 1
    for x in consumers:
        x.close()
    consumers = [c.subscribe(topic, "s", consumer_type=shared)]
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "s", consumer_type=shared)
    for x in consumers:
        x.close()


def test_max_subscriptions_per_topic(bp: BrokerProcess, c: Any) -> None:
    """``maxSubscriptionsPerTopic`` 2: a third subscription is refused NotAllowedError (by SUBSCRIBE, by a
    reader's, as Pulsar's getNonDurableSubscription, and by the admin's create, 412), while the existing ones
    attach again; removed, the third and the reader are made."""
    ns = _namespace(bp)
    path = f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic"
    admin(bp, "POST", path, 2)
    assert admin(bp, "GET", path) == 2
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}")["max_subscriptions_per_topic"] == 2
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    c.subscribe(topic, "a").close()
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}/subscription/b")
    with pytest.raises(pulsar.NotAllowedError):
        c.subscribe(topic, "third")
    with pytest.raises(urllib.error.HTTPError) as refused:
        admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}/subscription/third")
    assert refused.value.code == 412
    attached = [c.subscribe(topic, "a"), c.subscribe(topic, "b")]
    with pytest.raises(pulsar.NotAllowedError):
        c.create_reader(topic, pulsar.MessageId.earliest)
    admin(bp, "DELETE", path)
    attached.append(c.subscribe(topic, "third"))
    attached.append(c.create_reader(topic, pulsar.MessageId.earliest))
    subs = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions")
    assert {"a", "b", "third"} <= set(subs)
    for x in attached:
        x.close()


def test_a_topics_own_max_subscriptions_is_over_its_namespaces(bp: BrokerProcess, c: Any) -> None:
    """A topic's own ``maxSubscriptionsPerTopic`` (``pulsar-admin topics set-max-subscriptions-per-topic``) takes
    the place of its namespace's: 1 over the namespace's 3 refuses a second subscription, 0 over the namespace's
    1 takes more, removed the namespace's applies again."""
    ns = _namespace(bp)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic", 3)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    path = f"/admin/v2/persistent/public/{ns}/{t}/maxSubscriptionsPerTopic"
    c.subscribe(topic, "a").close()
    assert admin(bp, "GET", path) is None
    assert admin(bp, "GET", path + "?applied=true") == 3
    admin(bp, "POST", path, 1)
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (1, 1)
    with pytest.raises(pulsar.NotAllowedError):
        c.subscribe(topic, "b")
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic", 1)
    admin(bp, "POST", path, 0)
    c.subscribe(topic, "b").close()
    c.subscribe(topic, "c").close()
    admin(bp, "DELETE", path)
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (None, 1)
    with pytest.raises(pulsar.NotAllowedError):
        c.subscribe(topic, "d")
    assert set(admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions")) == {"a", "b", "c"}


def _limited_topic(bp: BrokerProcess, c: Any, limit: int) -> tuple[str, str, str]:
    """A new namespace with ``maxSubscriptionsPerTopic`` ``limit`` and in it a topic with subscription a and one
    keyed message: (namespace, local name, topic)."""
    ns = _namespace(bp)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic", limit)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    c.subscribe(topic, "a").close()
    c.create_producer(topic).send(b"v", partition_key="k")
    return ns, t, topic


def test_max_subscriptions_per_topic_counts_the_compactors(bp: BrokerProcess, c: Any) -> None:
    """``maxSubscriptionsPerTopic`` 2 on a topic with a subscription and a compaction run: its ``__compaction``
    cursor counts, as in Pulsar, so a second user subscription is refused NotAllowedError."""
    ns, t, topic = _limited_topic(bp, c, 2)
    at = f"/admin/v2/persistent/public/{ns}/{t}/compaction"
    admin(bp, "PUT", at)
    assert wait_for(lambda: admin(bp, "GET", at)["status"] == "SUCCESS", timeout_s=30.0, interval_s=0.2)
    assert "__compaction" in admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions")
    with pytest.raises(pulsar.NotAllowedError):
        c.subscribe(topic, "b")


def test_a_compaction_past_max_subscriptions_per_topic_fails_as_pulsars(bp: BrokerProcess, c: Any) -> None:
    """``maxSubscriptionsPerTopic`` 1 with subscription a: a compaction, whose ``__compaction`` cursor would be
    a second subscription, ends ERROR with Pulsar's message (its compactor subscribes through the same check) and
    makes no cursor; once the limit is removed it runs."""
    ns, t, topic = _limited_topic(bp, c, 1)
    at = f"/admin/v2/persistent/public/{ns}/{t}/compaction"
    admin(bp, "PUT", at)
    status: dict[str, Any] = {}

    def done() -> bool:
        status.update(admin(bp, "GET", at))
        return status["status"] != "RUNNING"

    assert wait_for(done, timeout_s=30.0, interval_s=0.2)
    assert status["status"] == "ERROR", status
    assert f"Exceed the maximum number of subscriptions of the topic: {topic}" in status["lastError"]
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions") == ["a"]
    admin(bp, "DELETE", f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic")
    admin(bp, "PUT", at)
    assert wait_for(lambda: admin(bp, "GET", at)["status"] == "SUCCESS", timeout_s=30.0, interval_s=0.2)
    assert "__compaction" in admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions")


def test_max_subscriptions_per_topic_refuses_a_producers_initial_subscription(
    bp: BrokerProcess, c: Any
) -> None:
    """``maxSubscriptionsPerTopic`` 1 with subscription a: a producer declaring ``initial_subscription_name`` b (as
    the client's dead-letter producer does) is refused NotAllowedError and b not made, as Pulsar's handleProducer
    (its createSubscription runs the limit's check); declaring a, it is taken. Before, b was made: 2 subscriptions
    past a limit of 1."""
    ns = _namespace(bp)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic", 1)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    c.subscribe(topic, "a").close()

    def produce(initial: str) -> Any:
        s = _raw(bp)
        try:
            _connect(s)
            cmd = pb.CommandProducer(
                topic=topic, producer_id=1, request_id=1, initial_subscription_name=initial
            )
            s.sendall(wire.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=cmd)))
            dec, frames = wire.FrameDecoder(), []
            while not frames:
                frames = dec.feed(s.recv(65536))
            return frames[0].command
        finally:
            s.close()

    refused = produce("b")
    assert refused.type == pb.BaseCommand.ERROR and refused.error.error == pb.NotAllowedError, refused
    assert "Exceed the maximum number of subscriptions of the topic" in refused.error.message
    assert produce("a").type == pb.BaseCommand.PRODUCER_SUCCESS
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions") == ["a"]


def test_max_topics_per_namespace(bp: BrokerProcess, c: Any) -> None:
    """``maxTopicsPerNamespace`` 3, a partitioned topic counting its partitions: 4 partitions refused (412), 2
    taken, then one topic a producer creates; past that a producer's topic is refused NotAllowedError and the
    admin's creates 412, while the topics that exist are served; removed, the refused topic is created."""
    ns = _namespace(bp)
    path = f"/admin/v2/namespaces/public/{ns}/maxTopicsPerNamespace"
    admin(bp, "POST", path, 3)
    assert admin(bp, "GET", path) == 3
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}")["max_topics_per_namespace"] == 3
    base = f"/admin/v2/persistent/public/{ns}"

    def refused(method: str, at: str, body: Any = None) -> int:
        with pytest.raises(urllib.error.HTTPError) as e:
            admin(bp, method, at, body)
        return e.value.code

    assert refused("PUT", f"{base}/wide/partitions", 4) == 412
    admin(bp, "PUT", f"{base}/two/partitions", 2)
    first = c.create_producer(f"persistent://public/{ns}/first")
    with pytest.raises(pulsar.NotAllowedError):
        c.create_producer(f"persistent://public/{ns}/second")
    with pytest.raises(pulsar.NotAllowedError):
        c.subscribe(f"persistent://public/{ns}/second", "s")
    assert refused("PUT", f"{base}/second") == 412
    assert refused("PUT", f"{base}/more/partitions", 1) == 412
    served = [
        c.create_producer(f"persistent://public/{ns}/two"),
        c.subscribe(f"persistent://public/{ns}/first", "s"),
    ]
    assert admin(bp, "GET", f"{base}") == sorted(
        f"persistent://public/{ns}/{t}" for t in ("first", "two-partition-0", "two-partition-1")
    )
    admin(bp, "DELETE", path)
    served.append(c.create_producer(f"persistent://public/{ns}/second"))
    for x in (first, *served):
        x.close()


def test_two_creates_at_once_do_not_both_take_the_last_room(zk_store: Any) -> None:
    """``maxTopicsPerNamespace`` 1: a topic created in the window between another create's count (0) and its
    transaction takes the room; the other's transaction then fails on the policies' version, counts again and is
    refused TopicsLimitError, nothing created (with the policies only checked, both were created). Real
    ZooKeeper."""
    meta = BrokerMetadataStore(zk_store, namespaces=True)

    async def run() -> None:
        await meta.set_policies("public", "capped", NamespacePolicies(max_topics_per_namespace=1))

        async def other() -> None:
            await meta.create_ml_info("public/capped/persistent/b", ManagedLedgerInfo())

        with (
            before_first_call(zk_store, "acreate_checked", other) as created,
            pytest.raises(TopicsLimitError),
        ):
            await meta.create_ml_info("public/capped/persistent/a", ManagedLedgerInfo())
        assert created == [None]
        assert await meta.get_ml_info("public/capped/persistent/a") is None
        assert await meta.count_topics("public", "capped") == 1
        policies = await meta.get_policies("public", "capped")
        assert policies == dataclasses.replace(NamespacePolicies(), max_topics_per_namespace=1)

    asyncio.run(run())


def test_a_topic_named_past_a_partitioned_topics_count_is_counted(zk_store: Any) -> None:
    """``maxTopicsPerNamespace`` 2 with partitioned topic x of 1 partition: ``x-partition-5``, past x's count, is
    a topic of its own (``count_topics`` counts it) and takes the last room; ``x-partition-6`` is refused
    TopicsLimitError. Before, both were created inside x's guard, never counted: 3 topics past a limit of 2.
    Real ZooKeeper."""
    meta = BrokerMetadataStore(zk_store, namespaces=True)

    async def run() -> None:
        await meta.set_policies("public", "wide", NamespacePolicies(max_topics_per_namespace=2))
        await meta.create_partitioned_topic("public/wide/persistent/x", 1)
        await meta.create_ml_info("public/wide/persistent/x-partition-0", ManagedLedgerInfo())  # x's own
        await meta.create_ml_info("public/wide/persistent/x-partition-5", ManagedLedgerInfo())
        with pytest.raises(TopicsLimitError):
            await meta.create_ml_info("public/wide/persistent/x-partition-6", ManagedLedgerInfo())
        assert await meta.get_ml_info("public/wide/persistent/x-partition-6") is None
        assert await meta.count_topics("public", "wide") == 2

    asyncio.run(run())
