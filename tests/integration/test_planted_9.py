"""Tests for the bugs planted in the audit of 2026-11-29 against c654dde that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the heap freeze, the shared liveness PING, the HTTP hardening,
the admin's new stats and routes, and the Spark stream's subscription and deleted topics"): each fails with its
bug planted and passes without it. One broker on 3 bookies (``test_broker_admin8``'s fixture, its own for this
module) and the official ``pulsar-client``."""

from __future__ import annotations

import contextlib
import datetime
import socket
import time
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_admin8 import BASE, _stats, bp, brokers
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_client_features7 import _answers, _raw_producer
from tests.integration.test_broker_pulsar_client import topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.service import PRODUCER_LIVENESS_TIMEOUT_S

pulsar = pytest.importorskip("pulsar")
#: the eighth admin part's broker (one per module) and the third part's client
__all__ = ["bp", "brokers", "c"]


def _sent_and_received(c: Any, t: str, consumer: Any, n: int) -> list[Any]:
    """``n`` messages ``m0``… sent to ``t`` one by one (no batching) and received by ``consumer``."""
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(n):
        producer.send(f"m{i}".encode())
    got = [consumer.receive(timeout_millis=10_000) for _ in range(n)]
    producer.close()
    return got


def test_a_topics_earliest_publish_time_in_backlog_is_its_oldest_subscriptions(
    bp: BrokerProcess, c: Any
) -> None:
    """``earliestMsgPublishTimeInBacklogs``: the oldest message left by any subscription, here that of ``behind``
    (nothing acknowledged), not that of ``ahead`` (which acknowledged the first of the three)."""
    t = f"persistent://public/default/{topic_name()}"
    ahead, behind = (c.subscribe(t, name) for name in ("ahead", "behind"))
    got = _sent_and_received(c, t, ahead, 3)
    ahead.acknowledge(got[0])
    wait_for(lambda: _stats(bp, t)["subscriptions"]["ahead"]["msgBacklog"] == 2, "the ack")
    stats = _stats(bp, t, "?getEarliestTimeInBacklog=true")
    subs = stats["subscriptions"]
    assert subs["ahead"]["earliestMsgPublishTimeInBacklog"] == got[1].publish_timestamp()
    assert subs["behind"]["earliestMsgPublishTimeInBacklog"] == got[0].publish_timestamp()
    assert stats["earliestMsgPublishTimeInBacklogs"] == got[0].publish_timestamp()
    behind.close()


def test_the_backlog_without_delayed_messages_leaves_out_those_held_back(bp: BrokerProcess, c: Any) -> None:
    """``msgBacklogNoDelayed``: the backlog less the messages held back for delayed delivery (Pulsar's), 2 of 4
    here, the other two due in an hour."""
    t = f"persistent://public/default/{topic_name()}"
    c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(2):
        producer.send(f"now-{i}".encode())
        producer.send(f"later-{i}".encode(), deliver_after=datetime.timedelta(hours=1))
    wait_for(lambda: _stats(bp, t)["subscriptions"]["s"]["msgDelayed"] == 2, "the delayed messages held back")
    sub = _stats(bp, t)["subscriptions"]["s"]
    assert (sub["msgBacklog"], sub["msgDelayed"], sub["msgBacklogNoDelayed"]) == (4, 2, 2)


def test_a_subscription_keeps_its_last_ack_time_once_its_consumer_has_left(bp: BrokerProcess, c: Any) -> None:
    """A subscription's ``lastAckedTimestamp`` is its own (Pulsar's PersistentSubscription keeps it): it stays
    once the consumer that acknowledged has closed, while the topic is served here."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s")
    c.create_producer(t).send(b"m")
    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    wait_for(lambda: _stats(bp, t)["subscriptions"]["s"]["lastAckedTimestamp"] > 0, "the ack's time")
    acked = _stats(bp, t)["subscriptions"]["s"]["lastAckedTimestamp"]
    consumer.close()
    sub = _stats(bp, t)["subscriptions"]["s"]
    assert sub["consumers"] == []
    assert sub["lastAckedTimestamp"] == acked


def test_an_idle_subscriptions_acknowledged_ranges_are_counted_from_its_stored_cursor(
    bp: BrokerProcess, c: Any
) -> None:
    """``nonContiguousDeletedMessagesRanges`` of a subscription without consumers, read from its stored cursor
    (the topic loaded again after an unload): the 2 ranges it acknowledged (messages 1 and 3 of 5), and the
    topic's total the same."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
    got = _sent_and_received(c, t, consumer, 5)
    consumer.acknowledge(got[1])
    consumer.acknowledge(got[3])

    def saved() -> bool:
        info = admin(bp, "GET", f"{BASE}/{t.rsplit('/', 1)[-1]}/internal-info")
        return len(info["cursors"]["s"]["individualDeletedMessages"]) == 2

    wait_for(saved, "the two acknowledged ranges saved")
    consumer.close()
    admin(bp, "PUT", f"{BASE}/{t.rsplit('/', 1)[-1]}/unload")
    stats = _stats(bp, t)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 3
    assert stats["subscriptions"]["s"]["nonContiguousDeletedMessagesRanges"] == 2
    assert stats["nonContiguousDeletedMessagesRanges"] == 2


