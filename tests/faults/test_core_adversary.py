"""The core under faults and strangers, on real ZooKeeper and bookie processes (docs/architecture.md §10).

Each test is one adversary with the invariants it must not break: a replica holding corrupt copies (failed
over by every read path, never handed out: invariant 3); a bookie SIGSTOPped past the add timeout and resumed
(replaced, nothing duplicated or reordered); strangers on the bookie port (wrong keys, forged flags, bodies cut
short or padded, huge declared lengths, slow loris) answered with an error or a close while an honest client is
served; the writer's ZooKeeper session expiring while it writes; recovery while a bookie of the ensemble is
down and comes back; the writer killed -9 with its ensemble change's metadata write in flight (before it is
sent, after it is applied) and recoverers killed -9 mid-recovery, then three recoverers in processes at once
(invariants 1, 5, 6); a bookie killed -9 mid group commit, then each bookie killed -9 after recovery fenced it
(invariants 1, 4, 7); the writer paused across a whole recovery and resumed (invariant 4); reads past a paused
replica."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from ledger_client import BookKeeper, ClientConfig
from ledger_client.read_planner import ReadyRuns
from tests.integration.rawbookie import RawBookie, build

PW = b"secret"
ROOT = str(Path(__file__).resolve().parents[2])


def payload(i: int, size: int = 64) -> bytes:
    return (f"entry-{i}-".encode() * size)[:size]


async def _bk(bookies, **cfg) -> BookKeeper:
    return await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, **cfg))


async def _written(bk: BookKeeper, n: int, size: int = 64, *, close: bool = True):
    """A 3/3/2 ledger holding ``payload(i, size)`` for i < n, written pipelined; closed unless ``close`` is
    False."""
    lh = await bk.create_ledger(3, 3, 2, password=PW)
    await asyncio.gather(*[await lh.append_future(payload(i, size)) for i in range(n)])
    if close:
        await lh.close()
    return lh


def _proc(procs, bookie_id: str):
    """The bookie process whose id is ``bookie_id``."""
    return next(bp for bp in procs if bp.id == bookie_id)


def _asked(reader: BookKeeper) -> list[str]:
    """The bookies ``reader``'s reads ask its read pool for, in order, from now on (a connection being opened
    asks twice)."""
    asked: list[str] = []
    get = reader.read_pool.get_nowait
    reader.read_pool.get_nowait = lambda b: asked.append(b) or get(b)  # type: ignore[method-assign]
    return asked


def test_a_replica_holding_a_corrupt_copy_is_failed_over_never_handed_out(bookies) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        # two of the three replicas hold corrupt copies of entries 0..9, so every read of them meets one
        corrupt = list(lh.metadata.last_ensemble.bookies[:2])
        codec = EntryCodec(lh.ledger_id, DigestType.CRC32C, None)
        for b in corrupt:
            raw = await RawBookie.open(b)
            for i in range(10):  # planted before the writer's: entries are immutable, the bookie keeps these
                bad = bytearray(codec.build(i, i - 1, sum(len(payload(j)) for j in range(i + 1)), payload(i)))
                bad[-1] ^= 0xFF
                resp = await raw.conn.request(
                    lambda rid, i=i, bad=bad: p.AddEntryRequest(
                        request_id=rid,
                        ledger_id=lh.ledger_id,
                        entry_id=i,
                        master_key=p.master_key(PW),
                        entry=bytes(bad),
                        flags=0,
                    ),
                    10,
                )
                assert resp.status == p.Status.OK
            raw.close()
        for i in range(10):
            await lh.append(payload(i))
        await lh.append(payload(10))  # entry 9 confirmed by entry 10's LAC; the ledger still open
        tb = await _bk(bookies)
        th = await tb.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert th.last_add_confirmed >= 9
        assert [e.data async for e in th.read(0, 9)] == [payload(i) for i in range(10)]
        assert [e.data async for e in th.read_unconfirmed(0, 10)] == [payload(i) for i in range(11)]
        tailed = []
        async for e in th.tail(0, poll_timeout_s=0.2):
            tailed.append(e.data)
            if len(tailed) == 10:
                break
        assert tailed == [payload(i) for i in range(10)]
        await tb.close()
        await lh.close()
        # (a writer's run of entries that covers a planted one may take its place in storage: most stay)
        for b in corrupt:
            seen = [st async for _, st, _ in lh.read_replica(b, 0, 9)]
            assert set(seen) <= {"OK", "DIGEST_MISMATCH"} and seen.count("DIGEST_MISMATCH") >= 3, seen
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW)
        for _ in range(3):
            got = [e.data async for e in rh.read(0, 9)]
            assert got == [payload(i) for i in range(10)]
        for i in range(10):
            assert (await rh.read_entry(i)).data == payload(i)
        rh2 = await bk2.open_ledger(lh.ledger_id, password=PW, recovery=True)
        assert [e.data async for e in rh2.read(0, 10)] == [payload(i) for i in range(11)]
        await bk2.close()
        await bk.close()

    asyncio.run(go())


def test_a_bookie_paused_past_the_add_timeout_then_resumed(bookies) -> None:
    procs = bookies.start_many(4)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=1.0)
        lh = await bk.create_ledger(3, 3, 3, password=PW)
        victim = _proc(procs, lh.metadata.last_ensemble.bookies[1])
        acked: list[int] = []
        futs = []
        for i in range(400):
            futs.append(await lh.append_future(payload(i)))
            if i == 100:
                victim.pause()
            if i == 250:
                await asyncio.sleep(3)
                victim.resume()
            if i % 20 == 0:
                await asyncio.sleep(0.05)
        acked = list(await asyncio.wait_for(asyncio.gather(*futs), 60))
        assert acked == list(range(400))
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert md.last_entry_id == 399, md
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW)
        assert [e.data async for e in rh.read(0, 399)] == [payload(i) for i in range(400)]
        print("ensembles", md.ensembles)
        await bk2.close()
        await bk.close()

    asyncio.run(go())


WRITER = r"""
import asyncio, sys
from ledger_client import BookKeeper, ClientConfig
async def main():
    bk = await BookKeeper.connect(sys.argv[1], config=ClientConfig(zk_root=sys.argv[2], add_timeout_s=0.5))
    lh = await bk.create_ledger(3, 3, 2, password=b"secret")
    print("L", lh.ledger_id, " ".join(lh.metadata.last_ensemble.bookies), flush=True)
    i = 0
    while True:
        fut = await lh.append_future(b"e%d" % i)
        fut.add_done_callback(lambda f, i=i: print("A", f.result(), i, flush=True) if not f.exception() else None)
        i += 1
        if i % 10 == 0:
            await asyncio.sleep(0.002)
