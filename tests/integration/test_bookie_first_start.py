"""A new bookie whose first start stopped before its journal was opened (its cookies written, then its ledger
storage would not open: fixed, it is started again) starts: it has acknowledged nothing. It was refused as a
bookie whose journal was deleted ("holds its cookie but no journal"), told to wipe and format."""

from __future__ import annotations


def test_a_first_start_that_stopped_before_its_journal_opened_starts_again(bookies, tmp_path) -> None:
    data = tmp_path / "new-bookie"
    (data / "ledgers" / "CURRENT").mkdir(parents=True)  # RocksDB cannot open: the first start fails
    bp = bookies.start(data_dir=data, wait=False)
    assert bp.wait_exit(60) not in (0, 3, None)
    assert (data / "journal" / "COOKIE").exists()  # the cookies were written before the storage was opened
    (data / "ledgers" / "CURRENT").rmdir()  # the operator fixes what failed
    bp.start(wait=False)
    bp.wait_healthy(60)  # before the fix: exit 3, "holds its cookie but no journal"


def test_a_journal_deleted_beside_its_free_segments_is_refused(bookies) -> None:
    """`rm journal/*.jnl journal/lastmark` on a bookie that has recycled segments leaves its free segment files
    (``<seq>-<hex>.free``, retired segments kept to be written over: nothing in them to replay); the journal is
    gone all the same, and the bookie must refuse to start as without them. It started, and answered NO_LEDGER for
    the entries acknowledged since its last checkpoint."""
    import asyncio
    import time

    from tests.integration.rawbookie import RawBookie
    from tests.integration.test_bookie_process import _add_entries

    bp = bookies.start("--journal-segment-mb", "1", "--checkpoint-interval-s", "1")
    journal = bp.data_dir / "journal"

    async def write(ledger_id: int, n: int) -> None:
        raw = await RawBookie.open(bp.id)
        await _add_entries(raw, ledger_id, n)
        raw.close()

    deadline = time.monotonic() + 60
    ledger_id = 1
    while not any(f.name.endswith(".free") for f in journal.iterdir()):  # segments rolled and retired
        assert time.monotonic() < deadline, sorted(f.name for f in journal.iterdir())
        asyncio.run(write(ledger_id, 2000))
        ledger_id += 1
        time.sleep(1.5)
    bp.kill9()  # at once: another write could roll a segment over the free file
    for f in journal.iterdir():  # the segments and the mark; the COOKIE and the free files left
        if f.name.endswith(".jnl") or f.name == "lastmark":
            f.unlink()
    assert any(f.name.endswith(".free") for f in journal.iterdir())
    bp.start(wait=False)
    assert bp.wait_exit(60) == 3  # before: it started
    assert "holds its cookie but no journal" in bp.started_log_tail(5)
