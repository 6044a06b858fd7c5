"""Key-based batching (the batching Key_Shared subscriptions call for) with deduplication on, the broker's
default, with the official ``pulsar-client``: its batches carry only their first sequence id, and their ids are
not contiguous (key A's batch holds 0, 8, 16, key B's 1, 9, sent after it). Every message is stored once and
acknowledged with its place, also after the broker was killed -9 and the producer opened again."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess

pulsar = pytest.importorskip("pulsar")

KEYS = 8


def send_keyed(producer: Any, first: int, n: int) -> list[tuple[str, Any]]:
    """``n`` messages m-<i> over KEYS keys (every other one k0), asynchronously (so that each key's batch holds several); their
    answers (result, message id) by value, once flushed."""
    lock = threading.Lock()
    answers: list[tuple[str, Any]] = []

    def cb(value: str) -> Any:
        def f(res: Any, mid: Any) -> None:
            with lock:
                answers.append((value, (res, mid)))

        return f

    for i in range(first, first + n):
        key = f"k{i % KEYS}" if i % 2 else "k0"  # batches of unequal sizes: k0's holds half the messages
        producer.send_async(f"m-{i}".encode(), cb(f"m-{i}"), partition_key=key)
    producer.flush()
    return answers


def test_key_based_batches_are_all_stored_with_dedup_on(broker: BrokerProcess) -> None:
    topic = f"kbb-{uuid.uuid4().hex[:8]}"
    c = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        consumer = c.subscribe(
            topic,
            "s",
            consumer_type=pulsar.ConsumerType.KeyShared,
            initial_position=pulsar.InitialPosition.Earliest,
        )

        def producer() -> Any:
            return c.create_producer(
                topic,
                producer_name="kb",
                batching_enabled=True,
                batching_type=pulsar.BatchingType.KeyBased,
                batching_max_publish_delay_ms=50,
            )

        p = producer()
        answers = send_keyed(p, 0, 200)
        p.close()
        broker.kill9()
        broker.start()
        p = producer()  # told the last sequence id the broker found in the ledger
        answers += send_keyed(p, 200, 200)
        assert len(answers) == 400
        assert all(res == pulsar.Result.Ok for _, (res, _) in answers)
        unplaced = sorted(v for v, (_, mid) in answers if mid.ledger_id() < 0 or mid.entry_id() < 0)
        assert not unplaced, f"acknowledged as resends, not stored: {unplaced[:10]} ({len(unplaced)})"
        got: list[str] = []
        while len(got) < 400:
            m = consumer.receive(timeout_millis=20_000)
            got.append(m.data().decode())
            consumer.acknowledge(m)
        assert sorted(got) == sorted(f"m-{i}" for i in range(400))
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        c.close()
