"""Tests for the bugs planted in the audit of 2026-11-29 against 5e17900 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the topic-level policies, topic grants, TLS client
certificates, orphaned chunks and the Spark stream's guarded commit"): each fails with its bug planted and passes
without it. One broker on 3 bookies (``test_broker_admin8``'s fixture, its housekeeping tick every second, its
own for this module) and the official ``pulsar-client``."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_admin8 import BASE, _http_status, _stats, bp, brokers
from tests.integration.test_broker_admin10 import zookeeper
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_client_features7 import _answers
from tests.integration.test_broker_pulsar_client import (
    _raw_answer,
    _raw_producer,
    _raw_send,
    _raw_send_chunks,
    drain,
    topic_name,
)
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from zk.client import MetadataStore
from zk.errors import MetadataNotFoundError
from zk.layout import namespace_policies_path

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand
#: the eighth admin part's broker (one per module) and the third part's client
__all__ = ["bp", "brokers", "c"]


def _namespace(bp: BrokerProcess) -> str:
    ns = f"ns-{topic_name()}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    return ns


def _producer_refused(c: Any, topic: str) -> bool:
    try:
        c.create_producer(topic).close()
    except pulsar.ProducerBusy:
        return True
    return False


def _set_namespace_policy(k: KazooClient, root: str, ns: str, field: str, value: Any) -> None:
    path = f"{root}/{namespace_policies_path('public', ns)}"
    policies = json.loads(k.get(path)[0])
    policies[field] = value
    k.set(path, json.dumps(policies).encode())


def test_a_limit_of_0_is_no_limit(bp: BrokerProcess, c: Any) -> None:
    """0 takes a limit off (Pulsar's): the topic's ``maxUnackedMessagesOnConsumer`` and
    ``maxUnackedMessagesOnSubscription`` of 0 are taken (204) and hold nothing back, the consumer is sent every
    message it has permits for; 0 is no limit of 0 messages."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    for limit in ("maxUnackedMessagesOnConsumer", "maxUnackedMessagesOnSubscription", "maxProducers"):
        assert _http_status(bp, "POST", f"{BASE}/{t}/{limit}", 0) == 200
        assert admin(bp, "GET", f"{BASE}/{t}/{limit}?applied=true") == 0
    consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"m-{i}".encode())
    got = [consumer.receive(timeout_millis=10_000).data() for _ in range(5)]
    assert sorted(got) == [f"m-{i}".encode() for i in range(5)]
    producer.close()
    consumer.close()


def test_max_consumers_counts_the_consumers_of_every_subscription(bp: BrokerProcess, c: Any) -> None:
    """``maxConsumers`` 2 is the topic's: a consumer on each of two subscriptions makes two, and a third on a
    third subscription is refused ConsumerBusy, though no subscription has two."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    admin(bp, "POST", f"{BASE}/{t}/maxConsumers", 2)
    held = [c.subscribe(topic, s) for s in ("a", "b")]
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "c")
    for consumer in held:
        consumer.close()


def test_subscribes_waiting_at_once_past_max_consumers_are_refused_but_the_first(bp: BrokerProcess) -> None:
    """Two SUBSCRIBEs (two consumer ids, two new subscriptions) sent at once to a topic of ``maxConsumers`` 1:
    both pass the check made before the subscription is created, and the second, checked again once its cursor
    is open, finds the first attached and is refused ConsumerBusy; one consumer on the topic."""
    t = topic_name()
    topic = f"persistent://public/default/{t}"
    admin(bp, "PUT", f"{BASE}/{t}")
    admin(bp, "POST", f"{BASE}/{t}/maxConsumers", 1)
    admin(bp, "GET", f"{BASE}/{t}/stats")  # served: its limit applied

    def subscribe(consumer_id: int, subscription: str) -> bytes:
        sub = pb.CommandSubscribe(
            topic=topic,
            subscription=subscription,
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=consumer_id,
            request_id=consumer_id,
        )
        return wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub))

    raw = socket.create_connection(("127.0.0.1", bp.port), timeout=30)
    with contextlib.closing(raw):
        connect = pb.CommandConnect(client_version="t", protocol_version=20)
        # at once: the second is read while the first waits for its cursor
        raw.sendall(
            wire.encode_command(T(type=T.CONNECT, connect=connect)) + subscribe(1, "a") + subscribe(2, "b")
        )
        assert _answers(raw, 2) == {1: "SUCCESS", 2: "ConsumerBusy"}
        subs = _stats(bp, topic)["subscriptions"]
        assert sum(len(s["consumers"]) for s in subs.values()) == 1


def test_a_namespaces_max_consumers_is_its_own_limit_not_its_producers(bp: BrokerProcess, c: Any) -> None:
    """``namespaces set-max-consumers-per-topic`` sets the consumers' limit (read back as such) and leaves the
    producers' unset: a second consumer is refused ConsumerBusy, a second producer is taken."""
    ns = _namespace(bp)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxConsumersPerTopic", 1)
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}/maxConsumersPerTopic") == 1
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}/maxProducersPerTopic") is None
    first = c.subscribe(topic, "a")
    with pytest.raises(pulsar.ConsumerBusy):
        c.subscribe(topic, "b")
    producers = [c.create_producer(topic) for _ in range(2)]
    for x in (first, *producers):
        x.close()


