"""The admin REST API as a ``pulsar-admin`` user meets it, tenth part: the topic-level policies (``pulsar-admin
topics set-max-producers``, ``set-max-consumers``, ``set-max-unacked-messages-per-consumer``, ``set-retention``,
``set-deduplication``, ``set-backlog-quota``) and the namespace limits under them, each set, read (its own and
``applied``) and enforced on the official ``pulsar-client``: a topic's own policy over its namespace's over the
broker's default.

One broker on 3 bookies (the eighth part's fixture, its housekeeping tick every second) is shared by the module;
every test uses its own topics and namespaces; every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import module_cluster
from tests.integration.test_broker_admin8 import BASE, _http_status, _stats, bp, brokers
from tests.integration.test_broker_admin11 import store
from tests.integration.test_broker_auth import SUPERUSER, SecureCluster, secure_cluster
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_pulsar_client import T, _connect, _raw, client, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from zk.acl import resolve_auth
from zk.layout import namespace_policies_path
from zk.managed_ledgers import TOPIC_POLICIES

pulsar = pytest.importorskip("pulsar")
__all__ = [
    "bp",
    "brokers",
    "c",
    "store",
]  # the eighth part's broker (one per module), the third part's client


def _namespace(bp: BrokerProcess) -> str:
    ns = f"ns-{topic_name()}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    return ns


def test_max_producers_refuses_the_producer_past_the_limit_topic_over_namespace(
    bp: BrokerProcess, c: Any
) -> None:
    """``set-max-producers-per-topic`` on the namespace and ``topics set-max-producers`` (before: 404, no such
    routes): the producer past the limit in force is refused with ProducerBusy; the topic's own limit takes the
    namespace's place, and removed the namespace's applies again."""
    ns = _namespace(bp)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    path = f"/admin/v2/persistent/public/{ns}/{t}/maxProducers"
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}/maxProducersPerTopic") is None
    assert admin(bp, "GET", path) is None
    assert admin(bp, "GET", path + "?applied=true") == 0  # the broker's default: no limit

    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxProducersPerTopic", 1)
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}/maxProducersPerTopic") == 1
    assert admin(bp, "GET", path + "?applied=true") == 1
    first = c.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        c.create_producer(topic)

    admin(bp, "POST", path, 2)  # the topic's own, over the namespace's
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (2, 2)
    second = c.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        c.create_producer(topic)
    second.close()

    admin(bp, "DELETE", path)  # the namespace's 1 again: one producer is left, none more is taken
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (None, 1)
    with pytest.raises(pulsar.ProducerBusy):
        c.create_producer(topic)
    first.send(b"still served")

    assert _http_status(bp, "POST", path, -1) == 412
    assert _http_status(bp, "POST", path, "many") == 400
    assert _http_status(bp, "GET", f"/admin/v2/persistent/public/{ns}/no-such-{t}/maxProducers") == 404


def test_max_consumers_refuses_the_consumer_past_the_limit(bp: BrokerProcess, c: Any) -> None:
    """``topics set-max-consumers``: the topic's consumers (of all its subscriptions) past the limit are refused
    with ConsumerBusy; on a partitioned topic the limit is each partition's."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    admin(bp, "POST", f"{BASE}/{t}/maxConsumers", 1)
    assert admin(bp, "GET", f"{BASE}/{t}/maxConsumers") == 1
    first = c.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "b")
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    first.close()
    c.subscribe(topic, "b").close()  # the place freed
    admin(bp, "DELETE", f"{BASE}/{t}/maxConsumers")
    both = [c.subscribe(topic, s) for s in ("a", "b")]
    for consumer in both:
        consumer.close()

    pt = topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    admin(bp, "POST", f"{BASE}/{pt}-partition-1/maxConsumers", 1)  # a partition's: the partitioned topic's
    assert admin(bp, "GET", f"{BASE}/{pt}/maxConsumers") == 1
    kept = c.subscribe(f"persistent://public/default/{pt}", "a")
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(f"persistent://public/default/{pt}", "b")
    kept.close()


