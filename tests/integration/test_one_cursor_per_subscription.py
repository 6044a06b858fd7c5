"""One cursor object per subscription on a topic: a consumer subscribing to a subscription an admin call opened
gets that call's cursor, on an in-process broker (real ZooKeeper and bookies, the admin REST over HTTP, the
official ``pulsar-client``)."""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import zk
from tests.broker_testing import Brokers, in_process_broker, swapped

pulsar = pytest.importorskip("pulsar")


@contextlib.contextmanager
def _idle_subscription(cluster: Brokers) -> Iterator[tuple[Any, Callable[[Any], Any], Any, list[Any], str]]:
    """An in-process broker serving its Pulsar port and the admin REST, a topic of 6 entries (m0..m5) and its
    subscription "s" at the earliest, stored only (as a new owner finds it): yields the service, ``run``, the
    topic, the entries' positions and the topic's admin URL."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.admin import AdminServer
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.names import TopicName
    from topic_broker.server import BrokerServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        http, server = AdminServer(service), BrokerServer(service)
        run(http.start())
        run(server.start())
        try:
            local = f"one-cursor-{uuid.uuid4().hex[:8]}"
            topic = run(service.get_topic(TopicName.parse(f"persistent://public/default/{local}")))
            md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
            positions = [run(topic.ml.append(wire.make_entry(md, b"m%d" % i))) for i in range(6)]
            run(ManagedCursor.open(topic.ml, "s", InitialPosition.EARLIEST))
            topic.ml.detach_cursor("s")
            yield (
                service,
                run,
                topic,
                positions,
                f"http://127.0.0.1:{service.config.http_port}/admin/v2/persistent/public/default/{local}",
            )
        finally:
            run(server.stop())
            run(http.stop())


def _admin(url: str, method: str) -> int:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _consume_to_the_end(service: Any, topic: Any) -> list[bytes]:
    """A pulsar-client consumer of "s" receives and acknowledges up to m5; what it received."""
    client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(str(topic.name), "s", consumer_type=pulsar.ConsumerType.Shared)
        got: list[bytes] = []
        while not got or got[-1] != b"m5":
            msg = consumer.receive(10_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
        consumer.close()
        return got
    finally:
        client.close()


def test_a_consumer_takes_the_cursor_an_admin_call_opened(cluster: Brokers) -> None:
    """An admin skip opened the idle subscription's cursor; its next skip's save failed (ZooKeeper away), the
    skip kept to be saved later. A consumer subscribing then opened a second cursor object of the subscription
    (its take-over write moving the version on) and the first one's delayed save, at the version it held,
    conflicted: the topic was fenced, its consumer closed and its acks not saved."""
    with _idle_subscription(cluster) as (service, run, topic, positions, url):
        assert _admin(f"{url}/subscription/s/skip/1", "POST") == 204
        opened = topic.ml.cursors["s"]
        opened._flush_interval_s = 3.0  # type: ignore[attr-defined]  # its delayed save after the subscribe

        async def zk_away(*args: Any, **kwargs: Any) -> Any:
            raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

        with swapped(topic.ml.store, "save_cursor", zk_away):
            assert _admin(f"{url}/subscription/s/skip/1", "POST") == 503
        assert opened.mark_delete == positions[1]  # kept, to be saved later
        got = _consume_to_the_end(service, topic)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the failed skip's delayed save, and the acks' saves
            stored = run(topic.ml.store.get_cursor(topic.ml.name, "s"))
            saved = opened._flush_task is None and not opened._dirty  # type: ignore[attr-defined]
            if topic.ml.fenced or (saved and tuple(stored.value.mark_delete) == tuple(positions[5])):
                break
            time.sleep(0.2)
        assert not topic.ml.fenced
        assert tuple(stored.value.mark_delete) == tuple(positions[5])  # no ack lost
        assert topic.ml.cursors["s"] is opened  # one cursor object for the subscription
        assert got == [b"m2", b"m3", b"m4", b"m5"]  # from the skipped-to position the cursor holds


def test_a_consumer_of_an_admin_opened_cursor_starts_where_another_writer_moved_it(cluster: Brokers) -> None:
    """The cursor an admin call opened, taken by a consumer subscribing later, adopts a move another writer
    stored meanwhile (the Spark source's commit), as a cursor opened anew would read it."""
    from dataclasses import replace

    with _idle_subscription(cluster) as (service, run, topic, positions, url):
        assert _admin(f"{url}/subscription/s/position/1", "GET") == 200  # a peek opens the cursor
        opened = topic.ml.cursors["s"]
        meta = service.meta
        stored = run(meta.get_cursor(topic.ml.name, "s"))
        run(
            meta.save_cursor(
                topic.ml.name, "s", replace(stored.value, mark_delete=tuple(positions[2])), stored.version
            )
        )
        assert _consume_to_the_end(service, topic) == [b"m3", b"m4", b"m5"]
        assert topic.ml.cursors["s"] is opened
        run(opened.flush())  # type: ignore[attr-defined]
        assert not topic.ml.fenced
        assert tuple(run(meta.get_cursor(topic.ml.name, "s")).value.mark_delete) == tuple(positions[5])


def _on_a_managed_ledger(bookies: Any, body: Callable[[Any, Any, str, list[Any]], Awaitable[None]]) -> None:
    """``body(store, ml, name, positions)`` run on a managed ledger of 3 entries (real ZooKeeper and bookies)."""
    import asyncio

    from ledger_client import BookKeeper, ClientConfig
    from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig
    from zk.managed_ledgers import BrokerMetadataStore

    bookies.start_many(2)
    name = f"public/default/persistent/one-cursor-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store = BrokerMetadataStore(bk.store)
            config = ManagedLedgerConfig(ensemble_size=2, write_quorum=2, ack_quorum=2)
            ml = await ManagedLedger.open(bk, store, name, config)
            await body(store, ml, name, [await ml.append(b"m%d" % i) for i in range(3)])
            await ml.close()
        finally:
            await bk.close()

    asyncio.run(run())


def test_two_opens_at_once_make_one_cursor(bookies: Any) -> None:
    """Two opens of one stored cursor at once (a consumer's and the compactor's or an admin call's, which no
    lock orders) made two objects, each with a take-over write: the first one's next save conflicted and fenced
    the managed ledger. Now the second waits for the first and takes its cursor."""
    import asyncio

    from topic_broker.cursor import InitialPosition, ManagedCursor

    async def body(store: Any, ml: Any, name: str, positions: list[Any]) -> None:
        await ManagedCursor.open(ml, "s", InitialPosition.EARLIEST)
        ml.detach_cursor("s")  # stored only, as a new owner finds it
        before = (await store.get_cursor(name, "s")).version
        first, second = await asyncio.gather(ManagedCursor.open(ml, "s"), ManagedCursor.open(ml, "s"))
        first.ack_cumulative(positions[0])
        await first.flush()  # (two objects: ManagedLedgerFencedError, written by another owner)
        second.ack_cumulative(positions[1])
        await second.flush()
        assert not ml.fenced
        assert tuple((await store.get_cursor(name, "s")).value.mark_delete) == tuple(positions[1])
        assert first is second is ml.cursors["s"]
        assert (await store.get_cursor(name, "s")).version == before + 3  # one take-over write, two saves

    _on_a_managed_ledger(bookies, body)


def test_an_open_after_a_delete_whose_reply_was_lost_makes_a_fresh_cursor(bookies: Any) -> None:
    """An unsubscribe whose znode delete was applied with its reply lost (ZooKeeper away) left its cursor
    attached, and the next open (a consumer subscribing again, an admin create) answered that ghost: its saves
    all failed (no znode), the consumer's acks kept only in memory. Now the open detaches it and creates the
    subscription anew, its saves stored."""
    from topic_broker.cursor import InitialPosition, ManagedCursor

    async def body(store: Any, ml: Any, name: str, positions: list[Any]) -> None:
        ghost = await ManagedCursor.open(ml, "s", InitialPosition.EARLIEST)
        ghost.ack_cumulative(positions[0])
        await ghost.flush()
        delete = store.delete_cursor

        async def applied_reply_lost(*args: Any) -> None:
            await delete(*args)
            raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

        with (
            swapped(store, "delete_cursor", applied_reply_lost),
            pytest.raises(zk.MetadataConnectionError),
        ):
            await ghost.delete()
        assert await store.get_cursor(name, "s") is None
        fresh = await ManagedCursor.open(ml, "s", InitialPosition.EARLIEST)
        assert fresh is not ghost and ml.cursors["s"] is fresh
        assert fresh.mark_delete == ml.first_position().previous()  # created anew at its initial position
        fresh.ack_cumulative(positions[1])
        await fresh.flush()  # (the ghost's: MetadataNotFoundError, for ever)
        assert not ml.fenced
        assert tuple((await store.get_cursor(name, "s")).value.mark_delete) == tuple(positions[1])

    _on_a_managed_ledger(bookies, body)


def test_deleting_an_idle_subscription_closes_the_cursor_an_admin_call_opened(cluster: Brokers) -> None:
    """An admin skip on an idle subscription whose save failed (ZooKeeper away) kept the skip for its cursor's
    delayed flush; the subscription's DELETE detached that cursor without closing it, and its delayed flush then
    saved it at the version it held, over the subscription created again meanwhile: the topic was fenced."""
    with _idle_subscription(cluster) as (service, run, topic, positions, url):
        assert _admin(f"{url}/subscription/s/skip/1", "POST") == 204
        opened = topic.ml.cursors["s"]
        opened._flush_interval_s = 3.0  # type: ignore[attr-defined]  # its delayed save after the re-create

        async def zk_away(*args: Any, **kwargs: Any) -> Any:
            raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

        with swapped(topic.ml.store, "save_cursor", zk_away):
            assert _admin(f"{url}/subscription/s/skip/1", "POST") == 503
        assert _admin(f"{url}/subscription/s", "DELETE") == 204
        assert _admin(f"{url}/subscription/s", "PUT") == 204  # created anew
        deadline = time.monotonic() + 10
        while opened._flush_task is not None and not topic.ml.fenced and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.2)
        assert not topic.ml.fenced
        assert topic.ml.cursors["s"] is not opened
        assert (
            run(topic.ml.store.get_cursor(topic.ml.name, "s")).version == 0
        )  # the new one's, not written over


