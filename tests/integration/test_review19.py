"""Faults found in review of the broker's registration, unsubscribe and delete marks (real ZooKeeper, bookies and
brokers in the test's process)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any
from urllib.parse import quote

import pulsar
import pytest

import zk
from tests.broker_testing import Brokers, before_first_call, cluster, swapped  # noqa: F401
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_namespace_delete_races import _namespace_on_a_broker, _status
from tests.zk_testing import ZkTarget, failing_deletes
from topic_broker.names import TopicName
from zk import layout
from zk.managed_ledgers import BrokerInfo, BrokerMetadataStore, OwnershipInfo


def test_an_ownership_of_the_same_broker_id_is_taken_over_only_while_registered_here(
    zk_connect: ZkTarget, zk_store: zk.MetadataStore
) -> None:
    """A broker re-registering after a lost session (its id registered meanwhile by another live session, which
    it waits out before exiting) found a topic's ownership znode of that other broker, the same id in another
    session, took it for its own earlier session's and deleted it, taking the topic (fencing the other's ledger),
    then left it unowned once refused. That other session's znode is now only taken over while brokers/<id> is
    this session's."""
    ml = "public/default/persistent/same-id"
    mine = OwnershipInfo(broker_id="x:1", service_url="pulsar://a:1", web_service_url="http://a:2")
    theirs = OwnershipInfo(broker_id="x:1", service_url="pulsar://b:1", web_service_url="http://b:2")
    reg = BrokerInfo(service_url="pulsar://b:1", web_service_url="http://b:2")
    other = zk.MetadataStore.connect(zk_connect.connect_string, zk_connect.root)
    try:
        bms, their_bms = BrokerMetadataStore(zk_store), BrokerMetadataStore(other)

        async def body() -> None:
            await their_bms.register_broker("x:1", reg)
            assert await their_bms.acquire_ownership(ml, theirs) == theirs
            with pytest.raises(zk.MetadataExistsError, match="not taken over"):
                await bms.acquire_ownership(ml, mine)
            assert await bms.get_owner(ml) == theirs
            st = zk_store.stat(layout.topic_ownership_path(ml))
            assert st is not None and st.ephemeral_owner == other.session_id, "the other's znode is left"
            # registered here (that session an earlier one of this broker, gone from brokers/): taken over
            await asyncio.to_thread(other.delete, layout.broker_path("x:1"))
            await bms.register_broker("x:1", reg)
            assert await bms.acquire_ownership(ml, mine) == mine

        asyncio.run(body())
    finally:
        other.close()


