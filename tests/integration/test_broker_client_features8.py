"""Pulsar client features under faults, eighth part, on a broker of its own (the fixtures of the third part): a
chunked message sent again by a producer that reconnected after it was stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import bp, c, receive_all
from tests.integration.test_broker_client_features4 import topic_stats, wait_for
from tests.integration.test_broker_pulsar_client import (
    _raw_answer,
    _raw_producer,
    _raw_send,
    _raw_send_chunks,
    drain,
    topic_name,
)
from topic_broker import pulsar_api_pb2 as pb

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "c"]  # the fixtures of the third part, on this module's broker

T = pb.BaseCommand


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features8")) as b:
        yield b


def _send_chunked(bp: BrokerProcess, topic: str, parts: list[bytes]) -> list[Any]:
    """One message of ``parts`` as chunks (sequence id 0, uuid chp-0) by a raw producer named chp on a connection
    of its own, closed after; the answers, one per chunk."""
    s, dec = _raw_producer(bp, topic, "chp")
    answers = _raw_send_chunks(s, dec, "chp", 0, parts)
    s.close()
    return answers


def test_a_chunked_message_sent_again_after_it_was_stored_is_stored_once(bp: BrokerProcess, c: Any) -> None:
    """A producer whose connection went after the last chunk of a message was stored sends the whole message
    again (the C++ client resends what it was not answered). The last chunk is a duplicate (only it takes part in
    deduplication), and the chunks before it were stored a second time: a partial copy after the whole message,
    which the client holds as an incomplete message. A consumer that read past it once (its queue cleared by a
    reconnection) then dropped the whole message at its redelivery ('a chunk whose chunk id is invalid'), and
    its chunks stayed in the backlog, unacknowledged. Now the resent chunks are answered as duplicates too."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s")
    first = _send_chunked(bp, t, [b"aaaa", b"AAAA"])
    assert [a.type for a in first] == [T.SEND_RECEIPT, T.SEND_RECEIPT]
    again = _send_chunked(bp, t, [b"aaaa", b"AAAA"])
    assert [a.type for a in again] == [T.SEND_RECEIPT, T.SEND_RECEIPT]
    assert [a.send_receipt.message_id.entryId for a in again] == [2**64 - 1] * 2  # no position: duplicates
    assert topic_stats(bp, t)["subscriptions"]["s"]["msgBacklogEntries"] == 2
    got = drain(consumer, 1)
    assert got[0].data() == b"aaaaAAAA"
    consumer.acknowledge(got[0])
    assert receive_all(consumer, 500) == []
    wait_for(lambda: topic_stats(bp, t)["subscriptions"]["s"]["msgBacklogEntries"] == 0, "an empty backlog")


def test_a_chunked_message_filling_a_skipped_id_is_stored_whole(bp: BrokerProcess, c: Any) -> None:
    """A chunked message whose sequence id is one its producer's stored sends jumped over (id 5 stored first,
    then the message of id 2) fills that id: stored whole, all its chunks. The chunks before the last, which
    take no part in deduplication, were taken for resends of a message stored (2 <= 5) and dropped, while the
    last chunk filled the id and was stored: the message acknowledged, and only its last chunk in the topic."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s")
    s, dec = _raw_producer(bp, t, "skp")
    try:
        _raw_send(s, 5, b"m5")
        assert _raw_answer(s, dec).type == T.SEND_RECEIPT
        answers = _raw_send_chunks(s, dec, "skp", 2, [b"aaaa", b"AAAA"])
    finally:
        s.close()
    assert [a.type for a in answers] == [T.SEND_RECEIPT, T.SEND_RECEIPT]
    assert all(a.send_receipt.message_id.entryId != 2**64 - 1 for a in answers), answers  # both stored
    assert topic_stats(bp, t)["subscriptions"]["s"]["msgBacklogEntries"] == 3
    assert sorted(m.data() for m in drain(consumer, 2)) == [b"aaaaAAAA", b"m5"]
