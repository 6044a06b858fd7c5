"""A real bookie process: crash safety under kill -9, torn journal tail, fencing, keys, hostile clients."""

from __future__ import annotations

import asyncio
import random
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from bookie import protocol as p
from bookie.journal import SEGMENT_HEADER_LEN, RecordType
from ledgerstore.cluster import BookieProcess, free_port
from tests.integration.rawbookie import KEY, WRONG, RawBookie, build, payload_for
from tests.metrics_testing import scrape


def _journal_segments(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "journal").iterdir() if p.suffix == ".jnl")


def test_every_acked_entry_fence_and_key_survive_kill9(bookies) -> None:
    bp = bookies.start("--checkpoint-interval-s", "0.5")
    acked: dict[tuple[int, int], bytes] = {}

    async def write_until_killed() -> None:
        raw = await RawBookie.open(bp.id)
        # A fenced ledger and a keyed ledger, both durable before the storm.
        assert await raw.add(900, 0) == p.Status.OK
        assert (await raw.fence(900)).status == p.Status.OK
        assert await raw.add(901, 0) == p.Status.OK
        loop = asyncio.get_running_loop()
        kill_at = loop.time() + random.uniform(0.5, 1.5)
        next_entry = {1: 0, 2: 0, 3: 0}
        inflight: set[asyncio.Future[None]] = set()

        async def one(ledger: int, entry: int) -> None:
            try:
                if await raw.add(ledger, entry) == p.Status.OK:
                    acked[(ledger, entry)] = build(ledger, entry)
            except Exception:
                pass  # the kill: unacknowledged, may or may not be stored

        while loop.time() < kill_at:
            while len(inflight) < 500:
                ledger = random.choice((1, 2, 3))
                t = asyncio.ensure_future(one(ledger, next_entry[ledger]))
                next_entry[ledger] += 1
                inflight.add(t)
                t.add_done_callback(inflight.discard)
            await asyncio.sleep(0.001)
        bp.kill9()
        await asyncio.gather(*inflight, return_exceptions=True)
        raw.close()

    asyncio.run(write_until_killed())
    assert len(acked) > 1000, f"only {len(acked)} adds acked before the kill"
    bp.start()

    async def verify() -> None:
        raw = await RawBookie.open(bp.id)
        for (ledger, entry), data in sorted(acked.items()):
            r = await raw.read(ledger, entry)
            assert r.status == p.Status.OK, (ledger, entry, r.status)
            assert r.entry == data
        assert await raw.add(900, 1) == p.Status.FENCED
        assert await raw.add(901, 1, key=WRONG) == p.Status.UNAUTHORIZED
        assert (await raw.read(901, 0, key=WRONG)).status == p.Status.UNAUTHORIZED
        raw.close()

    asyncio.run(verify())


def _end_of_last_entry_record(seg: Path) -> int:
    """File offset just after the last record that is not PADDING (read from the record headers, up to the
    zeros the journal writes ahead)."""
    raw = seg.read_bytes()
    pos, end = SEGMENT_HEADER_LEN, 0
    while pos + 9 <= len(raw):
        if not any(raw[pos : pos + 9]):
            break
        blen = int.from_bytes(raw[pos : pos + 4], "big")
        if pos + 9 + blen > len(raw):
            break
        if raw[pos + 8] != RecordType.PADDING:
            end = pos + 9 + blen
        pos += 9 + blen
    assert end, f"no record in {seg}"
    return end


def test_torn_journal_tail_replays_to_last_whole_record(bookies) -> None:
    bp = bookies.start("--checkpoint-interval-s", "3600")

    async def write(n: int) -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(n):
            assert await raw.add(7, e, size=1000) == p.Status.OK
        raw.close()

    asyncio.run(write(50))
    bp.kill9()
    last = _journal_segments(bp.data_dir)[-1]
    end = _end_of_last_entry_record(last)  # each batch is padded to 4 KiB after its last record
    with open(last, "r+b") as f:
        f.truncate(end - 500)  # cuts the last entry record (about 1.1 KB) in the middle
    bp.start()

    async def verify() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(49):
            r = await raw.read(7, e)
            assert r.status == p.Status.OK and r.entry == build(7, e, 1000), e
        assert (await raw.read(7, 49)).status == p.Status.NO_ENTRY
        assert await raw.add(7, 49, size=1000) == p.Status.OK  # the bookie keeps working after the cut
        raw.close()

    asyncio.run(verify())
    assert "journal" in bp.log_tail(100).lower()


