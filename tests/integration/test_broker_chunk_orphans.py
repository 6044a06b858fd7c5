"""Chunks orphaned by a reconnection or a broker crash: a chunked message whose first chunks were stored and
whose last was not, sent again whole by its producer. The chunks stored first are never delivered (they count as
acknowledged), so that pulsar-client 3.13's C++ consumer, which drops a message whose chunk 0 comes again after
its chunks 0 and 1 ('a chunk whose chunk id is invalid'), receives the message sent again whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import bp, c, receive_all
from tests.integration.test_broker_client_features4 import topic_stats, wait_for
from tests.integration.test_broker_pulsar_client import (
    _raw_producer,
    _raw_send_chunks,
    client,
    drain,
    topic_name,
)
from topic_broker import pulsar_api_pb2 as pb

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "c"]  # the fixtures of the third part, on this module's broker

T = pb.BaseCommand
PARTS = [b"aaaa", b"bbbb", b"cccc"]


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("chunk-orphans")) as b:
        yield b


def _send_chunks(bp: BrokerProcess, topic: str, chunk_ids: list[int]) -> list[Any]:
    """Chunks ``chunk_ids`` of one message of ``PARTS`` (sequence id 0, uuid cho-0) by a raw producer named cho
    on a connection of its own, closed after its receipts; the answers, one per chunk."""
    s, dec = _raw_producer(bp, topic, "cho")
    answers = _raw_send_chunks(s, dec, "cho", 0, PARTS, chunk_ids)
    s.close()
    assert [a.type for a in answers] == [T.SEND_RECEIPT] * len(chunk_ids)
    return answers


def _received_once(consumer: Any) -> None:
    """``consumer`` receives the message whole, once, and acknowledges it."""
    got = drain(consumer, 1, 30_000)
    assert got[0].data() == b"".join(PARTS)
    consumer.acknowledge(got[0])
    assert receive_all(consumer, 500) == []


def _unacked(bp: BrokerProcess, topic: str, sub: str) -> int:
    consumers = topic_stats(bp, topic)["subscriptions"][sub]["consumers"]
    return sum(int(c["unackedMessages"]) for c in consumers)


def _backlog(bp: BrokerProcess, topic: str, sub: str) -> int:
    return int(topic_stats(bp, topic)["subscriptions"][sub]["msgBacklog"])


def test_chunks_orphaned_by_a_reconnection_are_skipped(bp: BrokerProcess, c: Any) -> None:
    """Chunks 0 and 1 of a message of 3 stored, the connection gone, then chunks 0, 1, 2 sent again: the
    message comes whole, once, to a consumer connected throughout (sent the orphaned chunks before), to a
    subscription made before whose consumer comes after, and to one made after from the earliest; their
    backlogs are empty after its ack (without the change: the C++ consumers dropped it, 'a chunk whose chunk id
    is invalid', and its 5 entries stayed in the backlogs)."""
    t = f"persistent://public/default/{topic_name()}"
    live = c.subscribe(t, "live")
    c.subscribe(t, "idle").close()
    _send_chunks(bp, t, [0, 1])
    wait_for(lambda: _unacked(bp, t, "live") == 2, "the orphaned chunks sent to the live consumer")
    _send_chunks(bp, t, [0, 1, 2])
    idle = c.subscribe(t, "idle")
    after = c.subscribe(t, "after", initial_position=pulsar.InitialPosition.Earliest)
    for consumer, sub in ((live, "live"), (idle, "idle"), (after, "after")):
        _received_once(consumer)
        wait_for(lambda sub=sub: _backlog(bp, t, sub) == 0, f"an empty backlog on {sub}")


def test_chunks_orphaned_by_a_broker_crash_are_skipped(brokers: Brokers, bp: BrokerProcess) -> None:
    """The same across a kill -9 of the broker between the two sends: the new owner learns the open chunk
    sequence from the tail ledger, and the chunks sent again orphan it. After a second kill -9, the ledger of the
    orphans no longer the tail, the next owner knows them from the topic's properties."""
    t = f"persistent://public/default/{topic_name()}"
    cl = client(bp)
    try:
        cl.subscribe(t, "before").close()
    finally:
        cl.close()
    _send_chunks(bp, t, [0, 1])
    bp.kill9()
    bp.start()
    _send_chunks(bp, t, [0, 1, 2])
    cl = client(bp)
    try:
        before = cl.subscribe(t, "before")
        after = cl.subscribe(t, "after", initial_position=pulsar.InitialPosition.Earliest)
        for consumer, sub in ((before, "before"), (after, "after")):
            _received_once(consumer)
            wait_for(lambda sub=sub: _backlog(bp, t, sub) == 0, f"an empty backlog on {sub}")
    finally:
        cl.close()
    bp.kill9()
    bp.start()
    cl = client(bp)
    try:
        _received_once(cl.subscribe(t, "later", initial_position=pulsar.InitialPosition.Earliest))
        wait_for(lambda: _backlog(bp, t, "later") == 0, "an empty backlog on later")
    finally:
        cl.close()
