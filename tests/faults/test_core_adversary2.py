"""More single adversaries against the ledger client and bookies on real ZooKeeper and bookie processes, each
checking what readers see against what the writer was told was acknowledged (docs/architecture.md §10): a bookie
of an E5/Qw3/Qa2 ledger SIGSTOPped 5 s under pipelined load (no duplicate or missing entry id, the acks in
order, the LAC and the close right); the writer process SIGSTOPped past its ZooKeeper session just before its
close's compare-and-set, alone or while a reader recovers the ledger (the close fails on the lost session and a
second close goes through on the new one, or it adopts the recovery's close; every acknowledged entry is in the
closed ledger, the same for every reader); two readers recovering a ledger at once while its live writer
replaces a bookie killed -9 (one last entry, past every ack, the same entries for every reader)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

import pytest

from tests.faults.test_core_adversary import PW, WRITER, _acked, _bk, _proc, _spawn, payload


def test_a_bookie_of_an_e5_qw3_qa2_ledger_paused_5_s_under_load(bookies) -> None:
    procs = bookies.start_many(5)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(5, 3, 2, password=PW)
        victim = _proc(procs, lh.metadata.last_ensemble.bookies[2])
        acked: list[int] = []

        async def nemesis() -> None:
            await asyncio.sleep(0.5)
            victim.pause()
            await asyncio.sleep(5.0)
            victim.resume()

        paused = asyncio.create_task(nemesis())
        futs = []
        n = 0
        while not paused.done() or n < 2000:  # writing before, throughout and after the pause
            f = await lh.append_future(payload(n))
            f.add_done_callback(lambda f: acked.append(f.result()))
            futs.append(f)
            n += 1
            if n % 50 == 0:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*futs), 60)
        assert acked == list(range(n)), "acks missing, repeated or out of order"
        assert lh.last_add_confirmed == n - 1
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert md.last_entry_id == n - 1
        reader = await _bk(bookies)
        rh = await reader.open_ledger(lh.ledger_id, password=PW)
        got = [(e.entry_id, e.data) async for e in rh.read(0, n - 1)]
        assert got == [(i, payload(i)) for i in range(n)]
        await reader.close()
        await bk.close()

    asyncio.run(go())


WRITER_STOPPED_AT_CLOSE = r"""
import asyncio, os, signal, sys
import zk.ledger_metadata as lm
from ledger_client import BookKeeper, ClientConfig
from zk.ledger_metadata import LedgerState
real = lm.LedgerMetadataStore.write
stopped = []
def write(self, lid, new, expected):
    if new.state == LedgerState.CLOSED and not stopped:
        stopped.append(1)
        print("S", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes it past the session
    return real(self, lid, new, expected)
lm.LedgerMetadataStore.write = write
async def main():
    bk = await BookKeeper.connect(sys.argv[1], config=ClientConfig(zk_root=sys.argv[2], zk_session_timeout_s=2.0))
    lh = await bk.create_ledger(3, 3, 2, password=b"secret")
    print("L", lh.ledger_id, flush=True)
    for f in [await lh.append_future(b"e%d" % i) for i in range(200)]:
        print("A", await f, flush=True)
    for attempt in range(2):
        try:
            await lh.close()
            print("C ok", flush=True)
            break
        except Exception as e:
            print("C", type(e).__name__, flush=True)
            await asyncio.sleep(1.0)
    await bk.close()
asyncio.run(main())
"""


@pytest.mark.parametrize("recovered_meanwhile", [False, True], ids=["alone", "recovered"])
def test_the_writer_stopped_past_its_session_at_its_close(bookies, recovered_meanwhile: bool) -> None:
    bookies.start_many(3)
    w = _spawn(bookies, WRITER_STOPPED_AT_CLOSE)
    assert w.stdout is not None
    lines = []
    while not lines or lines[-1] != "S":
        ln = w.stdout.readline()
        assert ln, lines[-3:]
        lines.append(ln.strip())
    lid = int(lines[0].split()[1])
    acked = [int(ln.split()[1]) for ln in lines if ln.startswith("A ")]
    assert acked == list(range(200))
    time.sleep(4.0)  # twice the 2 s session

    async def recover() -> int:
        bk = await _bk(bookies)
        rh = await bk.open_ledger(lid, password=PW, recovery=True)
        await bk.close()
        return int(rh.metadata.last_entry_id)

    if recovered_meanwhile:
        assert asyncio.run(recover()) == 199
    os.kill(w.pid, signal.SIGCONT)
    out, _ = w.communicate(timeout=60)
    closes = [ln for ln in out.splitlines() if ln.startswith("C ")]
    print("closes", closes)
    assert closes[-1] == "C ok", closes  # a close that failed on the lost session goes through the next time

    async def check() -> None:
        for _ in range(2):  # two readers, the same ledger
            bk = await _bk(bookies)
            md = await bk.ledger_metadata(lid)
            assert (md.state.name, md.last_entry_id) == ("CLOSED", 199)
            rh = await bk.open_ledger(lid, password=PW, recovery=True)
            assert [e.data async for e in rh.read(0, 199)] == [b"e%d" % i for i in range(200)]
            await bk.close()

    asyncio.run(check())


def test_two_recoveries_while_the_live_writer_changes_its_ensemble(bookies) -> None:
    procs = bookies.start_many(5)
    w = _spawn(bookies, WRITER, stderr=subprocess.DEVNULL)
    assert w.stdout is not None
    first = w.stdout.readline().split()
    lid, ensemble = int(first[1]), first[2:]
    lines: list[str] = []
    pump = threading.Thread(target=lambda: lines.extend(w.stdout or []), daemon=True)
    pump.start()
    while len(lines) < 500:
        time.sleep(0.01)
    _proc(procs, ensemble[0]).kill9()  # the writer's 0.5 s add timeout, then its ensemble change
    time.sleep(0.3)

    async def recoverers() -> list[int]:
        async def one() -> int:
            bk = await _bk(bookies)
            try:
                rh = await bk.open_ledger(lid, password=PW, recovery=True)
                return int(rh.metadata.last_entry_id)
            finally:
                await bk.close()

        return list(await asyncio.gather(one(), one()))

    ends = asyncio.run(recoverers())
    time.sleep(1.0)  # the writer finds itself fenced
    w.kill()
    w.wait()
    pump.join(5)
    acked = _acked(lines)
    print("recovered at", ends, "acked", len(acked), "max", max(acked))
    assert ends[0] == ends[1] and max(acked) <= ends[0]

    async def check() -> None:
        for _ in range(2):
            bk = await _bk(bookies)
            md = await bk.ledger_metadata(lid)
            assert (md.state.name, md.last_entry_id) == ("CLOSED", ends[0])
            rh = await bk.open_ledger(lid, password=PW)
            got = [e.data async for e in rh.read(0, ends[0])]
            assert got == [b"e%d" % i for i in range(ends[0] + 1)]
            assert all(got[k] == v for k, v in acked.items())
            await bk.close()

    asyncio.run(check())