def test_fence_blocks_adds_across_restart_but_not_recovery_adds(bookies) -> None:
    bp = bookies.start()

    async def before() -> None:
        raw = await RawBookie.open(bp.id)
        assert await raw.add(5, 0) == p.Status.OK
        f = await raw.fence(5)
        assert f.status == p.Status.OK and f.entry_id == 0
        assert await raw.add(5, 1) == p.Status.FENCED
        assert await raw.add(5, 1, key=WRONG) == p.Status.UNAUTHORIZED
        # Fencing a ledger this bookie never saw makes later adds to it fail too.
        assert (await raw.fence(6)).status == p.Status.NO_ENTRY
        assert await raw.add(6, 0) == p.Status.FENCED
        raw.close()

    asyncio.run(before())
    bp.restart()

    async def after() -> None:
        raw = await RawBookie.open(bp.id)
        assert await raw.add(5, 1) == p.Status.FENCED
        assert await raw.add(6, 0) == p.Status.FENCED
        assert await raw.add(5, 1, flags=p.Flag.RECOVERY_ADD) == p.Status.OK
        r = await raw.read(5, 1)
        assert r.status == p.Status.OK and r.entry == build(5, 1)
        assert (await raw.read(5, 0, key=WRONG)).status == p.Status.UNAUTHORIZED
        raw.close()

    asyncio.run(after())


def test_garbage_frames_and_slow_loris_do_not_disturb_a_healthy_client(bookies) -> None:
    bp = bookies.start("--partial-frame-timeout-s", "1.0")
    host, port = "127.0.0.1", bp.port

    garbage = socket.create_connection((host, port))
    garbage.sendall(b"\xff\xff\xff\xff" + b"GET / HTTP/1.1\r\n\r\n")
    bad_version = socket.create_connection((host, port))
    frame = bytearray(p.encode(p.BookieInfoRequest(request_id=1)))
    frame[4] = 42
    bad_version.sendall(bytes(frame))
    loris = socket.create_connection((host, port))
    partial = build(3, 0)
    loris.sendall(p.encode_add_request(1, 3, 0, KEY, partial)[:20])

    async def healthy() -> int:
        raw = await RawBookie.open(bp.id)
        ok = 0
        for e in range(300):
            assert await raw.add(11, e) == p.Status.OK
            ok += 1
        r = await raw.read(11, 299)
        assert r.entry == build(11, 299)
        raw.close()
        return ok

    assert asyncio.run(healthy()) == 300
    for s in (garbage, bad_version):
        s.settimeout(5)
        assert s.recv(100) == b"", "a malformed frame must close its connection"
    loris.settimeout(5)
    t0 = time.monotonic()
    assert loris.recv(100) == b"", "a stalled partial frame must be cut"
    assert time.monotonic() - t0 < 5
    assert bp.alive
    log = bp.log_tail(200)
    assert "malformed frame" in log and "stalled" in log
    for s in (garbage, bad_version, loris):
        s.close()


def test_too_many_requests_instead_of_unbounded_memory(bookies) -> None:
    bp = bookies.start("--inflight-max", "50", "--journal-max-wait-ms", "50")

    async def flood() -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        statuses = await asyncio.gather(*(raw.add(12, e) for e in range(400)))
        raw.close()
        return list(statuses)

    statuses = asyncio.run(flood())
    assert p.Status.TOO_MANY_REQUESTS in statuses
    assert p.Status.OK in statuses
    assert set(statuses) <= {p.Status.OK, p.Status.TOO_MANY_REQUESTS}