def test_a_topics_own_deduplication_wins_over_its_namespaces(bp: BrokerProcess, c: Any) -> None:
    """The topic's own ``deduplicationEnabled`` true over its namespace's false: a sequence id sent again is
    dropped on the topic (3 of 5 stored), and ``applied`` says true."""
    ns = _namespace(bp)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/deduplication", False)
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    path = f"/admin/v2/persistent/public/{ns}/{t}/deduplicationEnabled"
    admin(bp, "POST", path, True)
    assert admin(bp, "GET", path + "?applied=true") is True
    consumer = c.subscribe(topic, "s")
    producer = c.create_producer(topic, producer_name=f"p-{t}", batching_enabled=False)
    for seq in (1, 2, 2, 1, 3):
        producer.send(f"seq-{seq}".encode(), sequence_id=seq)
    got = [consumer.receive(timeout_millis=10_000).data() for _ in range(3)]
    assert got == [b"seq-1", b"seq-2", b"seq-3"]
    stats = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/stats")
    assert stats["subscriptions"]["s"]["msgBacklog"] == 3
    producer.close()
    consumer.close()


def _ticks_passed(n: int = 3) -> None:
    """Some housekeeping ticks (every second here) have run: waited for, with no assertion on the time."""
    time.sleep(n * 1.0 + 0.5)


def test_a_partitioned_topics_own_limit_holds_past_the_housekeeping_tick(bp: BrokerProcess, c: Any) -> None:
    """A partitioned topic's own ``maxProducers`` (set on the partitioned topic) binds each partition when it is
    opened and still after the housekeeping ticks that refresh the policies (each partition's own are its
    partitioned topic's)."""
    pt = topic_name()
    topic = f"persistent://public/default/{pt}-partition-0"
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    admin(bp, "POST", f"{BASE}/{pt}/maxProducers", 1)
    first = c.create_producer(topic)
    assert _producer_refused(c, topic)
    _ticks_passed()
    assert _producer_refused(c, topic)
    first.close()


def test_a_namespace_policy_changed_keeps_the_topics_own(bp: BrokerProcess, c: Any) -> None:
    """A namespace's ``maxProducersPerTopic`` 1 set while its topic (own ``maxProducers`` 2) is served applies
    with the topic's own at once: the topic takes its second producer (not the namespace's 1), with no wait for
    the housekeeping tick."""
    ns = _namespace(bp)
    t = topic_name()
    topic = f"persistent://public/{ns}/{t}"
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    admin(bp, "POST", f"/admin/v2/persistent/public/{ns}/{t}/maxProducers", 2)
    first = c.create_producer(topic)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxProducersPerTopic", 1)
    second = c.create_producer(topic)
    assert _producer_refused(c, topic)
    first.close()
    second.close()


def test_a_namespace_whose_policies_are_unreadable_leaves_the_other_namespaces_refreshed(
    brokers: Any, c: Any
) -> None:
    """A namespace's policies znode that does not parse is passed over at the housekeeping tick: another
    namespace's limit written in ZooKeeper still reaches its topics (served after the broken one's)."""
    bp = brokers.procs[0]
    broken_ns, ns = _namespace(bp), _namespace(bp)
    t_broken, t = topic_name(), topic_name()
    admin(bp, "PUT", f"/admin/v2/persistent/public/{broken_ns}/{t_broken}")
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    producers = [
        c.create_producer(f"persistent://public/{broken_ns}/{t_broken}"),
        c.create_producer(f"persistent://public/{ns}/{t}"),
    ]  # served, in order
    with zookeeper(brokers) as (k, root):
        path = f"{root}/{namespace_policies_path('public', broken_ns)}"
        kept = k.get(path)[0]
        k.set(path, b"{not json")
        try:
            _set_namespace_policy(k, root, ns, "max_producers_per_topic", 1)
            wait_for(
                lambda: _producer_refused(c, f"persistent://public/{ns}/{t}"), "the other namespace's limit"
            )
        finally:
            k.set(path, kept)
    for p in producers:
        p.close()


