"""The backlog quota's ``consumer_backlog_eviction`` (``Topic.evict_backlog``) against a consumer subscribing to an
idle, unattached subscription at that moment, on an in-process broker (real ZooKeeper and bookies), the
interleaving held in place by a gate on the eviction's reading of the stored cursor."""

from __future__ import annotations

import asyncio
import uuid

from tests.broker_testing import Brokers, CursorReadGate, in_process_broker


def test_an_eviction_racing_a_subscribe_leaves_the_consumers_cursor_attached(cluster: Brokers) -> None:
    """The eviction opened the idle subscription's stored cursor and reset it with no subscription opening held
    off: a consumer subscribing meanwhile opened the version before the reset, and the eviction's stale copy
    took its place in the managed ledger; the consumer's next save conflicted with the reset and fenced the
    topic. Held off, the consumer opens the evicted cursor, stays attached, and its acks are saved."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.names import TopicName

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        local = f"evict-{uuid.uuid4().hex[:8]}"
        topic = run(service.get_topic(TopicName.parse(f"persistent://public/default/{local}")))
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        for _ in range(4):
            run(topic.ml.append(wire.make_entry(md, b"v" * 100)))
        run(ManagedCursor.open(topic.ml, "s", InitialPosition.EARLIEST))
        topic.ml.detach_cursor("s")  # stored only, as a new owner finds it
        last = topic.ml.last_confirmed_position()

        gate = CursorReadGate(topic.ml.store, run, 2)  # the eviction's read opening the stored cursor
        evicting = asyncio.run_coroutine_threadsafe(topic.evict_backlog(0), gate.loop)  # nothing may stay
        assert gate.reached.wait(30)
        cmd = pb.CommandSubscribe(topic=str(topic.name), subscription="s", subType=pb.CommandSubscribe.Shared)
        subscribing = asyncio.run_coroutine_threadsafe(topic.subscription(cmd), gate.loop)
        gate.release_after(subscribing)  # a subscribe not held off by the eviction is done by then
        evicting.result(30)
        rt = subscribing.result(30)
        gate.remove()
        assert rt.cursor is not None and rt.cursor.mark_delete == last  # the consumer starts where evicted
        new_last = run(topic.ml.append(wire.make_entry(md, b"w")))

        async def ack_and_save() -> None:
            assert rt.cursor is not None
            rt.cursor.ack_cumulative(new_last)
            await rt.cursor.flush()  # conflicted with the eviction's save, and fenced the topic, before

        run(ack_and_save())
        assert topic.ml.cursors["s"] is rt.cursor
        assert topic.ml.slowest_mark_delete() == new_last
        stored = run(gate.read(topic.ml.name, "s"))
        assert stored is not None and tuple(stored.value.mark_delete) == tuple(new_last)
        assert not topic.ml.fenced
