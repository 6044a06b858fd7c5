"""Tests for the bugs planted in the audit of 2026-11-29 against b698ba9 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the namespace operations, autoTopicCreation, https client
certificates, the broker's waits and lookups and the Spark stream's restarts"): each fails with its bug planted
and passes without it. One broker on 3 bookies (``test_broker_admin8``'s fixture, its housekeeping tick every
second, its own for this module) and the official ``pulsar-client``."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from bookie.auth import create_token
from ledgerstore.cluster import BrokerProcess, free_port
from tests.broker_testing import Brokers
from tests.conftest import BookieFactory
from tests.integration.test_broker_admin8 import _http_status, bp, brokers
from tests.integration.test_broker_admin11 import _backlogs, _call, _namespace, store
from tests.integration.test_broker_auth import SUPERUSER
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_client_features7 import _answers
from tests.integration.test_broker_pulsar_client import _connect, _raw, topic_name
from tests.integration.test_broker_tls2 import _secure_tls_broker
from tests.integration.test_cluster_cli import _ls
from tests.tls_testing import needs_openssl, self_signed, signed_by
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from zk.client import MetadataStore

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand
#: the eighth admin part's broker (one per module), the third part's client, the eleventh's metadata store
__all__ = ["bp", "brokers", "c", "store"]


def _last_active(store: MetadataStore, ns: str, t: str, sub: str, ms: int) -> None:
    """The subscription's cursor stored as last active at ``ms`` (0: a cursor stored without that time)."""
    cursor = f"managed-ledgers/public/{ns}/persistent/{t}/cursors/{sub}"
    stored = store.get(cursor)
    store.set(cursor, {**stored.value, "last_active_ms": ms}, stored.version)


def _topic_with_subscriptions(bp: BrokerProcess, *subs: str) -> tuple[str, str, str]:
    """A topic in a new namespace with the subscriptions ``subs``: the namespace, the topic, its admin path."""
    ns = _namespace(bp)
    t = topic_name()
    path = f"/admin/v2/persistent/public/{ns}/{t}"
    admin(bp, "PUT", path)
    for sub in subs:
        admin(bp, "PUT", f"{path}/subscription/{sub}")
    return ns, t, path


def _idle_for_an_hour(store: MetadataStore, ns: str, t: str, sub: str) -> None:
    """The subscription's cursor stored as last active an hour ago (a subscription its consumers left then)."""
    _last_active(store, ns, t, sub, int(time.time() * 1000) - 3_600_000)


def test_a_subscription_expiration_time_of_0_deletes_nothing(
    bp: BrokerProcess, c: Any, store: MetadataStore
) -> None:
    """``subscriptionExpirationTime`` 0 is never (Pulsar's): a subscription idle for an hour in a namespace set
    to 0 is kept, while in a namespace set to 30 minutes its like is deleted (the housekeeping has run) and a
    subscription whose cursor was stored without a last-active time is kept (counted as active from the first
    check that sees it, not as idle since 1970)."""
    never, soon = _namespace(bp), _namespace(bp)
    t = topic_name()
    for ns, minutes in ((never, 0), (soon, 30)):
        admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
        admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}/subscription/idle")
        if ns == soon:
            admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}/subscription/unstamped")
            _last_active(store, ns, t, "unstamped", 0)
        admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/stats")  # served here
        _idle_for_an_hour(store, ns, t, "idle")
        assert (
            _http_status(bp, "POST", f"/admin/v2/namespaces/public/{ns}/subscriptionExpirationTime", minutes)
            == 200
        )
    subs = "/admin/v2/persistent/public/{}/" + t + "/subscriptions"
    wait_for(
        lambda: "idle" not in admin(bp, "GET", subs.format(soon)), "the 30 minutes' idle subscription deleted"
    )
    time.sleep(2)  # two more housekeeping passes
    assert admin(bp, "GET", subs.format(never)) == ["idle"]
    assert admin(bp, "GET", subs.format(soon)) == ["unstamped"]


