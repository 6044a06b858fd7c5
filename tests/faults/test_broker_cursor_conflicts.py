"""A topic fenced by a cursor's conflicting write, against real ZooKeeper, bookie processes and a broker process
with the official ``pulsar-client``.

Found by killing ZooKeeper (kill -9) for a few seconds under a consumer's acks and starting it again: the
broker's cursor write conflicted and fenced the topic. The fence came from a cursor's delayed flush, which
tells nobody, and the housekeeping tick skipped a fenced managed ledger: the broker kept the topic, fenced, for
ever, and every consumer after that was answered ``Retryable: cursor not persisted: the topic is fenced`` until
its client timed out (no producer was left to find the fence on an append)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import zk
from tests.broker_testing import start_broker
from zk import layout

pulsar = pytest.importorskip("pulsar")


def test_a_topic_fenced_by_a_cursors_delayed_flush_is_let_go_and_served_again(
    bookies, tmp_path: Path
) -> None:
    bookies.start_many(3)
    bp = start_broker(bookies, tmp_path, 6.0, "--tick-interval-s", "1")
    bp.wait_ready(60)
    assert bp.log_path is not None
    log_path = bp.log_path
    topic = "persistent://public/default/fenced-by-a-flush"
    ml = "public/default/persistent/fenced-by-a-flush"
    client = pulsar.Client(bp.service_url, operation_timeout_seconds=20)
    store = zk.MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        consumer = client.subscribe(topic, "sub")
        producer = client.create_producer(topic)
        for i in range(3):
            producer.send(b"m%d" % i)
        producer.close()  # no producer left: nothing appends to the topic after the fence
        consumer.acknowledge(consumer.receive(10_000))
        path = layout.ml_cursor_path(ml, "sub")
        deadline = time.monotonic() + 20
        while store.get_optional(path) is None:  # the cursor's first flush
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stored = store.get(path)
        store.set(path, stored.value, stored.version)  # another writer: the next flush conflicts
        consumer.acknowledge(consumer.receive(10_000))  # its delayed flush (1 s later) fences the topic
        deadline = time.monotonic() + 30
        while "fenced: cursor sub written by another owner" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        let_go = f"stops serving topic={topic}: fenced: cursor sub written by another owner"
        deadline = time.monotonic() + 15  # the next tick (1 s) finds the fence and lets the topic go
        while let_go not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        t0 = time.monotonic()
        other = client.subscribe(topic, "other", initial_position=pulsar.InitialPosition.Earliest)
        assert time.monotonic() - t0 < 15
        assert [other.receive(10_000).data() for _ in range(3)] == [b"m0", b"m1", b"m2"]
        # the first consumer is back too (the acks the fenced flush did not store come again first)
        assert b"m2" in [consumer.receive(10_000).data() for _ in range(3)]
    finally:
        store.close()
        client.close()
        bp.stop()
