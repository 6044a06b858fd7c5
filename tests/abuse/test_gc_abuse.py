"""Garbage collection cannot be tricked into deleting ledgers, and never holds up a stopping bookie."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

from bookie import protocol as p
from ledger_client.sync import BookKeeper
from tests.abuse.helpers import http, ledger_ids, metric
from tests.integration.rawbookie import RawBookie
from zk import MetadataStore, layout


def test_a_missing_ledgers_node_deletes_nothing_and_a_really_deleted_ledger_goes(bookies) -> None:
    bp = bookies.start("--gc-interval-s", "3600")
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        ids = []
        for i in range(3):
            lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"pw")
            lh.append_many([b"entry %d" % i] * 5)
            lh.close()
            ids.append(lh.ledger_id)
        assert ledger_ids(bp) == set(ids)
        doomed, kept = ids[0], ids[1:]
        # deleting one ledger's metadata is a real deletion: that ledger goes, and only it
        store.delete(layout.ledger_path(doomed))
        status, body = http(bp, "PUT", "/api/v1/gc")
        assert status == 200, body
        assert body["ledgers"]["deleted"] == [doomed]
        assert ledger_ids(bp) == set(kept)
        # the whole ledgers node gone (the attack): the pass is refused, nothing is deleted
        store.delete(layout.LEDGERS, recursive=True)
        status, body = http(bp, "PUT", "/api/v1/gc")
        assert status == 409 and "ledgers node is missing" in body["error"], body
        assert ledger_ids(bp) == set(kept)
        # ... and so is a ledgers node without children
        store.ensure(layout.LEDGERS)
        status, body = http(bp, "PUT", "/api/v1/gc")
        assert status == 409 and "no children" in body["error"], body
        assert ledger_ids(bp) == set(kept)
        assert metric(bp, "bookie_gc_refused_total") == 2
        assert metric(bp, "bookie_gc_deleted_ledgers_total") == 1
        assert "gc refused" in bp.log_tail(200)
    finally:
        bk.close()
        store.close()


def _squat(address: str, first: int, n: int) -> None:
    """``n`` ledgers with one entry each and no metadata (what a stranger can make any bookie store)."""

    async def go() -> None:
        raw = await RawBookie.open(address)
        for lid in range(first, first + n, 50):
            statuses = await asyncio.gather(*(raw.add(x, 0) for x in range(lid, min(lid + 50, first + n))))
            assert set(statuses) == {p.Status.OK}
        raw.close()

    asyncio.run(go())


def test_a_gc_request_whose_caller_left_stops_and_sigterm_during_gc_exits_fast_and_clean(bookies) -> None:
    bp = bookies.start("--gc-interval-s", "3600", "--gc-deletions-max", "100000")
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"pw")
        lh.append(b"real")
        lh.close()
    finally:
        bk.close()
    _squat(bp.id, 10_000, 3000)
    assert len(ledger_ids(bp)) == 3001
    # a caller that gives up after half a second: its pass stops soon after
    try:
        http(bp, "PUT", "/api/v1/gc", timeout_s=0.5)
    except OSError:
        pass
    deadline = time.monotonic() + 10
    while metric(bp, "bookie_gc_stopped_total") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(bp, "bookie_gc_stopped_total") == 1
    left = len(ledger_ids(bp))
    time.sleep(1.0)
    assert len(ledger_ids(bp)) == left > 1, "a pass whose caller left must not go on deleting"
    # SIGTERM while a long pass runs: the process exits within seconds, cleanly
    runner = threading.Thread(target=lambda: _quiet_gc(bp), daemon=True)
    runner.start()
    time.sleep(1.0)
    assert bp.proc is not None
    t0 = time.monotonic()
    bp.proc.send_signal(signal.SIGTERM)
    code = bp.wait_exit(15)
    took = time.monotonic() - t0
    assert code == 0 and took < 8, (code, took, bp.log_tail(40))
    log = bp.log_tail(400)
    assert "Traceback" not in log and "stopped" in log, log


def _quiet_gc(bp) -> None:
    try:
        http(bp, "PUT", "/api/v1/gc", timeout_s=60)
    except OSError:
        pass


def test_a_ledger_id_past_the_largest_added_by_a_stranger_is_collected_and_blocks_no_pass(bookies) -> None:
    """The wire's ledger id is a u64, a ledger's at most 2^63-1: an add naming 2^63 was stored, and then every
    gc pass failed on it (its znode path cannot be made), and the ledgers to delete beside it stayed."""
    bp = bookies.start("--gc-interval-s", "3600")
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"pw")
        lh.append_many([b"kept"] * 3)
        lh.close()
    finally:
        bk.close()

    async def strangers_adds() -> None:
        raw = await RawBookie.open(bp.id)
        try:
            assert await raw.add(2**63, 0) == p.Status.OK
            assert await raw.add(10**12, 0) == p.Status.OK  # in range, in no metadata either
        finally:
            raw.close()

    asyncio.run(strangers_adds())
    assert ledger_ids(bp) == {lh.ledger_id, 2**63, 10**12}
    status, body = http(bp, "PUT", "/api/v1/gc")
    assert status == 200, body
    assert sorted(body["ledgers"]["deleted"]) == [10**12, 2**63], body
    assert ledger_ids(bp) == {lh.ledger_id}