def test_a_topics_grants_are_kept_per_role_merged_with_its_namespaces_and_go_with_the_topic(
    bp: BrokerProcess,
) -> None:
    """``topics grant-permission`` to two roles keeps both (a grant replaces that role's only); ``topics
    permissions`` shows a role's namespace and topic grants together; a deleted topic's grants go with it (a
    partitioned topic's too), and the topic made again under its name has its namespace's only."""
    ns = _namespace(bp)
    t = topic_name()
    base = f"/admin/v2/persistent/public/{ns}/{t}"
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/permissions/alice", ["consume"])
    admin(bp, "PUT", base)
    admin(bp, "POST", f"{base}/permissions/alice", ["produce"])
    admin(bp, "POST", f"{base}/permissions/bob", ["consume"])
    assert admin(bp, "GET", f"{base}/permissions") == {"alice": ["consume", "produce"], "bob": ["consume"]}
    admin(bp, "DELETE", base)
    admin(bp, "PUT", base)
    assert admin(bp, "GET", f"{base}/permissions") == {"alice": ["consume"]}
    admin(bp, "POST", f"{base}/permissions/bob", ["consume"])  # the same of a partitioned topic
    admin(bp, "DELETE", base)
    admin(bp, "PUT", f"{base}/partitions", 2)
    admin(bp, "POST", f"{base}/permissions/bob", ["consume"])
    assert admin(bp, "GET", f"{base}/permissions") == {"alice": ["consume"], "bob": ["consume"]}
    admin(bp, "DELETE", f"{base}/partitions")
    admin(bp, "PUT", f"{base}/partitions", 2)
    assert admin(bp, "GET", f"{base}/permissions") == {"alice": ["consume"]}


def test_create_missed_partitions_makes_the_last_partition_again(bp: BrokerProcess) -> None:
    """``createMissedPartitions`` covers every partition, the last one too: a partitioned topic of 2 whose
    partition 1 was deleted by name has it again."""
    pt = topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    partitions = [f"persistent://public/default/{pt}-partition-{i}" for i in range(2)]
    admin(bp, "DELETE", f"{BASE}/{pt}-partition-1")
    assert [p for p in partitions if p in admin(bp, "GET", BASE)] == partitions[:1]
    admin(bp, "POST", f"{BASE}/{pt}/createMissedPartitions")
    assert [p for p in partitions if p in admin(bp, "GET", BASE)] == partitions


def test_a_chunked_message_filling_the_first_id_of_a_skipped_range_is_stored_whole(
    bp: BrokerProcess, c: Any
) -> None:
    """A chunked message whose sequence id is the first (here the only) id of a range its producer's stored
    sends jumped over (ids 1 and 3 stored, then the message of id 2) fills it: every chunk stored, none taken
    for a resend of a message stored."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s")
    s, dec = _raw_producer(bp, t, "edge")
    try:
        for seq in (1, 3):
            _raw_send(s, seq, f"m{seq}".encode())
            assert _raw_answer(s, dec).type == T.SEND_RECEIPT
        answers = _raw_send_chunks(s, dec, "edge", 2, [b"bbbb", b"BBBB"])
    finally:
        s.close()
    assert [a.type for a in answers] == [T.SEND_RECEIPT, T.SEND_RECEIPT]
    assert all(a.send_receipt.message_id.entryId != 2**64 - 1 for a in answers), answers  # both stored
    assert sorted(m.data() for m in drain(consumer, 3)) == [b"bbbbBBBB", b"m1", b"m3"]
    consumer.close()


def test_a_guarded_update_below_a_guard_that_is_gone_makes_neither(zk_store: MetadataStore) -> None:
    """``update_guarded`` of a znode below its guard (a cursor under its managed ledger's znode, the Spark
    stream's commit) whose parents are missing: made, parents and all, while the guard is there; once the guard
    is gone, MetadataNotFoundError and nothing made, the guard not made again as the new znode's parent."""
    zk_store.create("ml", {})
    made = zk_store.update_guarded("ml/cursors/s", lambda d: {**d, "n": 1}, guard="ml", default={})
    assert made.value["n"] == 1
    zk_store.delete("ml/cursors/s")
    zk_store.delete("ml/cursors")
    zk_store.delete("ml")
    with pytest.raises(MetadataNotFoundError):
        zk_store.update_guarded("ml/cursors/s", lambda d: {**d, "n": 2}, guard="ml", default={})
    assert zk_store.get_optional("ml") is None
