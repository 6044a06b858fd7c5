"""The admin REST API as a ``pulsar-admin`` user meets it, eighth part: the fields of a topic's stats that scripts
read (Pulsar's TopicStats, SubscriptionStats and ConsumerStats names), checked against what the topic holds and
what its clients did, and the topic routes ``pulsar-admin topics`` calls daily.

One broker on 3 bookies (its housekeeping tick and its subscription expiration check every second) is shared by
the module; every test uses its own topics; every wait is bounded."""

from __future__ import annotations

import threading
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_pulsar_client import topic_name
from topic_broker.subscription import key_hash

pulsar = pytest.importorskip("pulsar")
__all__ = ["c"]  # the third part's client fixture, on this module's broker

BASE = "/admin/v2/persistent/public/default"


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(
        zk_server,
        tmp_path_factory.mktemp("admin8"),
        *("--tick-interval-s", "1", "--subscription-expiry-check-interval-s", "1"),
    ) as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


def _stats(bp: BrokerProcess, t: str, query: str = "") -> dict[str, Any]:
    return admin(bp, "GET", f"{BASE}/{t.rsplit('/', 1)[-1]}/stats{query}")


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_redeliveries_acks_and_deliveries_show_in_the_subscription_and_consumer_stats(
    bp: BrokerProcess, c: Any
) -> None:
    """``msgRateRedeliver`` (the consumer's and, summed, its subscription's) rises once a Shared consumer asks
    for its unacknowledged messages again, and stays 0 on a subscription that asked nothing again;
    ``lastConsumedTimestamp``, ``lastConsumedFlowTimestamp`` and ``lastAckedTimestamp`` are the times of the
    deliveries, FLOW and ack the clients made; ``blockedConsumerOnUnackedMsgs`` false under the limit."""
    t = f"persistent://public/default/{topic_name()}"
    before = _now_ms()
    redelivering = c.subscribe(t, "again", consumer_type=pulsar.ConsumerType.Shared, consumer_name="r")
    quiet = c.subscribe(t, "quiet", consumer_type=pulsar.ConsumerType.Shared, consumer_name="q")
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(5):
        producer.send(f"m{i}".encode())
    got = [redelivering.receive(timeout_millis=10_000) for _ in range(5)]
    for _ in range(5):
        quiet.acknowledge(quiet.receive(timeout_millis=10_000))
    delivered = _now_ms()
    stats = _stats(bp, t)["subscriptions"]
    (r,) = stats["again"]["consumers"]
    assert r["unackedMessages"] == 5 and r["blockedConsumerOnUnackedMsgs"] is False
    assert before <= r["lastConsumedTimestamp"] <= delivered, r
    assert before <= r["lastConsumedFlowTimestamp"] <= delivered, r
    assert r["lastAckedTimestamp"] == 0 and stats["again"]["lastAckedTimestamp"] == 0
    assert stats["again"]["lastConsumedTimestamp"] == r["lastConsumedTimestamp"]
    wait_for(
        lambda: _stats(bp, t)["subscriptions"]["quiet"]["lastAckedTimestamp"] > 0, "the quiet acks' time"
    )
    assert before <= _stats(bp, t)["subscriptions"]["quiet"]["lastAckedTimestamp"] <= _now_ms()

    redelivering.redeliver_unacknowledged_messages()

    def redelivered() -> bool:
        s = _stats(bp, t)["subscriptions"]
        (consumer,) = s["again"]["consumers"]
        return (
            consumer["msgRateRedeliver"] > 0
            and s["again"]["msgRateRedeliver"] == consumer["msgRateRedeliver"]
        )

    wait_for(redelivered, "msgRateRedeliver above 0 after the redelivery request")
    again = sorted(redelivering.receive(timeout_millis=10_000).data() for _ in range(5))
    assert again == sorted(m.data() for m in got)
    for m in got:
        redelivering.acknowledge(m)
    s = _stats(bp, t)["subscriptions"]
    assert s["quiet"]["msgRateRedeliver"] == 0.0 and s["quiet"]["consumers"][0]["msgRateRedeliver"] == 0.0
    wait_for(lambda: _stats(bp, t)["subscriptions"]["again"]["lastAckedTimestamp"] > 0, "the acks' time")


