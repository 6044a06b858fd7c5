"""Tests for the bugs planted in the audit of 2026-11-28 against 417011a that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of topic compaction and the fixes since"): each fails with its
bug planted and passes without it. Real ZooKeeper, bookie and broker processes, the official ``pulsar-client``."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import zk
from bookie.main import RESTARTED_FOR_ROOM_ENV
from ledger_client import BookKeeper, ClientConfig
from tests.broker_testing import Brokers
from tests.faults import test_compaction_record_faults as faults
from tests.integration.test_bookie_disk_full import small_fs  # noqa: F401 (a fixture)
from tests.integration.test_bookie_disk_full2 import killed_with_journal_entries_on_a_full_disk, read_all_back
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_compaction import (  # (brokers, c: the module's broker, a client of it)
    brokers,  # noqa: F401
    c,  # noqa: F401
    compact,
    compacted_consumer,
    send_all,
    topic_path,
    wait_for,
)
from tests.integration.test_broker_pulsar_client import topic_name
from topic_broker.compaction import COMPACTION_SUBSCRIPTION
from zk import layout

pulsar = pytest.importorskip("pulsar")


def backlog(b: Brokers, t: str, sub: str = "s") -> int:
    stats = admin(b.procs[0], "GET", topic_path(t) + "/stats")
    return int(stats["subscriptions"][sub]["msgBacklog"])


def test_an_unacked_message_of_the_compacted_ledger_is_redelivered(
    c: Any,  # noqa: F811
    brokers: Brokers,  # noqa: F811
) -> None:
    """A compacted consumer's message served from the compacted ledger and not acknowledged comes back on a
    redelivery: the redelivery finds it by its original position there (not taken for compacted away, acked
    and lost, as when the look-up lands on the next kept entry)."""
    t, cons, got = compacted_consumer(c, brokers.procs[0])  # j1, k3 from the compacted ledger, j2 after
    cons.acknowledge(got[1])
    cons.acknowledge(got[2])  # j1 is not acknowledged
    cons.redeliver_unacknowledged_messages()
    again = cons.receive(10_000)
    assert (again.partition_key(), again.data(), str(again.message_id())) == (
        "j",
        b"1",
        str(got[0].message_id()),
    )
    cons.acknowledge(again)
    wait_for("the subscription's backlog to drain", lambda: backlog(brokers, t) == 0)
    cons.close()


def test_a_tombstone_at_the_horizon_does_not_hold_the_backlog(
    c: Any,  # noqa: F811
    brokers: Brokers,  # noqa: F811
) -> None:
    """A topic whose last message before the compaction is a tombstone: the compacted ledger ends before the
    horizon, and the ids between its last entry and the horizon (compacted away, never delivered) count as
    acknowledged once a compacted consumer has read the ledger to its end, so its backlog drains."""
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("k", b"1"), ("j", b"1"), ("k", b"")])  # the horizon: k's tombstone
    compact(brokers.procs[0], t)
    cons = c.subscribe(t, "s", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest)
    m = cons.receive(10_000)
    assert (m.partition_key(), m.data()) == ("j", b"1")
    cons.acknowledge(m)
    wait_for("the subscription's backlog to drain", lambda: backlog(brokers, t) == 0)
    with pytest.raises(pulsar.Timeout):
        cons.receive(1000)
    cons.close()


def test_a_compacted_reader_starting_at_the_horizon_reads_the_compacted_view(
    c: Any,  # noqa: F811
    brokers: Brokers,  # noqa: F811
) -> None:
    """A compacted reader whose start is the horizon's own entry (inclusive: here a batch whose first message a
    later one of its key superseded) reads that entry from the compacted view, where the superseded message is
    compacted out, not from the topic, which still holds it; what follows the horizon comes from the topic."""
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("j", b"1")])
    bp = c.create_producer(
        t, batching_enabled=True, batching_max_messages=2, batching_max_publish_delay_ms=60_000
    )
    for value in (b"1", b"2"):  # one batch entry, the horizon
        bp.send_async(value, None, partition_key="d")
    bp.flush()
    plain = c.create_reader(t, pulsar.MessageId.earliest)
    first_of_batch = [plain.read_next(10_000) for _ in range(2)][1].message_id()  # d's first value
    plain.close()
    compact(brokers.procs[0], t)
    send_all(p, [("j", b"2")])
    r = c.create_reader(t, first_of_batch, is_read_compacted=True, start_message_id_inclusive=True)
    got = [r.read_next(10_000) for _ in range(2)]
    assert [(m.partition_key(), m.data()) for m in got] == [("d", b"2"), ("j", b"2")]  # not d's first value
    r.close()


def test_a_compaction_whose_record_and_its_undo_both_fail_keeps_the_ledger_the_cursor_names(bookies) -> None:
    """ZooKeeper away for both saves of a compaction's record: the first applied with its reply lost (the stored
    cursor names the new ledger), the undo (the previous record saved again) not. The new ledger is kept, left
    over at worst, never deleted: a new owner after a crash opens the ledger the stored cursor names."""
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store, config, ml, comp = await faults.keyed_topic(bk)
            await comp.compact()
            for i in range(4, 8):
                await ml.append(faults.keyed(f"k{i % 2}", b"v%d" % i))
            cursor_path = layout.ml_cursor_path(faults.ML, COMPACTION_SUBSCRIPTION)
            real_set = bk.store.aset
            calls = 0

            async def away(path: str, value: Any, version: int) -> Any:
                nonlocal calls
                if path != cursor_path:
                    return await real_set(path, value, version)
                calls += 1
                if calls == 1:  # the save naming the ledger being written
                    return await real_set(path, value, version)
                if calls == 2:
                    await real_set(path, value, version)  # applied, its reply lost
                raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

            bk.store.aset = away  # type: ignore[method-assign]
            with pytest.raises(zk.MetadataConnectionError):
                await comp.compact()
            bk.store.aset = real_set  # type: ignore[method-assign]
            assert calls == 3
            recorded = await faults.recorded_ledger(store)
            assert comp.view is not None and recorded != comp.view.ledger_id  # the new ledger, recorded
            await faults.assert_ledger_exists(bk, recorded, config.password)  # not deleted
            await comp.close()
            await ml.close()
        finally:
            await bk.close()

    asyncio.run(body())


def test_a_bookie_waiting_for_room_starts_only_below_the_low_water_mark_and_stops_when_told(
    bookies,
    small_fs: Path,  # noqa: F811
) -> None:
    """A bookie of its own restart that found its disk full again waits until usage is below the low-water mark
    (90 %), as the readonly bookie it was waited for its restart, not merely below the threshold (95 %): with
    usage in between it neither starts nor tries to (its start would fill the disk again at once). A SIGTERM
    while it waits stops it (exit 0); it is not taken for room."""
    bp, filler = killed_with_journal_entries_on_a_full_disk(bookies, small_fs, 7)
    bp.env[RESTARTED_FOR_ROOM_ENV] = "1"
    bp.start(wait=False)
    line = "the disk filled again before storage reopened"
    deadline = time.monotonic() + 60
    while line not in bp.log_tail(50):
        assert bp.alive and time.monotonic() < deadline, bp.log_tail(50)
        time.sleep(0.2)
    du = shutil.disk_usage(small_fs)
    os.truncate(filler, filler.stat().st_size - (du.used - int(du.total * 0.925)))  # usage 92.5 %
    du = shutil.disk_usage(small_fs)
    assert 0.91 < du.used / du.total < 0.94, du
    time.sleep(3)  # three checks of the disk (one a second)
    log = bp.log_tail(400)
    assert bp.alive and not bp.healthy(), log[-3000:]
    assert log.count(line) == 1, log[-3000:]  # no second try
    assert bp.proc is not None
    bp.proc.send_signal(signal.SIGTERM)  # an operator's stop while it waits
    assert bp.wait_exit(30) == 0, bp.log_tail(50)
    assert bp.log_tail(400).count(line) == 1
    filler.unlink()
    del bp.env[RESTARTED_FOR_ROOM_ENV]
    bp.start()
    read_all_back(bp, 7)
