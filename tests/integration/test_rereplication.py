"""`ledgerstore bookie recover`: a dead bookie's share of closed ledgers re-replicated to live bookies
(real ZooKeeper, 5 bookie processes, the real CLI)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from bookie import protocol as p
from ledger_client import BookKeeper, ClientConfig
from ledger_client.bookie_conn import connect
from ledger_client.quorum import write_set

PW = b"secret"


def _cli(bookies, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ledgerstore.cli", *args, "--zk", bookies.zk, "--zk-root", bookies.root]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def payload(lid: int, i: int) -> bytes:
    return f"L{lid}-entry-{i}-".encode() * 20


async def _raw_read(bookie: str, lid: int, eid: int) -> p.Response:
    conn = await connect(bookie)
    try:
        return await conn.request(
            lambda rid: p.ReadEntryRequest(
                request_id=rid, ledger_id=lid, entry_id=eid, master_key=p.master_key(PW)
            ),
            5.0,
        )
    finally:
        conn.close()


def test_recover_copies_a_dead_bookies_entries_and_swaps_it_out_of_closed_ledgers(bookies) -> None:
    procs = bookies.start_many(5)
    by_id = {bp.id: bp for bp in procs}

    async def write() -> tuple[int, int, int, str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            a = await bk.create_ledger(3, 2, 2, password=PW)
            victim = a.metadata.ensembles[0].bookies[1]
            for i in range(300):
                await a.append(payload(a.ledger_id, i))
            await a.close()
            # a second closed ledger, E = Qw, and an open one: placed at random, with or without the victim
            b = await bk.create_ledger(3, 3, 2, password=PW)
            for i in range(50):
                await b.append(payload(b.ledger_id, i))
            await b.close()
            c = await bk.create_ledger(3, 2, 2, password=PW)
            await c.append(b"open")
            return a.ledger_id, b.ledger_id, c.ledger_id, victim
        finally:
            await bk.close()

    la, lb, lc, victim = asyncio.run(write())
    by_id[victim].kill9()

    r = _cli(bookies, "bookie", "recover", victim, "--password", "wrong", "--json")
    assert r.returncode == 1, r.stderr
    assert {x["ledger_id"]: x["status"] for x in json.loads(r.stdout)["ledgers"]}[la] == "unauthorized"

    r = _cli(bookies, "bookie", "recover", victim, "--password", PW.decode(), "--dry-run")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert (
        "dry run" in r.stdout.splitlines()[0]
        and f"ledger {la}: 200 entries to copy; ensemble 0 -> " in r.stdout
    )

    async def still_there() -> bool:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            return victim in (await bk.ledger_metadata(la)).ensembles[0].bookies
        finally:
            await bk.close()

    assert asyncio.run(still_there())

    r = _cli(bookies, "bookie", "recover", victim, "--password", PW.decode(), "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    got = {x["ledger_id"]: x for x in json.loads(r.stdout)["ledgers"]}
    assert got[la]["status"] == "done" and got[la]["entries_copied"] == 200  # index 1 of E=3, Qw=2: 2 in 3
    r = _cli(bookies, "bookie", "recover", victim, "--password", PW.decode())
    assert r.returncode == 0 and "0 ledgers re-replicated" in r.stdout.splitlines()[0], r.stdout

    async def check() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            for lid, n in ((la, 300), (lb, 50)):
                md = await bk.ledger_metadata(lid)
                assert all(victim not in ens.bookies for ens in md.ensembles), md.ensembles
                assert md.is_closed and md.last_entry_id == n - 1
                ens = md.ensembles[0].bookies
                for eid in range(n):  # every bookie of every write set has the entry, byte for byte
                    copies = [await _raw_read(ens[i], lid, eid) for i in write_set(eid, 3, md.write_quorum)]
                    assert all(c.status == p.Status.OK for c in copies), (
                        lid,
                        eid,
                        [c.status for c in copies],
                    )
                    assert len({bytes(c.entry) for c in copies}) == 1
                h = await bk.open_ledger(lid, password=PW)
                assert [e.data async for e in h.read(0, n - 1)] == [payload(lid, i) for i in range(n)]
            new = got[la]["replacements"]["0"]
            conn = await connect(new)  # fenced there too: a stale writer's add is refused
            try:
                resp = await conn.request(
                    lambda rid: p.AddEntryRequest(
                        request_id=rid,
                        ledger_id=la,
                        entry_id=300,
                        master_key=p.master_key(PW),
                        entry=b"x" * 40,
                    ),
                    5.0,
                )
                assert resp.status == p.Status.FENCED
            finally:
                conn.close()
            md_c = await bk.ledger_metadata(lc)
            if victim in md_c.ensembles[0].bookies:
                assert got[lc]["status"] == "open" and not md_c.is_closed
            else:
                assert lc not in got
        finally:
            await bk.close()

    asyncio.run(check())


def test_a_copy_that_fails_swaps_nothing_and_a_rerun_completes(bookies) -> None:
    """The only possible replacement is down while copying: the ledger is reported failed and its metadata keeps
    the dead bookie (no swap to a bookie without the entries); once the replacement is back, a rerun completes."""
    procs = bookies.start_many(4)
    by_id = {bp.id: bp for bp in procs}

    async def write() -> tuple[int, str, str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            lh = await bk.create_ledger(3, 2, 2, password=PW)
            for i in range(100):
                await lh.append(payload(lh.ledger_id, i))
            await lh.close()
            ensemble = lh.metadata.ensembles[0].bookies
            (spare,) = set(by_id) - set(ensemble)
            return lh.ledger_id, ensemble[0], spare
        finally:
            await bk.close()

    async def ensemble_of(lid: int) -> tuple[str, ...]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            return tuple((await bk.ledger_metadata(lid)).ensembles[0].bookies)
        finally:
            await bk.close()

    lid, victim, spare = asyncio.run(write())
    before = asyncio.run(ensemble_of(lid))
    by_id[victim].kill9()
    by_id[spare].kill9()  # still registered until its ZooKeeper session expires: chosen, then unreachable
    r = _cli(bookies, "bookie", "recover", victim, "--password", PW.decode(), "--json")
    assert r.returncode == 1, (r.stdout, r.stderr)
    (got,) = json.loads(r.stdout)["ledgers"]
    # chosen and unreachable, or (had its session already expired) no replacement at all: no copy either way
    assert got["status"] == "failed" and (spare in got["error"] or "no replacement" in got["error"]), got
    assert asyncio.run(ensemble_of(lid)) == before
    by_id[spare].restart()
    r = _cli(bookies, "bookie", "recover", victim, "--password", PW.decode(), "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    (got,) = json.loads(r.stdout)["ledgers"]
    assert got["status"] == "done" and got["replacements"] == {"0": spare}
    assert asyncio.run(ensemble_of(lid)) == tuple(spare if b == victim else b for b in before)

    async def read_back() -> list[bytes]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            h = await bk.open_ledger(lid, password=PW)
            return [e.data async for e in h.read(0, 99)]
        finally:
            await bk.close()

    assert asyncio.run(read_back()) == [payload(lid, i) for i in range(100)]


def test_recover_of_an_id_no_bookie_has_is_an_error_naming_the_known_ones(bookies) -> None:
    """A mistyped id (never registered, no cookie, in no ensemble) is refused, not "0 ledgers re-replicated"."""
    (bp,) = bookies.start_many(1)
    r = _cli(bookies, "bookie", "recover", "127.0.0.1:1", "--password", PW.decode())
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "127.0.0.1:1" in r.stderr and bp.id in r.stderr, r.stderr
    r = _cli(bookies, "bookie", "recover", bp.id, "--password", PW.decode())  # known, in no ledger: fine
    assert r.returncode == 0 and "0 ledgers re-replicated" in r.stdout, (r.stdout, r.stderr)