def test_a_partitioned_topics_subscription_properties_are_its_partitions_merged(
    bp: BrokerProcess, c: Any
) -> None:
    """``GET …/subscription/{sub}/properties`` of a partitioned topic whose partitions' properties differ (each set
    on its partition): all of them, merged, as Pulsar's broker answers, not the first partition's alone."""
    t = topic_name()
    admin(bp, "PUT", f"{BASE}/{t}/partitions", 2)
    c.subscribe(f"persistent://public/default/{t}", "s")
    admin(bp, "PUT", f"{BASE}/{t}-partition-0/subscription/s/properties", {"a": "0"})
    admin(bp, "PUT", f"{BASE}/{t}-partition-1/subscription/s/properties", {"b": "1"})
    assert admin(bp, "GET", f"{BASE}/{t}/subscription/s/properties") == {"a": "0", "b": "1"}


def test_analyze_backlog_from_a_message_before_the_mark_delete_counts_only_the_backlog(
    bp: BrokerProcess, c: Any
) -> None:
    """``analyzeBacklog`` with a MessageId body before the subscription's mark-delete (the first message, after
    the first three of five were acknowledged cumulatively) starts at the mark-delete, as Pulsar's cursor seek
    does: the two messages left, not five."""
    t = topic_name()
    full = f"persistent://public/default/{t}"
    consumer = c.subscribe(full, "s")
    got = _sent_and_received(c, full, consumer, 5)
    consumer.acknowledge_cumulative(got[2])
    wait_for(lambda: _stats(bp, full)["subscriptions"]["s"]["msgBacklog"] == 2, "the cumulative ack")
    first = got[0].message_id()
    body = {"ledgerId": first.ledger_id(), "entryId": first.entry_id()}
    result = admin(bp, "POST", f"{BASE}/{t}/subscription/s/analyzeBacklog", body)
    third = got[3].message_id()
    assert (result["entries"], result["messages"]) == (2, 2)
    assert result["firstMessageId"] == f"{third.ledger_id()}:{third.entry_id()}"


def _next_ping(conn: socket.socket, dec: wire.FrameDecoder) -> float:
    """Read ``conn`` until a PING comes; when it came (``time.monotonic()``)."""
    while True:
        data = conn.recv(65536)
        assert data, "the broker closed the connection"
        if any(f.command.type == pb.BaseCommand.PING for f in dec.feed(data)):
            return time.monotonic()


def test_a_liveness_check_begun_after_another_has_its_own_time(bp: BrokerProcess) -> None:
    """Two liveness checks of one holder, one after the other: the first answered late (after two thirds of its
    5 s), the second PING answered after the first check's time would have run out but within its own. The
    holder answered both: it keeps its name, and both PRODUCERs asking for it are refused ProducerBusy. Before,
    the first check's timer, left running, ended the second at the first's deadline: the live holder was closed
    and its name given away. (The margins are 1.6 s either side.)"""
    t = f"persistent://public/default/{topic_name()}"
    third = PRODUCER_LIVENESS_TIMEOUT_S / 3
    holder = _raw_producer(bp, [(t, 1, 1, "p")])
    with contextlib.closing(holder):
        assert _answers(holder, 1) == {1: "PRODUCER_SUCCESS"}
        dec = wire.FrameDecoder()
        asker = _raw_producer(bp, [(t, 1, 1, "p")])
        with contextlib.closing(asker):
            first = _next_ping(holder, dec)
            time.sleep(max(0.0, first + 2 * third - time.monotonic()))
            holder.sendall(wire.pong())
            assert _answers(asker, 1) == {1: "ProducerBusy"}
            cmd = pb.CommandProducer(topic=t, producer_id=2, request_id=2, producer_name="p")
            asker.sendall(wire.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=cmd)))
            second = _next_ping(holder, dec)
            # after the first check's deadline (first + 5 s), before the second's (second + 5 s)
            time.sleep(max(0.0, second + 2 * third - time.monotonic()))
            holder.sendall(wire.pong())
            assert _answers(asker, 1) == {2: "ProducerBusy"}
