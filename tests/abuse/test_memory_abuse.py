"""Memory amplification, slow frames and connection floods against a real bookie process: the bookie's RSS
stays within ``RSS_GROWTH_MAX`` and an honest client is served meanwhile."""

from __future__ import annotations

import asyncio
import socket
import time

from bookie import protocol as p
from tests.abuse.helpers import metric, rss_bytes
from tests.integration.rawbookie import KEY, RawBookie, build

RSS_GROWTH_MAX = 300 * 2**20
BIG = p.ENTRY_SIZE_MAX - 64  # the largest entry a client may add
HONEST_LATENCY_MAX_S = 1.0


def _honest(address: str, ledger: int, n: int = 100) -> float:
    """Adds and reads back ``n`` small entries; returns the slowest request's seconds."""

    async def go() -> float:
        raw = await RawBookie.open(address)
        worst = 0.0
        for e in range(n):
            t0 = time.monotonic()
            assert await raw.add(ledger, e) == p.Status.OK
            assert (await raw.read(ledger, e)).entry == build(ledger, e)
            worst = max(worst, time.monotonic() - t0)
        raw.close()
        return worst

    return asyncio.run(go())


def _add_big(address: str, ledger: int) -> None:
    async def go() -> None:
        raw = await RawBookie.open(address)
        assert await raw.add(ledger, 0, size=BIG) == p.Status.OK
        raw.close()

    asyncio.run(go())


def test_pipelined_reads_of_a_large_entry_never_read_back_stay_bounded(bookies) -> None:
    bp = bookies.start()
    assert bp.proc is not None
    _add_big(bp.id, 5)
    base = rss_bytes(bp.proc.pid)
    reads = b"".join(
        p.encode(p.ReadEntryRequest(request_id=i + 1, ledger_id=5, entry_id=0, master_key=KEY))
        for i in range(400)
    )
    attackers = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", bp.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(reads)  # 400 reads of 5 MiB each: 2 GB of replies if all were made at once
        attackers.append(s)
    time.sleep(2.0)
    worst = _honest(bp.id, 6)
    growth = rss_bytes(bp.proc.pid) - base
    assert growth <= RSS_GROWTH_MAX, f"RSS grew {growth / 2**20:.0f} MiB"
    assert worst < HONEST_LATENCY_MAX_S, worst
    assert metric(bp, "bookie_write_stalls_total") >= 3
    for s in attackers:
        s.close()
    assert bp.alive


def test_trickled_partial_large_frames_stay_bounded_and_are_cut(bookies) -> None:
    bp = bookies.start("--frame-grace-s", "2", "--frame-rate-min-kib", "1024")
    assert bp.proc is not None
    base = rss_bytes(bp.proc.pid)
    frame = p.encode_add_request(1, 9, 0, KEY, build(9, 0, BIG))
    head = frame[:-100]  # all but the last 100 bytes of a 5 MiB add
    socks = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", bp.port))
        s.setblocking(False)
        socks.append([s, 0])
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and any(off < len(head) for _, off in socks):
        for row in socks:
            s, off = row
            if off < len(head):
                try:
                    row[1] += s.send(head[off : off + 1 << 20])
                except (BlockingIOError, OSError):
                    pass
        time.sleep(0.01)
    peak = rss_bytes(bp.proc.pid) - base
    worst = _honest(bp.id, 10)
    peak = max(peak, rss_bytes(bp.proc.pid) - base)
    assert peak <= RSS_GROWTH_MAX, f"RSS grew {peak / 2**20:.0f} MiB"
    assert worst < HONEST_LATENCY_MAX_S, worst
    # a byte every second does not keep them alive: each is cut by grace + size / rate (2 s + 5 s here)
    closed = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and closed < len(socks):
        closed = 0
        for s, _ in socks:
            try:
                s.send(b"x")
                s.recv(1)
            except BlockingIOError:
                continue
            except OSError:
                closed += 1
                continue
            closed += 1  # recv returned b"": closed by the bookie
        time.sleep(1.0)
    assert closed == len(socks), f"{closed} of {len(socks)} slow connections closed"
    assert metric(bp, "bookie_slow_frames_closed_total") >= 1
    for s, _ in socks:
        s.close()
    assert bp.alive


def test_connections_over_the_per_peer_cap_are_refused_with_a_log_line(bookies) -> None:
    bp = bookies.start("--connections-per-peer-max", "5")
    kept = [socket.create_connection(("127.0.0.1", bp.port)) for _ in range(5)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", bp.port))
    extra.settimeout(5)
    try:
        assert extra.recv(10) == b""
    except ConnectionResetError:
        pass
    assert metric(bp, "bookie_connections_refused_total") == 1
    assert "refusing connection" in bp.log_tail(100)
    for s in kept:
        s.close()
    time.sleep(0.3)
    assert _honest(bp.id, 3, n=10) < HONEST_LATENCY_MAX_S  # room again once they left


def test_an_idle_connection_is_closed(bookies) -> None:
    bp = bookies.start("--idle-timeout-s", "1")
    s = socket.create_connection(("127.0.0.1", bp.port))
    s.settimeout(6)
    t0 = time.monotonic()
    assert s.recv(10) == b""
    assert time.monotonic() - t0 < 4
    assert metric(bp, "bookie_idle_closed_total") == 1
    s.close()
