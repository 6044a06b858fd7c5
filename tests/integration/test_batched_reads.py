"""Batched sequential reads (READ_RANGE, ReadPlanner) against real ZooKeeper and bookie processes."""

from __future__ import annotations

import asyncio

import pytest

from ledger_client import BookKeeper, ClientConfig, NoSuchEntryError

PW = b"secret"


def payload(i: int, size: int = 100) -> bytes:
    return (f"entry-{i}-".encode() * size)[:size]


async def _bk(bookies, **cfg) -> BookKeeper:
    return await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, **cfg))


async def _write(lh, first: int, n: int, size: int = 100) -> None:
    futs = [await lh.append_future(payload(i, size)) for i in range(first, first + n)]
    await asyncio.gather(*futs)


@pytest.mark.parametrize(("E", "Qw"), [(3, 2), (3, 3)])
def test_read_of_a_closed_ledger_equals_what_was_written(bookies, E, Qw) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, read_batch_entries=64, read_batch_bytes=3000, read_ahead_batches=4)
        lh = await bk.create_ledger(E, Qw, 2, password=PW)
        await _write(lh, 0, 3000)
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        got = [(e.entry_id, e.data) async for e in rh.read(0, 2999)]
        assert got == [(i, payload(i)) for i in range(3000)]
        # a part of it, and a consumer that stops early
        assert [e.entry_id async for e in rh.read(1234, 1240)] == list(range(1234, 1241))
        async for e in rh.read(10, 2999):
            assert e.entry_id == 10
            break
        assert (await rh.read_entry(77)).data == payload(77)
        # read_batches: the same entries as columns, whatever the consumer does with the lists it gets
        nxt, got_batches = 5, []
        async for b in rh.read_batches(5, 2999):
            assert b.first_entry_id == nxt and b.ledger_id == lh.ledger_id and len(b) > 0
            nxt = b.last_entry_id + 1
            got_batches += b.payloads
            b.payloads.clear()
        assert nxt == 3000 and got_batches == [payload(i) for i in range(5, 3000)]
        await bk.close()

    asyncio.run(go())


def test_read_across_an_ensemble_change(bookies) -> None:
    procs = bookies.start_many(4)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=2.0, read_batch_entries=50)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await _write(lh, 0, 500)
        victim = next(bp for bp in procs if bp.id == lh.metadata.last_ensemble.bookies[0])
        victim.kill9()
        await _write(lh, 500, 500)
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) >= 2
        rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        got = [(e.entry_id, e.data) async for e in rh.read(0, 999)]
        assert got == [(i, payload(i)) for i in range(1000)]
        await bk.close()

    asyncio.run(go())


def test_a_bookie_killed_during_a_long_read_fails_over(bookies) -> None:
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, read_batch_entries=100, read_ahead_batches=2, read_timeout_s=3.0)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await _write(lh, 0, 20_000)
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        got: list[int] = []
        async for e in rh.read(0, 19_999):
            assert e.data == payload(e.entry_id)
            got.append(e.entry_id)
            if e.entry_id == 2000:
                procs[1].kill9()
        assert got == list(range(20_000))
        await bk.close()

    asyncio.run(go())


def test_read_unconfirmed_stops_at_the_end(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, read_batch_entries=16)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await _write(lh, 0, 100)
        reader_bk = await _bk(bookies, read_batch_entries=16)
        rh = await reader_bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        got = [e.entry_id async for e in rh.read_unconfirmed(0, 500)]
        assert got == list(range(100))  # the writer's LAC may trail; what is stored is read
        assert [e.entry_id async for e in rh.read_unconfirmed(100, 200)] == []
        await lh.close()
        rh = await reader_bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        with pytest.raises(NoSuchEntryError):
            async for _ in rh._read_range(95, 120):
                pass
        await reader_bk.close()
        await bk.close()

    asyncio.run(go())


def test_tail_follows_a_writer(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, explicit_lac_interval_s=0.1)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        reader_bk = await _bk(bookies, read_batch_entries=32)
        rh = await reader_bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        seen: list[tuple[int, bytes]] = []

        async def follow() -> None:
            async for e in rh.tail(0, poll_timeout_s=0.5):
                seen.append((e.entry_id, e.data))

        task = asyncio.create_task(follow())
        for k in range(10):
            await _write(lh, k * 300, 300)
            await asyncio.sleep(0.05)
        await lh.close()
        await asyncio.wait_for(task, 30)
        assert seen == [(i, payload(i)) for i in range(3000)]
        await reader_bk.close()
        await bk.close()

    asyncio.run(go())
