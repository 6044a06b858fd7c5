"""autoTopicCreation of partitioned topics checks ``--max-partitions-per-topic`` when it creates a topic, not only
when the policy is set: a broker process with a limit of 4 (real ZooKeeper, 3 bookies, pulsar-client), a namespace
whose policy asks for 8 (set where the limit was higher, here written to ZooKeeper directly)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_broker_client_features3 import admin
from zk.client import MetadataStore
from zk.managed_ledgers import AutoTopicCreation, BrokerMetadataStore

pulsar = pytest.importorskip("pulsar")


@pytest.fixture
def limited(cluster: Brokers) -> Iterator[BrokerProcess]:  # noqa: F811
    yield cluster.start("--max-partitions-per-topic", "4")


def test_auto_created_partitioned_topic_past_the_limit_is_refused_and_nothing_created(
    limited: BrokerProcess,
) -> None:
    """A producer on a new topic of the namespace: NotAllowedError at once with the limit in the broker's words
    (before: created with 8 partitions); over HTTP (an http:// client's metadata request) 406 with them; nothing
    created either way. With the policy at the limit, the topic is created with 4."""
    bp = limited
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    store = MetadataStore.connect(bp.zk, bp.zk_root)
    try:
        auto = AutoTopicCreation(allow=True, topic_type="partitioned", default_num_partitions=8)
        asyncio.run(
            BrokerMetadataStore(store).update_policies(
                "public", ns, lambda p: dataclasses.replace(p, auto_topic_creation=auto)
            )
        )
    finally:
        store.close()

    c = pulsar.Client(bp.service_url, operation_timeout_seconds=30)
    try:
        with pytest.raises(pulsar.NotAllowedError):
            c.create_producer(f"persistent://public/{ns}/{uuid.uuid4().hex[:8]}")
    finally:
        c.close()
    req = urllib.request.Request(
        f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/{ns}/over-http/partitions"
        "?checkAllowAutoCreation=true"
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 406
    reason = json.loads(e.value.read())["reason"]
    assert reason.startswith("Number of partitions should be less than or equal to 4:"), reason
    assert "8 partitions" in reason, reason
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/partitioned") == []
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}") == []

    within = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 4}
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/autoTopicCreation", within)
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=30)
    try:
        t = uuid.uuid4().hex[:8]
        c.create_producer(f"persistent://public/{ns}/{t}").send(b"m")
    finally:
        c.close()
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/partitions") == {"partitions": 4}