def test_a_busy_connection_is_paused_not_refused(bookies) -> None:
    """Adds arriving faster than the journal commits them: the bookie stops reading the connection at half its
    in-flight bound and resumes at a quarter, so a client that keeps sending in ordinary chunks is slowed by
    TCP, never refused (a refused add costs the writer an ensemble change)."""
    bp = bookies.start("--inflight-max", "400", "--journal-max-wait-ms", "50")

    async def stream() -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        tasks = []
        for first in range(0, 4000, 40):  # 40 KiB per loop iteration, far faster than a 50 ms group commit
            tasks += [asyncio.ensure_future(raw.add(13, e, size=1024)) for e in range(first, first + 40)]
            await asyncio.sleep(0.001)
        statuses = await asyncio.gather(*tasks)
        raw.close()
        return list(statuses)

    statuses = asyncio.run(stream())
    assert statuses == [p.Status.OK] * 4000
    pauses = scrape(f"http://127.0.0.1:{bp.http_port}/metrics")["bookie_backpressure_pauses_total"]
    assert pauses > 0, pauses


def test_payload_helper_is_deterministic() -> None:
    assert payload_for(1, 2) == payload_for(1, 2) != payload_for(1, 3)


@pytest.mark.parametrize("n", [1])
def test_bookie_info_and_admin_http(bookies, n: int) -> None:
    import json

    bp = bookies.start()
    with urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/health") as r:
        assert json.loads(r.read())["status"] == "ok"

    async def go() -> None:
        raw = await RawBookie.open(bp.id)
        assert await raw.add(44, 0) == p.Status.OK
        resp = await raw.conn.request(lambda rid: p.BookieInfoRequest(request_id=rid), 5)
        assert isinstance(resp, p.BookieInfoResponse) and resp.total_bytes > 0 and resp.bookie_id == bp.id
        raw.close()

    asyncio.run(go())
    m = scrape(f"http://127.0.0.1:{bp.http_port}/metrics")
    assert m["bookie_adds_total"] == 1 and m["bookie_journal_fsync_seconds_count"] >= 1
    assert m['bookie_journal_fsync_seconds_bucket{le="+Inf"}'] == m["bookie_journal_fsync_seconds_count"]
    assert m["bookie_storage_memtables_waiting"] == 0 and m["bookie_storage_writes_delayed"] == 0
    assert m["bookie_storage_blob_bytes"] >= 0 and m["bookie_storage_sst_bytes"] >= 0
    assert m["bookie_storage_blob_files_on"] in (0, 1) and m["bookie_storage_blob_files_switches"] >= 0
    with urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/api/v1/ledgers/44") as r:
        assert json.loads(r.read())["last_entry_id"] == 0
    with urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/api/v1/info") as r:
        assert json.loads(r.read())["bookie_id"] == bp.id


def test_sigterm_unregisters_and_a_wiped_data_dir_is_refused_by_the_cookie(bookies) -> None:
    import shutil

    from zk import BookieRegistry, MetadataStore

    bp = bookies.start()

    async def write() -> None:
        raw = await RawBookie.open(bp.id)
        assert await raw.add(3, 0) == p.Status.OK
        raw.close()

    asyncio.run(write())
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        reg = BookieRegistry(store)
        assert bp.id in reg.available()
        bp.stop()
        assert bp.proc is not None and bp.proc.returncode == 0, "SIGTERM is a clean shutdown"
        assert bp.id not in reg.available(), "a stopped bookie unregisters at once"
        assert "stopped" in bp.log_tail(5)

        shutil.rmtree(bp.data_dir)  # the disk is lost, the id is the same
        bp.start(wait=False)
        assert bp.wait_exit(30) == 3
        log = bp.log_tail(20)
        assert "cookie" in log.lower() and "refusing to start" in log
        assert bp.id not in reg.available()
    finally:
        store.close()


