"""A bookie of the topic's ensemble killed -9 on a cluster of three (no bookie to replace it) and started again
two seconds later, under the official ``pulsar-client``: the broker gives up replacing it after its
``--ensemble-change-timeout-s`` (5 s by default), rolls the topic to a new ledger on the three bookies up again,
and the send waiting meanwhile is stored. Its ledger client used to keep trying for 30 s, longer than the
client's send timeout here (15 s): the send failed with Timeout though the bookie was back within 2 s."""

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
def test_a_send_waiting_on_a_bookie_killed_and_back_soon_is_stored_within_the_send_timeout(
    bookies, tmp_path: Path
) -> None:
    bps = bookies.start_many(3)
    broker = start_broker(bookies, tmp_path, 4.0)
    broker.wait_ready(60)
    topic = f"back-soon-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        client.subscribe(topic, "s")  # keeps what it has not acknowledged: retention keeps nothing else here
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=15_000)
        producer.send(b"before")
        bps[0].kill9()
        results: dict[bytes, str] = {}
        done = threading.Event()

        def answered(data: bytes) -> Any:
            def f(res: Any, _mid: Any) -> None:
                results[data] = str(res)
                if len(results) == len(during):
                    done.set()

            return f

        # three entries in a row: with E3/Qw2 at least one has the killed bookie in its write set
        during = [b"during-0", b"during-1", b"during-2"]
        for data in during:
            producer.send_async(data, answered(data))
        time.sleep(2)
        bps[0].start(wait=True)
        assert done.wait(60), broker.log_tail(30)
        assert results == {d: str(pulsar.Result.Ok) for d in during}, broker.log_tail(30)
        producer.send(b"after")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)  # what is stored, each entry once
        got = []
        while True:
            try:
                got.append(reader.read_next(5_000).data())
            except pulsar.Timeout:
                break
        assert got == [b"before", *during, b"after"]
    finally:
        client.close()
        try:
            broker.stop()
        except Exception:
            broker.kill9()
