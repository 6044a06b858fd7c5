"""Peek (``…/subscription/{s}/position/{n}``) against a consumer subscribing to the same idle subscription at
that moment, on an in-process broker (real ZooKeeper and bookies, the admin REST over HTTP), the interleaving
held in place by a gate on the peek's reading of the stored cursor."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
import uuid

from tests.broker_testing import Brokers, CursorReadGate, in_process_broker


def test_a_peek_racing_a_subscribe_leaves_the_consumers_cursor_attached(cluster: Brokers) -> None:
    """Peek opened the idle subscription's stored cursor and attached it to the managed ledger, with no
    subscription opening held off: a consumer subscribing meanwhile attached its own first, and the peek's
    stale copy took its place. Retention and the backlog quota (the slowest mark-delete) then saw the copy's
    mark-delete, not the consumer's acks, for as long as the consumer stayed."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.admin import AdminServer
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.names import TopicName

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        http = AdminServer(service)
        run(http.start())
        try:
            local = f"peek-{uuid.uuid4().hex[:8]}"
            topic = run(service.get_topic(TopicName.parse(f"persistent://public/default/{local}")))
            md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
            for _ in range(3):
                run(topic.ml.append(wire.make_entry(md, b"v")))
            run(ManagedCursor.open(topic.ml, "s", InitialPosition.EARLIEST))
            topic.ml.detach_cursor("s")  # stored only, as a new owner finds it

            gate = CursorReadGate(topic.ml.store, run, 1)  # the peek's read opening the stored cursor
            url = f"http://127.0.0.1:{service.config.http_port}/admin/v2/persistent/public/default/{local}"
            peeked: list[int] = []

            def peek() -> None:
                with urllib.request.urlopen(f"{url}/subscription/s/position/1", timeout=60) as r:
                    peeked.append(r.status)

            peeker = threading.Thread(target=peek)
            peeker.start()
            assert gate.reached.wait(30)
            cmd = pb.CommandSubscribe(
                topic=str(topic.name), subscription="s", subType=pb.CommandSubscribe.Shared
            )
            subscribing = asyncio.run_coroutine_threadsafe(topic.subscription(cmd), gate.loop)
            gate.release_after(subscribing)  # a subscribe not held off by the peek is done by then
            rt = subscribing.result(30)
            peeker.join(30)
            assert peeked == [200]
            assert topic.ml.cursors["s"] is rt.cursor
            last = topic.ml.last_confirmed_position()

            async def ack_all() -> None:
                rt.cursor.ack_cumulative(last)

            run(ack_all())
            assert topic.ml.slowest_mark_delete() == last
        finally:
            run(http.stop())
