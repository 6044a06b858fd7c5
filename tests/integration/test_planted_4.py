"""Tests for the bugs planted in the audit of 2026-11-28 against 2d54aad that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of subscriptions, retention and the metadata layer"): each
fails with its bug planted and passes without it. Real ZooKeeper and bookie processes, an in-process broker,
the official ``pulsar-client``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.broker_testing import Brokers, in_process_broker
from tests.integration.test_broker_client_features3 import receive_all
from topic_broker.names import TopicName

pulsar = pytest.importorskip("pulsar")


def test_a_consumer_of_an_idle_subscription_another_writer_moved_back_starts_where_it_was_moved(
    cluster: Brokers,
) -> None:
    """A consumer reads and acks all six entries and leaves; the subscription's dispatcher stays, read to the
    end. Another writer (the Spark topic source, a subscription saved by hand) moves the stored cursor back to
    the third entry. The next consumer adopts the stored cursor and the dispatcher starts over from there: the
    three entries after it are delivered again, not nothing."""
    import time
    from dataclasses import replace

    from topic_broker.managed_ledger import Position
    from topic_broker.server import BrokerServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        server = BrokerServer(service)
        run(server.start())
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            topic = f"persistent://public/default/moved-{uuid.uuid4().hex[:8]}"
            producer = client.create_producer(topic, batching_enabled=False)
            ids = [producer.send(b"m%d" % i) for i in range(6)]
            positions = [(m.ledger_id(), m.entry_id()) for m in ids]
            consumer = client.subscribe(
                topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                initial_position=pulsar.InitialPosition.Earliest,
            )  # fmt: skip
            for _ in range(6):
                consumer.acknowledge(consumer.receive(timeout_millis=30_000))
            consumer.close()
            meta, ml_name = service.meta, TopicName.parse(topic).ml_name
            deadline = time.monotonic() + 30
            while (stored := run(meta.get_cursor(ml_name, "s"))).value.mark_delete != positions[-1]:
                assert time.monotonic() < deadline, "the acks were not saved"
                time.sleep(0.1)
            moved = replace(stored.value, mark_delete=positions[2], individually_deleted=())
            run(meta.save_cursor(ml_name, "s", moved, stored.version))  # the other writer

            consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
            got = [
                (m.message_id().ledger_id(), m.message_id().entry_id()) for m in receive_all(consumer, 3000)
            ]
            assert got == positions[3:]
            assert Position(*run(meta.get_cursor(ml_name, "s")).value.mark_delete) == Position(*positions[2])
        finally:
            client.close()
            run(server.stop())


def test_the_message_backlog_leaves_out_every_message_of_an_individually_acked_range(
    cluster: Brokers,
) -> None:
    """msgBacklog (the stats, the backlog's messages) after individual acks of two neighbouring entries: the
    range they make holds both, so four of six are left, as the entry backlog says."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.names import TopicName

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        name = TopicName.parse(f"persistent://public/default/backlog-{uuid.uuid4().hex[:8]}")
        topic = run(service.get_topic(name))
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        positions = [run(topic.ml.append(wire.make_entry(md, b"v"))) for _ in range(6)]
        cmd = pb.CommandSubscribe(
            topic=str(name), subscription="s", subType=pb.CommandSubscribe.Shared,
            initialPosition=pb.CommandSubscribe.Earliest,
        )  # fmt: skip
        rt = run(topic.subscription(cmd))

        async def ack_two() -> tuple[int, int]:
            rt.cursor.ack_individual(positions[1])
            rt.cursor.ack_individual(positions[2])
            return rt.cursor.backlog(), rt.cursor.backlog_messages()

        assert run(ack_two()) == (4, 4)


def test_retention_lets_go_what_a_deleted_subscription_held_back(bookies: Any) -> None:
    """A stored subscription nobody attached holds retention at its mark-delete; once it is deleted (unsubscribed
    elsewhere, or by the admin REST), the next retention pass goes by the subscriptions that are left and lets
    the consumed ledgers go."""
    from tests.integration.test_managed_ledger import ML, SMALL, payload
    from tests.integration.test_managed_ledger import run as run_ml
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig

    async def body(bk: Any, store: Any) -> None:
        ml = await ManagedLedger.open(bk, store, ML, ManagedLedgerConfig(max_entries_per_ledger=5, **SMALL))
        ml.retention_time_s, ml.retention_size_bytes = 0, 0
        await ManagedCursor.open(ml, "slow", InitialPosition.EARLIEST)
        ml.detach_cursor("slow")  # stored only, as a new owner finds it
        fast = await ManagedCursor.open(ml, "fast", InitialPosition.EARLIEST)
        positions = [await ml.append(payload(i)) for i in range(12)]  # ledgers of 5, 5, 2
        fast.ack_cumulative(positions[-1])
        assert await ml.trim_by_retention() == [], "the stored subscription has consumed nothing"
        await store.delete_cursor(ML, "slow")
        assert await ml.trim_by_retention() == sorted({p.ledger_id for p in positions[:10]})
        await ml.close()

    run_ml(bookies, body)


def test_retention_goes_by_where_another_writer_moved_an_idle_subscription(bookies: Any) -> None:
    """An idle subscription (its cursor attached, no consumer) moved on by another writer (the Spark topic source
    commits so): the retention pass reads it again and lets go the ledgers it has now consumed, rather than
    holding them at the mark-delete it had before."""
    from dataclasses import replace

    from tests.integration.test_managed_ledger import ML, SMALL, payload
    from tests.integration.test_managed_ledger import run as run_ml
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig

    async def body(bk: Any, store: Any) -> None:
        ml = await ManagedLedger.open(bk, store, ML, ManagedLedgerConfig(max_entries_per_ledger=5, **SMALL))
        ml.retention_time_s, ml.retention_size_bytes = 0, 0
        idle = await ManagedCursor.open(ml, "s", InitialPosition.EARLIEST)
        positions = [await ml.append(payload(i)) for i in range(12)]  # ledgers of 5, 5, 2
        assert await ml.trim_by_retention() == []
        stored = await store.get_cursor(ML, "s")
        moved = replace(stored.value, mark_delete=tuple(positions[-1]))
        await store.save_cursor(ML, "s", moved, stored.version)  # the other writer
        assert await ml.trim_by_retention() == sorted({p.ledger_id for p in positions[:10]})
        assert idle.mark_delete == positions[-1]
        await ml.close()

    run_ml(bookies, body)


def test_backlog_eviction_leaves_the_compaction_horizon_where_it_is(cluster: Brokers) -> None:
    """consumer_backlog_eviction moves every subscription behind the quota up to it, but not the compactor's
    ``__compaction``: its mark-delete is the compaction horizon, and moved so, the entries it passed over were
    never compacted and left the compacted view once retention let their ledger go (as for a skip by hand)."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.compaction import COMPACTION_SUBSCRIPTION
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.managed_ledger import Position

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        name = TopicName.parse(f"persistent://public/default/evict-{uuid.uuid4().hex[:8]}")
        topic = run(service.get_topic(name))
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key="k")
        for _ in range(4):
            run(topic.ml.append(wire.make_entry(md, b"v" * 100)))
        for sub in (COMPACTION_SUBSCRIPTION, "s"):
            run(ManagedCursor.open(topic.ml, sub, InitialPosition.EARLIEST))
            topic.ml.detach_cursor(sub)  # stored only, as a new owner finds them
        first = topic.ml.first_position().previous()
        run(topic.evict_backlog(0))  # nothing may stay
        stored = {s: run(service.meta.get_cursor(name.ml_name, s)) for s in (COMPACTION_SUBSCRIPTION, "s")}
        assert Position(*stored["s"].value.mark_delete) == topic.ml.last_confirmed_position()
        assert Position(*stored[COMPACTION_SUBSCRIPTION].value.mark_delete) == first
        assert not topic.ml.fenced


def test_a_producer_name_in_use_and_a_topic_held_by_an_exclusive_producer_refuse_a_second_producer(
    cluster: Brokers,
) -> None:
    """Deduplication goes by producer name: a second producer under the name of one still connected is refused
    (ProducerBusy), as Pulsar does; and a topic held by an Exclusive producer refuses a Shared one."""
    from topic_broker.server import BrokerServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        server = BrokerServer(service)
        run(server.start())
        url = f"pulsar://127.0.0.1:{service.config.port}"
        first, second = (pulsar.Client(url, operation_timeout_seconds=30) for _ in range(2))
        try:
            named = f"persistent://public/default/named-{uuid.uuid4().hex[:8]}"
            first.create_producer(named, producer_name="only-one")
            with pytest.raises(pulsar.ProducerBusy):
                second.create_producer(named, producer_name="only-one")
            held = f"persistent://public/default/held-{uuid.uuid4().hex[:8]}"
            first.create_producer(held, access_mode=pulsar.ProducerAccessMode.Exclusive)
            with pytest.raises(pulsar.ProducerBusy):
                second.create_producer(held)
        finally:
            first.close()
            second.close()
            run(server.stop())
