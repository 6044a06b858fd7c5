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
