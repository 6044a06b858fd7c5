"""Broker leftovers: a namespace's clearBacklog over a topic whose owner died mid-write, on broker processes
(real ZooKeeper, 3 bookies, pulsar-client)."""

from __future__ import annotations

import uuid

import pytest

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_client_features4 import wait_for
from topic_broker.names import TopicName
from zk.client import MetadataStore

pulsar = pytest.importorskip("pulsar")


def test_namespace_clear_backlog_clears_a_topic_whose_owner_died_with_its_ledger_open(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A topic with 3 messages of backlog on subscription "a" whose broker was killed (its last ledger left
    open, its ownership gone with its session): the namespace's clearBacklog, on another broker, leaves a
    backlog of 0 (the whole namespace's, and the named subscription's)."""
    first = cluster.start()
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    base = f"/admin/v2/persistent/public/{ns}"
    admin(first, "PUT", f"/admin/v2/namespaces/public/{ns}")
    topics = ["t-0", "t-1"]
    c = pulsar.Client(first.service_url)
    try:
        for t in topics:
            admin(first, "PUT", f"{base}/{t}")
            admin(first, "PUT", f"{base}/{t}/subscription/a")
            producer = c.create_producer(f"persistent://public/{ns}/{t}")
            for _ in range(3):
                producer.send(b"m")
    finally:
        first.kill9()  # mid-write: the topics' ledgers stay open
        c.close()
    store = MetadataStore.connect(first.zk, first.zk_root)
    try:
        wait_for(
            lambda: not store.children_many([f"ownership/public/{ns}/persistent"]).popitem()[1],
            "the dead broker's ownership gone with its session",
        )
    finally:
        store.close()
    second = cluster.start()
    admin(second, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/a")
    t0 = admin(second, "GET", f"{base}/{topics[0]}/stats")["subscriptions"]["a"]["msgBacklog"]
    assert t0 == 0
    admin(second, "PUT", f"/admin/v2/namespaces/public/{ns}/unload")
    admin(second, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog")
    assert [
        admin(second, "GET", f"{base}/{t}/stats")["subscriptions"]["a"]["msgBacklog"] for t in topics
    ] == [0, 0]


def test_a_namespace_deleted_while_a_lookup_holds_an_ownership_leaves_no_ownership_directories(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A lookup's ownership of a topic nobody opens is held while its namespace is deleted (no topic exists, so
    the delete goes on, and the ownership directories, not empty, stay); once the hold ends and the znode is let
    go, ``ownership/public/<ns>`` goes too (before, its two empty directories stayed for good: 2 znodes per
    namespace so deleted)."""
    bp = cluster.start()
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    topic = TopicName.parse(f"persistent://public/{ns}/looked-up")
    with (
        in_process_broker(cluster, tick_interval_s=0.5, lookup_ownership_hold_s=1.5) as (service, run),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):
        run(service.lookup_owner(topic))
        assert store.children(f"ownership/public/{ns}/persistent") == ["looked-up"]
        admin(bp, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        assert store.get_optional(f"ownership/public/{ns}/persistent/looked-up") is not None  # still held
        wait_for(lambda: not store.exists(f"ownership/public/{ns}"), "its ownership directories gone", 10)
        assert ns not in store.children("ownership/public")