def test_max_unacked_messages_on_consumer_holds_dispatch_until_acks(bp: BrokerProcess, c: Any) -> None:
    """``topics set-max-unacked-messages-per-consumer``: a consumer holding that many unacknowledged messages is
    sent nothing more (``blockedConsumerOnUnackedMsgs``) until it acknowledges; removed, the namespace's (here
    the broker's 50,000) applies and the rest is delivered at once."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    path = f"{BASE}/{t}/maxUnackedMessagesOnConsumer"
    assert admin(bp, "GET", path + "?applied=true") == 50_000
    admin(bp, "POST", path, 2)
    consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(topic, batching_enabled=False)
    for i in range(6):
        producer.send(f"m-{i}".encode())
    got = [consumer.receive(timeout_millis=10_000) for _ in range(2)]
    wait_for(
        lambda: _stats(bp, topic)["subscriptions"]["s"]["consumers"][0]["blockedConsumerOnUnackedMsgs"],
        "the consumer blocked on its unacked messages",
    )
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1_000)
    consumer.acknowledge(got[0])
    got.append(consumer.receive(timeout_millis=10_000))  # one acknowledged: one more sent
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1_000)
    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path) is None
    got += [consumer.receive(timeout_millis=10_000) for _ in range(3)]
    assert sorted(m.data() for m in got) == [f"m-{i}".encode() for i in range(6)]


def test_max_unacked_messages_on_subscription_holds_all_its_consumers(bp: BrokerProcess, c: Any) -> None:
    """``topics set-max-unacked-messages-per-subscription`` (``…/maxUnackedMessagesOnSubscription``; the
    namespace's ``…/maxUnackedMessagesPerSubscription``): a Shared subscription whose consumers together hold
    that many unacknowledged messages sends neither of them more (``blockedSubscriptionOnUnackedMsgs``) until
    one acknowledges; removed, the broker's 200,000 applies and the rest is delivered."""
    ns = _namespace(bp)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    path = f"/admin/v2/persistent/public/{ns}/{t}/maxUnackedMessagesOnSubscription"
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    assert admin(bp, "GET", path + "?applied=true") == 200_000
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxUnackedMessagesPerSubscription", 3)
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (None, 3)
    consumers = [c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared) for _ in range(2)]
    producer = c.create_producer(topic, batching_enabled=False)
    for i in range(8):
        producer.send(f"m-{i}".encode())

    def stats() -> dict[str, Any]:
        return admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/stats")["subscriptions"]["s"]

    wait_for(lambda: stats()["blockedSubscriptionOnUnackedMsgs"], "the subscription blocked on its unacked")
    got: list[Any] = []
    for consumer in consumers:
        while True:
            try:
                got.append((consumer, consumer.receive(timeout_millis=500)))
            except pulsar.Timeout:
                break
    assert len(got) == 3 and stats()["unackedMessages"] == 3
    consumer, msg = got[0]
    consumer.acknowledge(msg)
    wait_for(lambda: stats()["unackedMessages"] == 3 and stats()["msgBacklog"] == 7, "one more sent")
    admin(bp, "DELETE", f"/admin/v2/namespaces/public/{ns}/maxUnackedMessagesPerSubscription")
    wait_for(lambda: stats()["unackedMessages"] == 7, "the rest sent")
    assert not stats()["blockedSubscriptionOnUnackedMsgs"]