def test_an_unsubscribe_failing_as_its_topic_is_let_go_tells_the_consumer_to_reconnect(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The ZooKeeper session is lost (the topic let go, its clients told to reconnect) while an UNSUBSCRIBE's cursor
    delete is under way, its subscription out of the topic's list, and the delete fails: the consumer is told to
    reconnect too, and receives what is sent next (before: it was never told, stayed attached to a topic nobody
    served, and its receive() got nothing)."""
    with _serving(cluster) as (service, run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            meta = service.meta
            name = TopicName.parse(f"persistent://public/default/unsublost-{uuid.uuid4().hex[:8]}")
            consumer = client.subscribe(str(name), "s")
            topic = service._served(str(name))

            async def lost_then_fails(ml_name: str, sub: str) -> None:
                service.topic_lost(topic, "ZooKeeper session lost (made by the test)")
                raise zk.MetadataConnectionError("connection lost (made by the test)")

            with swapped(meta, "delete_cursor", lost_then_fails), pytest.raises(pulsar.PulsarException):
                consumer.unsubscribe()
            producer = client.create_producer(str(name))
            producer.send(b"after")
            assert consumer.receive(timeout_millis=15_000).data() == b"after"
            consumer.unsubscribe()
        finally:
            client.close()


def test_a_namespace_delete_during_the_end_of_another_here_is_409_not_a_take_over(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A second delete of a namespace on the same broker, sent while the first removes its deleting/ znode: 409
    '… is being deleted'. The first let go of its mark (``_deletes_here``) before its znode was gone, so the
    second took the znode, still this session's, for a leftover, ran, and held nothing once the first's removal
    went through (a delete on another broker could then run beside it)."""
    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        url = f"/admin/v2/namespaces/public/{ns}"
        # a topic in it: each delete refused 409 non-empty, the namespace left for the second to find
        assert _status(port, "PUT", f"/admin/v2/persistent/public/{ns}/t")[0] == 204

        async def second() -> tuple[int, Any]:
            return await asyncio.to_thread(_status, port, "DELETE", url)

        with before_first_call(
            service.meta.store, "adelete", second, when=lambda path, *a, **k: path.startswith("deleting/")
        ) as outcome:
            status, body = _status(port, "DELETE", url)
        assert status == 409 and "is being deleted" not in body["reason"], (status, body)
        # (before: taken over, it ran and was refused for the topic, its own reason)
        assert outcome and outcome[0][0] == 409 and "is being deleted" in outcome[0][1]["reason"], outcome


def test_a_namespace_delete_ending_leaves_the_deleting_znode_of_another_session(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The delete's ZooKeeper session is lost midway (its ephemeral deleting/ znode gone with it) and another
    broker's delete of the namespace makes the znode anew: the first, ending, leaves that znode (it deleted it
    unconditionally, and a third delete could then run beside the other)."""
    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        path = f"deleting/{quote(f'namespace/public/{ns}', safe='')}"
        store = service.meta.store
        other = zk.MetadataStore.connect(cluster.bookies.zk, root=cluster.bookies.root)
        try:

            async def session_lost_and_another_delete() -> None:
                await asyncio.to_thread(store.delete, path)  # (as the session's expiry does)
                await asyncio.to_thread(other.create, path, {"broker": "another"}, ephemeral=True)

            policies = layout.namespace_policies_path("public", ns)
            with before_first_call(
                store, "adelete", session_lost_and_another_delete, when=lambda p, *a, **k: p == policies
            ) as outcome:
                status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
            assert outcome == [None] and status == 204, (outcome, status, body)
            assert other.get(path).value["broker"] == "another", "the other's znode is left"
        finally:
            other.close()


def test_a_namespace_delete_whose_znode_removal_fails_answers_its_own_result(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The delete is done (its 204 ready) and ZooKeeper fails the removal of its deleting/ znode: the client
    gets the 204, not the ZooKeeper error (a 5xx, then a retry's 404 'Namespace does not exist' for a delete
    that succeeded)."""
    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        with failing_deletes(service.meta.store, "deleting/") as failed:
            status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        assert failed and status == 204, (failed, status, body)
        assert _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")[0] == 404


def test_an_unsubscribe_failing_otherwise_lists_its_subscription_again(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The cursor delete fails with another error than ZooKeeper's or the managed ledger's (here a RuntimeError;
    the connection is closed as for any internal error): the cursor is attached again, and so is its
    subscription listed again, with its backlog (before: the managed ledger counted a cursor that the topic did
    not list, and the consumer reconnecting made the subscription anew over it)."""
    with _serving(cluster) as (service, _run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            meta = service.meta
            name = TopicName.parse(f"persistent://public/default/unsubbug-{uuid.uuid4().hex[:8]}")
            consumer = client.subscribe(str(name), "s")
            topic = service._served(str(name))
            sub = topic.subscriptions["s"]

            async def fails(ml_name: str, sub: str) -> None:
                raise RuntimeError("a bug (made by the test)")

            with swapped(meta, "delete_cursor", fails), contextlib.suppress(pulsar.PulsarException):
                consumer.unsubscribe()
            assert topic.subscriptions.get("s") is sub and topic.ml.cursors["s"] is sub.cursor
        finally:
            client.close()


def test_a_producer_of_a_topic_terminated_during_its_quota_check_is_refused(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The topic is terminated while a PRODUCER's backlog quota check waits (the message_age quota reads an
    entry from the bookies): the producer is refused TopicTerminated (before: created on the terminated topic,
    the terminated check having been made before that wait, and every send of it refused)."""
    with _serving(cluster) as (service, _run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            name = TopicName.parse(f"persistent://public/default/termquota-{uuid.uuid4().hex[:8]}")
            client.create_producer(str(name)).close()
            topic = service._served(str(name))

            async def terminate() -> Any:
                return await topic.terminate()

            with (
                before_first_call(
                    service, "quota_exceeded", terminate, when=lambda t, *, evict: t is topic and not evict
                ) as outcome,
                pytest.raises(pulsar.TopicTerminated),
            ):
                client.create_producer(str(name))
            assert outcome and not isinstance(outcome[0], Exception), outcome
        finally:
            client.close()


def test_an_unreadable_age_probe_keeps_the_age_quota_decision_not_the_size_quotas(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The size quota marked the topic over its quota and fits again; the message_age quota's entry cannot be
    read (its bookies away): the age quota was never found exceeded, so nothing is exceeded (before: the size
    quota's mark stood for the age quota, refusing producers with 'its message_age quota of 1 s is exceeded')."""
    from topic_broker.managed_ledger import ManagedLedgerError
    from zk.managed_ledgers import BacklogQuota

    with _serving(cluster) as (service, run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            name = TopicName.parse(f"persistent://public/default/ageprobe-{uuid.uuid4().hex[:8]}")
            client.create_producer(str(name)).send(b"m")
            topic = service._served(str(name))

            async def unreadable() -> int | None:
                raise ManagedLedgerError("entry unreadable: its bookies are away (made by the test)")

            topic.age_quota = BacklogQuota(limit_time=1, policy="producer_request_hold")
            topic.quota_exceeded = True  # (the size quota's mark, its backlog acknowledged since)
            topic.oldest_unacked_publish_ms = unreadable
            try:
                assert run(service.quota_exceeded(topic, evict=False)) is None
            finally:
                del topic.oldest_unacked_publish_ms
        finally:
            client.close()


def test_a_stop_lets_the_closes_under_way_end_before_the_client_closes(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A topic let go just before the stop (as a failed re-registration lets every topic go, its close spawned):
    the stop waits for that close before it closes the ledger client, so its ledger is closed and its cursors
    flushed (before: the client was closed under the close under way, which was cut short)."""
    from tests.broker_testing import in_process_broker

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        name = TopicName.parse(f"persistent://public/default/stopclose-{uuid.uuid4().hex[:8]}")
        topic = run(service.get_topic(name))
        gate = run(_event())
        seen: list[bool] = []
        real_unregister, real_bk_close = service.meta.unregister_broker, service.bk.close

        async def unregister(broker_id: str) -> None:
            await real_unregister(broker_id)
            gate.set()  # the close goes on from here; the stop, as it was, went straight to the client's close

        async def bk_close() -> None:
            task = service._closing.get(str(name))
            seen.append(task is None or (task.done() and task.exception() is None))
            await real_bk_close()

        async def wait_gate() -> None:
            await gate.wait()

        service.meta.unregister_broker = unregister
        service.bk.close = bk_close
        with before_first_call(topic.ml, "close", wait_gate):

            async def lose() -> None:
                service.topic_lost(topic, "broker registration lost (made by the test)")

            run(lose())
            assert str(name) in service._closing
            run(service.stop())
        assert seen == [True], "the topic's close had ended before the ledger client's"
        service.stop = _nothing  # (stopped already)


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _nothing() -> None:
    return None
