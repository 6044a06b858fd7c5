"""The admin REST API as a Pulsar operator meets it, eleventh part: https on ``--admin-tls-port`` as a TLS
deployment uses it (the owner's https URL in the HTTP lookup and the cluster's data, ``pulsar-client`` over an
``https://`` service URL, client certificates on the https port) and the namespace-wide operations of
``pulsar-admin namespaces``, each checked with the official ``pulsar-client`` and plain HTTP.

The TLS tests start their own brokers (3 bookies each); the namespace tests share the eighth part's broker (its
housekeeping tick every second). Every wait is bounded."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess, free_port
from tests.broker_testing import Brokers, produce_consume
from tests.integration.test_broker_admin8 import _http_status, bp, brokers
from tests.integration.test_broker_auth import SUPERUSER
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_pulsar_client import topic_name
from tests.integration.test_broker_tls import _client, _tls_broker, _topic
from tests.integration.test_broker_tls2 import _secure_tls_broker
from tests.tls_testing import needs_openssl, self_signed, signed_by
from zk.client import MetadataStore

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "brokers", "c"]  # the eighth part's broker (one per module) and the third part's client


def _https_broker(cluster: Brokers, cert: Path, key: Path, *extra: str) -> tuple[BrokerProcess, str, str]:
    """A broker with a TLS port and https on its admin port (``cert``): it, its pulsar+ssl:// and https:// URLs."""
    admin_tls_port = free_port()
    bp, tls_url = _tls_broker(cluster, cert, key, "--admin-tls-port", str(admin_tls_port), *extra)
    return bp, tls_url, f"https://127.0.0.1:{admin_tls_port}"


def _call(
    method: str, url: str, ca: Path, cert: tuple[Path, Path] | None = None, token: str | None = None
) -> tuple[int, Any]:
    """``method url`` over https trusting ``ca``, with a client certificate and key, a token: status and body."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    req = urllib.request.Request(url, method=method, data=b"{}" if method in ("PUT", "POST") else None)
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=15, context=ctx) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    return status, json.loads(body) if body else None


def _get(url: str, ca: Path) -> Any:
    status, data = _call("GET", url, ca)
    assert status == 200, (status, data)
    return data


@needs_openssl
def test_the_http_lookup_answers_the_owners_https_url_and_an_https_client_works_on_either_broker(
    cluster: Brokers, tmp_path: Path
) -> None:
    """``httpUrlTls`` of ``/lookup/v2/topic/...`` is the owner's https URL (before: always ""), asked of the owner
    or of another broker; the cluster's ``serviceUrlTls`` too on a broker without https; and pulsar-client over
    an ``https://`` service URL (lookup over https, then the owner's pulsar+ssl:// port) works through either."""
    cert, key = self_signed(tmp_path, "broker")
    owner, owner_tls, owner_https = _https_broker(cluster, cert, key)
    other, other_tls, other_https = _https_broker(cluster, cert, key)
    topic = _topic()
    local = topic.rsplit("/", 1)[-1]
    first = _client(owner_https, cert)  # the first lookup, on `owner`, makes it the owner
    try:
        assert produce_consume(first, topic, 2) == [b"m-0", b"m-1"]
        for base in (owner_https, other_https):
            looked_up = _get(f"{base}/lookup/v2/topic/persistent/public/default/{local}", cert)
            assert (looked_up["brokerUrlTls"], looked_up["httpUrlTls"]) == (owner_tls, owner_https)
            assert looked_up["httpUrl"] == f"http://127.0.0.1:{owner.http_port}"
    finally:
        first.close()
    second = _client(other_https, cert)  # knows only the other broker, over https
    try:
        assert produce_consume(second, topic, 3) == [b"m-0", b"m-1", b"m-2"]
    finally:
        second.close()
    plain = cluster.start()  # no https of its own: the cluster's is another broker's
    with urllib.request.urlopen(
        f"http://127.0.0.1:{plain.http_port}/admin/v2/clusters/ledgerstore", timeout=15
    ) as r:
        data = json.loads(r.read())
    assert data["serviceUrlTls"] in (owner_https, other_https)
    assert data["brokerServiceUrlTls"] in (owner_tls, other_tls)
    assert data["serviceUrl"] == f"http://127.0.0.1:{plain.http_port}"


