"""The broker's operational surface against real processes: ZooKeeper, 3 bookies and broker processes.

Pulsar's ``/admin/v2`` round trips (namespaces and their policies, topics, partitions, stats, internalStats,
subscriptions, reset-cursor, skip-all, lastMessageId), ``pulsar.Client("http://…")`` through the HTTP lookup,
redirects to a topic's owner, ``ledgerstore topic …`` verbs and ``/metrics`` as Prometheus text.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers
from tests.metrics_testing import scrape

pulsar = pytest.importorskip("pulsar")


def web(bp: BrokerProcess) -> str:
    return f"http://127.0.0.1:{bp.http_port}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def call(bp: BrokerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed body, headers); no redirect following."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(web(bp) + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _opener.open(req, timeout=60) as r:
            text = r.read().decode()
            status, headers = r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        status, headers = e.code, dict(e.headers)
    try:
        parsed = json.loads(text) if text else None
    except json.JSONDecodeError:
        parsed = text
    return status, parsed, headers


def ok(bp: BrokerProcess, method: str, path: str, body: Any = None) -> Any:
    status, data, _ = call(bp, method, path, body)
    assert status in (200, 204), (method, path, status, data)
    return data


def client(url: str) -> Any:
    return pulsar.Client(url, operation_timeout_seconds=20)


def topic_name() -> str:
    return f"adm-{uuid.uuid4().hex[:8]}"


def ledgerstore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


T = "/admin/v2/persistent/public/default"


# -- namespaces, tenants, clusters ------------------------------------------------------------------------------


def test_clusters_tenants_namespaces_and_their_policies_round_trip(broker: BrokerProcess) -> None:
    assert ok(broker, "GET", "/admin/v2/clusters") == ["ledgerstore"]
    assert "public" in ok(broker, "GET", "/admin/v2/tenants")
    assert ok(broker, "GET", "/admin/v2/namespaces/public") == ["public/default"]
    assert call(broker, "GET", "/admin/v2/brokers/health")[0] == 200
    assert call(broker, "GET", "/admin/v2/brokers/ready")[:2] == (200, "ok")  # Pulsar's readiness call
    assert ok(broker, "GET", "/admin/v2/brokers/ledgerstore") == [f"127.0.0.1:{broker.http_port}"]

    pol = ok(broker, "GET", "/admin/v2/namespaces/public/default")
    assert pol["retention_policies"] == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    assert pol["deduplicationEnabled"] is None  # not set: the broker's default

    ns = "/admin/v2/namespaces/public/default"
    ok(broker, "POST", ns + "/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100})
    assert ok(broker, "GET", ns + "/retention") == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    ok(broker, "POST", ns + "/deduplication", True)
    assert ok(broker, "GET", ns + "/deduplication") is True
    ok(
        broker,
        "POST",
        ns + "/backlogQuota",
        {"limitSize": 1 << 30, "limitTime": -1, "policy": "producer_exception"},
    )
    assert ok(broker, "GET", ns + "/backlogQuota") == {
        "limitSize": 1 << 30,
        "limitTime": -1,
        "policy": "producer_exception",
    }
    assert ok(broker, "GET", ns + "/backlogQuotaMap")["destination_storage"]["policy"] == "producer_exception"
    assert ok(broker, "GET", ns)["retention_policies"]["retentionSizeInMB"] == 100

    # errors: Pulsar's statuses with {"reason": …}
    status, body, _ = call(broker, "POST", ns + "/retention", "sixty")
    assert status == 400 and "reason" in body
    status, body, _ = call(broker, "POST", ns + "/backlogQuota", {"policy": "drop_everything"})
    assert status == 400 and "policy" in body["reason"]
    status, body, _ = call(broker, "GET", "/admin/v2/namespaces/public/nope/retention")
    assert status == 404 and body == {"reason": "Namespace does not exist"}

    # a tenant and a namespace of one's own
    ok(broker, "PUT", "/admin/v2/tenants/acme")
    assert call(broker, "PUT", "/admin/v2/tenants/acme")[0] == 409
    ok(broker, "PUT", "/admin/v2/namespaces/acme/orders")
    assert call(broker, "PUT", "/admin/v2/namespaces/acme/orders")[0] == 409
    assert ok(broker, "GET", "/admin/v2/namespaces/acme") == ["acme/orders"]
    assert ok(broker, "GET", "/admin/v2/persistent/acme/orders") == []
    ok(broker, "PUT", "/admin/v2/persistent/acme/orders/o1")
    assert ok(broker, "GET", "/admin/v2/persistent/acme/orders") == ["persistent://acme/orders/o1"]
    assert call(broker, "DELETE", "/admin/v2/namespaces/acme/orders")[0] == 409  # not empty


# -- one topic ----------------------------------------------------------------------------------------------------


def test_topic_admin_round_trip_stats_cursors_and_metrics(broker: BrokerProcess) -> None:
    t = topic_name()
    full = f"persistent://public/default/{t}"
    assert call(broker, "GET", f"{T}/{t}/stats")[0] == 404
    ok(broker, "PUT", f"{T}/{t}")
    status, body, _ = call(broker, "PUT", f"{T}/{t}")
    assert status == 409 and body["reason"]
    assert full in ok(broker, "GET", T)
    assert ok(broker, "GET", f"{T}/{t}/partitions") == {"partitions": 0}
    assert ok(broker, "GET", f"{T}/{t}/subscriptions") == []

    # a subscription created by the REST before anything is produced starts at the end (latest)
    ok(broker, "PUT", f"{T}/{t}/subscription/early")
    assert call(broker, "PUT", f"{T}/{t}/subscription/early")[0] == 409

    c = client(broker.service_url)
    try:
        producer = c.create_producer(full)
        ids = [producer.send(f"m-{i}".encode()) for i in range(50)]
        consumer = c.subscribe(full, "work", initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=10_000) for _ in range(50)]
        assert [m.data() for m in got] == [f"m-{i}".encode() for i in range(50)]
        for m in got[:20]:
            consumer.acknowledge(m)
        consumer.acknowledge(got[30])
        time.sleep(0.5)  # acks are grouped by the client every 100 ms

        st = ok(broker, "GET", f"{T}/{t}/stats")
        assert st["msgInCounter"] == 50
        assert st["bytesInCounter"] > 50 * 3
        assert st["msgOutCounter"] >= 50
        assert st["storageSize"] >= 0
        assert [p["producerName"] for p in st["publishers"]] == [producer.producer_name()]
        assert st["subscriptions"]["work"]["msgBacklog"] == 29
        assert len(st["subscriptions"]["work"]["consumers"]) == 1
        assert st["subscriptions"]["early"]["msgBacklog"] == 50

        ist = ok(broker, "GET", f"{T}/{t}/internalStats")
        assert ist["numberOfEntries"] == 50 and ist["entriesAddedCounter"] == 50
        assert ist["currentLedgerEntries"] == 50
        assert ist["state"] == "LedgerOpened"
        last = ids[-1]
        assert ist["lastConfirmedEntry"] == f"{last.ledger_id()}:{last.entry_id()}"
        assert [li["ledgerId"] for li in ist["ledgers"]] == [last.ledger_id()]
        cur = ist["cursors"]["work"]
        m19, m30 = got[19].message_id(), got[30].message_id()
        assert cur["markDeletePosition"] == f"{m19.ledger_id()}:{m19.entry_id()}"
        assert cur["individuallyDeletedMessages"] == (
            f"[({m30.ledger_id()}:{m30.entry_id() - 1}..{m30.ledger_id()}:{m30.entry_id()}]]"
        )
        assert "early" in ist["cursors"]

        assert ok(broker, "GET", f"{T}/{t}/lastMessageId") == {
            "ledgerId": last.ledger_id(),
            "entryId": last.entry_id(),
            "partitionIndex": -1,
        }
        assert sorted(ok(broker, "GET", f"{T}/{t}/subscriptions")) == ["early", "work"]
        assert (
            ok(broker, "GET", f"{T}/{t}/examinemessage?initialPosition=earliest&messagePosition=1") == "m-0"
        )
        status, body, headers = call(broker, "GET", f"{T}/{t}/examinemessage?initialPosition=latest")
        assert status == 200 and body == "m-49"
        assert headers["X-Pulsar-Message-ID"] == f"{last.ledger_id()}:{last.entry_id()}:-1"
        published = datetime.datetime.fromisoformat(headers["X-Pulsar-publish-time"])  # Pulsar's ISO 8601
        assert int(published.timestamp() * 1000) == got[49].publish_timestamp()
        m5 = ids[5]
        assert ok(broker, "GET", f"{T}/{t}/ledger/{m5.ledger_id()}/entry/{m5.entry_id()}") == "m-5"

        # /metrics: Prometheus text that counts what was produced and what is left
        metrics = prometheus(broker)
        # (labels sorted by name, as prometheus_client writes them)
        labels = f'cluster="ledgerstore",namespace="public/default",topic="{full}"'
        assert metrics[f"pulsar_in_messages_total{{{labels}}}"] == 50
        assert metrics[f"pulsar_out_messages_total{{{labels}}}"] >= 50
        ns = 'cluster="ledgerstore",namespace="public/default"'
        assert metrics[f'pulsar_subscription_back_log{{{ns},subscription="work",topic="{full}"}}'] == 29
        assert metrics[f'pulsar_subscription_back_log{{{ns},subscription="early",topic="{full}"}}'] == 50
        broker_labels = f'broker="127.0.0.1:{broker.port}",cluster="ledgerstore"'
        assert metrics[f"pulsar_broker_publish_latency_seconds_count{{{broker_labels}}}"] == 50
        assert metrics[f'pulsar_broker_publish_latency_seconds_bucket{{{broker_labels},le="+Inf"}}'] == 50

        # skip_all empties the backlog; resetcursor by time rewinds to the first message published at/after it
        ok(broker, "POST", f"{T}/{t}/subscription/early/skip_all")
        assert ok(broker, "GET", f"{T}/{t}/stats")["subscriptions"]["early"]["msgBacklog"] == 0
        ts = got[40].publish_timestamp()
        ok(broker, "POST", f"{T}/{t}/subscription/early/resetcursor/{ts}")
        back = ok(broker, "GET", f"{T}/{t}/stats")["subscriptions"]["early"]["msgBacklog"]
        first_at_ts = min(i for i, m in enumerate(got) if m.publish_timestamp() >= ts)
        assert back == 50 - first_at_ts
        # the live subscription is reset too: its consumer is disconnected and gets messages again from there
        ok(broker, "POST", f"{T}/{t}/subscription/work/resetcursor/{ts}")
        again = consumer.receive(timeout_millis=15_000)
        assert again.data() == f"m-{first_at_ts}".encode()

        # a subscription at an explicit message id
        mid = got[10].message_id()
        ok(
            broker,
            "PUT",
            f"{T}/{t}/subscription/at10",
            {"ledgerId": mid.ledger_id(), "entryId": mid.entry_id()},
        )
        assert ok(broker, "GET", f"{T}/{t}/stats")["subscriptions"]["at10"]["msgBacklog"] == 40

        # unloading: the clients reconnect to the topic's next owner (here the same broker, reopening it)
        ok(broker, "PUT", f"{T}/{t}/unload")
        producer.send(b"after-unload")
        assert consumer.receive(timeout_millis=15_000).data().startswith(b"m-")
        assert ok(broker, "GET", f"{T}/{t}/stats")["msgInCounter"] == 1

        # deleting: refused while clients are connected, forced otherwise
        status, body, _ = call(broker, "DELETE", f"{T}/{t}/subscription/work")
        assert status == 412 and "consumers" in body["reason"]
        ok(broker, "DELETE", f"{T}/{t}/subscription/early")
        assert call(broker, "DELETE", f"{T}/{t}/subscription/early")[0] == 404
        assert "early" not in ok(broker, "GET", f"{T}/{t}/subscriptions")
        status, body, _ = call(broker, "DELETE", f"{T}/{t}")
        assert status == 412 and "active" in body["reason"]
        ok(broker, "DELETE", f"{T}/{t}?force=true")
        assert full not in ok(broker, "GET", T)
        assert call(broker, "GET", f"{T}/{t}/internalStats")[0] == 404
    finally:
        c.close()


def prometheus(bp: BrokerProcess) -> dict[str, float]:
    """/metrics, parsed by prometheus_client (text it cannot parse fails the test)."""
    return scrape(web(bp) + "/metrics")


# -- partitioned topics and the HTTP service URL ------------------------------------------------------------------


def test_partitioned_topic_and_pulsar_client_over_http_lookup(broker: BrokerProcess) -> None:
    t = topic_name()
    full = f"persistent://public/default/{t}"
    ok(broker, "PUT", f"{T}/{t}/partitions", 3)
    assert call(broker, "PUT", f"{T}/{t}/partitions", 3)[0] == 409
    assert call(broker, "PUT", f"{T}/{t}", None)[0] == 409
    assert ok(broker, "GET", f"{T}/{t}/partitions") == {"partitions": 3}
    ok(broker, "POST", f"{T}/{t}/partitions", 4)
    assert ok(broker, "GET", f"{T}/{t}/partitions") == {"partitions": 4}
    status, body, _ = call(broker, "POST", f"{T}/{t}/partitions", 2)  # never shrinks: Pulsar's 422, its words
    assert (status, body["reason"]) == (422, "Expect partitions 2 can't less than current partitions 4.")
    assert call(broker, "POST", f"{T}/{t}/partitions", 4)[0] == 204  # the same count: nothing to do
    assert ok(broker, "GET", f"{T}/{t}/partitions") == {"partitions": 4}
    assert full in ok(broker, "GET", f"{T}/partitioned")
    assert {f"{full}-partition-{i}" for i in range(4)} <= set(ok(broker, "GET", T))

    lk = ok(broker, "GET", f"/lookup/v2/topic/persistent/public/default/{t}-partition-0")
    assert lk["brokerUrl"] == broker.service_url and lk["httpUrl"] == web(broker)

    c = client(web(broker))  # http:// service URL: partitions and lookups through the REST
    try:
        producer = c.create_producer(full)
        n = 200
        for i in range(n):
            producer.send(f"p-{i}".encode(), partition_key=f"k{i % 13}")
        consumer = c.subscribe(full, "psub", initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=10_000) for _ in range(n)]
        assert sorted(m.data() for m in got) == sorted(f"p-{i}".encode() for i in range(n))
        assert {m.topic_name() for m in got} <= {f"{full}-partition-{i}" for i in range(4)}
        for m in got[: n // 2]:
            consumer.acknowledge(m)
        time.sleep(0.5)
        ps = ok(broker, "GET", f"{T}/{t}/partitioned-stats")
        assert ps["metadata"] == {"partitions": 4}
        assert ps["msgInCounter"] == n
        assert ps["subscriptions"]["psub"]["msgBacklog"] == n - n // 2
        # the aggregate has a partition's fields (its cursor positions excepted), as Pulsar's SubscriptionStatsImpl
        agg, part = (
            ps["subscriptions"]["psub"],
            ps["partitions"][f"{full}-partition-0"]["subscriptions"]["psub"],
        )
        assert set(agg) == set(part) - {"markDeletePosition", "readPosition"}
        assert (agg["isDurable"], agg["isReplicated"], agg["type"]) == (True, False, "Exclusive")
        assert (agg["earliestMsgPublishTimeInBacklog"], agg["blockedSubscriptionOnUnackedMsgs"]) == (0, False)
        assert len(ps["partitions"]) == 4
        assert ok(broker, "GET", f"{T}/{t}/subscriptions") == ["psub"]
        consumer.close()
        producer.close()
        ok(broker, "POST", f"{T}/{t}/subscription/psub/skip_all")
        assert ok(broker, "GET", f"{T}/{t}/partitioned-stats")["subscriptions"]["psub"]["msgBacklog"] == 0
        ok(broker, "DELETE", f"{T}/{t}/partitions")
        assert ok(broker, "GET", f"{T}/{t}/partitions") == {"partitions": 0}
        assert not any(x.startswith(full) for x in ok(broker, "GET", T))
    finally:
        c.close()


def test_a_broker_that_does_not_own_a_topic_redirects_to_its_owner(cluster: Brokers) -> None:
    a, b = cluster.start(), cluster.start()
    t = topic_name()
    full = f"persistent://public/default/{t}"
    c = client(a.service_url)
    try:
        producer = c.create_producer(full)
        producer.send(b"x")
        owner = ok(a, "GET", f"/lookup/v2/topic/persistent/public/default/{t}")
        assert ok(b, "GET", f"/lookup/v2/topic/persistent/public/default/{t}") == owner
        other = b if owner["httpUrl"] == web(a) else a
        status, _body, headers = call(other, "GET", f"{T}/{t}/stats")
        assert status == 307 and headers["Location"] == f"{owner['httpUrl']}{T}/{t}/stats"
        # ZooKeeper-only calls are answered by any broker
        assert full in ok(other, "GET", T)
        assert ok(other, "GET", f"{T}/{t}/partitions") == {"partitions": 0}
        # the CLI follows the redirect
        r = ledgerstore("topic", "stats", t, "--url", web(other), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["msgInCounter"] == 1
    finally:
        c.close()


# -- ledgerstore topic … ---------------------------------------------------------------------------------------


def test_topic_cli_verbs(broker: BrokerProcess) -> None:
    t = topic_name()
    full = f"persistent://public/default/{t}"
    urls = ["--url", web(broker), "--service-url", broker.service_url]

    r = ledgerstore("topic", "create", t, "--partitions", "2", *urls, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"topic": full, "partitions": 2}
    r = ledgerstore("topic", "create", t, *urls)
    assert r.returncode == 1 and "409" in r.stderr

    r = ledgerstore("topic", "list", *urls, "--json")
    assert r.returncode == 0 and full in json.loads(r.stdout)["partitioned"]

    r = ledgerstore(
        "topic", "produce", t, "-m", "hello", "-m", "world", "-n", "5", "--key", "k", *urls, "--json"
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["produced"] == 10

    r = ledgerstore("topic", "consume", t, "-s", "cli", "-n", "10", *urls, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["consumed"] == 10
    assert sorted(m["data"] for m in out["messages"]) == ["hello"] * 5 + ["world"] * 5
    assert {m["key"] for m in out["messages"]} == {"k"}

    r = ledgerstore("topic", "consume", t, "-s", "cli", "-n", "1", "--timeout-s", "2", *urls)
    assert r.returncode == 1 and "only 0 of 1" in r.stderr  # everything was acknowledged

    r = ledgerstore("topic", "stats", t, *urls, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["msgInCounter"] == 10 and st["subscriptions"]["cli"]["msgBacklog"] == 0
    r = ledgerstore("topic", "stats", t, *urls)
    assert r.returncode == 0 and "subscription cli" in r.stdout

    r = ledgerstore("topic", "internal-stats", t, *urls, "--json")
    assert r.returncode == 0, r.stderr
    ist = json.loads(r.stdout)
    assert set(ist) == {f"{full}-partition-0", f"{full}-partition-1"}
    assert sum(s["numberOfEntries"] for s in ist.values()) == 10
    r = ledgerstore("topic", "internal-stats", t, *urls)
    assert r.returncode == 0 and "cursor cli" in r.stdout

    r = ledgerstore("topic", "delete", t, *urls, "--json")
    assert r.returncode == 0, r.stderr
    r = ledgerstore("topic", "list", *urls, "--json")
    assert full not in json.loads(r.stdout)["partitioned"]
    r = ledgerstore("topic", "stats", "nope-" + t, *urls)
    assert r.returncode == 4 and "404" in r.stderr  # not found: exit status 4 (docs/cli.md)
