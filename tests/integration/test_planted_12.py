"""Tests for the bugs planted in the audit of 2026-11-30 against 0260c38 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the reader's seek grace, the lookups' ownership, the
per-connection opens, https redirects, unreadable topic policies, the subscription expiry, the bookie's wiped
journal, AutoRecovery's log limiter and the Spark stream's named restarts"): each fails with its bug planted and
passes without it. ZooKeeper and 3 bookies, a broker in this process (``in_process_broker``) or broker
processes."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from tests.integration.test_broker_admin11 import _https_broker
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_subscription_expiry import _idle_topic
from tests.integration.test_review16 import _NoRedirect
from tests.tls_testing import needs_openssl, self_signed
from topic_broker.names import TopicName
from topic_broker.server import BrokerServer
from zk.client import MetadataStore
from zk.errors import MetadataFormatError
from zk.managed_ledgers import BrokerMetadataStore, TopicPolicies, topic_policies_path

pulsar = pytest.importorskip("pulsar")
OWNED = "ownership/public/default/persistent"


def test_a_lookups_ownership_is_held_for_the_hold_from_the_last_lookup(cluster: Brokers) -> None:  # noqa: F811
    """The ownership a lookup took of a topic nobody opens is held ``lookup_ownership_hold_s`` (here 4 s, the
    housekeeping ticking every second) after the topic's LAST lookup, for the client that looked it up to come
    and open it, and only then let go: released at the first tick instead, or 4 s after the first lookup however
    recent the last, a client's open came to a broker that no longer owned the topic, and another broker's
    lookup could take it meanwhile."""
    name = f"held-{uuid.uuid4().hex}"
    topic = TopicName.parse(f"persistent://public/default/{name}")
    with (
        in_process_broker(cluster, tick_interval_s=1.0, lookup_ownership_hold_s=4.0) as (service, run),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):
        run(service.lookup_owner(topic))
        time.sleep(2.5)  # two ticks or more, within the hold
        assert name in store.children(OWNED)
        run(service.lookup_owner(topic))  # looked up again: held 4 s from now
        last = time.monotonic()
        time.sleep(3.0)  # 5.5 s after the first lookup
        assert name in store.children(OWNED)
        wait_for(lambda: name not in store.children(OWNED), "the ownership let go once the hold is over")
        assert time.monotonic() - last >= 4.0


def test_an_open_during_the_release_of_a_lookups_ownership_takes_it_anew(cluster: Brokers) -> None:  # noqa: F811
    """A topic opened while the ownership its lookup took is being released (the hold over) waits for the
    release, as for a close, and takes the ownership anew: the topic served here has its ownership znode. Run
    beside the release, the open found the znode still there and took it as its own, and the release then
    deleted it: a served topic without an owner in ZooKeeper, which another broker's lookup takes."""
    name = f"reopened-{uuid.uuid4().hex}"
    topic = TopicName.parse(f"persistent://public/default/{name}")
    with (
        in_process_broker(cluster, tick_interval_s=1.0, lookup_ownership_hold_s=0.5) as (service, run),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):

        async def on_loop() -> tuple[asyncio.Event, asyncio.AbstractEventLoop]:
            return asyncio.Event(), asyncio.get_running_loop()

        let_go, loop = run(on_loop())
        releasing = threading.Event()
        release = service.meta.release_ownership

        async def held_release(ml_name: str, broker_id: str) -> bool:
            if ml_name == topic.ml_name:
                releasing.set()
                await let_go.wait()
            return await release(ml_name, broker_id)

        service.meta.release_ownership = held_release
        run(service.lookup_owner(topic))
        assert releasing.wait(30), "the release never began"
        opening = asyncio.run_coroutine_threadsafe(service.get_topic(topic), loop)
        time.sleep(0.5)  # the open runs meanwhile, or waits for the release
        loop.call_soon_threadsafe(let_go.set)
        opening.result(30)
        time.sleep(0.5)
        assert str(topic) in service.topics
        assert name in store.children(OWNED), "the served topic's ownership znode is gone"