def test_a_topics_retention_keeps_its_consumed_ledgers(bp: BrokerProcess, c: Any) -> None:
    """``topics set-retention``: a topic's own retention (here infinite) keeps the ledgers its subscriptions
    have consumed, where its namespace's (none) lets them go at the next tick; ``applied`` is the namespace's
    until it is set."""
    kept, control = topic_name(), topic_name()
    for t in (kept, control):
        admin(bp, "PUT", f"{BASE}/{t}")
    assert admin(bp, "GET", f"{BASE}/{kept}/retention") is None
    namespace_retention = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    assert admin(bp, "GET", f"{BASE}/{kept}/retention?applied=true") == namespace_retention
    infinite = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    admin(bp, "POST", f"{BASE}/{kept}/retention", infinite)
    assert admin(bp, "GET", f"{BASE}/{kept}/retention") == infinite
    assert admin(bp, "GET", f"{BASE}/{kept}/retention?applied=true") == infinite
    first: dict[str, int] = {}
    for t in (kept, control):
        consumer = c.subscribe(f"persistent://public/default/{t}", "s")
        producer = c.create_producer(f"persistent://public/default/{t}")
        producer.send(b"x")
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        first[t] = admin(bp, "GET", f"{BASE}/{t}/internalStats")["ledgers"][0]["ledgerId"]
        producer.close()
        consumer.close()
        admin(bp, "PUT", f"{BASE}/{t}/unload")  # the ledger closed: retention decides

    def ledgers(t: str) -> list[int]:
        return [lg["ledgerId"] for lg in admin(bp, "GET", f"{BASE}/{t}/internalStats")["ledgers"]]

    # served again, the kept topic first: a tick that trims the control topic has been over the kept one
    c.create_producer(f"persistent://public/default/{kept}").close()
    c.create_producer(f"persistent://public/default/{control}").close()
    wait_for(lambda: first[control] not in ledgers(control), "the control topic's consumed ledger deleted")
    assert first[kept] in ledgers(kept)
    assert _http_status(bp, "POST", f"{BASE}/{kept}/retention", {"retentionTimeInMinutes": -2}) == 412


def test_a_topics_deduplication_turned_off_stores_a_resent_sequence_id(bp: BrokerProcess, c: Any) -> None:
    """``topics set-deduplication --disable``: the broker deduplicates by default (``applied`` true, nothing set
    on the topic or its namespace); off on the topic, a message sent again with a sequence id already stored is
    stored again, where a topic of the defaults drops it."""
    t, control = topic_name(), topic_name()
    path = f"{BASE}/{t}/deduplicationEnabled"
    for name in (t, control):
        admin(bp, "PUT", f"{BASE}/{name}")
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (None, True)
    admin(bp, "POST", path, False)
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (False, False)
    for name, expected in ((t, 5), (control, 3)):
        topic = f"persistent://public/default/{name}"
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic, producer_name=f"p-{name}", batching_enabled=False)
        for seq in (1, 2, 2, 1, 3):
            producer.send(f"seq-{seq}".encode(), sequence_id=seq)
        got = [consumer.receive(timeout_millis=10_000).data() for _ in range(expected)]
        assert len(got) == expected
        assert _stats(bp, topic)["subscriptions"]["s"]["msgBacklog"] == expected
    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path + "?applied=true") is True
    assert _http_status(bp, "POST", path, "yes") == 400


def test_a_namespaces_deduplication_turned_off_overrides_the_brokers_default(
    bp: BrokerProcess, c: Any
) -> None:
    """``namespaces set-deduplication --disable`` on a broker that deduplicates by default: its topics store a
    message sent again with a sequence id already stored (Pulsar's namespace ``deduplicationEnabled`` false).
    Before, the namespace's false was also its never-set value, and the broker's default stayed in force."""
    ns = _namespace(bp)
    path = f"/admin/v2/namespaces/public/{ns}/deduplication"
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    assert admin(bp, "GET", path) is None
    admin(bp, "POST", path, False)
    assert admin(bp, "GET", path) is False
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    assert (
        admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/deduplicationEnabled?applied=true") is False
    )
    consumer = c.subscribe(topic, "s")
    producer = c.create_producer(topic, producer_name=f"p-{t}", batching_enabled=False)
    for seq in (1, 2, 2, 1, 3):
        producer.send(f"seq-{seq}".encode(), sequence_id=seq)
    assert len([consumer.receive(timeout_millis=10_000) for _ in range(5)]) == 5
    stats = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/stats")
    assert stats["subscriptions"]["s"]["msgBacklog"] == 5
    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path) is None
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/deduplicationEnabled?applied=true") is True