def test_key_shared_consumers_show_the_hash_ranges_their_keys_come_from(bp: BrokerProcess, c: Any) -> None:
    """Each Key_Shared consumer's ``keyHashRanges`` (Pulsar's ``"[start, end]"`` strings): together they cover
    the hash space [0, 65535] once, and every message a consumer received has its key's hash in that consumer's
    ranges; a sticky consumer's are the ranges it declared; the subscription names its ``keySharedMode``."""
    t = f"persistent://public/default/{topic_name()}"
    consumers = {
        name: c.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name)
        for name in ("a", "b", "c")
    }
    producer = c.create_producer(t, batching_enabled=False)
    keys = [f"key-{i}" for i in range(40)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    received: dict[str, list[str]] = {name: [] for name in consumers}
    deadline = time.monotonic() + 30
    while sum(map(len, received.values())) < len(keys):
        assert time.monotonic() < deadline, received
        for name, consumer in consumers.items():
            try:
                m = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            received[name].append(m.partition_key())
            consumer.acknowledge(m)
    sub = _stats(bp, t)["subscriptions"]["ks"]
    assert sub["keySharedMode"] == "AUTO_SPLIT" and sub["allowOutOfOrderDelivery"] is False
    ranges = {}
    for cs in sub["consumers"]:
        parsed = []
        for text in cs["keyHashRanges"]:
            start, end = (int(v) for v in text.strip("[]").split(", "))
            assert text == f"[{start}, {end}]"
            parsed.append((start, end))
        ranges[cs["consumerName"]] = parsed
    assert set(ranges) == set(consumers)
    covered = sorted(r for rs in ranges.values() for r in rs)
    assert covered[0][0] == 0 and covered[-1][1] == 65535
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:], strict=False)), covered
    for name, got_keys in received.items():
        for k in got_keys:
            assert any(s <= key_hash(k.encode()) <= e for s, e in ranges[name]), (name, k, ranges[name])

    t2 = f"persistent://public/default/{topic_name()}"
    policy = pulsar.ConsumerKeySharedPolicy(
        pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 999), (5000, 6000)]
    )
    c.subscribe(t2, "sticky", consumer_type=pulsar.ConsumerType.KeyShared, key_shared_policy=policy)
    sticky = _stats(bp, t2)["subscriptions"]["sticky"]
    assert sticky["keySharedMode"] == "STICKY"
    assert sticky["consumers"][0]["keyHashRanges"] == ["[0, 999]", "[5000, 6000]"]


def test_waiting_publishers_count_the_wait_for_exclusive_producers_queued(bp: BrokerProcess, c: Any) -> None:
    """``waitingPublishers``: the WaitForExclusive producers queued behind the exclusive one, 1 while one
    waits, 0 once it has the topic (it is then among the ``publishers``)."""
    t = f"persistent://public/default/{topic_name()}"
    first = c.create_producer(t, producer_name="first", access_mode=pulsar.ProducerAccessMode.Exclusive)
    assert _stats(bp, t)["waitingPublishers"] == 0
    waiter: list[Any] = []

    def wait_for_it() -> None:
        mode = pulsar.ProducerAccessMode.WaitForExclusive
        waiter.append(c.create_producer(t, producer_name="waiter", access_mode=mode))

    th = threading.Thread(target=wait_for_it, daemon=True)
    th.start()
    wait_for(lambda: _stats(bp, t)["waitingPublishers"] == 1, "the queued producer counted")
    assert [p["producerName"] for p in _stats(bp, t)["publishers"]] == ["first"]
    first.close()
    th.join(30)
    assert waiter, "the waiting producer gets the topic once the exclusive one is gone"
    stats = _stats(bp, t)
    assert stats["waitingPublishers"] == 0
    assert [p["producerName"] for p in stats["publishers"]] == ["waiter"]


