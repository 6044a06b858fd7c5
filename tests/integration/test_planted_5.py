"""Tests for the bugs planted in the audit of 2026-11-29 against 78b3357 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the wire codec, connections, admin policies and the
AutoRecovery helpers"): each fails with its bug planted and passes without it. Real ZooKeeper, bookie and broker
processes."""

from __future__ import annotations

import uuid

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_admin import call, ok
from tests.zk_testing import ZkTarget

pytest.importorskip("pulsar")


def test_namespace_policies_left_out_or_removed_are_pulsars_defaults_not_kept_or_infinite(
    broker: BrokerProcess,
) -> None:
    """A retention set with its time only keeps no size (0, as Pulsar's RetentionPolicies), removing a
    namespace's retention leaves none (0 and 0, not infinite), removing its deduplication turns it off, and a
    backlog quota that names no policy holds producers (Pulsar's default), it does not evict backlogs."""
    ns = f"/admin/v2/namespaces/public/planted5-{uuid.uuid4().hex[:8]}"
    ok(broker, "PUT", ns)
    ok(broker, "POST", ns + "/retention", {"retentionTimeInMinutes": 30})
    assert ok(broker, "GET", ns + "/retention") == {"retentionTimeInMinutes": 30, "retentionSizeInMB": 0}
    ok(broker, "POST", ns + "/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    ok(broker, "DELETE", ns + "/retention")
    assert ok(broker, "GET", ns + "/retention") == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    ok(broker, "POST", ns + "/deduplication", True)
    ok(broker, "DELETE", ns + "/deduplication")
    assert ok(broker, "GET", ns + "/deduplication") is None  # not set: the broker's default
    ok(broker, "POST", ns + "/backlogQuota", {"limitSize": 1 << 20})
    assert ok(broker, "GET", ns + "/backlogQuota")["policy"] == "producer_request_hold"
    ok(broker, "DELETE", ns)


def test_a_partitioned_topic_is_not_made_over_a_topic_takes_no_policy_past_its_count_and_keeps_its_namespace(
    broker: BrokerProcess,
) -> None:
    """Partitions asked for a name that is a (non-partitioned) topic already are refused 409, a topic policy
    set through a partition past the count is refused 404, and a namespace that holds a partitioned topic is not
    deleted, even once every partition's own topic was deleted."""
    ns = f"planted5-{uuid.uuid4().hex[:8]}"
    ok(broker, "PUT", f"/admin/v2/namespaces/public/{ns}")
    topics = f"/admin/v2/persistent/public/{ns}"
    ok(broker, "PUT", topics + "/plain")
    status, body, _ = call(broker, "PUT", topics + "/plain/partitions", 2)
    assert status == 409, body
    assert ok(broker, "GET", topics + "/plain/partitions") == {"partitions": 0}
    ok(broker, "DELETE", topics + "/plain")

    ok(broker, "PUT", topics + "/parted/partitions", 1)
    status, body, _ = call(broker, "POST", topics + "/parted-partition-1/messageTTL?messageTTL=60")
    assert status == 404, body  # a partition past the count does not set the partitioned topic's policy
    assert ok(broker, "GET", topics + "/parted/messageTTL") is None
    ok(broker, "DELETE", topics + "/parted-partition-0")
    assert ok(broker, "GET", topics) == []
    status, body, _ = call(broker, "DELETE", f"/admin/v2/namespaces/public/{ns}")
    assert status == 409, body
    assert ok(broker, "GET", topics + "/partitioned") == [f"persistent://public/{ns}/parted"]
    ok(broker, "DELETE", topics + "/parted/partitions")
    ok(broker, "DELETE", f"/admin/v2/namespaces/public/{ns}")


def test_terminate_closes_the_producers_alone_and_their_connections_stay(broker: BrokerProcess) -> None:
    """Terminate tells each producer (CLOSE_PRODUCER): its next send fails with TopicTerminated, and the
    connection it shares with a consumer stays open, so the messages that consumer holds unacknowledged are
    not delivered to it a second time (a SEND for a producer the broker no longer knows would close it)."""
    import pulsar

    topic = f"persistent://public/default/planted5-term-{uuid.uuid4().hex[:8]}"
    pc = pulsar.Client(f"pulsar://127.0.0.1:{broker.port}", operation_timeout_seconds=30)
    try:
        consumer = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
        producer = pc.create_producer(topic, batching_enabled=False)
        for i in range(3):
            producer.send(b"m%d" % i)
        assert [consumer.receive(timeout_millis=30_000).data() for _ in range(3)] == [b"m0", b"m1", b"m2"]
        ok(broker, "POST", f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/terminate")
        with pytest.raises(pulsar.TopicTerminated):
            producer.send(b"after")
        with pytest.raises(pulsar.Timeout):
            got = consumer.receive(timeout_millis=3_000)
            pytest.fail(f"{got.data()!r} delivered again: the consumer's connection was closed")
    finally:
        pc.close()


def test_under_replication_marks_merge_survive_a_cancelled_decommission_and_locks_stay_their_owners(
    zk_connect: ZkTarget,
) -> None:
    """AutoRecovery's znodes against a real ZooKeeper: a second mark of a ledger keeps the bookies the first
    named; cancelling a decommission takes the bookie out of each mark's drain but keeps a mark that still
    names a lost bookie (one left naming none goes); and one session's unlock leaves another session's lock."""
    from zk.client import MetadataStore
    from zk.underreplication import UnderReplicationManager

    a, b = MetadataStore.connect(*zk_connect), MetadataStore.connect(*zk_connect)
    try:
        ma, mb = UnderReplicationManager(a), UnderReplicationManager(b)
        ma.mark(1, missing=["bk-1"])
        ma.mark(1, missing=["bk-2"])
        mark = ma.get(1)
        assert mark is not None and mark.value.missing == ("bk-1", "bk-2")

        ma.start_decommission("bk-9")
        ma.mark(2, missing=["bk-1"], drain=["bk-9"])
        ma.mark(3, drain=["bk-9"])
        was, changed = ma.cancel_decommission("bk-9")
        assert was and sorted(changed) == [2, 3]
        kept = ma.get(2)
        assert kept is not None and kept.value.missing == ("bk-1",) and kept.value.drain == ()
        assert ma.get(3) is None

        assert ma.try_lock(1, "worker-a")
        assert not mb.try_lock(1, "worker-b")
        mb.unlock(1)
        assert ma.locks() == {1: "worker-a"}
        ma.unlock(1)
        assert ma.locks() == {}
    finally:
        a.close()
        b.close()