def test_a_topics_backlog_quota_evicts_its_backlog(bp: BrokerProcess, c: Any) -> None:
    """``topics set-backlog-quota``: a topic's own quota (here 1 byte, consumer_backlog_eviction) is enforced at
    the next tick where its namespace has none: the subscription's backlog is evicted."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    assert admin(bp, "GET", f"{BASE}/{t}/backlogQuotaMap") == {}
    quota = {"limitSize": 1, "limitTime": -1, "policy": "consumer_backlog_eviction"}
    admin(bp, "POST", f"{BASE}/{t}/backlogQuota?backlogQuotaType=destination_storage", quota)
    assert admin(bp, "GET", f"{BASE}/{t}/backlogQuotaMap") == {"destination_storage": quota}
    c.subscribe(topic, "s")
    producer = c.create_producer(topic)
    for i in range(5):
        producer.send(f"m-{i}".encode())
    wait_for(lambda: _stats(bp, topic)["subscriptions"]["s"]["msgBacklog"] == 0, "the backlog evicted")
    admin(bp, "DELETE", f"{BASE}/{t}/backlogQuota")
    assert admin(bp, "GET", f"{BASE}/{t}/backlogQuotaMap") == {}
    default_quota = {"limitSize": -1, "limitTime": -1, "policy": "producer_request_hold"}
    assert admin(bp, "GET", f"{BASE}/{t}/backlogQuotaMap?applied=true") == {
        "destination_storage": default_quota
    }


def test_a_subscribe_refused_past_max_consumers_creates_no_subscription(bp: BrokerProcess, c: Any) -> None:
    """A SUBSCRIBE refused ConsumerBusy for the topic's consumers limit leaves no subscription behind, as
    Pulsar checks the limit before it creates one: a durable one made for it held the topic's backlog from then
    on (retention and the backlog quota counted it) with no consumer to ever read it."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    admin(bp, "POST", f"{BASE}/{t}/maxConsumers", 1)
    first = c.subscribe(topic, "a")
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "refused")
    assert sorted(_stats(bp, topic)["subscriptions"]) == ["a"]
    first.close()


def test_subscribes_at_once_past_max_consumers_leave_no_subscription(bp: BrokerProcess) -> None:
    """Two SUBSCRIBEs of new subscriptions at once (one connection, one write) on a topic of one consumer at
    most: one is attached, the other refused ConsumerBusy, and only the first's subscription is there. Both
    passed the limit's first check before either was attached; the second's cursor was made while the first
    attached, and the second check refused it with its subscription left behind."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    admin(bp, "POST", f"{BASE}/{t}/maxConsumers", 1)
    s = _raw(bp)
    try:
        _connect(s)
        subscribes = [
            pb.CommandSubscribe(
                topic=topic,
                subscription=name,
                subType=pb.CommandSubscribe.Shared,
                consumer_id=i,
                request_id=i,
            )
            for i, name in ((1, "a"), (2, "b"))
        ]
        s.sendall(b"".join(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=cmd)) for cmd in subscribes))
        dec, answers = wire.FrameDecoder(), {}
        s.settimeout(30)
        while len(answers) < 2:
            for f in dec.feed(s.recv(65536)):
                if f.command.type == T.SUCCESS:
                    answers[f.command.success.request_id] = "SUCCESS"
                elif f.command.type == T.ERROR:
                    answers[f.command.error.request_id] = pb.ServerError.Name(f.command.error.error)
        assert answers == {1: "SUCCESS", 2: "ConsumerBusy"}
        assert sorted(_stats(bp, topic)["subscriptions"]) == ["a"]
    finally:
        s.close()


@pytest.fixture
def secure(bookies: Any, tmp_path: Path) -> Iterator[SecureCluster]:
    yield from secure_cluster(bookies, tmp_path)


def test_a_topics_own_grants_authorize_on_that_topic_only(secure: SecureCluster) -> None:
    """``pulsar-admin topics grant-permission`` / ``revoke-permission`` (``POST|DELETE …/{topic}/permissions/{role}``;
    before: 404): the broker's authorization lets a role do on the topic (each partition of a partitioned one) what
    the topic grants it, beside its namespace's grants, and nowhere else; ``topics permissions`` answers both
    levels; revoked, refused again; a deleted topic's grants go with it."""
    su, alice = secure.tokens[SUPERUSER], secure.tokens["alice"]
    local, other, pt = (f"g-{uuid.uuid4().hex[:8]}" for _ in range(3))
    topic = f"persistent://public/default/{local}"
    path = f"{BASE}/{local}/permissions"
    assert secure.http("PUT", f"{BASE}/{local}", token=su)[0] == 204
    assert secure.http("PUT", f"{BASE}/{pt}/partitions", 2, token=su)[0] == 204
    secure.grant("bob", ["consume"])  # a namespace grant, shown with the topic's

    c = secure.client(alice)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            c.create_producer(topic)
        assert secure.http("POST", f"{path}/alice", ["produce"], token=alice)[0] == 403  # not a superuser
        assert secure.http("POST", f"{path}/alice", ["produce"], token=su)[0] == 204
        assert secure.http("POST", f"{BASE}/{pt}/permissions/alice", ["produce"], token=su)[0] == 204
        assert secure.http("GET", path, token=su) == (200, {"alice": ["produce"], "bob": ["consume"]})
        status, ns_perms = secure.http("GET", "/admin/v2/namespaces/public/default/permissions", token=su)
        assert (status, ns_perms) == (200, {"bob": ["consume"]})  # the namespace's own are unchanged
        status, policies = secure.http("GET", "/admin/v2/namespaces/public/default", token=su)
        assert policies["auth_policies"]["destination_auth"][topic] == {"alice": ["produce"]}

        c.create_producer(topic).send(b"granted")
        c.create_producer(f"persistent://public/default/{pt}").send(b"each partition", partition_key="k")
        with pytest.raises(pulsar.AuthorizationError):
            c.create_producer(f"persistent://public/default/{other}")  # another topic of the namespace
        with pytest.raises(pulsar.AuthorizationError):
            c.subscribe(topic, "s")  # consume is not granted

        assert secure.http("DELETE", f"{path}/alice", token=su)[0] == 204
        with pytest.raises(pulsar.AuthorizationError):
            c.create_producer(topic)
        assert secure.http("DELETE", f"{path}/alice", token=su)[0] == 412
        assert secure.http("POST", f"{path}/alice", ["fly"], token=su)[0] == 400
    finally:
        c.close()

    assert secure.http("POST", f"{path}/alice", ["produce"], token=su)[0] == 204
    assert secure.http("DELETE", f"{BASE}/{local}", token=su)[0] == 204
    assert secure.http("PUT", f"{BASE}/{local}", token=su)[0] == 204
    assert secure.http("GET", path, token=su) == (200, {"bob": ["consume"]})