@needs_openssl
def test_an_https_request_for_an_owner_without_https_goes_to_its_http_url(
    cluster: Brokers,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A call over https on a topic served by a broker without https is redirected to that broker's http URL
    (Pulsar's validateTopicOwnership: the owner's httpUrlTls only where it has one). Redirected to its https URL,
    which it has not, the Location was the path alone: the client was sent back to the broker it asked, which
    redirected it again, until it gave up."""
    cert, key = self_signed(tmp_path, "broker")
    owner = cluster.start()  # plain http only
    _other, _other_tls, other_https = _https_broker(cluster, cert, key)
    topic = f"persistent://public/default/plain-{uuid.uuid4().hex[:6]}"
    c = pulsar.Client(owner.service_url)
    try:
        c.create_producer(topic).send(b"m")  # its lookup on `owner` makes it the owner, which serves it
    finally:
        c.close()
    https = urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(cert)))
    url = f"{other_https}/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/stats"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.build_opener(_NoRedirect, https).open(url, timeout=15)
    owners = url.replace(other_https, f"http://127.0.0.1:{owner.http_port}")
    assert (e.value.code, e.value.headers["Location"]) == (307, owners)


def test_a_policy_set_over_unreadable_policies_replaces_them_and_keeps_one_written_meanwhile(
    zk_store: MetadataStore,
) -> None:
    """A topic policy set over own policies that do not parse (a field of the wrong type) replaces them; and
    where another admin writes readable policies between the read that found them unreadable and the delete,
    the delete (of the version read only) fails and theirs are kept beside the new one. Before: the unreadable
    znode was deleted at another version than the one read (its field kept, the write failing on it, 500), or at
    any version (the other admin's policies deleted)."""
    meta = BrokerMetadataStore(zk_store)
    ml = f"public/default/persistent/unreadable-{uuid.uuid4().hex[:8]}"
    path = topic_policies_path(ml)
    unreadable = {"max_consumers": "five"}

    async def run() -> tuple[TopicPolicies | None, TopicPolicies | None]:
        await zk_store.acreate(path, unreadable)
        await meta.update_topic_policy(ml, "max_producers", 4)
        first = await meta.get_topic_policies(ml)
        stored = await zk_store.aget(path)
        await zk_store.aset(path, unreadable, stored.version)
        read = meta.get_topic_policies

        async def another_admin_writes_after_the_read(ml_name: str) -> TopicPolicies | None:
            try:
                return await read(ml_name)
            except MetadataFormatError:
                v = await zk_store.aget(path)
                await zk_store.aset(path, {"max_consumers": 7}, v.version)
                raise

        meta.get_topic_policies = another_admin_writes_after_the_read  # type: ignore[method-assign]
        await meta.update_topic_policy(ml, "max_producers", 3)
        return first, await read(ml)

    first, second = asyncio.run(run())
    assert first is not None and (first.max_producers, first.max_consumers) == (4, None)
    assert second is not None and (second.max_producers, second.max_consumers) == (3, 7)


def test_a_served_topic_keeps_its_policies_when_their_znode_stops_parsing(cluster: Brokers) -> None:  # noqa: F811
    """A topic served here whose own policies' znode stops parsing keeps the policies it had (said once in the
    log) at the housekeeping refresh, rather than falling back to its namespace's: the topic's maxProducers of 1
    stays in force after two ticks (before: the broker's default, none); mended, they are readable again (the
    next break is said again)."""
    name = TopicName.parse(f"persistent://public/default/kept-{uuid.uuid4().hex[:8]}")
    with (
        in_process_broker(cluster, tick_interval_s=1.0) as (service, run),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):
        run(service.meta.update_topic_policy(name.ml_name, "max_producers", 1))
        topic = run(service.get_topic(name))
        assert topic.max_producers == 1
        path = topic_policies_path(name.ml_name)
        store.set(path, {"max_producers": "one"}, store.get(path).version)
        time.sleep(2.5)  # two refreshes at least
        assert topic.own_policies_unreadable
        assert topic.max_producers == 1
        # mended: readable again, so that a later break is said again
        store.set(path, {"max_producers": 2}, store.get(path).version)
        wait_for(lambda: topic.max_producers == 2, "the mended policies applied")
        assert not topic.own_policies_unreadable


def test_the_subscription_expiry_runs_at_its_interval_not_at_each_tick(cluster: Brokers) -> None:  # noqa: F811
    """The monitor checks the subscription expiration every ``subscription_expiry_check_interval_s`` (here an
    hour), not every housekeeping tick (here a second): an idle subscription past its namespace's expiration is
    still there three ticks on. Checked at each tick, every served topic's cursors were listed and read each
    second, the load the interval was made to spare ZooKeeper."""
    with (
        in_process_broker(cluster, tick_interval_s=1.0, subscription_expiry_check_interval_s=3600.0) as (
            service,
            run,
        ),
        MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store,
    ):
        server = BrokerServer(service)
        run(server.start())
        try:
            _t, topic, client = _idle_topic(service, run, store)
            topic.subscriptions["s"].idle_since_ms -= 3_600_000  # its consumer left an hour ago
            time.sleep(3.5)
            assert list(run(topic.ml.store.list_cursors(topic.ml.name))) == ["s"]
            run(service.expire_inactive_subscriptions())  # (what the monitor runs: it is expired)
            assert list(run(topic.ml.store.list_cursors(topic.ml.name))) == []
            client.s.close()
        finally:
            run(server.stop())
