"""The ledger client's I/O layer against real bookie processes, where planted bugs showed it unguarded
(docs/architecture.md §11, "The bookie's and the ledger client's planted-bug audit")."""

from __future__ import annotations

import asyncio

import pytest

from ledger_client import BookKeeper, ClientConfig, LedgerError, LedgerHandle

PW = b"secret"


async def _client(bookies) -> BookKeeper:
    return await BookKeeper.connect(
        bookies.zk, config=ClientConfig(zk_root=bookies.root, read_timeout_s=2.0, explicit_lac_interval_s=0)
    )


async def _open_ledger_of(bk: BookKeeper, n: int) -> LedgerHandle:
    """An open E3/Qw2/Qa2 ledger holding entries ``b"e0"``... (entry i carries LAC i - 1)."""
    lh = await bk.create_ledger(3, 2, 2, password=PW)
    for i in range(n):
        await lh.append(b"e%d" % i)
    return lh


def test_read_unconfirmed_stops_quietly_only_where_every_replica_lacks_the_entry(bookies) -> None:
    """Past the last entry every replica answers NO_ENTRY: the read ends without an error. An entry whose
    replicas cannot be reached is not "missing": the read raises instead of passing for the end of the log."""
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _client(bookies)
        lh = await _open_ledger_of(bk, 30)
        rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        got = [e.entry_id async for e in rh.read_unconfirmed(0, 40)]
        assert got == list(range(30))
        ensemble = rh.metadata.last_ensemble.bookies
        for bp in procs:  # entry 30 on would land on these two too; 0, 3, 6... live only there
            if bp.id in ensemble[:2]:
                bp.kill9()
        got = []
        with pytest.raises(LedgerError):
            async for e in rh.read_unconfirmed(0, 40):
                got.append(e.entry_id)
        assert got == []
        await bk.close()

    asyncio.run(go())


def test_a_lac_read_takes_the_highest_lac_its_answers_carry(bookies) -> None:
    """E3/Qw2: each bookie's last entry carries another LAC (bookie 1 of the ensemble holds entries 28 and 27,
    the others 29). With bookie 2 down the read needs bookies 0 and 1; whichever answers last, the LAC is
    the higher one, and a handle's LAC never goes back."""
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _client(bookies)
        lh = await _open_ledger_of(bk, 30)
        rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert rh.last_add_confirmed == 28
        ensemble = rh.metadata.last_ensemble.bookies
        next(bp for bp in procs if bp.id == ensemble[2]).kill9()
        for _ in range(10):
            fresh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
            assert fresh.last_add_confirmed == 28
            assert await rh.read_last_add_confirmed() == 28
        await bk.close()

    asyncio.run(go())


def test_a_reader_of_an_open_ledger_follows_an_ensemble_change_made_after_it_opened(bookies) -> None:
    """E3/Qw2: the writer replaces two bookies of its ensemble after a reader opened the ledger. Entry 12's
    write set is then two bookies the reader's metadata does not name: the reader reads the metadata again and
    finds it there, as a BookKeeper read handle does."""
    procs = bookies.start_many(5)

    async def go() -> None:
        bk = await _client(bookies)
        lh = await _open_ledger_of(bk, 10)
        reader = await _client(bookies)
        rh = await reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        ensemble = rh.metadata.last_ensemble.bookies
        for bp in procs:
            if bp.id in ensemble[:2]:
                bp.kill9()
        for i in range(10, 30):
            await lh.append(b"e%d" % i)
        assert set(lh.metadata.last_ensemble.bookies[:2]).isdisjoint(ensemble)
        got = [(e.entry_id, e.data) async for e in rh.read_unconfirmed(10, 29)]
        assert got == [(i, b"e%d" % i) for i in range(10, 30)]
        await reader.close()
        await bk.close()

    asyncio.run(go())
