"""Deduplication's walk of a compressed batch on the send path (the official ``pulsar-client`` states a batch's
first sequence id only, so the broker reads its last one from the batch): a ZLIB batch that inflates past
``wire.INFLATE_ON_LOOP_MAX`` is walked in a worker thread, not on the broker's event loop, and the producer's
SENDs behind it wait for it, so that they are stored, acknowledged and deduplicated in their order. An
in-process broker (real ZooKeeper and bookies) tells where each walk ran."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.broker_testing import Brokers
from tests.integration.test_broker_gone_connection import _serving
from topic_broker import service as service_module
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")

LARGE = 64 * 1024  # batches of several of these inflate past INFLATE_ON_LOOP_MAX; the small ones' do not


def test_a_large_compressed_batch_is_walked_off_the_loop_and_sends_keep_their_order(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    walked_on: list[tuple[bool, bool]] = []  # (walked in a worker thread, on the broker's loop thread)
    real_walk = service_module.dedup_walk

    def observed(*args: Any) -> int | Callable[[], int]:
        found = real_walk(*args)
        if isinstance(found, int):
            return found

        def walk() -> int:
            walked_on.append((True, threading.current_thread() is loop_thread))
            return found()

        return walk

    monkeypatch.setattr(service_module, "dedup_walk", observed)
    with _serving(cluster) as (service, run):

        async def thread() -> threading.Thread:
            return threading.current_thread()

        loop_thread = run(thread())
        topic = f"persistent://public/default/walk-{uuid.uuid4().hex[:8]}"
        c = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            p = c.create_producer(
                topic,
                producer_name="walker",
                compression_type=pulsar.CompressionType.ZLib,
                batching_enabled=True,
                batching_max_messages=10,  # a batch per run, sent one behind the other
                batching_max_allowed_size_in_bytes=2 * 1024 * 1024,
                batching_max_publish_delay_ms=1000,
            )
            lock = threading.Lock()
            answers: dict[int, Any] = {}

            def answered(i: int) -> Callable[[Any, Any], None]:
                def f(res: Any, mid: Any) -> None:
                    with lock:
                        answers[i] = (res, mid)

                return f

            values = []
            for i in range(120):
                # runs of large messages (batches inflating past the bound) between runs of small ones
                value = f"m-{i:03d}".encode() + (b"x" * LARGE if (i // 10) % 2 else b"")
                values.append(value)
                p.send_async(value, answered(i))
            p.flush()
            assert len(answers) == 120 and all(res == pulsar.Result.Ok for res, _ in answers.values())
            ids = [answers[i][1] for i in range(120)]
            places = [(m.ledger_id(), m.entry_id(), m.batch_index()) for m in ids]
            assert places == sorted(places) and len(set(places)) == 120  # stored once each, in order
            got = []
            for _ in range(120):
                m = consumer.receive(timeout_millis=20_000)
                got.append(m.data())
                consumer.acknowledge(m)
            assert got == values
            # the producer opened again is told the last batch's last id (a large batch's, walked in a thread),
            # not its first
            p.close()
            again = c.create_producer(topic, producer_name="walker")
            assert again.last_sequence_id() == 119
            again.close()
        finally:
            c.close()
    assert walked_on and all(in_thread and not on_loop for in_thread, on_loop in walked_on)
    assert len(walked_on) >= 5  # each run of large messages was at least one batch walked so
    assert wire.INFLATE_ON_LOOP_MAX < 10 * LARGE <= wire.SEND_WALK_UNCOMPRESSED_MAX