def _unsubscribe_with_its_reply_lost(consumer: Any, topic: Any) -> None:
    """``consumer.unsubscribe()`` whose cursor delete ZooKeeper applies with its reply lost: answered an error."""
    store = topic.ml.store
    delete = store.delete_cursor

    async def applied_reply_lost(*args: Any) -> None:
        await delete(*args)
        raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

    with swapped(store, "delete_cursor", applied_reply_lost), pytest.raises(Exception):  # noqa: B017
        consumer.unsubscribe()


@pytest.mark.parametrize("then", ["retried", "given-up"])
def test_an_unsubscribe_whose_reply_was_lost_then_an_ack_is_retried_or_subscribed_again_anew(
    cluster: Brokers, then: str
) -> None:
    """An UNSUBSCRIBE whose cursor delete ZooKeeper applied with its reply lost is answered an error, its consumer
    kept and its cursor attached, for the client's retry; an ack the consumer sent then made that cursor dirty,
    and c20bda1's ghost rule took only a clean one for a ghost. The retried UNSUBSCRIBE failed at the cursor's
    save (no znode) each time; a consumer subscribing after the client gave up took the idle subscription as it
    was, every save of its cursor failing ('not saved yet' for ever, its acks lost at the next unload). Now the
    retry deletes it, and the subscription is made anew for the next consumer, at its initial position."""
    with _idle_subscription(cluster) as (service, run, topic, positions, url):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=10)
        try:
            consumer = client.subscribe(str(topic.name), "s", consumer_type=pulsar.ConsumerType.Shared)
            store = topic.ml.store
            _unsubscribe_with_its_reply_lost(consumer, topic)
            assert run(store.get_cursor(topic.ml.name, "s")) is None  # the delete was applied
            consumer.acknowledge(consumer.receive(10_000))  # m0, on the cursor attached again
            deadline = time.monotonic() + 10
            while topic.ml.cursors["s"].mark_delete != positions[0] and time.monotonic() < deadline:
                time.sleep(0.1)
            if then == "retried":
                consumer.unsubscribe()  # (before: MetadataError, its flush finding no znode, each time)
                assert "s" not in topic.subscriptions and "s" not in topic.ml.cursors
                assert run(store.get_cursor(topic.ml.name, "s")) is None
                return
            consumer.close()
            again = client.subscribe(
                str(topic.name),
                "s",
                consumer_type=pulsar.ConsumerType.Shared,
                initial_position=pulsar.InitialPosition.Earliest,
            )
            assert run(store.get_cursor(topic.ml.name, "s")) is not None  # the subscription is stored again
            got = again.receive(10_000)
            assert got.data() == b"m0"  # anew, at its initial position
            again.acknowledge(got)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stored = run(store.get_cursor(topic.ml.name, "s"))
                if tuple(stored.value.mark_delete) == tuple(positions[0]):
                    break
                time.sleep(0.2)
            assert tuple(stored.value.mark_delete) == tuple(positions[0])  # its acks stored
            assert topic.subscriptions["s"].cursor is topic.ml.cursors["s"]
            assert not topic.ml.fenced
        finally:
            client.close()


