"""A partitioned topic's subscription in ``partitioned-stats``: its partitions' added as Pulsar's
``SubscriptionStatsImpl.add`` adds them."""

from typing import Any

from topic_broker.admin import _add_subscription, _new_subscription_total


def _total(*parts: dict[str, Any]) -> dict[str, Any]:
    total = _new_subscription_total()
    for p in parts:
        _add_subscription(total, p)
    return total


def test_flags_are_any_partitions_and_counters_are_summed() -> None:
    reader = {"type": "Exclusive", "isDurable": False, "msgBacklog": 2, "subscriptionProperties": {"a": "1"}}
    durable = {"type": "Failover", "isDurable": True, "msgBacklog": 3, "subscriptionProperties": {"b": "2"}}
    t = _total(reader, durable)
    assert (t["isDurable"], t["isReplicated"], t["type"], t["msgBacklog"]) == (True, False, "Failover", 5)
    assert t["subscriptionProperties"] == {"a": "1", "b": "2"}
    assert _total(reader, reader)["isDurable"] is False
    assert "allowOutOfOrderDelivery" not in t
    ks = {"type": "Key_Shared", "allowOutOfOrderDelivery": True}
    assert _total({**ks, "allowOutOfOrderDelivery": False}, ks)["allowOutOfOrderDelivery"] is True
    # what Pulsar does not aggregate keeps its default
    busy = {
        "earliestMsgPublishTimeInBacklog": 17,
        "blockedSubscriptionOnUnackedMsgs": True,
        "activeConsumerName": "c",
    }
    t = _total(busy)
    assert (t["earliestMsgPublishTimeInBacklog"], t["blockedSubscriptionOnUnackedMsgs"]) == (0, False)
    assert t["activeConsumerName"] is None


def test_a_key_shared_subscriptions_mode_is_there_and_null() -> None:
    """A Key_Shared subscription's partitions each have ``keySharedMode``; the aggregate has the key too (a
    partition's fields, as docs/broker.md says), null as Pulsar's ``SubscriptionStatsImpl.add`` leaves it. A
    subscription of another type has none, as its partitions have none."""
    sticky = {"type": "Key_Shared", "keySharedMode": "STICKY", "allowOutOfOrderDelivery": False}
    t = _total(sticky, {**sticky, "keySharedMode": "AUTO_SPLIT"})
    assert "keySharedMode" in t and t["keySharedMode"] is None
    assert "keySharedMode" not in _total({"type": "Shared"}, {"type": "Shared"})
