"""A topic's cursor write that conflicts, against real ZooKeeper, bookie processes and (the second test) a broker
process with the official ``pulsar-client``.

Found by killing ZooKeeper (kill -9) for a few seconds under a consumer's acks and starting it again: the
broker's cursor write timed out ("ZooKeeper did not answer within 10s") but ZooKeeper applied it once back, so
the next write, at the old version, conflicted; the broker took its own write for another owner's and fenced
the topic. The fence came from a cursor's delayed flush, which tells nobody, and the housekeeping tick skipped a
fenced managed ledger: the broker kept the topic, fenced, for ever, and every consumer after that was answered
``Retryable: cursor not persisted: the topic is fenced`` until its client timed out (no producer was left to
find the fence on an append)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import zk
from ledger_client import BookKeeper, ClientConfig
from tests.broker_testing import start_broker
from topic_broker.cursor import InitialPosition, ManagedCursor
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, ManagedLedgerFencedError
from zk import layout
from zk.managed_ledgers import BrokerMetadataStore

pulsar = pytest.importorskip("pulsar")

ML = "public/default/persistent/lost-reply"
SMALL = dict(ensemble_size=2, write_quorum=2, ack_quorum=2, min_rollover_time_s=0.0)


def test_a_cursor_write_whose_reply_was_lost_is_not_another_owners_but_a_real_one_fences(bookies) -> None:
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store = BrokerMetadataStore(bk.store)
            ml = await ManagedLedger.open(bk, store, ML, ManagedLedgerConfig(**SMALL))
            positions = [await ml.append(b"m%d" % i) for i in range(6)]
            cur = await ManagedCursor.open(ml, "sub", InitialPosition.EARLIEST, flush_interval_s=3600)
            real_set = bk.store.aset
            lost = []

            async def applied_but_no_answer(path: str, value: Any, version: int) -> Any:
                await real_set(path, value, version)
                lost.append(path)
                raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s (the reply was lost)")

            bk.store.aset = applied_but_no_answer  # type: ignore[method-assign]
            cur.ack_cumulative(positions[1])
            with pytest.raises(zk.MetadataConnectionError):
                await cur.flush()
            bk.store.aset = real_set  # type: ignore[method-assign]
            assert lost
            cur.ack_cumulative(positions[3])
            await cur.flush()  # the stored cursor is our own lost write: no fence
            assert not ml.fenced
            await ml.tick()
            assert tuple((await store.get_cursor(ML, "sub")).value.mark_delete) == tuple(positions[3])

            # another writer's change still fences, and the next tick says so (the broker's cue to let go)
            stored = await store.get_cursor(ML, "sub")
            await bk.store.aset(layout.ml_cursor_path(ML, "sub"), stored.value.to_json(), stored.version)
            cur.ack_cumulative(positions[4])
            with pytest.raises(ManagedLedgerFencedError):
                await cur.flush()
            assert ml.fenced
            with pytest.raises(ManagedLedgerFencedError):
                await ml.tick()
            await ml.close()
        finally:
            await bk.close()

    asyncio.run(body())


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