@pytest.fixture(scope="module")
def idle(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose housekeeping tick (which trims by retention) does not come during the module."""
    with module_cluster(zk_server, tmp_path_factory.mktemp("admin10"), "--tick-interval-s", "3600") as b:
        yield b.procs[0]


def test_trim_deletes_the_consumed_ledgers_now(idle: BrokerProcess) -> None:
    """``pulsar-admin topics trim-topic`` (``POST …/{topic}/trim``; before: 404): the ledgers its subscriptions
    consumed, which retention (none here) lets go, are deleted at once, not at the owner's next tick (an hour
    away on this broker); the unconsumed current ledger stays. Each partition of a partitioned topic."""
    t, pt = topic_name(), topic_name()
    admin(idle, "PUT", f"{BASE}/{pt}/partitions", 2)
    c = client(idle)
    try:
        for name in (t, f"{pt}-partition-0"):
            consumer = c.subscribe(f"persistent://public/default/{name}", "s")
            c.create_producer(f"persistent://public/default/{name}").send(b"x")
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            consumer.close()
            admin(idle, "PUT", f"{BASE}/{name}/unload")  # its ledger closed, consumed
            c.create_producer(f"persistent://public/default/{name}").close()  # served again, a new ledger
    finally:
        c.close()

    def ledgers(name: str) -> list[int]:
        return [lg["ledgerId"] for lg in admin(idle, "GET", f"{BASE}/{name}/internalStats")["ledgers"]]

    before = {name: ledgers(name) for name in (t, f"{pt}-partition-0")}
    assert all(len(ids) == 2 for ids in before.values()), before  # nothing trimmed them yet
    admin(idle, "POST", f"{BASE}/{t}/trim")
    assert ledgers(t) == before[t][1:]
    admin(idle, "POST", f"{BASE}/{pt}/trim")
    assert ledgers(f"{pt}-partition-0") == before[f"{pt}-partition-0"][1:]


def test_create_missed_partitions_makes_the_missing_ones_again(bp: BrokerProcess) -> None:
    """``pulsar-admin topics create-missed-partitions`` (``POST …/{topic}/createMissedPartitions``; before: 404):
    a partition of a partitioned topic deleted by name is made again, empty, the others left as they are; 409
    "Topic is not partitioned topic" for a topic that is not one."""
    pt, t = topic_name(), topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 3)
    partitions = [f"persistent://public/default/{pt}-partition-{i}" for i in range(3)]
    admin(bp, "DELETE", f"{BASE}/{pt}-partition-1")
    assert [p for p in partitions if p in admin(bp, "GET", BASE)] == [partitions[0], partitions[2]]
    admin(bp, "POST", f"{BASE}/{pt}/createMissedPartitions")
    assert [p for p in partitions if p in admin(bp, "GET", BASE)] == partitions
    admin(bp, "POST", f"{BASE}/{pt}/createMissedPartitions")  # none missing: nothing to do
    admin(bp, "PUT", f"{BASE}/{t}")
    assert _http_status(bp, "POST", f"{BASE}/{t}/createMissedPartitions") == 409


@pytest.fixture
def strict(bookies: Any, tmp_path: Path) -> Iterator[SecureCluster]:
    """:func:`secure_cluster` with aiohttp's NotAppKeyWarning an error in the broker (``PYTHONWARNINGS``)."""
    yield from secure_cluster(
        bookies, tmp_path, env={"PYTHONWARNINGS": "error:It is recommended to use web."}
    )