asyncio.run(main())
"""


def _ask(sock: socket.socket, frame: bytes, timeout_s: float = 5.0) -> p.Response | None:
    """Send one frame, read one response frame (None: the bookie closed the connection)."""
    sock.settimeout(timeout_s)
    sock.sendall(frame)
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return p.decode_one_response(buf[: 4 + int.from_bytes(buf[:4], "big")])


def _closed(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_strangers_on_the_bookie_port_get_errors_or_closes_and_honest_adds_go_on(bookies) -> None:
    bp = bookies.start("--partial-frame-timeout-s", "2.0")
    host, port = "127.0.0.1", bp.port
    key, wrong = p.master_key(PW), p.master_key(b"guess")
    lat: dict[str, list[float]] = {"before": [], "during": [], "after": []}

    async def honest(phase: str, first: int, n: int) -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(first, first + n):
            t0 = time.perf_counter()
            assert await raw.add(77, e) == p.Status.OK
            lat[phase].append(time.perf_counter() - t0)
        raw.close()

    asyncio.run(honest("before", 0, 200))
    conns = []
    # slow loris with the largest frame declared, and more with a declared length beyond the maximum
    for _ in range(20):
        s = socket.create_connection((host, port))
        s.sendall(
            int(p.FRAME_SIZE_MAX).to_bytes(4, "big") + bytes([p.PROTOCOL_VERSION, 1, 0, 0]) + b"\0" * 1000
        )
        conns.append(s)
    huge = socket.create_connection((host, port))
    huge.sendall((p.FRAME_SIZE_MAX + 1).to_bytes(4, "big") + b"\1" * 64)
    # a valid header and a body cut short, and one with trailing junk
    short = socket.create_connection((host, port))
    add = p.encode(
        p.AddEntryRequest(request_id=5, ledger_id=77, entry_id=999, master_key=key, entry=build(77, 999))
    )
    cut = (len(p.FRAME_HEADER.pack(1, 1, 0, 5)) + 10).to_bytes(4, "big") + add[
        4 : 4 + p.FRAME_HEADER.size + 10
    ]
    short_r = _ask(short, cut)
    junk = socket.create_connection((host, port))
    rd = bytearray(p.encode(p.ReadEntryRequest(request_id=6, ledger_id=77, entry_id=0, master_key=key)))
    rd += b"JUNKJUNK"
    rd[:4] = (len(rd) - 4).to_bytes(4, "big")
    junk_r = _ask(junk, bytes(rd))
    # wrong keys: a read, a fencing read, an add with a forged RECOVERY_ADD|FENCE flags, a WRITE_LAC
    s = socket.create_connection((host, port))
    r1 = _ask(s, p.encode(p.ReadEntryRequest(request_id=1, ledger_id=77, entry_id=0, master_key=wrong)))
    r2 = _ask(
        s,
        p.encode(
            p.ReadEntryRequest(request_id=2, ledger_id=77, entry_id=-1, master_key=wrong, flags=p.Flag.FENCE)
        ),
    )
    r3 = _ask(
        s,
        p.encode(
            p.AddEntryRequest(
                request_id=3,
                ledger_id=77,
                entry_id=5000,
                master_key=wrong,
                entry=build(77, 5000),
                flags=p.Flag.RECOVERY_ADD | p.Flag.FENCE,
            )
        ),
    )
    r4 = _ask(
        s,
        p.encode(
            p.WriteLacRequest(request_id=4, ledger_id=77, lac=10**9, master_key=wrong, lac_blob=b"x" * 16)
        ),
    )
    # the right key, an ADD carrying the FENCE bit and unknown bits: it must not fence the ledger
    r5 = _ask(
        s,
        p.encode(
            p.AddEntryRequest(
                request_id=7,
                ledger_id=77,
                entry_id=200,
                master_key=key,
                entry=build(77, 200),
                flags=p.Flag.FENCE | 0x4000,
            )
        ),
    )
    r6 = _ask(
        s,
        p.encode(
            p.ReadRangeRequest(
                request_id=8, ledger_id=77, first_entry_id=0, last_entry_id=2**62, master_key=key
            )
        ),
    )
    r7 = _ask(s, p.encode(p.ReadEntryRequest(request_id=9, ledger_id=77, entry_id=-7, master_key=key)))
    print("short", short_r, "junk", junk_r)
    print("r1..r7", [getattr(r, "status", r) for r in (r1, r2, r3, r4, r5, r6, r7)])
    asyncio.run(honest("during", 201, 200))
    assert r1 is not None and r1.status == p.Status.UNAUTHORIZED
    assert r2 is not None and r2.status == p.Status.UNAUTHORIZED
    assert r3 is not None and r3.status == p.Status.UNAUTHORIZED
    assert r4 is not None and r4.status == p.Status.UNAUTHORIZED
    assert _closed(huge)
    for c in conns:
        assert _closed(c, 10)
    asyncio.run(honest("after", 401, 100))

    async def check() -> None:
        raw = await RawBookie.open(bp.id)
        assert await raw.add(77, 1000) == p.Status.OK  # not fenced by anything above
        for e in (0, 199, 200, 400, 500):
            r = await raw.read(77, e)
            assert r.status == p.Status.OK and r.entry == build(77, e), (e, r.status)
        r = await raw.read(77, 5000)
        assert r.status == p.Status.NO_ENTRY
        raw.close()

    asyncio.run(check())
    med = {k: sorted(v)[len(v) // 2] * 1000 for k, v in lat.items()}
    print("honest add median ms", med, "max during", max(lat["during"]) * 1000)
    assert bp.alive


def test_the_writers_zookeeper_session_expiring_while_it_writes(bookies) -> None:
    from tests.zk_testing import expire_session

    procs = bookies.start_many(4)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=1.0)
        lh = await _written(bk, 100, close=False)
        old = await asyncio.to_thread(expire_session, bk.store)
        print("expired", hex(old))
        futs = [await lh.append_future(payload(i)) for i in range(100, 200)]
        await asyncio.gather(*futs)
        # an ensemble change after the expiry: the metadata write goes through the new session
        victim = _proc(procs, lh.metadata.last_ensemble.bookies[0])
        victim.kill9()
        futs = [await lh.append_future(payload(i)) for i in range(200, 300)]
        print([type(r).__name__ for r in await asyncio.gather(*futs, return_exceptions=True)][-3:])
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        print("closed", md.state, md.last_entry_id, len(md.ensembles))
        assert md.last_entry_id == 299
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW)
        assert [e.data async for e in rh.read(0, 299)] == [payload(i) for i in range(300)]
        await bk2.close()
        await bk.close()

    asyncio.run(go())


def test_recovery_while_an_ensemble_bookie_is_down_and_comes_back_midway(bookies) -> None:
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=1.0)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(300):
            await lh.append(payload(i, 2000))
        down = procs[0]
        down.kill9()
        # the writer is gone without a close (its handle is dropped, its client closed)
        await bk.close()
        bk2 = await _bk(bookies, add_timeout_s=1.0, read_timeout_s=1.0)

        async def back() -> None:
            await asyncio.sleep(0.3)
            await asyncio.to_thread(down.start)

        t = asyncio.create_task(back())
        rh = await bk2.open_ledger(lh.ledger_id, password=PW, recovery=True)
        await t
        md = rh.metadata
        print("recovered", md.state, md.last_entry_id, md.ensembles)
        assert md.last_entry_id == 299
        assert [e.data async for e in rh.read(0, 299)] == [payload(i, 2000) for i in range(300)]
        bk3 = await _bk(bookies)
        rh3 = await bk3.open_ledger(lh.ledger_id, password=PW, recovery=True)
        assert rh3.metadata.last_entry_id == 299
        for b in md.last_ensemble.bookies:
            got = [st async for _, st, _ in rh3.read_replica(b, 0, 299)]
            print(b, {s: got.count(s) for s in set(got)})
        await bk3.close()
        await bk2.close()

    asyncio.run(go())


WRITER_CAS = r"""
import asyncio, os, signal, sys
import zk.ledger_metadata as lm
from ledger_client import BookKeeper, ClientConfig
mode, e, qw, qa = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
real = lm.LedgerMetadataStore.write
def write(self, lid, new, expected):
    old = expected.value if hasattr(expected, "value") else self.read(lid).value
    change = len(new.ensembles) > len(old.ensembles)
    if change and mode == "before":
        print("K before", flush=True); os.kill(os.getpid(), signal.SIGKILL)
    out = real(self, lid, new, expected)
    if change and mode == "after":
        print("K after", new.ensembles[-1].first_entry_id, flush=True); os.kill(os.getpid(), signal.SIGKILL)
    return out
