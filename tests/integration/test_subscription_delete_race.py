"""A subscription's delete (the admin's DELETE …/subscription/{sub}) and a consumer subscribing to it at once: an
in-process broker (real ZooKeeper, 3 bookies) whose cursor read, in the delete's window between its look at the
subscription and its delete, lets a pulsar-client consumer subscribe."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from typing import Any

import pulsar

from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_broker_gone_connection import _serving
from topic_broker.admin import AdminServer
from topic_broker.names import TopicName


def _call(port: int, method: str, path: str, body: Any = None) -> int:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(r.status)


def test_a_consumer_subscribing_while_its_subscription_is_deleted_keeps_a_stored_one(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The consumer attached after the delete, to a subscription made anew: stored in ZooKeeper, known to the
    managed ledger (its retention counts it), and it receives what is published (before: the delete had seen
    no consumer, so it deleted the cursor's znode and detached it from the managed ledger under the consumer
    that attached meanwhile, 204 with a consumer connected)."""
    with _serving(cluster) as (service, run):
        admin = AdminServer(service)
        run(admin.start())
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            port, meta = service.config.http_port, service.meta
            name = TopicName.parse(f"persistent://public/default/unsub-{uuid.uuid4().hex[:8]}")
            path = f"/admin/v2/persistent/public/default/{name.local}"
            assert _call(port, "PUT", path) == 204
            assert _call(port, "PUT", f"{path}/subscription/s") == 204
            consumers: list[Any] = []
            real_get_cursor = meta.get_cursor

            async def read_then_consumer_subscribes(ml_name: str, sub: str) -> Any:
                found = await real_get_cursor(ml_name, sub)
                if ml_name == name.ml_name and not consumers:
                    consumers.append(None)
                    subscribing = asyncio.get_running_loop().run_in_executor(
                        None, lambda: client.subscribe(str(name), "s")
                    )
                    # as far as the subscribe goes while the delete waits
                    done, _ = await asyncio.wait({subscribing}, timeout=3)
                    consumers[0] = subscribing
                return found

            meta.get_cursor = read_then_consumer_subscribes
            try:
                status = _call(port, "DELETE", f"{path}/subscription/s")
            finally:
                del meta.get_cursor

            async def subscribed() -> Any:
                return await consumers[0]

            consumer = run(subscribed())
            assert status == 204
            topic = service._served(str(name))
            rt = topic.subscriptions["s"]
            assert len(rt.consumers) == 1
            assert run(meta.get_cursor(name.ml_name, "s")) is not None, "the attached subscription's cursor"
            assert "s" in topic.ml.cursors
            producer = client.create_producer(str(name))
            producer.send(b"after")
            assert consumer.receive(timeout_millis=10_000).data() == b"after"
        finally:
            client.close()
            run(admin.stop())


def test_a_consumer_subscribing_while_another_unsubscribes_keeps_a_stored_subscription(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A consumer's UNSUBSCRIBE (the subscription's only consumer) and another consumer subscribing while the
    cursor is deleted: the second attaches after the delete, to a subscription made anew, stored and known to
    the managed ledger (before: it restored the cursor still stored, attached, and the delete then removed that
    znode under it)."""
    with _serving(cluster) as (service, run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            meta = service.meta
            name = TopicName.parse(f"persistent://public/default/unsub2-{uuid.uuid4().hex[:8]}")
            first = client.subscribe(str(name), "s", consumer_type=pulsar.ConsumerType.Shared)
            second: list[Any] = []
            real_delete_cursor = meta.delete_cursor

            async def other_subscribes_then_deleted(ml_name: str, sub: str) -> None:
                if ml_name == name.ml_name and not second:
                    second.append(
                        asyncio.get_running_loop().run_in_executor(
                            None,
                            lambda: client.subscribe(
                                str(name), "s", consumer_type=pulsar.ConsumerType.Shared
                            ),
                        )
                    )
                    await asyncio.wait(set(second), timeout=3)  # as far as it goes while the delete waits
                await real_delete_cursor(ml_name, sub)

            meta.delete_cursor = other_subscribes_then_deleted
            try:
                first.unsubscribe()
            finally:
                del meta.delete_cursor

            async def subscribed() -> Any:
                return await second[0]

            consumer = run(subscribed())
            topic = service._served(str(name))
            assert len(topic.subscriptions["s"].consumers) == 1
            assert run(meta.get_cursor(name.ml_name, "s")) is not None, "the attached subscription's cursor"
            assert "s" in topic.ml.cursors
            client.create_producer(str(name)).send(b"after")
            assert consumer.receive(timeout_millis=10_000).data() == b"after"
        finally:
            client.close()
