"""A bookie of the topic's ensemble killed -9 on a cluster of three (E3/Qw2/Qa2: no bookie to replace it),
under a producer with deduplication (the broker's default), with the official ``pulsar-client``: the appends
fail, the broker closes the ledger by recovery and its producers send again to the next one. Entries that
reached two bookies before the first failing add are found by that recovery; their appends had been failed,
so the ledger's record ends before them, and each message is stored once."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.broker_testing import start_broker

pulsar = pytest.importorskip("pulsar")


@pytest.mark.timeout(150)
def test_entries_failed_here_and_found_by_the_close_are_not_stored_twice(bookies, tmp_path: Path) -> None:
    bps = bookies.start_many(3)
    broker = start_broker(bookies, tmp_path, 4.0)
    broker.wait_ready(60)
    topic = f"failed-close-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    lock = threading.Lock()
    answers: dict[str, Any] = {}
    sent: list[str] = []
    stop = threading.Event()
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        producer = client.create_producer(
            topic, producer_name="p", batching_enabled=False, send_timeout_millis=0, block_if_queue_full=True
        )

        def cb(value: str) -> Any:
            def f(res: Any, _mid: Any) -> None:
                with lock:
                    answers[value] = res

            return f

        def produce() -> None:
            i = 0
            while not stop.is_set():
                value = f"m-{i}"
                i += 1
                with lock:
                    sent.append(value)
                producer.send_async(value.encode(), cb(value))
                time.sleep(0.003)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        time.sleep(1.5)
        bps[0].kill9()
        log = broker.log_path
        assert log is not None
        deadline = time.monotonic() + 60
        while "append failed, replacing the ledger" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, broker.log_tail(20)
            time.sleep(0.2)
        bps[0].start(wait=True)
        time.sleep(2)
        stop.set()
        t.join(5)
        deadline = time.monotonic() + 60
        while True:
            with lock:
                if len(answers) == len(sent):
                    break
            assert time.monotonic() < deadline, "sends left unanswered"
            time.sleep(0.2)
        assert all(res == pulsar.Result.Ok for res in answers.values())
        got: list[str] = []
        while len(got) < 2 * len(sent):  # everything stored, until nothing more comes
            try:
                got.append(reader.read_next(20_000 if len(got) < len(sent) else 1_000).data().decode())
            except pulsar.Timeout:
                break
        twice = sorted({v for v in got if got.count(v) > 1}, key=lambda v: int(v[2:]))
        assert not twice, f"stored twice: {twice[:10]} ({len(twice)})"
        assert got == sent
    finally:
        stop.set()
        client.close()
        try:
            broker.stop()
        except Exception:
            broker.kill9()