def test_backlog_fields_match_the_messages_left_unacknowledged(bp: BrokerProcess, c: Any) -> None:
    """With messages 2 and 4 of 6 acknowledged: ``msgBacklogNoDelayed`` is the backlog (nothing delayed),
    ``nonContiguousDeletedMessagesRanges`` the 2 acknowledged ranges (the topic's too), and, asked with
    ``getEarliestTimeInBacklog=true`` as ``pulsar-admin topics stats --get-earliest-time-in-backlog`` does,
    ``earliestMsgPublishTimeInBacklog`` (and the topic's ``earliestMsgPublishTimeInBacklogs``) the publish
    time of the first message, 0 when not asked (as Pulsar), -1 once nothing is left."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "b", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(6):
        producer.send(f"m{i}".encode())
    got = [consumer.receive(timeout_millis=10_000) for _ in range(6)]
    consumer.acknowledge(got[1])
    consumer.acknowledge(got[3])
    wait_for(lambda: _stats(bp, t)["subscriptions"]["b"]["msgBacklog"] == 4, "the two acks")
    stats = _stats(bp, t)
    sub = stats["subscriptions"]["b"]
    assert sub["msgBacklogNoDelayed"] == 4 and sub["msgDelayed"] == 0
    assert sub["nonContiguousDeletedMessagesRanges"] == 2 and stats["nonContiguousDeletedMessagesRanges"] == 2
    assert sub["earliestMsgPublishTimeInBacklog"] == 0 and stats["earliestMsgPublishTimeInBacklogs"] == 0
    # the same two ranges in info-internal (once saved), each from its open lower bound, as Pulsar's MessageRange
    ids = [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in (got[1], got[3])]
    ranges = [
        {"from": {"ledgerId": lid, "entryId": eid - 1}, "to": {"ledgerId": lid, "entryId": eid}}
        for lid, eid in ids
    ]

    def saved() -> bool:
        info = admin(bp, "GET", f"{BASE}/{t.rsplit('/', 1)[-1]}/internal-info")
        return bool(info["cursors"]["b"]["individualDeletedMessages"] == ranges)

    wait_for(saved, "the acknowledged ranges saved")
    asked = _stats(bp, t, "?getEarliestTimeInBacklog=true")
    first_published = got[0].publish_timestamp()
    assert asked["subscriptions"]["b"]["earliestMsgPublishTimeInBacklog"] == first_published
    assert asked["earliestMsgPublishTimeInBacklogs"] == first_published
    for m in got:
        consumer.acknowledge(m)
    wait_for(lambda: _stats(bp, t)["subscriptions"]["b"]["msgBacklog"] == 0, "all acked")
    asked = _stats(bp, t, "?getEarliestTimeInBacklog=true")
    assert asked["subscriptions"]["b"]["earliestMsgPublishTimeInBacklog"] == -1
    assert asked["earliestMsgPublishTimeInBacklogs"] == 0
    assert asked["subscriptions"]["b"]["nonContiguousDeletedMessagesRanges"] == 0


def test_partitioned_stats_sum_the_new_fields(bp: BrokerProcess, c: Any) -> None:
    """``partitioned-stats`` adds up each partition's backlog without delayed messages and asks each for the
    earliest publish time when asked."""
    t = topic_name()
    admin(bp, "PUT", f"{BASE}/{t}/partitions", 2)
    full = f"persistent://public/default/{t}"
    consumer = c.subscribe(full, "p", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(full, batching_enabled=False)
    for i in range(6):
        producer.send(f"m{i}".encode(), partition_key=f"k{i}")
    first = min(consumer.receive(timeout_millis=10_000).publish_timestamp() for _ in range(6))
    stats = admin(bp, "GET", f"{BASE}/{t}/partitioned-stats?getEarliestTimeInBacklog=true")
    assert stats["subscriptions"]["p"]["msgBacklogNoDelayed"] == 6
    assert stats["earliestMsgPublishTimeInBacklogs"] == first
    assert stats["waitingPublishers"] == 0


def _http_status(bp: BrokerProcess, method: str, path: str, body: Any = None) -> int:
    try:
        admin(bp, method, path, body)
    except urllib.error.HTTPError as e:
        return e.code
    return 200


def test_subscription_properties_are_set_read_and_kept_across_an_unload(bp: BrokerProcess, c: Any) -> None:
    """``pulsar-admin topics get-|update-subscription-properties``: ``GET|PUT …/subscription/{sub}/properties``
    (before: 404, no such route). The properties replace the old ones, show in the stats as
    ``subscriptionProperties``, are stored with the cursor (the same after the topic is unloaded and loaded
    again, and on an idle subscription), and a partitioned topic's are each partition's."""
    t = topic_name()
    sub_path = f"{BASE}/{t}/subscription/s"
    consumer = c.subscribe(f"persistent://public/default/{t}", "s")
    assert admin(bp, "GET", f"{sub_path}/properties") == {}
    assert admin(bp, "PUT", f"{sub_path}/properties", {"owner": "billing", "tier": "gold"}) is None
    assert admin(bp, "GET", f"{sub_path}/properties") == {"owner": "billing", "tier": "gold"}
    admin(bp, "PUT", f"{sub_path}/properties", {"owner": "payments"})  # replaced, not merged
    assert admin(bp, "GET", f"{sub_path}/properties") == {"owner": "payments"}
    assert _stats(bp, t)["subscriptions"]["s"]["subscriptionProperties"] == {"owner": "payments"}
    admin(bp, "PUT", f"{BASE}/{t}/unload")
    assert admin(bp, "GET", f"{sub_path}/properties") == {"owner": "payments"}
    consumer.close()  # idle: the stored cursor's
    admin(bp, "PUT", f"{BASE}/{t}/unload")
    assert _stats(bp, t)["subscriptions"]["s"]["subscriptionProperties"] == {"owner": "payments"}
    admin(bp, "PUT", f"{sub_path}/properties", {})
    assert admin(bp, "GET", f"{sub_path}/properties") == {}
    assert _http_status(bp, "GET", f"{BASE}/{t}/subscription/nope/properties") == 404
    assert _http_status(bp, "PUT", f"{sub_path}/properties", ["owner"]) == 400

    pt = topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    c.subscribe(f"persistent://public/default/{pt}", "ps")
    admin(bp, "PUT", f"{BASE}/{pt}/subscription/ps/properties", {"k": "v"})
    assert admin(bp, "GET", f"{BASE}/{pt}/subscription/ps/properties") == {"k": "v"}
    for i in range(2):
        assert admin(bp, "GET", f"{BASE}/{pt}-partition-{i}/subscription/ps/properties") == {"k": "v"}


def test_backlog_size_by_message_id_is_the_subscriptions_estimate_from_there(
    bp: BrokerProcess, c: Any
) -> None:
    """``pulsar-admin topics get-backlog-size -m l:e``: ``PUT …/backlogSize`` with a MessageId (before: 404)
    answers the bytes after that message, what a subscription acknowledged up to it shows as its
    ``backlogSize``: half the topic's 4 equal messages after the second; 405 on a partitioned topic."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s")
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(4):
        producer.send(f"message-{i}".encode())
    got = [consumer.receive(timeout_millis=10_000) for _ in range(4)]
    consumer.acknowledge_cumulative(got[1])
    wait_for(lambda: _stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 2, "the cumulative ack")
    mid = got[1].message_id()
    size = admin(
        bp,
        "PUT",
        f"{BASE}/{t.rsplit('/', 1)[-1]}/backlogSize",
        {"ledgerId": mid.ledger_id(), "entryId": mid.entry_id()},
    )
    stats = _stats(bp, t)
    assert size == stats["subscriptions"]["s"]["backlogSize"] == stats["storageSize"] * 2 // 4 > 0
    first = got[0].message_id()
    whole = {"ledgerId": first.ledger_id(), "entryId": first.entry_id() - 1}
    assert admin(bp, "PUT", f"{BASE}/{t.rsplit('/', 1)[-1]}/backlogSize", whole) == stats["storageSize"]
    pt = topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    assert _http_status(bp, "PUT", f"{BASE}/{pt}/backlogSize", {"ledgerId": 1, "entryId": 0}) == 405


