"""Disk full: a bookie on a small tmpfs goes read-only (adds get READONLY, registered under readonly),
loses nothing it acknowledged, and comes back when space frees up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bookie import protocol as p
from ledgerstore.cluster import BookieProcess
from tests.integration.rawbookie import RawBookie, build


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _health(bp) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/health", timeout=2) as r:
        return json.loads(r.read())


def _wait(pred, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def _fill(path: Path, nbytes: int | None) -> None:
    """Write a filler file of nbytes (None: until the filesystem is full)."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        written = 0
        with contextlib.suppress(OSError):
            while nbytes is None or written < nbytes:
                f.write(chunk)
                written += len(chunk)
            f.flush()
            os.fsync(f.fileno())


def _registered(bookies, kind: str) -> list[str]:
    from zk import BookieRegistry, MetadataStore

    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        reg = BookieRegistry(store)
        return list(reg.readonly() if kind == "readonly" else reg.available())
    finally:
        store.close()


def test_disk_usage_over_threshold_goes_readonly_and_back(bookies, small_fs: Path) -> None:
    bp = bookies.start(
        "--disk-usage-threshold", "0.6", "--disk-usage-lwm", "0.4", data_dir=small_fs / "bookie"
    )

    async def write(first: int, n: int) -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        out = [await raw.add(1, e) for e in range(first, first + n)]
        raw.close()
        return out

    assert asyncio.run(write(0, 20)) == [p.Status.OK] * 20
    filler = small_fs / "filler"
    _fill(filler, 34 * 1024 * 1024)
    _wait(lambda: _health(bp)["readonly"])
    _wait(lambda: bp.id in _registered(bookies, "readonly"))
    assert bp.id not in _registered(bookies, "available")
    assert asyncio.run(write(20, 3)) == [p.Status.READONLY] * 3

    async def read_back() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(20):
            r = await raw.read(1, e)
            assert r.status == p.Status.OK and r.entry == build(1, e)
        raw.close()

    asyncio.run(read_back())
    filler.unlink()
    _wait(lambda: not _health(bp)["readonly"])
    _wait(lambda: bp.id in _registered(bookies, "available"))
    assert asyncio.run(write(20, 3)) == [p.Status.OK] * 3


def test_enospc_in_the_journal_answers_readonly_and_loses_nothing(bookies, small_fs: Path) -> None:
    bp = bookies.start(
        "--disk-usage-threshold", "1.0", "--disk-usage-lwm", "0.5", data_dir=small_fs / "bookie"
    )

    async def write(first: int, n: int, size: int = 100) -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        out = [await raw.add(2, e, size=size) for e in range(first, first + n)]
        raw.close()
        return out

    assert asyncio.run(write(0, 10)) == [p.Status.OK] * 10
    filler = small_fs / "filler"
    _fill(filler, None)
    statuses = asyncio.run(write(10, 64, size=64 * 1024))  # more than the 2 MiB the journal wrote ahead
    assert statuses[-1] == p.Status.READONLY, statuses
    assert set(statuses) <= {p.Status.OK, p.Status.READONLY}
    assert bp.alive
    ok_extra = statuses.count(p.Status.OK)

    async def read_back() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(10):
            r = await raw.read(2, e)
            assert r.status == p.Status.OK and r.entry == build(2, e)
        for e in range(10, 10 + ok_extra):
            r = await raw.read(2, e)
            assert r.status == p.Status.OK and r.entry == build(2, e, 64 * 1024)
        raw.close()

    asyncio.run(read_back())
    filler.unlink()
    _wait(lambda: not _health(bp)["readonly"])
    assert asyncio.run(write(10 + ok_extra, 2)) == [p.Status.OK] * 2
    bp.restart()
    asyncio.run(read_back())


