"""A bookie whose RocksDB files were deleted while it was down, its ledger directory's cookie left: it must refuse
to start, not serve the entries its checkpoints dropped from the journal as missing."""

from __future__ import annotations

import asyncio
import shutil

from bookie import protocol as p
from ledgerstore.cluster import BookieProcess
from tests.integration.rawbookie import RawBookie, build
from tests.integration.test_bookie_process import _add_entries


def wrote_500(bp: BookieProcess) -> None:
    """Entries 0..499 of ledger 5 added to ``bp`` and acknowledged."""

    async def write() -> None:
        raw = await RawBookie.open(bp.id)
        await _add_entries(raw, 5, 500)
        raw.close()

    asyncio.run(write())


def _delete_storage(bp: BookieProcess) -> None:
    """RocksDB's files deleted from the ledger directory, its cookie left (as `rm -r ledgers/*` with it kept)."""
    for f in (bp.data_dir / "ledgers").iterdir():
        if f.name != "COOKIE":
            shutil.rmtree(f) if f.is_dir() else f.unlink()


def test_a_ledger_storage_deleted_but_its_cookie_left_is_refused_not_served_as_empty(bookies) -> None:
    bp = bookies.start("--checkpoint-interval-s", "3600")
    wrote_500(bp)
    bp.stop()  # a clean stop checkpoints: the 500 entries are in RocksDB only
    _delete_storage(bp)
    bp.start(wait=False)
    assert bp.wait_exit(30) == 3  # before the fix: it started and answered NO_LEDGER for the 500 entries
    log = bp.started_log_tail(5)
    assert "holds its cookie but no ledger storage" in log and "bookie format --delete-cookie" in log, log


def test_a_ledger_storage_deleted_before_any_checkpoint_is_rebuilt_from_the_journal(bookies) -> None:
    bp = bookies.start("--checkpoint-interval-s", "3600")
    wrote_500(bp)
    bp.kill9()
    (bp.data_dir / "journal" / "lastmark").unlink()  # the mark at the journal's start: nothing ever dropped
    _delete_storage(bp)
    bp.start()

    async def read() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(0, 500, 7):
            r = await raw.read(5, e)
            assert r.status == p.Status.OK and r.entry == build(5, e, size=1000)
        raw.close()

    asyncio.run(read())


def test_updatecookie_refuses_a_move_that_left_the_ledger_storage_behind(bookies, tmp_path) -> None:
    """`bookie updatecookie` of moved directories whose ledger directory holds the cookie but no RocksDB, the
    journal checkpointed: refused as `bookie serve` refuses such a start, the cookie left as it was."""
    from tests.integration.test_cluster_cli import _ls
    from zk.cookies import COOKIE_FILE

    bp = bookies.start("--checkpoint-interval-s", "3600")
    wrote_500(bp)
    bp.stop()  # a clean stop checkpoints: the 500 entries are in RocksDB only
    moved = tmp_path / "moved"
    shutil.copytree(bp.data_dir / "journal", moved / "journal")
    (moved / "ledgers").mkdir()
    shutil.copy(bp.data_dir / "ledgers" / COOKIE_FILE, moved / "ledgers" / COOKIE_FILE)
    args = ["--bookie-id", bp.id, "--zk", bookies.zk, "--zk-root", bookies.root]
    r = _ls("bookie", "updatecookie", *args, "--data-dir", str(moved))
    # before the fix: 'recorded the moved directories', and the bookie then refused to start there
    assert r.returncode != 0 and "holds its cookie but no ledger storage" in r.stderr, r.stdout + r.stderr
    assert "bookie format --delete-cookie" in r.stderr, r.stderr
    shutil.copytree(bp.data_dir / "ledgers", moved / "ledgers", dirs_exist_ok=True)
    r = _ls("bookie", "updatecookie", *args, "--data-dir", str(moved), "--dry-run")
    assert r.returncode == 0 and "would record" in r.stdout, r.stdout + r.stderr