@needs_openssl
def test_a_client_certificate_on_the_https_port_authenticates_by_its_cn(
    cluster: Brokers, tmp_path: Path
) -> None:
    """With ``--tls-trust-certs``, the admin's https port takes a verified client certificate's CN as the role
    (before: only tokens, 401 without one): a superuser's CN may change anything, alice's is refused a change
    (403) and her lookup until she is granted, and pulsar-client over ``https://`` with ``AuthenticationTLS``
    then works; a token still works there, and no certificate nor token is 401."""
    ca = self_signed(tmp_path, "ca")
    alice = signed_by(ca, tmp_path, "alice", "alice")
    root = signed_by(ca, tmp_path, "root", SUPERUSER)
    https_port = free_port()
    secure, _, broker_cert = _secure_tls_broker(cluster, tmp_path, "--admin-tls-port", str(https_port))
    base = f"https://127.0.0.1:{https_port}"
    tenants = f"{base}/admin/v2/tenants"
    assert _call("PUT", f"{tenants}/by-cert", broker_cert, cert=root)[0] == 204
    assert _call("PUT", f"{tenants}/by-alice", broker_cert, cert=alice) == (
        403,
        {"reason": "alice is not a superuser"},
    )
    status, body = _call("PUT", f"{tenants}/by-nobody", broker_cert)
    assert status == 401 and "client certificate" in body["reason"]
    assert _call("PUT", f"{tenants}/by-token", broker_cert, token=secure.tokens[SUPERUSER])[0] == 204
    assert sorted(_get(tenants, broker_cert)) == ["by-cert", "by-token", "public"]

    topic = _topic()
    lookup = f"{base}/lookup/v2/topic/persistent/public/default/{topic.rsplit('/', 1)[-1]}"
    assert _call("GET", lookup, broker_cert, cert=alice)[0] == 403  # authenticated, not granted
    secure.grant("alice", ["produce", "consume"])
    assert _call("GET", lookup, broker_cert, cert=alice)[0] == 200
    auth = pulsar.AuthenticationTLS(str(alice[0]), str(alice[1]))
    c = _client(base, broker_cert, authentication=auth)
    try:  # the lookup over https and the owner's TLS port, both by alice's certificate
        assert produce_consume(c, topic, 2) == [b"m-0", b"m-1"]
    finally:
        c.close()
    # a call the broker sends on to each topic (here to itself) carries a token of the certificate's role
    clear = f"{base}/admin/v2/namespaces/public/default/clearBacklog"
    assert _call("POST", clear, broker_cert, cert=root)[0] == 204


# -- namespace-wide operations (the eighth part's broker) ------------------------------------------------------


def _namespace(bp: BrokerProcess) -> str:
    ns = f"ns-{topic_name()}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    return ns


def _backlogs(bp: BrokerProcess, ns: str, topics: list[str]) -> dict[str, dict[str, int]]:
    """Each topic's (partition's) subscriptions and their ``msgBacklog``."""
    out = {}
    for t in topics:
        stats = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{t}/stats")
        out[t] = {sub: s["msgBacklog"] for sub, s in stats["subscriptions"].items()}
    return out


def _topics_with_backlog(bp: BrokerProcess, c: Any, ns: str, subs: tuple[str, ...]) -> list[str]:
    """A topic and a partitioned topic of 2 partitions in ``ns``, each with the subscriptions ``subs`` and 4
    messages published: the topic and the two partitions."""
    t, pt = topic_name(), topic_name()
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{pt}/partitions", 2)
    for name in (t, pt):
        for sub in subs:
            admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{name}/subscription/{sub}")
        producer = c.create_producer(f"persistent://public/{ns}/{name}", batching_enabled=False)
        for i in range(4):
            producer.send(f"m-{i}".encode(), partition_key=str(i))
        producer.close()
    return [t, f"{pt}-partition-0", f"{pt}-partition-1"]


