"""The ledger client against real ZooKeeper and real bookie processes on loopback."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from ledger_client import (
    BookKeeper,
    ClientConfig,
    LedgerFencedError,
    NotEnoughBookiesError,
    ReadBeyondLacError,
    UnauthorizedError,
)
from ledger_client.bookie_conn import connect
from ledger_client.quorum import write_set
from tests.metrics_testing import scrape

PW = b"secret"


def payload(i: int, size: int = 64) -> bytes:
    return (f"entry-{i}-".encode() * size)[:size]


async def _bk(bookies, **cfg) -> BookKeeper:
    return await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, **cfg))


def _with_request_id(build: Callable[..., p.Request]) -> Callable[[int], p.Request]:
    return lambda rid: build(request_id=rid)


async def _read_all(lh) -> list[bytes]:
    return [e.data async for e in lh.read(0, lh.last_add_confirmed)] if lh.last_add_confirmed >= 0 else []


def test_write_close_read_round_trip(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 2, 2, password=PW, custom_metadata={"app": b"x"})
        ids = [await lh.append(payload(i)) for i in range(50)]
        futs = [await lh.append_future(payload(i)) for i in range(50, 500)]
        ids += list(await asyncio.gather(*futs))
        assert ids == list(range(500))
        assert lh.last_add_confirmed == 499
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert md.state.value == "CLOSED" and md.last_entry_id == 499
        assert md.length == sum(len(payload(i)) for i in range(500))
        assert md.custom_metadata == {"app": b"x"}
        rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=True)
        assert rh.last_add_confirmed == 499
        assert await _read_all(rh) == [payload(i) for i in range(500)]
        assert lh.ledger_id in await bk.list_ledgers()
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(lh.ledger_id, password=b"wrong")
        with pytest.raises(ReadBeyondLacError):
            async for _ in rh.read(0, 500):
                pass
        await bk.delete_ledger(lh.ledger_id)
        assert lh.ledger_id not in await bk.list_ledgers()
        await bk.close()

    asyncio.run(go())


def test_tailing_reader_sees_entries_as_lac_advances(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        reader_bk = await _bk(bookies)
        rh = await reader_bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        seen: list[bytes] = []

        async def follow() -> None:
            async for e in rh.tail(0, poll_timeout_s=0.5):
                seen.append(e.data)

        task = asyncio.create_task(follow())
        for i in range(30):
            await lh.append(payload(i))
            await asyncio.sleep(0.01)
        await lh.close()
        await asyncio.wait_for(task, 20)
        # The LAC trails the last add by one until close; the tail reads to last_entry_id once CLOSED.
        assert seen == [payload(i) for i in range(30)]
        assert lh.metadata.state.value == "CLOSED"
        await bk.close()
        await reader_bk.close()

    asyncio.run(go())


def test_kill9_bookie_while_appending_changes_ensemble_and_loses_nothing(bookies) -> None:
    procs = bookies.start_many(4)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=2.0)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        victim = next(bp for bp in procs if bp.id == lh.metadata.last_ensemble.bookies[1])
        acked: dict[int, bytes] = {}

        async def writer() -> None:
            for i in range(600):
                eid = await lh.append(payload(i, 200))
                acked[eid] = payload(i, 200)
                if i == 200:
                    victim.kill9()

        await asyncio.wait_for(writer(), 60)
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 2, md.ensembles
        assert victim.id not in md.ensembles[1].bookies
        assert md.last_entry_id == 599
        rh = await bk.open_ledger(lh.ledger_id, password=PW)
        data = await _read_all(rh)
        assert {i: d for i, d in enumerate(data)} == acked
        await bk.close()

    asyncio.run(go())


def test_a_blocked_event_loop_is_not_taken_for_timed_out_bookies(bookies) -> None:
    """The application blocks the client's loop for longer than add_timeout_s twice in a row (here time.sleep;
    in life a gather over millions of futures, which took 31 s in ``ledger write -n 2000000``) while adds are in
    flight. The bookies acked in time, their acks wait unread in the sockets: the timeout sweep that runs
    right after a stall must not count it against them (with only three bookies, that ledger would fail with
    NOT_ENOUGH_BOOKIES)."""
    import time

    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=1.0)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        futs = []
        for round_ in range(2):
            futs += [await lh.append_future(payload(100 * round_ + i)) for i in range(100)]
            time.sleep(1.3)  # blocks the loop: the sweep's timer falls due meanwhile
            await asyncio.sleep(0)
        assert await asyncio.wait_for(asyncio.gather(*futs), 10) == list(range(200))
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 1 and md.last_entry_id == 199
        await bk.close()

    asyncio.run(go())


def test_a_bookie_that_stops_reading_throttles_then_is_replaced(bookies) -> None:
    """SIGSTOP one bookie of a 3/3/2 ledger: its two peers still ack every entry, so nothing times out, but the
    client's unsent bytes toward the stopped bookie would grow without limit. They stop at the connection's
    high-water mark (appends wait), and once the bookie has not drained it for add_timeout_s it is replaced."""
    from ledger_client.bookie_conn import WRITE_BUFFER_HIGH

    procs = bookies.start_many(4)
    size = 32 * 1024

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=2.0, outstanding_adds_max=32)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        victim = next(bp for bp in procs if bp.id == lh.metadata.last_ensemble.bookies[2])
        acked: dict[int, bytes] = {}
        most_buffered = 0

        async def writer() -> None:
            nonlocal most_buffered
            for i in range(2000):  # ~64 MiB: four times the high-water mark
                eid = await lh.append(payload(i, size))
                acked[eid] = payload(i, size)
                if i == 50:
                    victim.pause()
                conn = bk.pool.get_nowait(victim.id)
                if conn is not None and conn.transport is not None:
                    most_buffered = max(most_buffered, conn.transport.get_write_buffer_size())

        try:
            await asyncio.wait_for(writer(), 90)
        finally:
            victim.resume()
        await lh.close()
        assert most_buffered <= WRITE_BUFFER_HIGH + 32 * (size + 100), most_buffered
        md = await bk.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 2, md.ensembles
        assert victim.id not in md.ensembles[1].bookies
        rh = await bk.open_ledger(lh.ledger_id, password=PW)
        assert {i: d for i, d in enumerate(await _read_all(rh))} == acked
        await bk.close()

    asyncio.run(go())


def test_deleted_ledger_is_garbage_collected_from_its_bookie(bookies) -> None:
    import urllib.error
    import urllib.request

    # frequent checkpoints: the entries reach RocksDB's blob files (two ledgers interleave) before the delete
    bp = bookies.start("--gc-interval-s", "0.5", "--checkpoint-interval-s", "0.2")

    def status(lid: int) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/api/v1/ledgers/{lid}") as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    async def go() -> None:
        bk = await _bk(bookies)
        doomed = await bk.create_ledger(1, 1, 1, password=PW)
        kept = await bk.create_ledger(1, 1, 1, password=PW)
        for i in range(500):
            await doomed.append(payload(i, 1024))
            await kept.append(payload(i, 1024))
        await doomed.close()
        await kept.close()
        assert status(doomed.ledger_id) == 200
        await bk.delete_ledger(doomed.ledger_id)
        for _ in range(100):
            if status(doomed.ledger_id) == 404:
                break
            await asyncio.sleep(0.1)
        assert status(doomed.ledger_id) == 404, "the bookie kept a ledger deleted from metadata"
        conn = await connect(bp.id)
        resp = await conn.request(
            lambda rid: p.ReadEntryRequest(
                request_id=rid, ledger_id=doomed.ledger_id, entry_id=0, master_key=p.master_key(PW)
            ),
            5.0,
        )
        assert resp.status in (p.Status.NO_LEDGER, p.Status.NO_ENTRY)
        conn.close()
        rh = await bk.open_ledger(kept.ledger_id, password=PW)
        assert await _read_all(rh) == [payload(i, 1024) for i in range(500)]
        # The deleted ledger's entries share blob files with the kept one's: garbage, under the default
        # --storage-blob-gc-min-mb, until the admin API asks for a pass.
        assert _metric(bp, "bookie_storage_blob_garbage_bytes") >= 400 * 1024
        req = urllib.request.Request(f"http://127.0.0.1:{bp.http_port}/api/v1/gc", method="PUT")
        with urllib.request.urlopen(req) as r:
            done = json.load(r)
        assert done["blob_gc_pass"]["reclaimed_bytes"] >= 400 * 1024, done
        assert done["blob_garbage_bytes"] == 0, done
        assert _metric(bp, "bookie_storage_blob_gc_passes_total") == 1
        assert _metric(bp, "bookie_storage_blob_gc_reclaimed_bytes_total") >= 400 * 1024
        rh = await bk.open_ledger(kept.ledger_id, password=PW)
        assert await _read_all(rh) == [payload(i, 1024) for i in range(500)]
        await bk.close()

    asyncio.run(go())


def test_blob_storage_stays_bounded_while_ledgers_beside_a_long_lived_one_are_deleted(bookies) -> None:
    """Retention's pattern: one long-lived ledger written beside a stream of short-lived ones, each deleted in
    turn. The long-lived ledger's entries are in every blob file, so deleting the others frees no file by
    itself; the bookie's blob garbage passes keep what it stores within 1 / (1 - ratio) of the live entries
    (plus the minimum and the round in flight), where without them it would hold everything ever written."""
    bp = bookies.start(
        "--gc-interval-s", "0.3", "--checkpoint-interval-s", "0.2", "--storage-blob-gc-min-mb", "1"
    )  # fmt: skip
    size, rounds, per_round, per_round_kept = 1024, 8, 1000, 150

    async def go() -> None:
        bk = await _bk(bookies)
        kept = await bk.create_ledger(1, 1, 1, password=PW)
        n_kept = 0
        for _ in range(rounds):
            doomed = await bk.create_ledger(1, 1, 1, password=PW)
            adds = [doomed.append(payload(i, size)) for i in range(per_round)]
            for j in range(per_round_kept):
                adds.insert(j * (per_round // per_round_kept), kept.append(payload(n_kept + j, size)))
            n_kept += per_round_kept
            await asyncio.gather(*adds)
            await doomed.close()
            await asyncio.sleep(0.3)  # a checkpoint: the round's entries are in blob files before the delete
            await bk.delete_ledger(doomed.ledger_id)
        live = n_kept * size
        written = rounds * (per_round + per_round_kept) * size
        bound = 2 * live + 1024 * 1024 + per_round * size * 2  # ratio 0.5, the minimum, a round's slack

        def stored() -> float:
            return _metric(bp, "bookie_storage_blob_bytes") + _metric(bp, "bookie_storage_sst_bytes")

        for _ in range(100):  # the last deletes and passes happen in the bookie's next GC rounds
            if stored() <= bound:
                break
            await asyncio.sleep(0.1)
        assert stored() <= bound < written * 0.75, (stored(), bound, written)
        assert _metric(bp, "bookie_storage_blob_gc_passes_total") >= 1
        await kept.close()
        rh = await bk.open_ledger(kept.ledger_id, password=PW)
        assert await _read_all(rh) == [payload(i, size) for i in range(n_kept)]
        await bk.close()

    asyncio.run(go())


def _metric(bp: Any, name: str) -> float:

    m = scrape(f"http://127.0.0.1:{bp.http_port}/metrics")
    assert name in m, f"no {name} in /metrics"
    return m[name]


def test_recovery_while_writer_appends_fences_the_writer_and_keeps_every_ack(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        acked: dict[int, bytes] = {}
        fenced = asyncio.Event()

        async def writer() -> None:
            i = 0
            try:
                while True:
                    eid = await lh.append(payload(i))
                    acked[eid] = payload(i)
                    i += 1
            except LedgerFencedError:
                fenced.set()

        wt = asyncio.create_task(writer())
        while len(acked) < 200:
            await asyncio.sleep(0.01)
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW, recovery=True)
        await asyncio.wait_for(wt, 30)
        assert fenced.is_set()
        md = rh.metadata
        assert md.state.value == "CLOSED"
        assert max(acked) <= md.last_entry_id
        data = await _read_all(rh)
        for eid, d in acked.items():
            assert data[eid] == d
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")
        with pytest.raises(LedgerFencedError):
            await lh.close()
        await bk.close()
        await bk2.close()

    asyncio.run(go())


def test_concurrent_recoverers_agree_on_one_last_entry_id(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        for i in range(100):
            await lh.append(payload(i))
        # The writer disappears without closing; several clients recover at once.
        recoverers = [await _bk(bookies) for _ in range(4)]
        handles = await asyncio.gather(*(r.open_ledger(lh.ledger_id, password=PW) for r in recoverers))
        lasts = {h.last_add_confirmed for h in handles}
        md = await bk.ledger_metadata(lh.ledger_id)
        assert lasts == {md.last_entry_id} and md.last_entry_id >= 99
        for r in recoverers:
            await r.close()
        await bk.close()

    asyncio.run(go())


def test_unrecoverable_tail_is_cut_never_half_kept(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(10):
            await lh.append(payload(i))
        ens = lh.metadata.last_ensemble.bookies
        # Entry 10 reached no bookie; entry 11 reached only one (the writer died mid-flight).
        codec = EntryCodec(lh.ledger_id, DigestType.CRC32C)
        conn = await connect(ens[0])
        key = p.master_key(PW)
        e11 = codec.build(11, 9, 12 * 64, payload(11))
        resp = await conn.request(
            lambda rid: p.AddEntryRequest(
                request_id=rid, ledger_id=lh.ledger_id, entry_id=11, master_key=key, entry=e11
            ),
            5,
        )
        assert resp.status == p.Status.OK
        conn.close()
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW)
        assert rh.metadata.last_entry_id == 9
        assert await _read_all(rh) == [payload(i) for i in range(10)]
        await bk.close()
        await bk2.close()

    asyncio.run(go())


def test_entry_on_one_bookie_is_either_recovered_to_quorum_or_cut(bookies) -> None:
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(5):
            await lh.append(payload(i))
        ens = lh.metadata.last_ensemble.bookies
        codec = EntryCodec(lh.ledger_id, DigestType.CRC32C)
        conn = await connect(ens[2])
        key = p.master_key(PW)
        e5 = codec.build(5, 4, 6 * 64, payload(5))
        await conn.request(
            lambda rid: p.AddEntryRequest(
                request_id=rid, ledger_id=lh.ledger_id, entry_id=5, master_key=key, entry=e5
            ),
            5,
        )
        conn.close()
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW)
        last = rh.metadata.last_entry_id
        assert last in (4, 5)
        if last == 5:  # recovered: now on >= Qa bookies, and readable
            holders = 0
            for b in ens:
                c = await connect(b)
                r = await c.request(
                    lambda rid: p.ReadEntryRequest(
                        request_id=rid, ledger_id=lh.ledger_id, entry_id=5, master_key=key
                    ),
                    5,
                )
                holders += r.status == p.Status.OK
                c.close()
            assert holders >= 2
        assert await _read_all(rh) == [payload(i) for i in range(last + 1)]
        assert len(procs) == 3
        await bk.close()
        await bk2.close()

    asyncio.run(go())


def test_recovery_write_back_reaches_a_replacement_named_by_the_close(bookies) -> None:
    """Entries 10..13 of an E3/Qw3/Qa2 ledger are on two bookies only, the third is dead: recovery writes them
    back, the dead bookie's failure replaces it, and its replacement is named in the closed metadata. Every live
    bookie the close names for a recovered entry holds it once recovery returns (the resends to the replacement
    are sent and answered, not dropped when the other two acks already make Qa)."""
    procs = bookies.start_many(4)
    by_id = {bp.id: bp for bp in procs}

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(10):
            await lh.append(payload(i))
        ens = lh.metadata.last_ensemble.bookies
        codec = EntryCodec(lh.ledger_id, DigestType.CRC32C)
        key = p.master_key(PW)
        for b in ens[1:]:
            conn = await connect(b)
            for eid in range(10, 14):
                entry = codec.build(eid, 9, (eid + 1) * 64, payload(eid))
                add = functools.partial(
                    p.AddEntryRequest, ledger_id=lh.ledger_id, entry_id=eid, master_key=key, entry=entry
                )
                resp = await conn.request(_with_request_id(add), 5)
                assert resp.status == p.Status.OK
            conn.close()
        await bk.close()  # the writer is gone, its ledger left OPEN
        by_id[ens[0]].kill9()
        live = set(by_id) - {ens[0]}
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW)
        md = rh.metadata
        assert md.last_entry_id == 13
        for eid in range(10, 14):
            members = [md.ensemble_at(eid).bookies[i] for i in write_set(eid, 3, 3)]
            for b in sorted(set(members) & live):
                c = await connect(b)
                read = functools.partial(
                    p.ReadEntryRequest, ledger_id=lh.ledger_id, entry_id=eid, master_key=key
                )
                r = await c.request(_with_request_id(read), 5)
                c.close()
                assert r.status == p.Status.OK, (eid, b, members, [e.bookies for e in md.ensembles])
        assert await _read_all(rh) == [payload(i) for i in range(14)]
        await bk2.close()

    asyncio.run(go())


@pytest.mark.skipif(os.environ.get("LEDGERSTORE_SKIP_SLOW") == "1", reason="slow")
def test_writer_without_enough_bookies_fails_cleanly(bookies) -> None:
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=1.0, ensemble_change_timeout_s=2.0)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await lh.append(b"first")
        procs[0].kill9()
        procs[1].kill9()
        with pytest.raises(Exception) as ei:
            for _ in range(20):
                await asyncio.wait_for(lh.append(b"more"), 20)
        assert ei.value.__class__.__name__ in ("NotEnoughBookiesError", "BookieUnavailableError")
        await bk.close()

    asyncio.run(go())


def test_explicit_lac_lets_a_tailing_reader_see_the_last_entry_before_close(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, explicit_lac_interval_s=0.1)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        for i in range(5):
            await lh.append(payload(i))
        reader = await _bk(bookies)
        rh = await reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        deadline = asyncio.get_running_loop().time() + 10
        while await rh.read_last_add_confirmed() < 4:
            assert asyncio.get_running_loop().time() < deadline, "explicit LAC never reached the reader"
            await asyncio.sleep(0.05)
        assert [e.data async for e in rh.read(0, 4)] == [payload(i) for i in range(5)]
        await lh.close()
        await bk.close()
        await reader.close()

    asyncio.run(go())


def test_ensemble_change_survives_a_lost_metadata_reply(bookies) -> None:
    """ZooKeeper applies the ensemble change but the reply is lost (connection loss): the writer must notice
    its own write on re-read and carry on, not fail (found by the simulator)."""
    import zk

    procs = bookies.start_many(4)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=2.0)
        real_write = bk.ledgers.write
        lost = []

        def write_then_lose_reply(ledger_id, new, expected):  # type: ignore[no-untyped-def]
            result = real_write(ledger_id, new, expected)
            if len(new.ensembles) > 1 and not lost:
                lost.append(result)
                raise zk.MetadataConnectionError("connection lost after the write was applied")
            return result

        bk.ledgers.write = write_then_lose_reply  # type: ignore[method-assign]
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        victim = next(bp for bp in procs if bp.id == lh.metadata.last_ensemble.bookies[0])
        for i in range(50):
            await lh.append(payload(i))
        victim.kill9()
        for i in range(50, 150):
            await asyncio.wait_for(lh.append(payload(i)), 30)
        assert lost, "the lost-reply path was not exercised"
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 2 and md.last_entry_id == 149
        rh = await bk.open_ledger(lh.ledger_id, password=PW)
        assert await _read_all(rh) == [payload(i) for i in range(150)]
        await bk.close()

    asyncio.run(go())


def test_placement_skips_a_decommissioning_bookie_and_spreads_over_racks(zk_connect, zk_store) -> None:
    """Bookies registered as znodes only (placement needs no bookie process): a bookie in
    ``bookies/decommissioning`` is never in a new ensemble nor a replacement; an explicit ensemble may still
    name it; ensembles span both racks."""
    from zk import BookieRegistry
    from zk.racks import set_rack
    from zk.underreplication import UnderReplicationManager

    ids = [f"127.0.0.1:{4000 + i}" for i in range(5)]
    registry = BookieRegistry(zk_store)
    for i, b in enumerate(ids):
        registry.register(b, {"host": "127.0.0.1", "port": 4000 + i})
        set_rack(zk_store, b, "/r/a" if i % 2 else "/r/b")
    draining = ids[2]
    UnderReplicationManager(zk_store).start_decommission(draining)

    async def go() -> None:
        bk = await BookKeeper.connect(zk_connect.connect_string, config=ClientConfig(zk_root=zk_connect.root))
        try:
            for _ in range(40):
                lh = await bk.create_ledger(3, 2, 2, password=PW)
                ensemble = lh.metadata.ensembles[0].bookies
                assert draining not in ensemble
                assert {"/r/a", "/r/b"} == {"/r/a" if ids.index(b) % 2 else "/r/b" for b in ensemble}
            for _ in range(40):  # ensemble change: 4 non-draining bookies, 3 in the ensemble, one failed
                ensemble = [ids[0], ids[1], ids[3]]
                assert await bk._replacements(ensemble, [0]) == [ids[4], ids[1], ids[3]]
            # all four others taken: no replacement rather than the draining bookie
            with pytest.raises(NotEnoughBookiesError):
                await bk._replacements([ids[0], ids[1], ids[3], ids[4]], [0])
            with pytest.raises(NotEnoughBookiesError):
                await bk.create_ledger(5, 2, 2, password=PW)
            lh = await bk.create_ledger(3, 2, 2, password=PW, bookies=[draining, ids[0], ids[1]])
            assert lh.metadata.ensembles[0].bookies == (draining, ids[0], ids[1])
            UnderReplicationManager(zk_store).end_decommission(draining)
            chosen = set()
            for _ in range(40):
                chosen |= set((await bk.create_ledger(3, 2, 2, password=PW)).metadata.ensembles[0].bookies)
            assert draining in chosen
        finally:
            await bk.close()
            registry.close()

    asyncio.run(go())


def test_ensemble_change_never_replaces_with_a_decommissioning_bookie(bookies) -> None:
    from zk.underreplication import UnderReplicationManager

    procs = {bp.id: bp for bp in bookies.start_many(5)}

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=2.0)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        first = lh.metadata.ensembles[0].bookies
        spare, draining = sorted(set(procs) - set(first))
        await asyncio.to_thread(UnderReplicationManager(bk.store).start_decommission, draining)
        for i in range(20):
            await lh.append(payload(i))
        procs[first[0]].kill9()
        for i in range(20, 60):
            await asyncio.wait_for(lh.append(payload(i)), 30)
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert [e.bookies for e in md.ensembles] == [first, (spare, *first[1:])]
        rh = await bk.open_ledger(lh.ledger_id, password=PW)
        assert await _read_all(rh) == [payload(i) for i in range(60)]
        await bk.close()

    asyncio.run(go())


def _in_a_fresh_process(script: str, *args: str, timeout_s: float = 60) -> list[str]:
    """The words ``script`` prints, run by a new Python process with ``args`` (the heap tests below need a process
    in which no earlier connect of the test run decided anything)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout_s, check=True
    ).stdout.split()