def test_a_topics_permissions_are_its_namespaces_grants(bp: BrokerProcess) -> None:
    """``pulsar-admin topics permissions``: ``GET …/persistent/{t}/{ns}/{topic}/permissions`` (before: 404)
    answers the roles granted on the topic's namespace and their actions, as the namespace's permissions."""
    ns = f"ns-{topic_name()}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    topic_path = f"/admin/v2/persistent/public/{ns}/{topic_name()}/permissions"
    assert admin(bp, "GET", topic_path) == {}
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/permissions/app-1", ["produce", "consume"])
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/permissions/reader", ["consume"])
    expected = {"app-1": ["consume", "produce"], "reader": ["consume"]}
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}/permissions") == expected
    assert admin(bp, "GET", topic_path) == expected
    assert _http_status(bp, "GET", f"/admin/v2/persistent/public/no-such-ns-{ns}/t/permissions") == 404


def test_subscription_properties_too_large_to_store_are_refused_and_leave_the_cursor_saving(
    bp: BrokerProcess, c: Any
) -> None:
    """Properties that the cursor's znode cannot hold (here 300,000 'é', stored escaped as 1.8 MB) are refused
    with 413 and leave nothing behind: the old properties stay, and the subscription's acknowledgements are still
    saved (the topic unloaded and loaded again has no backlog). Before, the PUT failed (500) with the properties
    kept in memory, and every later save of the cursor failed on them: its acknowledgements were never stored."""
    import json
    import urllib.request

    t = topic_name()
    full = f"persistent://public/default/{t}"
    sub_path = f"{BASE}/{t}/subscription/s"
    consumer = c.subscribe(full, "s")
    admin(bp, "PUT", f"{sub_path}/properties", {"owner": "billing"})
    request = urllib.request.Request(
        f"http://127.0.0.1:{bp.http_port}{sub_path}/properties",
        data=json.dumps({"k": "é" * 300_000}, ensure_ascii=False).encode(),  # 600 kB of UTF-8
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413
    assert admin(bp, "GET", f"{sub_path}/properties") == {"owner": "billing"}
    producer = c.create_producer(full, batching_enabled=False)
    producer.send(b"m")
    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    wait_for(lambda: _stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 0, "the ack")
    consumer.close()
    admin(bp, "PUT", f"{BASE}/{t}/unload")  # the cursor saved as it closes, then read again
    assert _stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 0
    assert admin(bp, "GET", f"{sub_path}/properties") == {"owner": "billing"}