def test_authenticated_admin_calls_store_their_request_state_under_typed_keys(strict: SecureCluster) -> None:
    """The admin keeps a request's principal and namespace policies under ``web.RequestKey``s: a string key
    makes aiohttp warn (NotAppKeyWarning) at the first request that stores one, which, that warning an error in
    the broker, failed that authenticated call with 500 (a grant, a topic call after its namespace check)."""
    su = strict.tokens[SUPERUSER]
    local = f"k-{uuid.uuid4().hex[:8]}"
    assert strict.http("PUT", f"{BASE}/{local}", token=su)[0] == 204
    assert strict.http("POST", f"{BASE}/{local}/permissions/alice", ["produce"], token=su)[0] == 204
    assert strict.http("GET", f"{BASE}/{local}/permissions", token=su) == (200, {"alice": ["produce"]})
    status, _ = strict.http(
        "GET", f"/lookup/v2/topic/persistent/public/default/{local}", token=strict.tokens["alice"]
    )
    assert status == 200


@contextlib.contextmanager
def zookeeper(brokers: Any) -> Iterator[tuple[KazooClient, str]]:
    """A ZooKeeper session of the cluster's (as another broker's admin, or a hand, writes) and its root."""
    auth = resolve_auth()
    k = KazooClient(
        hosts=brokers.bookies.zk,
        auth_data=None if auth is None else [("digest", f"{auth.user}:{auth.password}")],
    )
    k.start(30)
    try:
        yield k, brokers.bookies.root
    finally:
        k.stop()
        k.close()


def test_one_topics_unreadable_policies_leave_the_other_topics_policies_applied(brokers: Any, c: Any) -> None:
    """A topic's own policies znode that does not parse (written by hand, or by another version) is logged and
    passed over at the housekeeping tick: a namespace limit changed in ZooKeeper still reaches the namespace's
    other topics, and the broken one keeps the own policies it had. Before, the tick's policy refresh stopped at
    the topic whose policies raised, and every topic served after it kept its old policies."""
    bp = brokers.procs[0]
    ns = _namespace(bp)
    broken, other = topic_name(), topic_name()
    for t in (broken, other):
        admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    admin(bp, "POST", f"/admin/v2/persistent/public/{ns}/{broken}/maxProducers", 5)
    producers = [
        c.create_producer(f"persistent://public/{ns}/{t}") for t in (broken, other)
    ]  # served, in order
    with zookeeper(brokers) as (k, root):
        own = f"{root}/{TOPIC_POLICIES}/public/{ns}/persistent"
        (child,) = k.get_children(own)
        k.set(f"{own}/{child}", b"{not json")
        path = f"{root}/{namespace_policies_path('public', ns)}"
        policies = json.loads(k.get(path)[0])
        policies["max_producers_per_topic"] = 1  # as another broker's admin would write it
        k.set(path, json.dumps(policies).encode())

    def refused() -> bool:
        try:
            c.create_producer(f"persistent://public/{ns}/{other}").close()
        except pulsar.ProducerBusy:
            return True
        return False

    wait_for(refused, "the namespace's producer limit applied to the topic after the broken one")
    # the broken topic keeps the own policies it had (its 5), not its namespace's 1: a second producer taken
    producers.append(c.create_producer(f"persistent://public/{ns}/{broken}"))
    for p in producers:
        p.close()