def test_sigterm_stops_promptly_when_zookeeper_is_gone(bookies) -> None:
    """Unregistering needs ZooKeeper; a bookie cut off from it still stops cleanly and within bounds."""
    import signal

    from tests.zk_testing import TcpProxy

    host, _, port = bookies.zk.rpartition(":")
    with TcpProxy(host, int(port)) as proxy:
        bp = BookieProcess(
            zk=proxy.connect_string,
            zk_root=bookies.root,
            data_dir=bookies.tmp / "cut-off",
            port=free_port(),
            http_port=free_port(),
        ).start()
        try:
            _wait_registered(bookies, bp.id)
            proxy.partition()  # ZooKeeper unreachable from now on
            time.sleep(1.0)
            t0 = time.monotonic()
            assert bp.proc is not None
            bp.proc.send_signal(signal.SIGTERM)
            rc = bp.wait_exit(40)
            assert rc == 0, bp.log_tail(40)
            took = time.monotonic() - t0
        finally:
            bp.kill9()
    # each ZooKeeper call of the shutdown is bounded (ZK_STOP_TIMEOUT_S); unbounded, the store's own 10 s
    # operation timeout and kazoo's reconnect attempts made this take 10-20 s
    assert took < 8, f"shutdown without ZooKeeper took {took:.1f}s"
    assert "stopped" in bp.log_tail(10)


def _wait_registered(bookies, bookie_id: str, timeout_s: float = 30.0) -> None:
    from zk import BookieRegistry, MetadataStore

    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        reg = BookieRegistry(store)
        deadline = time.monotonic() + timeout_s
        while bookie_id not in reg.available():
            assert time.monotonic() < deadline, f"bookie {bookie_id} never registered"
            time.sleep(0.1)
    finally:
        store.close()


def test_journal_on_its_own_directory_survives_kill9_and_is_part_of_the_cookie(bookies, tmp_path) -> None:
    journal = tmp_path / "journal-disk"
    bp = bookies.start("--journal-dir", str(journal))

    async def write() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(50):
            assert await raw.add(8, e) == p.Status.OK
        raw.close()

    asyncio.run(write())
    assert any(journal.glob("*.jnl")), "the journal lives where --journal-dir says"
    assert not (bp.data_dir / "journal").exists()
    bp.kill9()
    bp.start()

    async def read() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(50):
            r = await raw.read(8, e)
            assert r.status == p.Status.OK and r.entry == build(8, e)
        raw.close()

    asyncio.run(read())
    bp.stop()
    import shutil

    shutil.rmtree(journal)  # the journal disk was replaced: acked entries may be gone, refuse to start
    bp.start(wait=False)
    assert bp.wait_exit(30) == 3
    assert "cookie" in bp.log_tail(20).lower()


async def _add_entries(raw: RawBookie, ledger_id: int, n: int) -> None:
    """Entries 0..n-1 of 1000 bytes, 500 in flight at a time, every one acknowledged OK."""
    for first in range(0, n, 500):
        results = await asyncio.gather(*(raw.add(ledger_id, e, size=1000) for e in range(first, first + 500)))
        assert set(results) == {p.Status.OK}


async def _check_entries(raw: RawBookie, ledger_id: int, n: int) -> None:
    """Every 7th of the entries ``_add_entries`` wrote reads back as written."""
    for e in range(0, n, 7):
        r = await raw.read(ledger_id, e)
        assert r.status == p.Status.OK and r.entry == build(ledger_id, e, size=1000)


