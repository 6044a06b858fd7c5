"""A bookie whose disk stays full: one line about it, not a traceback every checkpoint; reads are served and adds
refused with READONLY meanwhile, and it comes back once there is room. Restarted on a full disk, it refuses to
start in one line that names the directory and its free space."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bookie import protocol as p
from tests.integration.rawbookie import RawBookie, build
from tests.integration.test_bookie_disk_full import (
    _fill,
    _health_any,
    _wait,
    fill_until_a_flush_fails,
    small_fs,  # noqa: F401 (a fixture)
)


def test_a_disk_that_stays_full_is_one_log_line_and_the_bookie_serves_reads(bookies, small_fs: Path) -> None:  # noqa: F811
    bp = bookies.start("--checkpoint-interval-s", "0.3", data_dir=small_fs / "bookie")

    async def write(first: int, n: int) -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        out = [await raw.add(4, e, size=32 * 1024) for e in range(first, first + n)]
        raw.close()
        return out

    async def read_back(n: int) -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(n):
            r = await raw.read(4, e)
            assert r.status == p.Status.OK and r.entry == build(4, e, 32 * 1024), e
        raw.close()

    filler = small_fs / "filler"
    written, failed = fill_until_a_flush_fails(bp, filler, lambda first: asyncio.run(write(first, 8)))
    assert "No space left on device" in failed, failed
    time.sleep(5)  # some 15 checkpoints on the full disk
    assert asyncio.run(write(written, 2)) == [p.Status.READONLY] * 2
    asyncio.run(read_back(written))
    log = bp.log_tail(400)
    assert "Traceback" not in log and "periodic task checkpoint failed" not in log, log[-3000:]
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "FAILED" in errors[0], log[-3000:]  # once, not once per checkpoint
    assert sum("No space left on device" in line for line in log.splitlines()) <= 2, log[-3000:]
    filler.unlink()
    _wait(lambda: _health_any(bp).get("status") == "ok", 30.0)
    asyncio.run(read_back(written))
    assert asyncio.run(write(written, 2)) == [p.Status.OK] * 2


def killed_with_journal_entries_on_a_full_disk(bookies, mnt: Path, ledger_id: int) -> tuple[Any, Path]:
    """A bookie killed with 200 acknowledged entries of ``ledger_id`` only in its journal, the disk mounted at
    ``mnt`` then filled (the bookie not started again); (the bookie, the filler file)."""
    bp = bookies.start("--checkpoint-interval-s", "3600", data_dir=mnt / "bookie")

    async def write(n: int) -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        out = [await raw.add(ledger_id, e, size=32 * 1024) for e in range(n)]
        raw.close()
        return out

    assert asyncio.run(write(200)) == [p.Status.OK] * 200
    bp.kill9()
    filler = mnt / "filler"
    _fill(filler, None)
    return bp, filler


def read_all_back(bp: Any, ledger_id: int) -> None:
    """Every entry ``killed_with_journal_entries_on_a_full_disk`` wrote reads back."""

    async def run() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(200):
            r = await raw.read(ledger_id, e)
            assert r.status == p.Status.OK and r.entry == build(ledger_id, e, 32 * 1024), e
        raw.close()

    asyncio.run(run())


def test_a_restart_on_a_full_disk_refuses_in_one_line_and_the_next_one_replays_everything(
    bookies,
    small_fs: Path,  # noqa: F811
) -> None:
    """Killed with acknowledged entries only in its journal, restarted on a disk with no room left: the bookie
    cannot open its storage nor replay the journal into it, and says so (the directory, its free space) instead
    of a bare RocksDB error; with room again, it starts and every entry reads back."""
    bp, filler = killed_with_journal_entries_on_a_full_disk(bookies, small_fs, 5)
    bp.start(wait=False)
    assert bp.wait_exit(60) == 1
    log = bp.log_tail(400)
    assert "Traceback" not in log, log[-3000:]
    refusal = [line for line in log.splitlines() if "refusing to start" in line]
    assert len(refusal) == 1, log[-3000:]
    assert "no space left on device to open its storage and replay its journal" in refusal[0]
    assert f"in {small_fs / 'bookie' / 'ledgers'} (0.0 MiB free of 48.0 MiB)" in refusal[0], refusal[0]
    assert "ledgerstore: IO error" not in log, log[-3000:]
    filler.unlink()
    bp.start()
    read_all_back(bp, 5)