def test_a_topic_whose_own_policies_do_not_parse_opens_with_none_of_its_own(brokers: Any, c: Any) -> None:
    """A topic whose own policies znode does not parse opens, as one without policies of its own (its
    namespace's limit applies), with one warning in the broker's log however many ticks pass; the admin's GET of
    its policies says they are unreadable (409); setting a policy replaces them. Before, opening the topic raised:
    no producer or consumer could use it (ServiceNotReady, MetadataFormatError), and the GET was 500 with a
    traceback in the log."""
    bp = brokers.procs[0]
    ns = _namespace(bp)
    t = topic_name()
    topic, path = f"persistent://public/{ns}/{t}", f"/admin/v2/persistent/public/{ns}/{t}/maxProducers"
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    admin(bp, "POST", path, 5)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxProducersPerTopic", 2)
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}/unload")
    with zookeeper(brokers) as (k, root):
        own = f"{root}/{TOPIC_POLICIES}/public/{ns}/persistent"
        (child,) = k.get_children(own)
        k.set(f"{own}/{child}", b"{not json")
        producers = [c.create_producer(topic), c.create_producer(topic)]
        with pytest.raises(pulsar.ProducerBusy):  # the namespace's 2, not the topic's unreadable 5
            c.create_producer(topic)
        # a housekeeping refresh later (the namespace's limit, changed by hand, applied): still one warning
        ns_path = f"{root}/{namespace_policies_path('public', ns)}"
        k.set(ns_path, json.dumps({**json.loads(k.get(ns_path)[0]), "max_producers_per_topic": 3}).encode())

        def third_taken() -> bool:
            try:
                producers.append(c.create_producer(topic))
            except pulsar.ProducerBusy:
                return False
            return True

        wait_for(third_taken, "the namespace's 3 applied")
    assert bp.log_path is not None
    log = bp.log_path.read_bytes()[bp.log_start :].decode(errors="replace")
    assert [line for line in log.splitlines() if t in line and "unreadable" in line] != []
    assert len([line for line in log.splitlines() if t in line and "policies" in line]) == 1, log[-3000:]
    with pytest.raises(urllib.error.HTTPError) as got:
        admin(bp, "GET", path)
    assert got.value.code == 409
    assert "unreadable" in json.loads(got.value.read())["reason"]
    admin(bp, "POST", path, 4)  # replaces them
    assert (admin(bp, "GET", path), admin(bp, "GET", path + "?applied=true")) == (4, 4)
    producers.append(c.create_producer(topic))
    for p in producers:
        p.close()