def test_paced_direct_io_storage_flushes_and_keeps_every_entry(bookies) -> None:
    """--storage-flush-io direct with --storage-write-rate-mb: direct-I/O, rate-limited RocksDB flushes. With a
    1 MiB memtable and 1 s checkpoints the entries go through many flushes and a checkpoint that drops the journal
    behind them; after a restart every entry reads back from storage alone."""
    bp = bookies.start(
        "--storage-flush-io=direct",
        "--storage-write-rate-mb=20",
        "--write-buffer-mb=1",
        "--checkpoint-interval-s=1",
    )
    n = 3000

    async def write() -> None:
        raw = await RawBookie.open(bp.id)
        await _add_entries(raw, 9, n)
        raw.close()

    asyncio.run(write())
    time.sleep(2.5)  # at least one checkpoint: storage flushed, journal segments behind the mark deleted
    bp.restart()

    async def read() -> None:
        raw = await RawBookie.open(bp.id)
        await _check_entries(raw, 9, n)
        raw.close()

    asyncio.run(read())
    assert list((bp.data_dir / "ledgers").glob("*.sst")), "entries must have been flushed to SST files"
    import re

    replayed = [int(m) for m in re.findall(r"replayed (\d+) journal records", bp.log_tail(200))]
    assert replayed and replayed[-1] < n, (
        f"a checkpoint should have let the journal forget the entries: {replayed}"
    )


def test_flushes_leave_the_entries_in_the_block_cache(bookies) -> None:
    """--storage-cache-mb: a bookie's memtable flushes leave the entries they wrote in RocksDB's block cache
    (the first read after a write reads memory), seen in /metrics, and the entries read back."""
    bp = bookies.start("--storage-blob-files=off", "--write-buffer-mb=1", "--storage-cache-mb=16")
    n = 3000

    async def write_and_read() -> None:
        raw = await RawBookie.open(bp.id)
        await _add_entries(raw, 5, n)
        deadline = time.monotonic() + 10
        metrics = scrape(f"http://127.0.0.1:{bp.http_port}/metrics")
        while metrics["bookie_storage_cache_bytes"] < 2_000_000 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # flushes run in RocksDB's own threads
            metrics = scrape(f"http://127.0.0.1:{bp.http_port}/metrics")
        assert metrics["bookie_storage_sst_bytes"] >= 2_000_000, "1 MiB memtables should have been flushed"
        assert metrics["bookie_storage_cache_bytes"] >= 2_000_000, metrics["bookie_storage_cache_bytes"]
        await _check_entries(raw, 5, n)
        raw.close()

    asyncio.run(write_and_read())


def test_strided_range_reads_of_a_bookie_process_old_and_new_requests(bookies) -> None:
    """A bookie holding two entries in three (E3/Qw2) answers a READ_RANGE with a step of 3 with one residue,
    from its memtable and, after a restart, from flushed storage; a request without a step keeps today's
    meaning (consecutive entries, stopping at the first it does not hold)."""
    bp = bookies.start()
    held = [e for e in range(600) if (0 - e) % 3 < 2]  # bookie 0's entries of an E3/Qw2 ledger

    async def read_range(raw: RawBookie, first: int, last: int, step: int) -> list[bytes]:
        resp = await raw.conn.request(
            lambda rid: p.ReadRangeRequest(
                request_id=rid, ledger_id=77, first_entry_id=first, last_entry_id=last, master_key=KEY,
                step=step,
            ),
            10.0,
        )  # fmt: skip
        assert isinstance(resp, p.ReadRangeResponse)
        return list(resp.entries) if resp.status == p.Status.OK else []

    async def check(raw: RawBookie) -> None:
        assert await read_range(raw, 2, 599, 3) == [build(77, e) for e in range(2, 600, 3)]
        assert await read_range(raw, 0, 599, 3) == [build(77, e) for e in range(0, 600, 3)]
        assert await read_range(raw, 1, 599, 3) == []  # a residue it does not hold: NO_ENTRY
        assert await read_range(raw, 2, 599, 1) == [build(77, 2), build(77, 3)]

    async def write_and_read() -> None:
        raw = await RawBookie.open(bp.id)
        assert set(await asyncio.gather(*(raw.add(77, e) for e in held))) == {p.Status.OK}
        await check(raw)
        raw.close()

    async def read_again() -> None:
        raw = await RawBookie.open(bp.id)
        await check(raw)
        raw.close()

    asyncio.run(write_and_read())
    bp.restart()
    asyncio.run(read_again())