def test_namespace_clear_backlog_of_one_subscription_then_of_all(bp: BrokerProcess, c: Any) -> None:
    """``pulsar-admin namespaces clear-backlog [-s SUB]`` (before: 404, no such routes): ``POST
    …/clearBacklog/{sub}`` skips that subscription's backlog on every topic and partition of the namespace,
    the others' untouched; ``POST …/clearBacklog`` every subscription's; a consumer then gets only what comes
    after. 404 for a namespace that does not exist."""
    ns = _namespace(bp)
    topics = _topics_with_backlog(bp, c, ns, ("a", "b"))
    before = _backlogs(bp, ns, topics)
    assert sum(b["a"] for b in before.values()) == 8 and sum(b["b"] for b in before.values()) == 8
    assert _http_status(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/a") == 200  # 204
    after = _backlogs(bp, ns, topics)
    assert {t: b["a"] for t, b in after.items()} == dict.fromkeys(topics, 0)
    assert {t: b["b"] for t, b in after.items()} == {t: b["b"] for t, b in before.items()}

    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog")
    assert _backlogs(bp, ns, topics) == {t: {"a": 0, "b": 0} for t in topics}
    consumer = c.subscribe(f"persistent://public/{ns}/{topics[0]}", "b")
    producer = c.create_producer(f"persistent://public/{ns}/{topics[0]}")
    producer.send(b"after")
    assert consumer.receive(timeout_millis=15_000).data() == b"after"  # not one of the skipped
    consumer.close()
    producer.close()
    assert _http_status(bp, "POST", f"/admin/v2/namespaces/public/no-such-{ns}/clearBacklog") == 404


def test_namespace_unsubscribe_deletes_the_subscription_everywhere_unless_consumers_are_connected(
    bp: BrokerProcess, c: Any
) -> None:
    """``pulsar-admin namespaces unsubscribe -s SUB`` (before: 404): ``POST …/unsubscribe/{sub}`` deletes the
    subscription from every topic and partition of the namespace that has it, the others kept; with a
    consumer connected on one topic, 412 "Subscription has active connected consumers", as Pulsar answers."""
    ns = _namespace(bp)
    topics = _topics_with_backlog(bp, c, ns, ("gone", "kept"))
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/unsubscribe/gone")
    assert {t: sorted(b) for t, b in _backlogs(bp, ns, topics).items()} == dict.fromkeys(topics, ["kept"])
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/unsubscribe/nobody-has-it")  # 204: nothing to do

    consumer = c.subscribe(f"persistent://public/{ns}/{topics[0]}", "kept")
    url = f"http://127.0.0.1:{bp.http_port}/admin/v2/namespaces/public/{ns}/unsubscribe/kept"
    req = urllib.request.Request(url, data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 412
    assert json.loads(e.value.read()) == {"reason": "Subscription has active connected consumers"}
    assert "kept" in _backlogs(bp, ns, topics[:1])[topics[0]]
    consumer.close()
    admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/unsubscribe/kept")
    assert _backlogs(bp, ns, topics) == {t: {} for t in topics}


@pytest.fixture
def store(brokers: Brokers) -> Iterator[MetadataStore]:
    """A metadata store on the module's broker's ZooKeeper and root (paths relative to it)."""
    s = MetadataStore.connect(brokers.bookies.zk, brokers.bookies.root)
    try:
        yield s
    finally:
        s.close()


def test_namespace_unload_lets_go_of_every_topic_served(
    bp: BrokerProcess, c: Any, store: MetadataStore
) -> None:
    """``pulsar-admin namespaces unload`` (before: 404): ``PUT …/unload`` unloads every topic of the namespace
    served: an idle topic's ownership is let go (nobody takes it again), a producer's topic is looked up again
    by its client and the producer goes on sending."""
    ns = _namespace(bp)
    idle, busy = topic_name(), topic_name()
    owned = f"ownership/public/{ns}/persistent"
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{idle}")
    admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{idle}/stats")  # served: owned
    producer = c.create_producer(f"persistent://public/{ns}/{busy}")
    producer.send(b"before")
    assert sorted(store.children(owned)) == sorted([idle, busy])
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}/unload")
    wait_for(lambda: idle not in store.children(owned), "the idle topic's ownership let go")
    producer.send(b"after")  # reconnected to the topic served again
    consumer = c.subscribe(
        f"persistent://public/{ns}/{busy}", "s", initial_position=pulsar.InitialPosition.Earliest
    )
    assert [consumer.receive(timeout_millis=15_000).data() for _ in range(2)] == [b"before", b"after"]
    consumer.close()
    producer.close()
    assert _http_status(bp, "PUT", f"/admin/v2/namespaces/public/no-such-{ns}/unload") == 404


def test_subscription_expiration_time_deletes_subscriptions_without_consumers_for_that_long(
    bp: BrokerProcess, c: Any, store: MetadataStore
) -> None:
    """``pulsar-admin namespaces set-subscription-expiration-time`` (before: 404): set, read, removed; the
    owner's housekeeping deletes a subscription whose last activity (its cursor's last save) is older than that
    many minutes and that has no consumer, and keeps one as old with a consumer connected and a fresh one."""
    ns = _namespace(bp)
    t = topic_name()
    path = f"/admin/v2/namespaces/public/{ns}/subscriptionExpirationTime"
    assert admin(bp, "GET", path) is None
    assert _http_status(bp, "POST", path, -1) == 412
    assert _http_status(bp, "POST", path, "soon") == 400
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}")
    for sub in ("old", "busy", "fresh"):
        admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{t}/subscription/{sub}")
    hour_ago = int(time.time() * 1000) - 3_600_000
    for sub in ("old", "busy"):  # last active an hour ago, as a subscription left by its consumers then
        cursor = f"managed-ledgers/public/{ns}/persistent/{t}/cursors/{sub}"
        stored = store.get(cursor)
        store.set(cursor, {**stored.value, "last_active_ms": hour_ago}, stored.version)
    consumer = c.subscribe(f"persistent://public/{ns}/{t}", "busy")
    admin(bp, "POST", path, 30)
    assert admin(bp, "GET", path) == 30
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}")["subscription_expiration_time_minutes"] == 30
    subs = f"/admin/v2/persistent/public/{ns}/{t}/subscriptions"
    wait_for(lambda: "old" not in admin(bp, "GET", subs), "the subscription idle for an hour deleted")
    assert admin(bp, "GET", subs) == ["busy", "fresh"]
    consumer.close()
    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path) is None


