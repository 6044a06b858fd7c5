"""Checks that fail on bugs a reviewer planted in the Spark sources and the existing tests let through (see the
planted-bug audit in ``docs/architecture.md`` §11): the ledger reader's byte cap per Arrow batch, the topic
stream's AvailableNow target under a writer that keeps appending."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ledger_client import ClientConfig
from ledger_client.client import EntryBatch
from spark.ledger_source import _Payloads
from tests.spark.test_topic_source import PW, Broker


async def _runs(runs: list[tuple[int, list[bytes]]]) -> AsyncIterator[EntryBatch]:
    for first, payloads in runs:
        yield EntryBatch(5, first, payloads)


def _take_all(runs: list[tuple[int, list[bytes]]], max_rows: int, max_bytes: int) -> list[list[bytes]]:
    async def go() -> list[list[bytes]]:
        p = _Payloads(_runs(runs), runs[0][0] if runs else 0)
        out = []
        while chunks := await p.take(max_rows, max_bytes):  # (a batch's payloads, in chunks as read)
            out.append([payload for chunk in chunks for payload in chunk])
        return out

    return asyncio.run(go())


def test_a_batch_ends_with_the_entry_that_reaches_the_byte_cap_so_a_huge_entry_is_never_dropped() -> None:
    """The byte cap closes a batch after the entry that reaches it: an entry larger than the cap is a batch of
    its own (a batch of none would end the range's read there and lose the rest of it silently)."""
    small = [bytes([i]) * 40 for i in range(6)]
    # 40 + 40 + 40 reaches 100 at the third entry: batches of three, carried over between runs
    got = _take_all([(10, small[:4]), (14, small[4:])], max_rows=100, max_bytes=100)
    assert got == [small[:3], small[3:6]]
    huge = [b"a" * 250, b"b" * 10, b"c" * 300, b"d" * 300]
    got = _take_all([(0, huge)], max_rows=100, max_bytes=100)
    assert got == [[huge[0]], [huge[1], huge[2]], [huge[3]]]
    # the row cap still holds beside it, and every entry comes out once, in order
    got = _take_all([(3, small), (9, huge)], max_rows=4, max_bytes=10**6)
    assert [len(b) for b in got] == [4, 4, 2] and sum(got, []) == small + huge


# --- the topic stream's AvailableNow target (driver side, live bookies and ZooKeeper, no Spark session) -----------


def test_available_now_reads_to_the_positions_seen_when_it_started_while_the_writer_appends_on(
    bookies: Any,
) -> None:
    """``Trigger.AvailableNow`` stops at the latest positions of when the query started: entries appended
    meanwhile are the next run's (a query chasing a busy topic would never end)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark._topic_offsets import positions_from_json
    from spark.topic_source import TOPIC_SCHEMA, TopicDataSource

    bookies.start_many(3)
    broker = Broker(bookies)
    topic = "persistent://public/default/target"
    options = {
        "zk": bookies.zk,
        "zkRoot": bookies.root,
        "password": PW,
        "topic": topic,
        "startingOffsets": "earliest",
        "subscriptionName": "spark-target",
        "maxEntriesPerTrigger": 4,
    }
    src = TopicDataSource(options).streamReader(TOPIC_SCHEMA)
    try:
        before = broker.write(topic, 10, "a", batch_every=0)  # 7 entries a ledger: A closed, B open with 3
        start = src.initialOffset()
        src.prepareForTriggerAvailableNow()
        after = broker.write(topic, 10, "b", batch_every=0)  # fills B, rolls over to C
        b_ledger = before[-1].pos[0]
        assert after[-1].pos[0] > b_ledger
        # all at once, and in micro-batches of maxEntriesPerTrigger: never past the last entry written before the start
        end = positions_from_json(src.latestOffset(start, ReadAllAvailable()))[topic]
        assert (b_ledger, 2) <= end <= (b_ledger, 3), end  # B's LAC may lag its last add by one entry
        pos, steps = start, 0
        while True:
            nxt = src.latestOffset(pos, src.getDefaultReadLimit())
            if nxt == pos:
                break
            pos, steps = nxt, steps + 1
            assert steps < 10
        assert positions_from_json(pos)[topic] == end and steps == 3
    finally:
        src.stop()
        broker.close()


def test_entries_missing_from_a_ledger_that_still_exists_fail_the_range_even_with_fail_on_data_loss_false(
    bookies: Any,
) -> None:
    """failOnDataLoss=false skips a ledger deleted under the query, never one that is still there: entries no
    bookie serves fail the read instead of ending the range early (rows missing with no error)."""
    from bookie.storage import RocksLedgerStorage, run_key
    from ledger_client import NoSuchEntryError, NoSuchLedgerError
    from ledger_client.sync import BookKeeper as SyncBookKeeper
    from spark.ledger_source import LEDGER_SCHEMA, LedgerRange, read_range
    from spark.options import parse_ledger_options

    procs = bookies.start_many(2)
    bk = SyncBookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        lh = bk.create_ledger(2, 2, 2, password=b"pw")
        lh.append_many([b"x%d" % i for i in range(130)])
        lh.close()
    finally:
        bk.close()
    for bp in procs:  # both replicas lose entries 64..127 (the runs stored in that block of ids)
        bp.stop()
        s = RocksLedgerStorage(bp.data_dir / "ledgers")
        try:
            for first, _ in s.runs(lh.ledger_id, 63, 1000):
                if first < 128:
                    s._db.delete(run_key(lh.ledger_id, first))
            s.flush()
        finally:
            s.close()
        bp.start()
    opts = parse_ledger_options(
        {"zk": bookies.zk, "zkRoot": bookies.root, "password": "pw", "failOnDataLoss": "false"}
    )
    rows = 0
    with pytest.raises((NoSuchEntryError, NoSuchLedgerError)):
        for batch in read_range(opts, LedgerRange(lh.ledger_id, 0, 129, "CLOSED", 0), LEDGER_SCHEMA):
            rows += batch.num_rows
    assert rows <= 64


def test_a_batch_messages_id_carries_its_index_and_the_batchs_size(bookies: Any) -> None:
    """``__messageId`` of a message in a batch entry holds ``batch_index`` and ``batch_size`` (what Pulsar's
    clients serialise, and need to acknowledge or seek to it); a message of its own entry holds neither."""
    from spark.topic_source import TOPIC_SCHEMA, TopicDataSource
    from topic_broker import pulsar_api_pb2 as pb

    bookies.start_many(3)
    broker = Broker(bookies)
    try:
        topic = "persistent://public/default/ids"
        msgs = broker.write(topic, 6, "m")  # every third entry a batch of three messages
        broker.close_topic(topic)
    finally:
        broker.close()
    reader = TopicDataSource(
        {"zk": bookies.zk, "zkRoot": bookies.root, "password": PW, "topic": topic}
    ).reader(TOPIC_SCHEMA)
    got = []
    for part in reader.partitions():
        for batch in reader.read(part):
            for raw in batch.column("__messageId").to_pylist():
                mid = pb.MessageIdData.FromString(raw)
                got.append(
                    (
                        mid.ledgerId,
                        mid.entryId,
                        mid.batch_index if mid.HasField("batch_index") else -1,
                        mid.batch_size if mid.HasField("batch_size") else 0,
                    )
                )
    want = [(*m.pos, 3 if m.pos[2] >= 0 else 0) for m in msgs]
    assert sorted(got) == sorted(want) and len(want) == 6 + 2 * 2