def test_a_subscription_its_consumer_just_left_outlives_an_old_last_active_time(
    bp: BrokerProcess, c: Any, store: MetadataStore
) -> None:
    """The expiration counts a subscription's inactivity from the last housekeeping pass that saw a consumer on
    it, not only from its cursor's stored time: a subscription whose consumer was connected at a pass and has
    just left, its stored time an hour old (a save that did not happen, another broker's), is kept, while an
    idle one beside it is deleted (another, deleted before the consumer left, shows that a pass saw it)."""
    ns, t, path = _topic_with_subscriptions(bp, "idle-1", "idle-2")
    consumer = c.subscribe(f"persistent://public/{ns}/{t}", "left")
    _idle_for_an_hour(store, ns, t, "idle-1")
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/subscriptionExpirationTime", 30)
    # a pass deleted idle-1: it saw the consumer on "left"
    wait_for(lambda: "idle-1" not in admin(bp, "GET", f"{path}/subscriptions"), "a pass with the consumer")
    consumer.close()
    wait_for(
        lambda: admin(bp, "GET", f"{path}/stats")["subscriptions"]["left"]["consumers"] == [], "the close"
    )
    time.sleep(1.5)  # any save the close made is done
    for sub in ("left", "idle-2"):
        _idle_for_an_hour(store, ns, t, sub)
    wait_for(
        lambda: "idle-2" not in admin(bp, "GET", f"{path}/subscriptions"), "the idle subscription deleted"
    )
    assert admin(bp, "GET", f"{path}/subscriptions") == ["left"]


def test_the_compactors_subscription_is_left_alone_by_clear_backlog_and_expiration(
    bp: BrokerProcess, c: Any, store: MetadataStore
) -> None:
    """A compacted topic's ``__compaction`` subscription is the compactor's: a namespace's ``clearBacklog``
    clears the other subscriptions and answers 204 (the compactor's skip would be refused, 405), and
    ``subscriptionExpirationTime`` deletes an idle subscription but not the compactor's, idle as long."""
    ns, t, path = _topic_with_subscriptions(bp, "app", "idle")
    producer = c.create_producer(f"persistent://public/{ns}/{t}", batching_enabled=False)
    for i in range(4):
        producer.send(f"m-{i}".encode(), partition_key=f"k{i % 2}")
    admin(bp, "PUT", f"{path}/compaction")
    wait_for(lambda: admin(bp, "GET", f"{path}/compaction")["status"] != "RUNNING", "the compaction")
    assert admin(bp, "GET", f"{path}/compaction")["status"] == "SUCCESS"
    producer.send(b"after", partition_key="k0")
    producer.close()
    assert "__compaction" in admin(bp, "GET", f"{path}/subscriptions")

    assert _http_status(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog") == 200  # 204
    assert _backlogs(bp, ns, [t])[t]["app"] == 0

    for sub in ("idle", "__compaction"):
        _idle_for_an_hour(store, ns, t, sub)
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/subscriptionExpirationTime", 30)
    wait_for(lambda: "idle" not in admin(bp, "GET", f"{path}/subscriptions"), "the idle subscription deleted")
    assert admin(bp, "GET", f"{path}/subscriptions") == ["__compaction", "app"]


def test_auto_topic_creation_off_refuses_a_partition_past_the_count_and_a_partitioned_type(
    bp: BrokerProcess, c: Any
) -> None:
    """``autoTopicCreation`` off (``allowAutoTopicCreation`` false, with a ``topicType`` of partitioned and a
    count given, which Pulsar takes as off too): a partition of a partitioned topic within its count is served,
    the partition past it (index = count) is refused TopicNotFound as a topic that does not exist, and a new
    name is refused, not created partitioned."""
    ns = _namespace(bp)
    off = {"allowAutoTopicCreation": False, "topicType": "partitioned", "defaultNumPartitions": 2}
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/autoTopicCreation", off)
    pt = topic_name()
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{pt}/partitions", 2)
    c.create_producer(f"persistent://public/{ns}/{pt}-partition-1").close()
    with pytest.raises(pulsar.TopicNotFound):
        c.create_producer(f"persistent://public/{ns}/{pt}-partition-2")
    new = topic_name()
    with pytest.raises(pulsar.TopicNotFound):
        c.create_producer(f"persistent://public/{ns}/{new}")
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{new}/partitions") == {"partitions": 0}


@needs_openssl
def test_a_token_sent_over_https_is_the_role_checked_whatever_the_client_certificate(
    cluster: Brokers, tmp_path: Path
) -> None:
    """On the admin's https port a request with both a client certificate and a token is the token's role (as
    the binary port's CONNECT takes its auth data): alice's certificate with the superuser's token may change a
    tenant, the superuser's certificate with alice's token may not (403)."""
    ca = self_signed(tmp_path, "ca")
    alice = signed_by(ca, tmp_path, "alice", "alice")
    root = signed_by(ca, tmp_path, "root", SUPERUSER)
    https_port = free_port()
    secure, _, broker_cert = _secure_tls_broker(cluster, tmp_path, "--admin-tls-port", str(https_port))
    alice_token = create_token(secure.secret, "alice", expires_in_s=600)
    tenants = f"https://127.0.0.1:{https_port}/admin/v2/tenants"
    status, _ = _call("PUT", f"{tenants}/by-token", broker_cert, cert=alice, token=secure.tokens[SUPERUSER])
    assert status == 204
    assert _call("PUT", f"{tenants}/not-by-cert", broker_cert, cert=root, token=alice_token) == (
        403,
        {"reason": "alice is not a superuser"},
    )


def test_a_topic_auto_created_partitioned_by_a_metadata_request_has_every_partition(
    bp: BrokerProcess,
) -> None:
    """``autoTopicCreation`` partitioned (3): the metadata request of a client (here over http, as pulsar-client
    through an http:// service URL) creates the partitioned topic and each partition's managed ledger, as the
    admin's create does: the namespace lists the three partitions before any producer connects. The same GET
    without ``checkAllowAutoCreation`` (``pulsar-admin topics get-partitioned-topic-metadata``) is a read: 0,
    nothing created."""
    ns = _namespace(bp)
    auto = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3}
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/autoTopicCreation", auto)
    t = topic_name()
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/partitions") == {"partitions": 0}
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}") == []
    asked = f"/admin/v2/persistent/public/{ns}/{t}/partitions?checkAllowAutoCreation=true"
    assert admin(bp, "GET", asked) == {"partitions": 3}
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}") == [
        f"persistent://public/{ns}/{t}-partition-{i}" for i in range(3)
    ]