def test_blob_garbage_waits_when_the_disk_has_no_room_for_the_copies(small_fs: Path) -> None:
    """A pass copies every live entry before it frees anything: on a disk without room for that (and a margin),
    it does not start, the garbage stays, and every live entry still reads back."""
    from bookie.storage import BlobGarbagePolicy, LedgerInfo, RocksLedgerStorage

    s = RocksLedgerStorage(small_fs / "db", blob_files="on", blob_gc=BlobGarbagePolicy(0.5, 0))
    key = b"k" * 20
    infos = {lid: LedgerInfo(key) for lid in range(1, 5)}
    for f in range(3):
        s.write(
            [(lid, f * 500 + i, bytes([lid]) * 1000) for i in range(500) for lid in infos],
            list(infos.items()),
        )
        s.flush()
    for lid in (2, 3, 4):
        s.delete_ledger(lid)
    stored, garbage = s.blob_garbage()
    assert garbage >= 0.5 * stored  # due...
    assert s.collect_blob_garbage() is None and s.collect_blob_garbage(force=True) is None  # ...but no room
    assert s.blob_gc_no_room == 2 and s.blob_gc_passes == 0
    assert s.blob_garbage()[1] == garbage
    assert s.get_range(1, 0, 1499, 1 << 30) == [b"\x01" * 1000] * 1500
    s.close()


def _health_any(bp) -> dict:
    """``/health``'s body, 200 or 503 (a failed bookie answers 503 with the reason); {} while it is not listening
    (restarting)."""
    try:
        return _health(bp)
    except urllib.error.HTTPError as e:
        return json.loads(e.read())
    except OSError:
        return {}


def fill_until_a_flush_fails(
    bp: BookieProcess, filler: Path, write8: Callable[[int], list[p.Status]]
) -> tuple[int, str]:
    """Write 8 entries (``write8(first)``), fill the disk, give a checkpoint 3 s to fail the bookie on its flush
    (the journal may have room left); again until one does. Returns (entries written, ``/health``'s reason),
    with the disk left full."""
    failed = ""
    written = 0
    for _ in range(20):
        assert write8(written) == [p.Status.OK] * 8
        written += 8
        _fill(filler, None)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not (failed := _health_any(bp).get("reason", "")):
            time.sleep(0.1)
        if failed:
            break
        filler.unlink()
    return written, failed


def test_a_storage_flush_on_a_full_disk_fails_the_bookie_until_space_returns_then_it_restarts_itself(
    bookies, small_fs: Path
) -> None:
    """RocksDB refuses every write after a flush hit ENOSPC, until it is reopened: the bookie fails (503, read-only)
    and, once the disk has room again, runs itself anew in the same process (same pid: a supervisor sees nothing
    exit), replaying the journal; every acknowledged entry reads back and adds are accepted again."""
    bp = bookies.start(
        "--disk-usage-threshold",
        "1.0",
        "--disk-usage-lwm",
        "0.5",
        "--checkpoint-interval-s",
        "0.5",
        data_dir=small_fs / "bookie",
    )
    pid = bp.proc.pid

    async def write(first: int, n: int, size: int) -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        out = [await raw.add(3, e, size=size) for e in range(first, first + n)]
        raw.close()
        return out

    async def read_back(n: int, size: int) -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(n):
            r = await raw.read(3, e)
            assert r.status == p.Status.OK and r.entry == build(3, e, size), e
        raw.close()

    filler = small_fs / "filler"
    written, failed = fill_until_a_flush_fails(
        bp, filler, lambda first: asyncio.run(write(first, 8, 32 * 1024))
    )
    assert "No space left on device" in failed, failed
    assert _health_any(bp)["readonly"]
    filler.unlink()
    _wait(lambda: _health_any(bp).get("status") == "ok", 30.0)
    assert bp.proc.pid == pid and bp.proc.poll() is None
    assert "restarting to reopen storage" in bp.log_tail(200)
    asyncio.run(read_back(written, 32 * 1024))
    assert asyncio.run(write(written, 2, 32 * 1024)) == [p.Status.OK] * 2
