"""A consumer's UNSUBSCRIBE whose cursor delete fails (ZooKeeper's delete refused once): an in-process broker
(real ZooKeeper, 3 bookies) and a pulsar-client consumer."""

from __future__ import annotations

import uuid

import pulsar
import pytest

import zk
from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_broker_gone_connection import _serving
from topic_broker.names import TopicName


def test_an_unsubscribe_whose_cursor_delete_fails_leaves_the_consumer_for_the_retry(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The failed UNSUBSCRIBE leaves the consumer, its subscription and the cursor attached as they were, and the
    client's retry unsubscribes (before: the consumer and subscription were removed first, so the retry met
    ConsumerNotFound and the cursor stayed stored)."""
    with _serving(cluster) as (service, run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            meta = service.meta
            name = TopicName.parse(f"persistent://public/default/unsubfail-{uuid.uuid4().hex[:8]}")
            consumer = client.subscribe(str(name), "s")
            failed: list[str] = []
            real_delete_cursor = meta.delete_cursor

            async def refused_once(ml_name: str, sub: str) -> None:
                if not failed:
                    failed.append(sub)
                    raise zk.MetadataError("delete refused (test)")
                await real_delete_cursor(ml_name, sub)

            meta.delete_cursor = refused_once
            try:
                with pytest.raises(pulsar.PulsarException):
                    consumer.unsubscribe()
                topic = service._served(str(name))
                assert len(topic.subscriptions["s"].consumers) == 1
                assert "s" in topic.ml.cursors
                consumer.unsubscribe()
            finally:
                del meta.delete_cursor
            assert failed == ["s"]
            assert "s" not in topic.subscriptions
            assert "s" not in topic.ml.cursors
            assert run(meta.get_cursor(name.ml_name, "s")) is None
        finally:
            client.close()