@pytest.mark.parametrize("freeze", [True, False])
def test_first_connect_freezes_the_heap_unless_told_not_to(zk_connect, freeze: bool) -> None:
    """The first connect of a process moves the objects alive then to the collector's permanent generation
    (docs/client.md, "Many tasks and CPython's garbage collector"), once; ``freeze_heap=False`` leaves the collector
    alone. In a fresh process, so that no earlier connect of the test run decides it."""
    script = (
        "import asyncio, gc, sys\n"
        "from ledger_client import BookKeeper, ClientConfig\n"
        "async def main():\n"
        "    counts, kept = [], []\n"
        "    for _ in range(2):\n"
        "        cfg = ClientConfig(zk_root=sys.argv[2], freeze_heap=sys.argv[3] == '1')\n"
        "        bk = await BookKeeper.connect(sys.argv[1], config=cfg)\n"
        "        counts.append(gc.get_freeze_count())\n"
        "        await bk.close()\n"
        "        kept = [[i] for i in range(5000)]  # alive at the second connect\n"
        "    print(*counts)\n"
        "asyncio.run(main())\n"
    )
    out = _in_a_fresh_process(script, zk_connect.connect_string, zk_connect.root, "1" if freeze else "0")
    first, second = map(int, out)
    if freeze:
        assert first > 1000  # the modules imported, at least
        assert second < first + 5000  # once per process: the second connect froze nothing more
    else:
        assert first == second == 0


