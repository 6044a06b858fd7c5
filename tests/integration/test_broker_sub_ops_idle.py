"""Skip, expire-messages, skip_all and reset-cursor on a subscription whose consumers have gone (its dispatcher
still here, idle) after another writer moved its stored cursor, as the Spark topic source does
(``BrokerMetadataStore.save_cursor``), on an in-process broker with real ZooKeeper and bookies."""

from __future__ import annotations

import urllib.request
import uuid
from dataclasses import replace
from typing import Any

from tests.broker_testing import Brokers, in_process_broker


def idle_and_moved(service: Any, run: Any) -> tuple[Any, Any, list[Any]]:
    """A topic of 6 entries and its subscription ``s`` opened with no consumer (idle), then moved by another
    writer to its third entry: (topic, its idle runtime, the entries' positions)."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.names import TopicName

    name = TopicName.parse(f"persistent://public/default/idle-{uuid.uuid4().hex[:8]}")
    topic = run(service.get_topic(name))
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    positions = [run(topic.ml.append(wire.make_entry(md, b"v"))) for _ in range(6)]
    cmd = pb.CommandSubscribe(
        topic=str(name),
        subscription="s",
        subType=pb.CommandSubscribe.Shared,
        initialPosition=pb.CommandSubscribe.Earliest,
    )
    rt = run(topic.subscription(cmd))  # opened, no consumer: idle
    assert rt.cursor is not None and not rt.consumers
    meta = service.meta
    stored = run(meta.get_cursor(name.ml_name, "s"))
    moved = replace(stored.value, mark_delete=tuple(positions[2]))  # the other writer: 3 consumed
    run(meta.save_cursor(name.ml_name, "s", moved, stored.version))
    return topic, rt, positions


def test_a_skip_after_another_writer_moved_an_idle_subscription(cluster: Brokers) -> None:
    """The idle dispatcher's cursor was the version before the other writer's: the skip counted from the old
    mark-delete and its save conflicted, which fenced the topic (every client disconnected, the topic
    reopened). It adopts the stored cursor first, as a consumer subscribing does."""
    from topic_broker import sub_ops
    from topic_broker.managed_ledger import Position

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        topic, rt, positions = idle_and_moved(service, run)
        meta, name = service.meta, topic.name
        assert run(sub_ops.skip(topic, "s", 1))
        assert not topic.ml.fenced and not topic.unloaded
        assert rt.cursor.mark_delete == positions[3]  # one after the other writer's
        assert Position(*run(meta.get_cursor(name.ml_name, "s")).value.mark_delete) == positions[3]


def test_a_skip_all_and_a_reset_after_another_writer_moved_an_idle_subscription(cluster: Brokers) -> None:
    """skip_all and reset-cursor (the admin REST) of the idle subscription: they saved at the version before the
    other writer's, a conflict that fenced the topic."""
    from topic_broker.admin import AdminServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        http = AdminServer(service)
        run(http.start())
        try:
            topic, rt, positions = idle_and_moved(service, run)
            url = f"http://127.0.0.1:{service.config.http_port}/admin/v2/persistent/public/default/{topic.name.local}"
            req = urllib.request.Request(f"{url}/subscription/s/skip_all", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 204
            assert not topic.ml.fenced and not topic.unloaded
            assert rt.cursor.mark_delete == positions[-1]
        finally:
            run(http.stop())