lm.LedgerMetadataStore.write = write
async def main():
    bk = await BookKeeper.connect(sys.argv[1], config=ClientConfig(zk_root=sys.argv[2], add_timeout_s=0.5))
    lh = await bk.create_ledger(e, qw, qa, password=b"secret")
    print("L", lh.ledger_id, " ".join(lh.metadata.last_ensemble.bookies), flush=True)
    i = 0
    while True:
        fut = await lh.append_future(b"e%d" % i)
        fut.add_done_callback(lambda f, i=i: print("A", f.result(), i, flush=True) if not f.exception() else None)
        i += 1
        if i % 10 == 0:
            await asyncio.sleep(0.002)
asyncio.run(main())
"""


def _spawn(bookies, script: str, *args: str, stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """``script`` in a process of its own (``python -c``) with the test's ZooKeeper and root as its first
    arguments."""
    return subprocess.Popen(
        [sys.executable, "-c", script, bookies.zk, bookies.root, *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def _acked(lines: list[str]) -> dict[int, bytes]:
    """The entries a writer script said were acknowledged ('A entry_id i' lines): entry id -> its bytes."""
    acked = {}
    for ln in lines:
        parts = ln.split()
        if parts and parts[0] == "A":
            acked[int(parts[1])] = f"e{parts[2]}".encode()
    return acked


@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.parametrize("quorums", [(3, 3, 2), (3, 2, 2)], ids=["3-3-2", "3-2-2"])
def test_writer_killed_with_its_ensemble_change_cas_in_flight(bookies, mode: str, quorums) -> None:
    procs = bookies.start_many(5)
    w = _spawn(bookies, WRITER_CAS, mode, *map(str, quorums), stderr=subprocess.DEVNULL)
    assert w.stdout is not None
    head = w.stdout.readline().split()
    lid, ens = int(head[1]), head[2:]
    lines = [w.stdout.readline() for _ in range(300)]
    victim = _proc(procs, ens[1])
    victim.kill9()
    rest = w.stdout.read()
    assert w.wait(30) == -signal.SIGKILL
    acked = _acked(lines + rest.splitlines())
    kills = [ln for ln in rest.splitlines() if ln.startswith("K")]
    assert kills, rest[-300:]

    async def recover() -> None:
        bk = await _bk(bookies)
        before = await bk.ledger_metadata(lid)
        rh = await bk.open_ledger(lid, password=PW, recovery=True)
        md = rh.metadata
        top = max(acked)
        print(
            mode,
            quorums,
            kills,
            "acked",
            len(acked),
            "max",
            top,
            "closed at",
            md.last_entry_id,
            "ensembles before",
            [e.first_entry_id for e in before.ensembles],
            "after",
            [(e.first_entry_id, e.bookies) for e in md.ensembles],
        )
        assert md.last_entry_id >= top, (md.last_entry_id, top)
        data = {e.entry_id: e.data async for e in rh.read(0, md.last_entry_id)}
        assert [data[i] for i in range(md.last_entry_id + 1)] == [
            b"e%d" % i for i in range(md.last_entry_id + 1)
        ]
        bk2 = await _bk(bookies)
        rh2 = await bk2.open_ledger(lid, password=PW, recovery=True)
        assert rh2.metadata.last_entry_id == md.last_entry_id
        for e in md.ensembles:
            for b in e.bookies:
                if b == victim.id:
                    continue
                got = [st async for _, st, _ in rh2.read_replica(b, 0, md.last_entry_id)]
                assert set(got) <= {"OK"}, (b, {s: got.count(s) for s in set(got)})
        await bk2.close()
        await bk.close()

    asyncio.run(recover())


RECOVERER = r"""
import asyncio, os, signal, sys
import zk.ledger_metadata as lm
from ledger_client import BookKeeper, ClientConfig
die_at = sys.argv[4].replace("-bookie-down", "")
real = lm.LedgerMetadataStore.write
def write(self, lid, new, expected):
    if die_at == "closed-before" and new.state.value == "CLOSED":
        os.kill(os.getpid(), signal.SIGKILL)
    out = real(self, lid, new, expected)
    if die_at == "in-recovery-after" and new.state.value == "IN_RECOVERY":
        os.kill(os.getpid(), signal.SIGKILL)
    return out
