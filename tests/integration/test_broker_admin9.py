"""The admin REST API as a ``pulsar-admin`` user meets it, ninth part: ``topics analyze-backlog`` and ``topics
truncate``, checked against the messages the topic holds and what its subscriptions acknowledged.

One broker on 3 bookies (the eighth part's fixture) is shared by the module; every test uses its own topics; every
wait is bounded."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_admin8 import BASE, _http_status, _stats, bp, brokers
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_pulsar_client import topic_name

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "brokers", "c"]  # the eighth part's broker (one per module) and the third part's client


def _ids(msgs: list[Any]) -> list[tuple[int, int]]:
    return [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in msgs]


def _mid(position: tuple[int, int]) -> str:
    return f"{position[0]}:{position[1]}"


def test_analyze_backlog_counts_the_entries_and_batched_messages_left(bp: BrokerProcess, c: Any) -> None:
    """``pulsar-admin topics analyze-backlog``: ``POST …/subscription/{sub}/analyzeBacklog`` (before: 404, no
    such route) reads the backlog: ``entries`` the stored entries not acknowledged, ``messages`` their messages (a
    batch's each), all accepted (no filters), first and last ``ledger:entry``; individually acknowledged entries
    and those before the mark-delete are not counted; a MessageId body starts the scan there. 404 for no such
    subscription, 405 on a partitioned topic."""
    t = topic_name()
    consumer = c.subscribe(f"persistent://public/default/{t}", "s")
    plain = c.create_producer(f"persistent://public/default/{t}", batching_enabled=False)
    for i in range(3):
        plain.send(f"single-{i}".encode())
    batching = {"batching_enabled": True, "batching_max_messages": 5, "batching_max_publish_delay_ms": 60_000}
    batched = c.create_producer(f"persistent://public/default/{t}", **batching)
    for i in range(10):
        batched.send_async(f"batched-{i}".encode(), None)
    batched.flush()
    got = [consumer.receive(timeout_millis=10_000) for _ in range(13)]
    entries = sorted(set(_ids(got)))
    assert len(entries) == 5  # 3 single messages, 2 batches of 5

    path = f"{BASE}/{t}/subscription/s/analyzeBacklog"
    result = admin(bp, "POST", path)
    assert result == {
        "entries": 5,
        "messages": 13,
        "filterAcceptedEntries": 5,
        "filterAcceptedMessages": 13,
        "filterRejectedEntries": 0,
        "filterRejectedMessages": 0,
        "filterRescheduledEntries": 0,
        "filterRescheduledMessages": 0,
        "aborted": False,
        "firstMessageId": _mid(entries[0]),
        "lastMessageId": _mid(entries[-1]),
    }
    assert result["messages"] == _stats(bp, t)["subscriptions"]["s"]["msgBacklog"]

    consumer.acknowledge_cumulative(got[0])  # the first single message
    consumer.acknowledge(got[2])  # the third, individually
    wait_for(lambda: _stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 11, "the acks")
    result = admin(bp, "POST", path)
    assert (result["entries"], result["messages"]) == (3, 11)
    assert result["firstMessageId"] == _mid(entries[1])
    assert result["lastMessageId"] == _mid(entries[-1])

    ledger, entry = entries[3]  # the first batch's: the scan starts there
    result = admin(bp, "POST", path, {"ledgerId": ledger, "entryId": entry})
    assert (result["entries"], result["messages"]) == (2, 10)
    assert result["firstMessageId"] == _mid(entries[3])

    for m in [got[1], *got[3:]]:
        consumer.acknowledge(m)
    wait_for(lambda: _stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 0, "the last acks")
    result = admin(bp, "POST", path)
    assert (result["entries"], result["messages"], result["aborted"]) == (0, 0, False)
    assert "firstMessageId" not in result and "lastMessageId" not in result

    assert _http_status(bp, "POST", f"{BASE}/{t}/subscription/nope/analyzeBacklog") == 404
    pt = topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    assert _http_status(bp, "POST", f"{BASE}/{pt}/subscription/s/analyzeBacklog") == 405


def test_truncate_drops_every_backlog_and_the_ledgers_before_a_new_one(bp: BrokerProcess, c: Any) -> None:
    """``pulsar-admin topics truncate``: ``DELETE …/{topic}/truncate`` (before: 404, no such route) moves every
    subscription, a live one and an idle one, to the last message (backlog 0) and deletes the ledgers holding the
    messages (only a new, empty current ledger is left); the topic takes and delivers new messages after it. Each
    partition of a partitioned topic; 412 on a non-persistent topic, as in Pulsar."""
    t = topic_name()
    full = f"persistent://public/default/{t}"
    live = c.subscribe(full, "live")
    c.subscribe(full, "idle").close()
    producer = c.create_producer(full, batching_enabled=False)
    producer.send(b"old-0")
    admin(bp, "PUT", f"{BASE}/{t}/unload")  # a second ledger
    producer.send(b"old-1")
    got: dict[bytes, int] = {}
    while len(got) < 2:  # an unacknowledged message may come again after the unload (at least once)
        m = live.receive(timeout_millis=10_000)
        got[m.data()] = m.message_id().ledger_id()
    old = set(got.values())
    before = admin(bp, "GET", f"{BASE}/{t}/internalStats")
    assert old <= {li["ledgerId"] for li in before["ledgers"]} and len(old) == 2
    subs = _stats(bp, t)["subscriptions"]
    assert subs["live"]["msgBacklog"] == subs["idle"]["msgBacklog"] == 2

    assert admin(bp, "DELETE", f"{BASE}/{t}/truncate") is None
    after = admin(bp, "GET", f"{BASE}/{t}/internalStats")
    (left,) = after["ledgers"]
    assert left["ledgerId"] not in old and left["entries"] == 0
    subs = _stats(bp, t)["subscriptions"]
    assert subs["live"]["msgBacklog"] == subs["idle"]["msgBacklog"] == 0
    assert _stats(bp, t)["storageSize"] == 0

    producer.send(b"new")
    assert live.receive(timeout_millis=10_000).data() == b"new"
    idle = c.subscribe(full, "idle")
    assert idle.receive(timeout_millis=10_000).data() == b"new"  # not the truncated ones

    pt = topic_name()
    admin(bp, "PUT", f"{BASE}/{pt}/partitions", 2)
    c.subscribe(f"persistent://public/default/{pt}", "s")
    pp = c.create_producer(f"persistent://public/default/{pt}", batching_enabled=False)
    for i in range(4):
        pp.send(f"p{i}".encode())
    assert admin(bp, "GET", f"{BASE}/{pt}/partitioned-stats")["subscriptions"]["s"]["msgBacklog"] == 4
    admin(bp, "DELETE", f"{BASE}/{pt}/truncate")
    assert admin(bp, "GET", f"{BASE}/{pt}/partitioned-stats")["subscriptions"]["s"]["msgBacklog"] == 0
    assert _http_status(bp, "DELETE", f"/admin/v2/non-persistent/public/default/{t}/truncate") == 412