def test_a_closed_first_client_is_collected_with_the_heap_frozen(zk_connect) -> None:
    """The heap is frozen before the first client's own objects exist: closed and dropped, they are collected.
    Frozen with them, the cycles of its ZooKeeper session were never collected. In a fresh process, as above."""
    script = (
        "import asyncio, gc, sys, weakref\n"
        "from ledger_client import BookKeeper, ClientConfig\n"
        "async def main():\n"
        "    bk = await BookKeeper.connect(sys.argv[1], config=ClientConfig(zk_root=sys.argv[2]))\n"
        "    assert gc.get_freeze_count() > 0\n"
        "    refs = weakref.ref(bk), weakref.ref(bk.store)\n"
        "    await bk.close()\n"
        "    return refs\n"
        "refs = asyncio.run(main())\n"
        "gc.collect()\n"
        "print(*(r() is None for r in refs))\n"
    )
    out = _in_a_fresh_process(script, zk_connect.connect_string, zk_connect.root)
    assert out == ["True", "True"]  # the client and its metadata store freed


def test_spark_planning_leaves_the_drivers_heap_alone(zk_connect) -> None:
    """The Spark sources' client (planning connects in the driver: a notebook's or an application's process) does
    not freeze the heap; the Python workers freeze their own (spark.ledger_source.freeze_worker_heap)."""
    script = (
        "import gc, sys\n"
        "from spark.ledger_source import _client\n"
        "from spark.options import parse_ledger_options\n"
        "opts = parse_ledger_options({'zk': sys.argv[1], 'zkRoot': sys.argv[2], 'ledgers': 'all'})\n"
        "bk = _client(opts)\n"
        "print(gc.get_freeze_count())\n"
        "bk.close()\n"
    )
    out = _in_a_fresh_process(script, zk_connect.connect_string, zk_connect.root, timeout_s=120)
    assert int(out[0]) == 0