lm.LedgerMetadataStore.write = write
async def main():
    bk = await BookKeeper.connect(sys.argv[1], config=ClientConfig(zk_root=sys.argv[2], add_timeout_s=1.0))
    rh = await bk.open_ledger(int(sys.argv[3]), password=b"secret", recovery=True)
    print("R", rh.metadata.last_entry_id, flush=True)
    await bk.close()
asyncio.run(main())
"""


@pytest.mark.parametrize("die_at", ["in-recovery-after", "closed-before", "closed-before-bookie-down"])
def test_recoverers_in_processes_one_killed_midway_and_three_at_once(bookies, die_at: str) -> None:
    procs = bookies.start_many(4)
    w = _spawn(bookies, WRITER, stderr=subprocess.DEVNULL)
    assert w.stdout is not None
    head = w.stdout.readline().split()
    lid, ens = int(head[1]), head[2:]
    lines = [w.stdout.readline() for _ in range(500)]
    w.kill()
    rest, _ = w.communicate()
    acked = _acked(lines + rest.splitlines())
    if die_at.endswith("bookie-down"):  # recovery's write-back must replace a bookie
        _proc(procs, ens[0]).kill9()
    r = _spawn(bookies, RECOVERER, str(lid), die_at)
    out, err = r.communicate(timeout=60)
    assert r.returncode == -signal.SIGKILL, (r.returncode, out, err[-2000:])
    rs = [_spawn(bookies, RECOVERER, str(lid), "never") for _ in range(3)]
    ends = []
    for x in rs:
        out, err = x.communicate(timeout=90)
        assert x.returncode == 0, err[-2000:]
        ends.append(int(out.split()[1]))

    async def check() -> None:
        bk = await _bk(bookies)
        md = await bk.ledger_metadata(lid)
        print(
            die_at,
            "acked max",
            max(acked),
            "ends",
            ends,
            "md",
            md.state,
            md.last_entry_id,
            [e.first_entry_id for e in md.ensembles],
        )
        assert set(ends) == {md.last_entry_id}
        assert md.last_entry_id >= max(acked)
        rh = await bk.open_ledger(lid, password=PW)
        data = [e.data async for e in rh.read(0, md.last_entry_id)]
        assert data == [b"e%d" % i for i in range(md.last_entry_id + 1)]
        await bk.close()

    asyncio.run(check())


def test_bookie_killed_mid_group_commit_then_fenced_and_killed_again(bookies) -> None:
    procs = bookies.start_many(4)

    async def go() -> None:
        bk = await _bk(bookies, add_timeout_s=1.0)
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        ens = list(lh.metadata.last_ensemble.bookies)
        victim = _proc(procs, ens[2])
        acked: dict[int, bytes] = {}
        futs = []
        for i in range(3000):
            f = await lh.append_future(payload(i, 1000))
            f.add_done_callback(
                lambda f, i=i: acked.__setitem__(f.result(), payload(i, 1000)) if not f.exception() else None
            )
            futs.append(f)
            if i == 1500:
                victim.kill9()
        await asyncio.gather(*futs, return_exceptions=True)
        victim.start()
        top = max(acked)
        assert sorted(acked) == list(range(top + 1))
        raw = await RawBookie.open(victim.id)
        r = await raw.read(lh.ledger_id, -1)
        print("victim back: status", r.status, "lac", r.lac, "entry", r.entry_id, "writer acked", top)
        assert r.lac <= top
        raw.close()
        # recovery fences; the fence's bookie is killed right after and restarted: still fenced
        bk2 = await _bk(bookies)
        rh = await bk2.open_ledger(lh.ledger_id, password=PW, recovery=True)
        assert rh.metadata.last_entry_id >= top
        for b in rh.metadata.last_ensemble.bookies:
            bp = _proc(procs, b)
            bp.kill9()
            bp.start()
            raw = await RawBookie.open(b)
            st = await raw.add(lh.ledger_id, rh.metadata.last_entry_id + 1, key=p.master_key(PW))
            assert st == p.Status.FENCED, (b, st)
            raw.close()
        res = await asyncio.gather(lh.append(b"late"), return_exceptions=True)
        print("old writer's append after recovery:", res)
        assert isinstance(res[0], Exception)
        data = [e.data async for e in rh.read(0, rh.metadata.last_entry_id)]
        assert data[: top + 1] == [acked[i] for i in range(top + 1)]
        assert data == [payload(i, 1000) for i in range(len(data))]
        await bk2.close()
        await bk.close()

    asyncio.run(go())


WRITER_CLOSES = r"""
import asyncio, sys
from ledger_client import BookKeeper, ClientConfig
async def main():
    bk = await BookKeeper.connect(sys.argv[1], config=ClientConfig(zk_root=sys.argv[2], add_timeout_s=0.5))
    lh = await bk.create_ledger(3, 2, 2, password=b"secret")
    print("L", lh.ledger_id, flush=True)
    futs = []
    for i in range(100000):
        try:
            fut = await lh.append_future(b"e%d" % i)
        except Exception as e:
            print("X append", type(e).__name__, flush=True)
            break
        fut.add_done_callback(lambda f, i=i: print("A", f.result(), i, flush=True) if not f.exception() else print("F", i, type(f.exception()).__name__, flush=True))
        futs.append(fut)
        if i % 10 == 0:
            await asyncio.sleep(0.002)
    await asyncio.gather(*futs, return_exceptions=True)
    try:
        await lh.close()
        print("C ok", lh.metadata.state.value, lh.metadata.last_entry_id, flush=True)
    except Exception as e:
        print("C", type(e).__name__, e, lh.metadata.state.value, lh.metadata.last_entry_id, flush=True)
    await bk.close()