def test_a_subscription_whose_consumer_never_acknowledged_outlives_a_move_of_its_topic(
    bp: BrokerProcess, store: Any
) -> None:
    """With a subscription expiration time, a subscription whose consumer stayed attached without acknowledging
    (no message came) is not deleted when its topic is served again before the consumer is back: its cursor's
    last_active_ms is saved while a consumer is attached. It was saved by acknowledgements only, and the times a
    broker saw consumers are its own and are dropped when the topic stops being served, so the next owner took
    the subscription for idle since its last acknowledgement and deleted it at its first housekeeping pass."""
    ns = _namespace(bp)
    base = f"/admin/v2/persistent/public/{ns}"
    t, clock = topic_name(), topic_name()

    def subscriptions(topic: str) -> list[str]:
        return list(admin(bp, "GET", f"{base}/{topic}/subscriptions"))

    def last_active_an_hour_ago(topic: str, sub: str) -> None:
        cursor = f"managed-ledgers/public/{ns}/persistent/{topic}/cursors/{sub}"
        stored = store.get(cursor)
        store.set(
            cursor, {**stored.value, "last_active_ms": int(time.time() * 1000) - 3_600_000}, stored.version
        )

    admin(bp, "PUT", f"{base}/{t}")
    for sub in ("live", "zz-one"):
        admin(bp, "PUT", f"{base}/{t}/subscription/{sub}")
    admin(bp, "PUT", f"{base}/{t}/unload")
    for sub in ("live", "zz-one"):  # as a consumer attached an hour ago, and nothing to acknowledge since
        last_active_an_hour_ago(t, sub)
    s = _raw(bp)
    try:
        _connect(s)
        cmd = pb.CommandSubscribe(
            topic=f"persistent://public/{ns}/{t}", subscription="live", subType=pb.CommandSubscribe.Shared,
            consumer_id=1, request_id=1,
        )  # fmt: skip
        s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=cmd)))
        dec, got = wire.FrameDecoder(), []
        s.settimeout(30)
        while not got:
            got = [f.command for f in dec.feed(s.recv(65536)) if f.command.type in (T.SUCCESS, T.ERROR)]
        assert got[0].type == T.SUCCESS, got
        admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/subscriptionExpirationTime", 30)
        # a housekeeping pass with the consumer attached: zz-one (idle) deleted, live kept
        wait_for(lambda: "zz-one" not in subscriptions(t), "the idle subscription deleted")
        assert subscriptions(t) == ["live"]
        admin(bp, "PUT", f"{base}/{t}/unload")  # the consumer (it does not reconnect) closed with it
    finally:
        s.close()
    # a pass while the topic is not served (another topic's idle subscription deleted): its seen times go
    admin(bp, "PUT", f"{base}/{clock}")
    admin(bp, "PUT", f"{base}/{clock}/subscription/old")
    last_active_an_hour_ago(clock, "old")
    wait_for(lambda: subscriptions(clock) == [], "another topic's idle subscription deleted")
    # served again; the pass that deletes zz-two (idle) checks live (before it, in name order) too
    admin(bp, "PUT", f"{base}/{t}/subscription/zz-two")
    last_active_an_hour_ago(t, "zz-two")
    wait_for(lambda: "zz-two" not in subscriptions(t), "the idle subscription deleted")
    assert subscriptions(t) == ["live"]


def test_a_partitioned_topic_made_by_an_http_metadata_request_needs_the_lookups_authorization(
    secure: SecureCluster,
) -> None:
    """``GET …/{topic}/partitions?checkAllowAutoCreation=true`` (pulsar-client's metadata request through an
    ``http://`` service URL) creates a topic that does not exist where its namespace's autoTopicCreation says
    partitioned, so under ``--auth-required`` it takes the binary PARTITIONED_METADATA's authorization (produce or
    consume on the topic): anonymous 401, a role without a grant 403, and nothing is created; granted, 200 and
    the topic made. It was a read (GET) to the admin's authentication: anyone made topics of up to
    ``--max-partitions-per-topic`` partitions each, as many as names."""
    su, alice = secure.tokens[SUPERUSER], secure.tokens["alice"]
    ns = f"auto-{uuid.uuid4().hex[:8]}"
    assert secure.http("PUT", f"/admin/v2/namespaces/public/{ns}", token=su)[0] == 204
    auto = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 2}
    assert (
        secure.http("POST", f"/admin/v2/namespaces/public/{ns}/autoTopicCreation", auto, token=su)[0] == 204
    )
    t = f"persistent://public/{ns}/made-by-lookup"
    metadata = f"/admin/v2/persistent/public/{ns}/made-by-lookup/partitions?checkAllowAutoCreation=true"

    def partitioned() -> Any:
        return secure.http("GET", f"/admin/v2/persistent/public/{ns}/partitioned", token=su)

    assert secure.http("GET", metadata)[0] == 401
    assert secure.http("GET", metadata, token=alice)[0] == 403
    assert partitioned() == (200, [])
    granted = {"alice": ["produce"]}
    assert (
        secure.http("POST", f"/admin/v2/namespaces/public/{ns}/permissions/alice", ["produce"], token=su)[0]
        == 204
    )
    assert secure.http("GET", f"/admin/v2/namespaces/public/{ns}/permissions", token=su) == (200, granted)
    assert secure.http("GET", metadata, token=alice) == (200, {"partitions": 2})
    assert partitioned() == (200, [t])