def test_auto_topic_creation_of_a_namespace_takes_the_place_of_the_brokers(bp: BrokerProcess, c: Any) -> None:
    """``pulsar-admin namespaces set-auto-topic-creation`` (before: 404): refused as Pulsar refuses a bad
    override (412 with its words, 406 past ``--max-partitions-per-topic``); off, a producer or consumer naming a
    topic that does not exist is refused TopicNotFound while an existing topic is served; partitioned, the topic
    a producer names is created with that many partitions; removed, the broker's (non-partitioned) again."""
    ns = _namespace(bp)
    path = f"/admin/v2/namespaces/public/{ns}/autoTopicCreation"
    assert admin(bp, "GET", path) is None
    for bad, status in (
        ({"allowAutoTopicCreation": True, "topicType": "partitioned"}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 0}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "sharded"}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "non-partitioned", "defaultNumPartitions": 2}, 412),
        ({"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 5000}, 406),
        ("yes", 400),
    ):
        assert _http_status(bp, "POST", path, bad) == status, bad

    admin(bp, "POST", path, {"allowAutoTopicCreation": False})
    assert admin(bp, "GET", path) == {
        "allowAutoTopicCreation": False,
        "topicType": None,
        "defaultNumPartitions": None,
    }
    with pytest.raises(pulsar.TopicNotFound):
        c.create_producer(f"persistent://public/{ns}/{topic_name()}")
    with pytest.raises(pulsar.TopicNotFound):
        c.subscribe(f"persistent://public/{ns}/{topic_name()}", "s")
    made = topic_name()
    admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/{made}")
    c.create_producer(f"persistent://public/{ns}/{made}").send(b"an existing topic is served")
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}") == [f"persistent://public/{ns}/{made}"]

    auto = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3}
    admin(bp, "POST", path, auto)
    assert admin(bp, "GET", path) == auto
    assert admin(bp, "GET", f"/admin/v2/namespaces/public/{ns}")["autoTopicCreationOverride"] == auto
    t = topic_name()
    producer = c.create_producer(f"persistent://public/{ns}/{t}")
    producer.send(b"m")
    producer.close()
    over_http = pulsar.Client(f"http://127.0.0.1:{bp.http_port}", operation_timeout_seconds=30)
    try:  # the client's metadata request through an http:// service URL creates it too
        t_http = topic_name()
        over_http.create_producer(f"persistent://public/{ns}/{t_http}").send(b"m")
    finally:
        over_http.close()
    for name in (t, t_http):
        assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{name}/partitions") == {"partitions": 3}
    partitioned = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/partitioned")
    assert partitioned == sorted(f"persistent://public/{ns}/{name}" for name in (t, t_http))

    admin(bp, "DELETE", path)
    assert admin(bp, "GET", path) is None
    u = topic_name()
    c.create_producer(f"persistent://public/{ns}/{u}").close()
    assert admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/{u}/partitions") == {"partitions": 0}