@pytest.mark.parametrize("call", ["skip/1", "resetcursor/0", "skip_all"])
def test_an_admin_call_on_an_idle_subscription_whose_znode_is_gone_drops_it_from_the_topics_list(
    cluster: Brokers, call: str
) -> None:
    """An UNSUBSCRIBE whose cursor delete ZooKeeper applied with its reply lost keeps the subscription listed for
    the client's retry; once its consumer left without retrying, an admin call on it answers 404 (its znode is
    gone), and the subscription leaves the topic's list then: GET subscriptions and the stats no longer show it
    (before, both listed it until a consumer subscribed again). Reset-cursor and skip_all too: they sought the
    listed subscription, resetting its ghost cursor, and kept it listed."""
    import json

    with _idle_subscription(cluster) as (service, run, topic, _positions, url):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=10)
        try:
            consumer = client.subscribe(str(topic.name), "s", consumer_type=pulsar.ConsumerType.Shared)
            _unsubscribe_with_its_reply_lost(consumer, topic)
            consumer.close()  # the client gave up: an idle subscription whose znode is gone
            assert "s" in topic.subscriptions
            assert _admin(f"{url}/subscription/s/{call}", "POST") == 404
            assert "s" not in topic.subscriptions and "s" not in topic.ml.cursors
            with urllib.request.urlopen(f"{url}/subscriptions", timeout=60) as r:
                assert json.loads(r.read()) == []
            with urllib.request.urlopen(f"{url}/stats", timeout=60) as r:
                assert json.loads(r.read())["subscriptions"] == {}
            assert not topic.ml.fenced
        finally:
            client.close()