def test_decommission_of_a_running_bookie_asks_to_stop_it(bookies: BookieFactory) -> None:
    """``bookie decommission`` of a bookie that is registered (running) ends with the advice to stop it now
    (its cookie is deleted under it), not with 'it was not running'."""
    live, _other = bookies.start_many(2)
    r = _ls(
        "bookie", "decommission", live.id, "--settle-s", "0", "--zk", bookies.zk, "--zk-root", bookies.root
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cookie deleted (stop the bookie now)" in r.stdout, r.stdout


def test_an_unsubscribe_sent_behind_its_subscribe_waits_for_it(bp: BrokerProcess) -> None:
    """An UNSUBSCRIBE that follows its consumer's SUBSCRIBE on the connection before the SUBSCRIBE is answered
    (as GET_LAST_MESSAGE_ID and SEEK may) is answered once the consumer is there: SUCCESS, the subscription
    gone, not ConsumerNotFound."""
    t = topic_name()
    s = _raw(bp)
    _connect(s)
    sub = pb.CommandSubscribe(topic=f"persistent://public/default/{t}", subType=pb.CommandSubscribe.Exclusive)
    sub.subscription, sub.consumer_id, sub.request_id = "s", 1, 1
    unsub = pb.CommandUnsubscribe(consumer_id=1, request_id=2)
    s.settimeout(30)
    with contextlib.closing(s):
        s.sendall(  # in one write: the topic is not open yet when the UNSUBSCRIBE is read
            wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub))
            + wire.encode_command(T(type=T.UNSUBSCRIBE, unsubscribe=unsub))
        )
        assert _answers(s, 2) == {1: "SUCCESS", 2: "SUCCESS"}
    assert admin(bp, "GET", f"/admin/v2/persistent/public/default/{t}/subscriptions") == []


def test_a_topic_takes_producers_again_once_its_exclusive_producer_closed(bp: BrokerProcess, c: Any) -> None:
    """An exclusive producer holds the topic while it is open: another producer is refused ProducerBusy, and
    once it closed a shared producer and another exclusive one are taken."""
    topic = f"persistent://public/default/{topic_name()}"
    exclusive = c.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        c.create_producer(topic)
    exclusive.close()
    c.create_producer(topic).close()
    c.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive).close()
