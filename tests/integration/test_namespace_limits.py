"""A namespace's limits of subscriptions and topics (Pulsar's ``maxConsumersPerSubscription``,
``maxSubscriptionsPerTopic``, ``maxTopicsPerNamespace``): set, read and removed through the admin REST, shown in
the namespace's policies, and enforced on the official ``pulsar-client``. One broker on 3 bookies
(``test_broker_admin8``'s fixture, its own for this module)."""

from __future__ import annotations

import urllib.error
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_admin8 import bp, brokers
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_pulsar_client import topic_name
from tests.integration.test_planted_10 import _namespace

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


def test_max_subscriptions_per_topic(bp: BrokerProcess, c: Any) -> None:
    """``maxSubscriptionsPerTopic`` 2: a third subscription is refused NotAllowedError (by SUBSCRIBE and by the
    admin's create, 412), while the existing ones attach again and a reader is taken; removed, the third is
    made."""
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
    attached.append(c.create_reader(topic, pulsar.MessageId.earliest))
    admin(bp, "DELETE", path)
    attached.append(c.subscribe(topic, "third"))
    subs = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/subscriptions")
    assert {"a", "b", "third"} <= set(subs)
    for x in attached:
        x.close()