def test_a_backlog_eviction_passes_over_an_idle_subscription_whose_znode_is_gone(cluster: Brokers) -> None:
    """The backlog quota's consumer_backlog_eviction on a topic holding such a subscription (the lost-reply
    UNSUBSCRIBE, its consumer gone) and another idle one, "t": the first leaves the topic's list, as an admin call
    on it does, and "t" is evicted. Before, the eviction sought the listed one, whose reset's save found no znode:
    MetadataNotFoundError ended the eviction there, "t" kept its backlog and the ghost stayed listed."""
    from topic_broker.cursor import InitialPosition, ManagedCursor

    with _idle_subscription(cluster) as (service, run, topic, positions, _url):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=10)
        try:
            consumer = client.subscribe(str(topic.name), "s", consumer_type=pulsar.ConsumerType.Shared)
            _unsubscribe_with_its_reply_lost(consumer, topic)
            consumer.close()
            run(ManagedCursor.open(topic.ml, "t", InitialPosition.EARLIEST))
            topic.ml.detach_cursor("t")
            run(topic.evict_backlog(0))
            assert "s" not in topic.subscriptions and "s" not in topic.ml.cursors
            stored = run(topic.ml.store.get_cursor(topic.ml.name, "t"))
            assert tuple(stored.value.mark_delete) == tuple(positions[-1])
            assert not topic.ml.fenced
        finally:
            client.close()
