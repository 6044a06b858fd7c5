"""Namespace-wide admin operations open only the topics they act on: ``clearBacklog``, ``clearBacklog/{sub}``,
``unsubscribe/{sub}`` and ``unload`` over a namespace of idle topics, on a broker process (real ZooKeeper,
3 bookies, pulsar-client). A topic a broker opens takes its ownership znode, so the znodes tell what was opened."""

from __future__ import annotations

import urllib.error
import uuid

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import broker, cluster  # noqa: F401
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_client_features4 import wait_for
from topic_broker.compaction import COMPACTION_SUBSCRIPTION
from zk.client import MetadataStore

pulsar = pytest.importorskip("pulsar")


def test_namespace_operations_open_only_the_topics_that_have_the_subscription(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    """10 idle topics without subscriptions and 2 with subscriptions "a" and "b" and 3 messages of backlog, none
    of them served: clearBacklog/a, clearBacklog and unsubscribe/a open the 2 (their backlog cleared, then the
    subscription gone), never the 10, and not the 2 again for a backlog their stored cursors show cleared; unload
    lets go of what is served. (Before: clearBacklog/a and unsubscribe/a opened all 12.)"""
    bp = broker
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    base = f"/admin/v2/persistent/public/{ns}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    idle = [f"idle-{i}" for i in range(10)]
    with_a = ["with-a-0", "with-a-1"]
    for t in idle + with_a:
        admin(bp, "PUT", f"{base}/{t}")  # metadata only: nothing opened
    c = pulsar.Client(bp.service_url)
    try:
        for t in with_a:
            admin(bp, "PUT", f"{base}/{t}/subscription/a")
            admin(bp, "PUT", f"{base}/{t}/subscription/b")
            producer = c.create_producer(f"persistent://public/{ns}/{t}")
            for _ in range(3):
                producer.send(b"m")
            producer.close()
    finally:
        c.close()

    store = MetadataStore.connect(bp.zk, bp.zk_root)

    def owned() -> set[str]:
        return set(store.children_many([f"ownership/public/{ns}/persistent"]).popitem()[1] or [])

    def unload_all() -> None:
        admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}/unload")
        wait_for(lambda: not owned(), "every topic let go")

    def backlogs() -> list[dict[str, int]]:
        rows = [admin(bp, "GET", f"{base}/{t}/stats")["subscriptions"] for t in with_a]
        return [{sub: row["msgBacklog"] for sub, row in subs.items()} for subs in rows]

    unload_all()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/a")
    assert owned() == set(with_a)
    assert backlogs() == [{"a": 0, "b": 3}] * 2
    unload_all()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/a")  # cleared already: nothing opened
    assert owned() == set()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog")
    assert owned() == set(with_a)
    assert backlogs() == [{"a": 0, "b": 0}] * 2
    unload_all()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog")  # cleared already: nothing opened
    assert owned() == set()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/unsubscribe/a")
    assert owned() == set(with_a)
    for t in with_a:
        assert admin(bp, "GET", f"{base}/{t}/subscriptions") == ["b"]
    unload_all()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/unsubscribe/a")  # nobody has it now: nothing opened
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog")
    assert owned() == set()

    # the compactor's subscription named: refused (405) on a topic nobody serves whose compaction horizon is at
    # the end, as on a served one (before: 204, its stored cursor taken as nothing to clear)
    admin(bp, "PUT", f"{base}/{with_a[0]}/compaction")
    wait_for(lambda: admin(bp, "GET", f"{base}/{with_a[0]}/compaction")["status"] == "SUCCESS", "compacted")
    unload_all()
    with pytest.raises(urllib.error.HTTPError) as refused:
        admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/{COMPACTION_SUBSCRIPTION}")
    assert refused.value.code == 405
    store.close()