asyncio.run(main())
"""


def test_writer_paused_across_a_recovery_then_resumed(bookies) -> None:
    bookies.start_many(4)
    w = _spawn(bookies, WRITER_CLOSES, stderr=subprocess.DEVNULL)
    assert w.stdout is not None
    lid = int(w.stdout.readline().split()[1])
    lines = [w.stdout.readline() for _ in range(300)]
    w.send_signal(signal.SIGSTOP)

    async def recover() -> int:
        bk = await _bk(bookies)
        rh = await bk.open_ledger(lid, password=PW, recovery=True)
        end = rh.metadata.last_entry_id
        await bk.close()
        return end

    end = asyncio.run(recover())
    w.send_signal(signal.SIGCONT)
    out, _ = w.communicate(timeout=60)
    allout = lines + out.splitlines()
    acked = _acked(allout)
    failed = [ln for ln in allout if ln.startswith(("F ", "X "))]
    close = [ln for ln in allout if ln.startswith("C ")]
    print("recovered at", end, "acked max", max(acked), "failed", len(failed), failed[:2], "close", close)
    assert max(acked) <= end
    assert all(v == b"e%d" % k for k, v in acked.items())

    async def check() -> None:
        bk = await _bk(bookies)
        md = await bk.ledger_metadata(lid)
        assert md.last_entry_id == end
        rh = await bk.open_ledger(lid, password=PW)
        assert [e.data async for e in rh.read(0, end)] == [b"e%d" % i for i in range(end + 1)]
        await bk.close()

    asyncio.run(check())


def test_reads_with_a_paused_replica(bookies) -> None:
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await _written(bk, 3000, 1000)
        paused = _proc(procs, lh.metadata.last_ensemble.bookies[0])
        paused.pause()
        try:
            for cfg in ({"read_timeout_s": 1.0},):
                bk2 = await _bk(bookies, **cfg)
                t0 = time.monotonic()
                rh = await bk2.open_ledger(lh.ledger_id, password=PW)
                t1 = time.monotonic()
                data = [e.data async for e in rh.read(0, 2999)]
                t2 = time.monotonic()
                single = [(await rh.read_entry(i)).data for i in range(0, 3000, 300)]
                t3 = time.monotonic()
                print(
                    cfg,
                    "open",
                    round(t1 - t0, 2),
                    "read all",
                    round(t2 - t1, 2),
                    "10 singles",
                    round(t3 - t2, 2),
                )
                assert data == [payload(i, 1000) for i in range(3000)]
                assert single == [payload(i, 1000) for i in range(0, 3000, 300)]
                await bk2.close()
        finally:
            paused.resume()
        await bk.close()

    asyncio.run(go())


def test_a_replica_whose_read_timed_out_is_asked_last_by_the_next_reads(bookies) -> None:
    """A replica that hangs (SIGSTOP: a stalled disk or process) cost every read of a closed ledger a full
    ``read_timeout_s`` (10 s by default), handle after handle, as long as it hung: its batches were planned onto
    it every time. Once one of its reads timed out, the client asks it last for a while."""
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await _written(bk, 600, 1000)
        hung = _proc(procs, lh.metadata.last_ensemble.bookies[0])
        hung.pause()
        try:
            reader = await _bk(bookies, read_timeout_s=2.0, read_batch_entries=50)
            asked = _asked(reader)
            for _ in range(3):
                asked.clear()
                rh = await reader.open_ledger(lh.ledger_id, password=PW)
                assert [e.data async for e in rh.read(0, 599)] == [payload(i, 1000) for i in range(600)]
                print("asked the hung bookie", asked.count(hung.id), "times of", len(asked))
            assert hung.id not in asked
            await reader.close()
        finally:
            hung.resume()
        await bk.close()

    asyncio.run(go())


def test_a_read_a_hung_replica_does_not_answer_goes_to_another_after_the_speculative_timeout(bookies) -> None:
    """A read the hung replica (SIGSTOP) was asked for is sent to the next replica after
    ``speculative_read_timeout_s``, not after ``read_timeout_s`` (here 120 s, so without it the read could not
    finish within the test's bound); the hung bookie is then asked last. A whole read with a replica that
    answers late (stopped, then resumed while its copies and their speculative ones are out) hands out every
    entry once, in order."""
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await _written(bk, 40)
        # a fresh reader's first batch goes to bookie 1 of the ensemble (Qw == E: batches in turn from 1)
        hung = _proc(procs, lh.metadata.last_ensemble.bookies[1])
        reader = await _bk(
            bookies, read_timeout_s=120.0, speculative_read_timeout_s=0.5, read_batch_entries=4
        )
        asked = _asked(reader)
        hung.pause()
        try:
            rh = await reader.open_ledger(lh.ledger_id, password=PW)
            e = await asyncio.wait_for(rh.read_entry(5), 60)
            assert e.data == payload(5)
            # the hung bookie first, then another replica (a third too if the second was slow to answer on a
            # busy machine), the hung one once (a connection being opened asks the pool twice)
            order = list(dict.fromkeys(asked))
            assert len(order) >= 2 and order[0] == hung.id, asked
            assert reader.speculative_reads == len(order) - 1 and hung.id in reader.read_timed_out
            asked.clear()
            assert [x.data async for x in rh.read(0, 39)] == [payload(i) for i in range(40)]
            assert hung.id not in asked, asked  # asked last: another replica holds every entry

            late = await _bk(
                bookies, read_timeout_s=120.0, speculative_read_timeout_s=0.5, read_batch_entries=4
            )
            rh = await late.open_ledger(lh.ledger_id, password=PW)
            # every replica stopped: each batch is asked of all three in turn, then all of them answer at once
            others = [bp for bp in procs if bp is not hung]
            for bp in others:
                bp.pause()
            added: list[int] = []
            add = ReadyRuns.add
            ReadyRuns.add = lambda self, first, payloads: added.append(first) or add(self, first, payloads)  # type: ignore[method-assign]
            try:
                task = asyncio.ensure_future(_read_all(rh, 0, 39))
                await asyncio.sleep(1.5)
                for bp in procs:
                    bp.resume()
                got = await asyncio.wait_for(task, 60)
            finally:
                ReadyRuns.add = add  # type: ignore[method-assign]
            assert got == [(i, payload(i)) for i in range(40)]
            assert late.speculative_reads >= 2 * 8  # (the read-ahead window's 8 batches, 2 copies each)
            assert len(added) == len(set(added)), sorted(added)  # every answer but the first one dropped
            await late.close()
        finally:
            for bp in procs:
                bp.resume()
        await reader.close()
        await bk.close()

    asyncio.run(go())


def test_a_speculative_copy_to_a_dead_bookie_does_not_leave_the_read_waiting_on_the_hung_one(bookies) -> None:
    """The batch's bookie hangs (SIGSTOP) and its speculative copy goes to a bookie that is down (connection
    refused at once): the read must still go to the third replica a speculative timeout later, not wait out
    ``read_timeout_s`` (here 120 s) on the hung one. The failed copy used to take the batch's only speculative
    timer with it."""
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await _written(bk, 10)
        ensemble = lh.metadata.last_ensemble.bookies
        # a fresh reader asks bookie 1 of the ensemble first (Qw == E: batches in turn from 1); entry 5's write
        # set in order is 2, 0, 1, so its speculative copy goes to bookie 2, then bookie 0
        hung, dead = (_proc(procs, ensemble[i]) for i in (1, 2))
        dead.kill9()
        reader = await _bk(bookies, read_timeout_s=120.0, speculative_read_timeout_s=0.5)
        asked = _asked(reader)
        rh = await reader.open_ledger(lh.ledger_id, password=PW)
        hung.pause()
        try:
            e = await asyncio.wait_for(rh.read_entry(5), 60)
            assert e.data == payload(5)
            assert list(dict.fromkeys(asked)) == [hung.id, dead.id, ensemble[0]], asked
        finally:
            hung.resume()
        await reader.close()
        await bk.close()

    asyncio.run(go())


async def _read_all(rh, first: int, last: int) -> list[tuple[int, bytes]]:
    return [(e.entry_id, e.data) async for e in rh.read(first, last)]


def test_a_long_poll_for_the_lac_a_hung_bookie_does_not_answer_asks_another_after_the_speculative_timeout(
    bookies,
) -> None:
    """``wait_for_lac`` (``tail``'s long poll) asks one bookie at a time: a hung one (SIGSTOP) cost its long
    poll plus ``read_timeout_s`` (here 120 s) before the next was asked. Now the next one is asked for the LAC
    ``speculative_read_timeout_s`` after the long poll should have ended, and the hung one is asked last."""
    procs = bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await _written(bk, 20, close=False)
        ensemble = lh.metadata.last_ensemble.bookies
        hung = _proc(procs, ensemble[0])
        reader = await _bk(bookies, read_timeout_s=120.0, speculative_read_timeout_s=0.5)
        rh = await reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        hung.pause()
        try:
            for b in ensemble[
                1:
            ]:  # (the failure history puts the live ones last: the hung one is asked first)
                reader.read_timed_out[b] = time.monotonic()
            lac = await asyncio.wait_for(rh.wait_for_lac(-1, 1.0), 60)
            assert lac == 19
            # the hung bookie's long poll the other answer won over is forgotten, not left pending on its
            # connection until the bookie answers or the connection closes
            await asyncio.sleep(0.1)  # (the cancelled poll's task runs its cleanup)
            conn = reader.pool.get_nowait(hung.id)
            assert conn is not None and conn.outstanding == 0, conn and conn.outstanding
            assert hung.id in reader.read_timed_out
            assert len([b for b in ensemble[1:] if b in reader.read_timed_out]) == 1  # the one that answered
            # the next long poll asks the hung bookie last: a live one answers at its long poll's end
            assert await asyncio.wait_for(rh.wait_for_lac(19, 0.5), 60) == 19
        finally:
            hung.resume()
        await reader.close()
        await lh.close()
        await bk.close()

    asyncio.run(go())
